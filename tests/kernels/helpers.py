"""Shared by the kernel tests: they run on CUDA when present, else on CPU tensors in Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported)."""

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
