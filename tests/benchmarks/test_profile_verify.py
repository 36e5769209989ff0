"""The phase profile (GPU-only to time) launches the kernels as the launcher does: checked in Triton's
interpreter at small heads."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_util as U  # noqa: E402
import profile_verify as P  # noqa: E402

from trtllm_bole.kernels.gdn_tree_verify_inverse import InverseConfig  # noqa: E402
from trtllm_bole.testing import topk_parents  # noqa: E402


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return U.make_inputs(U.tree_of([topk_parents(12, 4, 4)] * 2, "cpu"), 2, 4, 32, 32, torch.bfloat16, gen)


def test_one_launch_phase_is_the_launchers_call_and_passes_the_check():
    x, cfg = _inputs(), InverseConfig(16, 32, 16, 1, 1, 1)
    assert P._check(x, cfg, "tf32") <= P.TOL
    (o, u, log_p), _ = P._launch(x, cfg, "tf32", 3, 1)
    o_ref, u_ref, lp_ref = P._verify(x, cfg, "tf32")
    assert torch.equal(o, o_ref) and torch.equal(u, u_ref) and torch.equal(log_p, lp_ref)


def test_factor_phase_alone_writes_the_path_log_decay():
    x, cfg = _inputs(), InverseConfig(16, 32, 16, 1, 2, 1)
    (_, _, log_p), _ = P._launch(x, cfg, "tf32", 1, 1)
    _, _, lp_ref = P._verify(x, cfg, "tf32")
    assert torch.equal(log_p, lp_ref)


def test_a_nan_error_fails_the_benchmarks_checks():
    """``max`` keeps its first argument against a NaN and ``nan > tol`` is False: three scripts' gates let
    a NaN output be timed."""
    nan = float("nan")
    assert not U.passes([2e-3, nan], 1e-2) and not U.passes([nan, 2e-3], 1e-2) and not U.passes([nan], 1e-2)
    assert U.passes([2e-3, 5e-3], 1e-2) and not U.passes([2e-3, 2e-2], 1e-2)
