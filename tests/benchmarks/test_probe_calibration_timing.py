"""The calibration-timing probe (GPU-only): it refuses to run without CUDA, by name."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import probe_calibration_timing as P


def test_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err
