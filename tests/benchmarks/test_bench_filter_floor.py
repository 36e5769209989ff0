"""The top-k / top-p floor bench on the CPU (a smoke run of its checks: the kernel in Triton's
interpreter against the sorting reference)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_checks_the_floors_and_the_acceptance(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_filter_floor.py"), "--out", str(tmp_path),
           "--device", "cpu", "--vocab", "600", "--batches", "1"]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("same outcome True") == 3 and not list(tmp_path.iterdir())
