"""The compile check of tests/hopper_compile.py: a launch's signature as the compiler takes it, and a
kernel the interpreter runs but the compiler refuses, reported."""

import os

import pytest
import torch
import triton
import triton.language as tl

from tests.hopper_compile import Compiler, Launches, launch
from trtllm_bole.kernels.norms import rms_norm


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


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("BOLE_COMPILE_CHECK", "1") == "0",
    reason="the launches are noted in Triton's interpreter, with the compile check on",
)
def test_the_interpreter_notes_each_launch_of_this_packages_kernels(monkeypatch):
    """The check of every test rests on this: were no launch noted (a hook left uninstalled, a module
    filter that matches nothing), every test would pass it without a kernel compiled."""
    noted = []
    monkeypatch.setattr(Launches, "note", lambda self, record: noted.append(record))
    rms_norm(torch.randn(3, 8), torch.ones(8), 1e-6)
    branch_types[(1,)](torch.zeros(1), 1)  # a kernel of the tests: not the package's, not noted
    assert [(r["module"], r["name"]) for r in noted] == [("trtllm_bole.kernels.norms", "_rms_norm_kernel")]
