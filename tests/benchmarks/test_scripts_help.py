"""Every benchmark script answers ``--help`` with its usage and runs nothing (one started its H200 run)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_script_answers_help():
    # As the READMEs run them: no PYTHONPATH (bench_aot_plugins.py failed to import plugins/ without one).
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "CUDA_VISIBLE_DEVICES": ""}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env, "cwd": ROOT}
    runs = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], **pipes) for p in SCRIPTS}
    answers = {name: (*run.communicate(timeout=300), run.returncode) for name, run in runs.items()}
    failed = {name: err[-300:] for name, (out, err, rc) in answers.items() if rc or "usage:" not in out}
    assert len(SCRIPTS) >= 30 and not failed
