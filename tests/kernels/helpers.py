"""Shared by the kernel tests: they run on CUDA when present, else on CPU tensors in Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported)."""

import os
import subprocess
import sys

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every fresh ``torch.empty``/``empty_like`` is NaN-filled, so outputs a kernel fails to write fail
    the comparison (the references fill everything they allocate, so they are unaffected)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.dtype.is_floating_point else t.fill_(-(2**30))

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poisoned(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poisoned(empty_like(*a, **kw)))


def compile_for_hopper(kernel: str, signature: dict[str, str], constexprs: dict[str, int]) -> None:
    """Compiles ``module:kernel`` for sm_90 to a cubin on this machine, GPU or none: Triton's interpreter
    runs code that its compiler rejects (a loop-carried value changing type, a name typed differently in
    two branches), so interpreter-green tests alone do not show that a kernel builds. In a fresh process,
    where ``@triton.jit`` makes compilable functions rather than interpreted ones."""
    module, name = kernel.split(":")
    script = (
        "import importlib, sys, triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        f"fn = getattr(importlib.import_module({module!r}), {name!r})\n"
        f"source = ASTSource(fn, {signature!r}, constexprs={constexprs!r})\n"
        "assert 'cubin' in triton.compile(source, target=GPUTarget('cuda', 90, 32)).asm\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
