"""Serving-state helpers of :mod:`trtllm_bole.models.cache`."""

import torch

from trtllm_bole.models.cache import NO_BLOCK, block_table


def test_block_table_pads_with_no_block():
    """The executor's tables: each request's own blocks in order, ``NO_BLOCK`` past them (never block 0,
    which belongs to some request)."""
    table = block_table([[3, 0], [7], []])
    assert table.dtype == torch.int32
    assert table.tolist() == [[3, 0], [7, NO_BLOCK], [NO_BLOCK, NO_BLOCK]]
    assert NO_BLOCK < 0
