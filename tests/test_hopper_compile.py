"""The compile check of tests/hopper_compile.py: a launch's signature as the compiler takes it, and a
kernel the interpreter runs but the compiler refuses, reported."""

import pytest
import torch
import triton
import triton.language as tl

from tests.hopper_compile import Compiler, launch


def _scaled(x, out, n, factor, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * factor, mask=offs < n)


@triton.jit
def branch_types(x, flag):
    """Runs in the interpreter; the compiler refuses it: ``_`` is fp32 in one branch, int32 in the other."""
    if flag > 0:  # noqa: SIM108 (the if statement is the shape under test)
        _ = tl.load(x)
    else:
        _ = tl.load(x).to(tl.int32)
    tl.store(x, 1.0)


def test_a_launch_is_its_argument_types_constexprs_and_options():
    x = torch.zeros(4, dtype=torch.bfloat16)
    record = launch(_scaled, (x, x.long(), 3, 0.5), {"BLOCK": 8, "SHIFT": None, "num_warps": 2})
    assert record["signature"] == {
        "x": "*bf16", "out": "*i64", "n": "i32", "factor": "fp32", "BLOCK": "constexpr", "SHIFT": "constexpr"
    }  # fmt: skip
    assert record["constexprs"] == {"BLOCK": 8, "SHIFT": None} and record["options"] == {"num_warps": 2}
    assert launch(_scaled, (x, x, 2**40, 1.0), {"BLOCK": 8})["signature"]["n"] == "i64"
    with pytest.raises(TypeError, match="no compiler type for an argument of type str"):
        launch(_scaled, (x, x, "3", 1.0), {"BLOCK": 8})


def test_the_compiler_builds_a_good_kernel_and_reports_a_refused_one():
    compiler = Compiler()
    signature = {"x": "*fp32", "n": "i32", "factor": "constexpr"}
    good = {"module": "tests.kernels.test_compiles", "name": "_scale_kernel", "signature": signature}
    good |= {"constexprs": {"factor": 3.0}, "options": {}}
    bad = {"module": __name__, "name": "branch_types", "signature": {"x": "*fp32", "flag": "i32"}}
    bad |= {"constexprs": {}, "options": {}}
    try:
        assert compiler.failures([good]) == []
        (failure,) = compiler.failures([bad])
    finally:
        compiler.close()
    assert "branch_types" in failure and "Mismatched type for _" in failure
