"""The trtllm-bench-style tools run end to end on a tiny checkpoint and check exactness inside."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck")
    subprocess.run([sys.executable, str(ROOT / "build_scripts" / "make_checkpoint.py"), "--out", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    return out


def test_prepare_dataset_modes(tmp_path):
    for mode, extra in (
        ("token-norm-dist", ["--input-mean", "20", "--input-stdev", "4", "--output-mean", "6",
                             "--vocab-size", "99"]),
        ("token-unif-dist", ["--input-min", "3", "--input-max", "9", "--output-min", "2", "--output-max", "5",
                             "--vocab-size", "99"]),
        ("code", ["--output-tokens", "7"]),
    ):  # fmt: skip
        out = tmp_path / f"{mode}.jsonl"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "prepare_dataset.py"), "--out", str(out), mode,
               "--num-requests", "5", *extra]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["task_id"] for r in rows] == list(range(5))
        assert all(("input_ids" in r) != ("prompt" in r) and r["output_tokens"] >= 1 for r in rows)
        if mode != "code":
            assert all(max(r["input_ids"]) < 99 for r in rows)


def test_throughput_bench_reports_and_checks_exactness(tmp_path, checkpoint):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 7, 9], "output_tokens": 5}) + "\n"
                            for i in range(4)))  # fmt: skip
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "throughput", "--dataset", str(data),
           "--engine", str(checkpoint), "--modes", "ar,bole", "--batch-sizes", "2", "--depth", "3",
           "--max-nodes", "6", "--warmup", "1", "--out", str(tmp_path), "--tag", "t"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["all_identical_to_ar"]
    (ar, bole) = result["runs"]
    assert ar["mode"] == "ar" and bole["mode"] == "bole" and bole["output_tokens"] == 20
    assert bole["ttft_ms"]["p50"] > 0 and "speedup_vs_ar" in bole
