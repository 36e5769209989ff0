"""The transposed value-tile probe (GPU-only to time): its kernel computes what the kept one does, checked
in Triton's interpreter at small heads against the float64 serial recurrence, in every variant."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_util as U  # noqa: E402
import probe_transposed_tiles as P  # noqa: E402

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv  # noqa: E402
from trtllm_bole.testing import topk_parents  # noqa: E402


@pytest.mark.parametrize("name", ["t64", "t64_bf16", "t128"])
def test_transposed_kernel_matches_the_serial_recurrence(name):
    gen = torch.Generator().manual_seed(0)
    trees = [topk_parents(20, 3, 5), topk_parents(33, 4, 6)]
    # value tiles of 64 and 128 need dv = 128; two heads a key head as at Qwen3.5-9B
    x = U.make_inputs(U.tree_of(trees, "cpu"), 2, 4, 32, 128, torch.bfloat16, gen)
    _, args, consts = inv.inverse_launch_args(x.call("bf16"), P.CONFIG)
    kernel, grid, constexprs, options = inv.phase_launch(1, P.CONFIG, consts, 4, 128, 2)
    kernel[grid](*args, **constexprs, **options)
    o, u = args[12], args[13]
    o.fill_(float("nan")), u.fill_(float("nan"))
    P.launch_transposed(args, consts, name, 4, 2)
    exact = U.exact_outputs(x)
    # Triton's interpreter (3.9) truncates fp32 -> bf16 casts instead of rounding them to nearest (a
    # -0.27% bias a cast): the bf16 T x T products cast X and U, so O drifts to ~1.4e-2 here, against
    # 3.3e-3 on the H200 (results/probe_transposed_tiles_h200.json). A wrong index errs by O(1).
    tol = 2e-2 if P.VARIANTS[name][3] else 1e-2
    assert U.rel_rms(o, exact[0]) < tol and U.rel_rms(u, exact[2]) < tol


def test_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err
