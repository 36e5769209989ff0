"""The real-size bench's bookkeeping (GPU-only to run): kernel shares, the budget sweep, the plot."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_real_dims import (  # noqa: E402
    GDN_VERIFY_KERNELS,
    budget_sweep,
    device_events,
    kernel_breakdown,
    plot,
    reestimate,
    verify_check,
)


def test_kernel_breakdown_splits_gdn_verify_and_commit_per_step():
    events = [
        ("_gdn_tree_verify_inverse_kernel", 30.0),
        ("_tree_serial_kernel", 10.0),
        ("_gdn_commit_kernel", 20.0),
        ("sm90_xmma_gemm_bf16", 140.0),
    ]
    out = kernel_breakdown(events, steps=2)
    assert out["gpu_us"] == 100.0 and out["gdn_verify_us"] == 20.0 and out["gdn_commit_us"] == 10.0
    assert out["verify_share"] == pytest.approx(0.2) and out["commit_share"] == pytest.approx(0.1)


def test_every_kernel_of_the_verify_path_counts_as_gdn_verify():
    """The one-launch kernel was once missing from a hand-kept list: its steps reported a 0% share."""
    for name in ("_compact_one_launch_kernel", "_path_factors_kernel", "_gdn_tree_verify_inverse_kernel",
                 "_gdn_tree_verify_kernel", "_tree_serial_kernel"):  # fmt: skip
        assert name in GDN_VERIFY_KERNELS
        assert kernel_breakdown([(name, 5.0), ("gemm", 15.0)], steps=1)["verify_share"] == 0.25
    assert "_gdn_commit_kernel" not in GDN_VERIFY_KERNELS


def test_device_events_drop_the_host_launch_events_that_repeat_kernel_time():
    events = [
        SimpleNamespace(name="cudaLaunchKernel", device_type=DeviceType.CPU, device_time_total=7.0),
        SimpleNamespace(name="gemm", device_type=DeviceType.CUDA, device_time_total=7.0),
        SimpleNamespace(name="Memset", device_type=DeviceType.CUDA, device_time_total=1.0),
    ]
    assert device_events(events) == [("gemm", 7.0), ("Memset", 1.0)]


def _point(gpu_us: float) -> dict:
    return {"wall_ms": 50.0, "gpu_us": gpu_us, "verify_share": 0.03}


def test_budget_sweep_uses_the_batch_gpu_time_and_mat_at_draft_tokens():
    rows = [
        {"batch": 16, "tokens_per_request": 8, "bole": _point(10_000.0), "tree_serial": _point(12_000.0)},
        {"batch": 16, "tokens_per_request": 64, "bole": _point(20_000.0), "tree_serial": {"error": "OOM"}},
        {"batch": 16, "tokens_per_request": 128, "bole": {"error": "CUDA out of memory"}, "tree_serial": {}},
        {"batch": 1, "tokens_per_request": 64, "bole": _point(5_000.0), "tree_serial": _point(6_000.0)},
    ]
    sweep = budget_sweep(rows, {"4": 3.0, "16": 4.5, "64": 5.5})
    assert [r["total_tree_tokens"] for r in sweep] == [128, 1024]
    # 7 draft tokens -> MAT measured at 4; 63 -> at 16 (64 drafts would need 65 nodes).
    assert [r["mat_from_small_model"] for r in sweep] == [3.0, 4.5]
    assert sweep[1]["estimated_output_tokens_per_s"] == pytest.approx(16 * 4.5 / 0.02)


def test_reestimate_uses_the_new_acceptance_curve(tmp_path):
    rows = [
        {"batch": b, "tokens_per_request": 16, "bole": _point(10_000.0), "tree_serial": {}} for b in (1, 8)
    ]
    result = {"models": {"m": {"steps": rows, "budget_sweep_estimate": []}}}
    curve = tmp_path / "acceptance.json"
    curve.write_text('{"mat_by_draft_tokens": {"15": 4.0}}')
    reestimate(result, curve)
    (row,) = result["models"]["m"]["budget_sweep_estimate"]  # the largest batch (<= 16) only
    assert row["total_tree_tokens"] == 128 and row["mat_from_small_model"] == 4.0
    assert result["acceptance"] == str(curve)


def test_reestimate_adds_the_8_token_chain_where_acceptance_measured_it(tmp_path):
    rows = [
        {"batch": b, "tokens_per_request": 16, "bole": _point(10_000.0), "tree_serial": {},
         "chain9": _point(8_000.0)}
        for b in (1, 8)
    ]  # fmt: skip
    result = {"models": {"m": {"steps": rows}}}
    curve = tmp_path / "acceptance.json"
    curve.write_text(json.dumps({"mat_by_draft_tokens": {"15": 4.0},
                                 "rows": [{"shape": "chain d8", "mean_accepted_tokens": 3.2}]}))  # fmt: skip
    reestimate(result, curve)
    chain = result["models"]["m"]["chain8_estimate"]
    assert chain["batch"] == 8 and chain["estimated_output_tokens_per_s"] == pytest.approx(8 * 3.2 / 0.008)
    curve.write_text('{"mat_by_draft_tokens": {"15": 4.0}, "rows": []}')
    reestimate(result, curve)
    assert "chain8_estimate" not in result["models"]["m"]


def test_plot_draws_every_model(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        {"batch": 1, "tokens_per_request": n, "bole": _point(1e3 * n), "tree_serial": _point(2e3 * n),
         "decode": _point(900.0)}
        for n in (8, 64)
    ]  # fmt: skip
    entry = {"steps": rows, "budget_sweep_estimate": budget_sweep(rows, {"4": 3.0}),
             "chain8_estimate": {"estimated_output_tokens_per_s": 2.0}}  # fmt: skip
    result = {"device": "test", "torch": "x", "kv_len": 512, "models": {"a": entry, "b": entry}}
    plot(result, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_verify_check_runs_the_kernel_against_float64_and_catches_a_wrong_one(monkeypatch):
    """In Triton's interpreter at small heads: the launcher's default passes; a kernel whose o is off
    by 5% fails (so a broken point is never timed)."""
    from trtllm_bole.kernels import gdn_tree_verify as kernel
    from trtllm_bole.testing import topk_parents

    trees = [topk_parents(20, 4, 9)] * 2
    ok = verify_check(trees, 2, 4, 32, 32, device="cpu")
    assert ok["ok"] and ok["o"] < 1e-2 and ok["u"] < 1e-2
    serial = verify_check(trees, 2, 4, 32, 32, device="cpu", scheme="serial")  # the tree-serial kernel
    assert serial["ok"] and serial["o"] < 1e-2 and "u" not in serial
    real = kernel.gdn_tree_verify

    def off(*args, **kwargs):
        o, u, log_p = real(*args, **kwargs)
        return o * 1.05, u, log_p

    monkeypatch.setattr(kernel, "gdn_tree_verify", off)
    bad = verify_check(trees, 2, 4, 32, 32, device="cpu")
    assert not bad["ok"] and bad["o"] > 1e-2
