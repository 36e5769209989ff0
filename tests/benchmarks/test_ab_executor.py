"""The executor A/Bs' old sides patch what the executor calls (an A/B whose patch nobody calls measures
nothing: the first ``unfiltered-sampling`` run sorted in the drafter only)."""

import sys
from pathlib import Path

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
