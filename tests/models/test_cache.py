"""Serving-state helpers of :mod:`trtllm_bole.models.cache`."""

import pytest
import torch

from trtllm_bole.models.cache import NO_BLOCK, block_table


def test_block_table_pads_with_no_block():
    """The executor's tables: each request's own blocks in order, ``NO_BLOCK`` past them (never block 0,
    which belongs to some request)."""
    table = block_table([[3, 0], [7], []])
    assert table.dtype == torch.int32
    assert table.tolist() == [[3, 0], [7, NO_BLOCK], [NO_BLOCK, NO_BLOCK]]
    assert NO_BLOCK < 0


def test_a_step_refused_for_its_blocks_leaves_every_state_as_it_was():
    """A decode, a prefill continuation or a verify's commit past a request's blocks is refused before
    any state moves, so the caller can extend the table and retry (the GDN and conv states were
    committed first, and a prefill's GDN layers update their state as they run: a retry then decoded
    from a state already past the refused tokens)."""
    from trtllm_bole.models.cache import StepContext
    from trtllm_bole.models.config import load_config
    from trtllm_bole.models.loader import random_model
    from trtllm_bole.testing import TINY_CONFIG, topk_parents
    from trtllm_bole.tree import TreeBatch

    model = random_model(load_config(TINY_CONFIG), seed=1, dtype=torch.float32)
    cache = model.allocate_cache(2, 8, 4)
    tables, slots = block_table([[5, 2]]), torch.tensor([1])  # 8 positions
    model.prefill(
        torch.arange(8) % 16, StepContext.chains([8], slots, tables, torch.zeros(1, dtype=torch.long))
    )
    before = [t.clone() for t in (cache.gdn_state, cache.conv_state, cache.k_cache, cache.v_cache)]
    full = torch.tensor([8])
    tree = TreeBatch.build(torch.tensor(topk_parents(5, 2, 3)), torch.tensor([0, 5]))
    _, _, pending = model.verify(torch.arange(5), StepContext(slots, tables, full, tree))
    steps = {
        "decode": lambda: model.decode(torch.tensor([3]), StepContext.single_tokens(slots, tables, full)),
        "prefill": lambda: model.prefill(torch.tensor([3, 4]), StepContext.chains([2], slots, tables, full)),
        "commit": lambda: model.commit(pending, torch.tensor([4])),
    }
    for name, step in steps.items():
        with pytest.raises(ValueError, match="block table holds 8 positions"):
            step()
        after = (cache.gdn_state, cache.conv_state, cache.k_cache, cache.v_cache)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), name


def test_a_prefill_refused_for_its_slot_writes_no_cache():
    """With attention as the first layer, a prefill on a slot past the pool wrote that layer's K/V before
    the first GDN layer refused the slot."""
    from trtllm_bole.models.cache import StepContext
    from trtllm_bole.models.config import load_config
    from trtllm_bole.models.loader import random_model
    from trtllm_bole.testing import TINY_CONFIG

    config = {**TINY_CONFIG, "num_hidden_layers": 2, "layer_types": ["full_attention", "linear_attention"]}
    model = random_model(load_config(config), seed=1, dtype=torch.float32)
    cache = model.allocate_cache(2, 8, 4)
    ctx = StepContext.chains([4], torch.tensor([7]), block_table([[1]]), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"state_indices must lie in \[0, 2\), got \[7\]"):
        model.prefill(torch.arange(4), ctx)
    assert not cache.k_cache.any() and not cache.v_cache.any() and not cache.gdn_state.any()
