"""The executor A/Bs' old sides patch what the executor calls (an A/B whose patch nobody calls measures
nothing: the first ``unfiltered-sampling`` run sorted in the drafter only)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import ab_executor

from trtllm_bole import ops
from trtllm_bole.reference import sampling as reference
from trtllm_bole.spec import sampling
from trtllm_bole.spec.drafter import DraftSettings


def test_unfiltered_sampling_old_side_filters_every_sampled_batch_by_the_sort(monkeypatch):
    sorted_rows = []
    monkeypatch.setattr(reference, "filter_floor", lambda *a: sorted_rows.append(a) or torch.zeros(1))
    settings = [0.8, 0.0], [0, 0], [1.0, 1.0], "cpu"
    assert DraftSettings.of(*settings).kind == "sampled"
    with ab_executor.always_sorted():
        drafted = DraftSettings.of(*settings)
        assert drafted.kind == "filtered" and DraftSettings.of([0.0], [0], [1.0], "cpu").kind == "greedy"
        sampling.filter_floors(torch.zeros(2, 5), drafted.temperature, drafted.top_k, drafted.top_p)
    assert len(sorted_rows) == 1 and DraftSettings.of(*settings).kind == "sampled"
    assert ops.filter_floor is not reference.filter_floor


def test_a_greedy_ab_stops_when_its_outputs_are_not_plain_greedy_decodings(monkeypatch, tmp_path):
    """Both sides are compared with plain greedy decoding, not only with each other (a change that broke
    both alike passed before)."""
    seen = []

    def wrong_reference(dev, batch, requests, params):
        seen.append(len(requests))
        return [[0] for _ in requests]

    monkeypatch.setattr(ab_executor, "plain_greedy", wrong_reference)
    argv = ["ab_executor.py", "outcome-queue", "--device", "cpu", "--trials", "1", "--batches", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="differ from plain greedy decoding's"):
        ab_executor.main()
    assert seen == [1] and not list(tmp_path.iterdir())
