"""The long-prompt prefill bench on the CPU (a smoke run: its check and its JSON, no memory figures)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_checks_the_logits_and_writes_its_points(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_long_prefill.py"), "--out", str(tmp_path),
           "--tag", "smoke", "--device", "cpu", "--points", "2x70,1x9", "--repeats", "1",
           "--bounds", "200,7", "--serve", "3x24"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((tmp_path / "bench_long_prefill_cpu_smoke.json").read_text())
    points = data["points"]
    assert [(p["prompts"], p["tokens_each"]) for p in points] == [(2, 70), (1, 9)]
    assert all(p["logits_rel_rms"] <= 1e-3 and p["ms"] > 0 and p["peak_mib"] is None for p in points)
    runs = data["admission"]["runs"]  # one forward, then 3 x 24 tokens in forwards of 7
    assert [r["max_prefill_tokens"] for r in runs] == [200, 7] and not any("error" in r for r in runs)
    assert all(len(o) == 4 for o in runs[0]["outputs"]) and len(runs[0]["outputs"]) == 3
    # Where and how it ran, as every result says (the smoke JSON had none, and --compare crashed on it).
    assert data["device"] == "cpu" and data["tag"] == "cpu_smoke" and {"torch", "command"} <= set(data)
    compare = [sys.executable, str(ROOT / "benchmarks" / "bench_long_prefill.py"), "--out", str(tmp_path),
               "--compare", *[str(tmp_path / "bench_long_prefill_cpu_smoke.json")] * 2]  # fmt: skip
    run = subprocess.run(compare, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize(
    "script", ["bench_long_prefill.py", "bench_filter_floor.py", "bench_sampled_accept.py"]
)
def test_a_device_it_cannot_name_is_refused(script, tmp_path):
    """These scripts time on ``cuda`` (the current GPU) or check on ``cpu``; ``cuda:0`` had been taken for a
    CPU run (named ``cpu``, no device recorded) or timed nothing and said nothing."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--out", str(tmp_path), "--device", "cuda:0"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "invalid choice: 'cuda:0'" in run.stderr and not list(tmp_path.iterdir())
