"""The split-products probe (GPU-only to time): its three kernels compute what the kept pair does, checked in
Triton's interpreter at small heads against the float64 serial recurrence, with fp32 and bf16
intermediates, in every precision."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_util as U  # noqa: E402
import probe_split_products as P  # noqa: E402

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv  # noqa: E402
from trtllm_bole.testing import topk_parents  # noqa: E402


@pytest.mark.parametrize(("precision", "tol"), [("ieee", 1e-5), ("tf32", 1e-5), ("bf16", 1e-2)])
@pytest.mark.parametrize("inter_dtype", [torch.float32, torch.bfloat16])
def test_the_three_kernels_match_the_serial_recurrence(precision, tol, inter_dtype):
    gen = torch.Generator().manual_seed(0)
    trees = [topk_parents(16, 2, 4), topk_parents(11, 3, 3), topk_parents(16, 4, 5)]
    # two value heads a key head, two value tiles a head, a request shorter than the tile
    x = U.make_inputs(U.tree_of(trees, "cpu"), 2, 4, 32, 32, torch.float32, gen)
    split = P.Split(inv.InverseConfig(16, 32, 16, 2, 2, 2), 4, len(trees), inter_dtype, None, (None, None))
    prepared = split.prepare(x.call(precision))
    o, u, log_p = prepared[0]
    for t in (o, u, log_p):
        t.fill_(float("nan"))
    split.launch(prepared)
    exact = U.exact_outputs(x)
    # bf16 intermediates round K S and Q S (2^-9): o and u off by ~1e-3 at these sizes; a wrong index errs
    # by O(1).
    tol = max(tol, 1e-2) if inter_dtype == torch.bfloat16 else tol
    assert U.rel_rms(o, exact[0]) < tol and U.rel_rms(u, exact[2]) < tol and U.rel_rms(log_p, exact[3]) < 1e-5


def test_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err
