"""The sampled acceptance bench on the CPU (a smoke run: its check)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_checks_that_both_sides_accept_alike(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_sampled_accept.py"), "--out", str(tmp_path),
           "--device", "cpu", "--vocabs", "50", "--batches", "2"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("same outcome True") == 4 and not list(tmp_path.iterdir())
