"""The dispatch-cost benchmark's three calls of each op compute the same thing and it writes its split."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import op_dispatch  # noqa: E402


def test_writes_the_split_of_every_op(tmp_path):
    assert op_dispatch.main(["--device", "cpu", "--calls", "1", "--rounds", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "op_dispatch_cpu.json").read_text())
    assert result["device"] == "cpu" and {"torch", "triton", "python", "command"} <= set(result)
    points = result["points"]
    assert sorted(points) == ["gdn_tree_verify", "rms_norm", "tree_conv1d"]
    for p in points.values():
        assert all(0 < p[f"{k}_us"] < float("inf") for k in ("public_op", "operator", "implementation"))
        assert p["validation_us"] == p["public_op_us"] - p["operator_us"]
        assert p["dispatch_us"] == p["operator_us"] - p["implementation_us"]


def test_refuses_to_report_when_the_calls_disagree(tmp_path, monkeypatch):
    cases = op_dispatch._cases("cpu")
    broken = {
        name: (calls[0], calls[1], lambda direct=calls[2]: direct() + 1) for name, calls in cases.items()
    }
    monkeypatch.setattr(op_dispatch, "_cases", lambda device: broken)
    assert op_dispatch.main(["--device", "cpu", "--calls", "1", "--rounds", "1", "--out", str(tmp_path)]) == 1
    assert not (tmp_path / "op_dispatch_cpu.json").exists()
