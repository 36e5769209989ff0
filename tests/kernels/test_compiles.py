"""Counting Triton's compiles: the hook is installed only inside the block, chains to a hook already set,
and (on a GPU) sees a new kernel variant once, not its cached launches."""

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs

from trtllm_bole.kernels.compiles import recording_compiles


def test_records_inside_the_block_only_and_keeps_an_existing_hook():
    seen = []
    knobs.runtime.jit_post_compile_hook = lambda *, fn, **kw: seen.append(fn.name)
    try:
        with recording_compiles() as compiled:
            knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="k1"), key=None)
        assert compiled == ["k1"] and seen == ["k1"]
        knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="k2"), key=None)
        assert compiled == ["k1"] and seen == ["k1", "k2"]
    finally:
        knobs.runtime.jit_post_compile_hook = None


@triton.jit
def _scale_kernel(x, n, factor: tl.constexpr):
    offs = tl.arange(0, 16)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) * factor, mask=offs < n)


@pytest.mark.gpu
def test_a_new_variant_is_recorded_once():
    x = torch.ones(16, device="cuda")
    with recording_compiles() as compiled:
        for _ in range(3):
            _scale_kernel[(1,)](x, 5, 3.0)
    torch.cuda.synchronize()
    assert compiled == ["_scale_kernel"]
