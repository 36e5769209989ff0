"""The sm_90 resource report compiles the launcher's kernels on a machine without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reports_registers_of_every_default_kernel_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if " registers, " in line]
    # batch 1 and 4: one launch; batch 16: the factor and the value-tile kernel
    assert [line.split(" phase ")[1].split(" ")[0] for line in lines] == ["3", "3", "1", "2"]
    for line in lines:
        registers = int(line.split(": ")[-1].split(" registers")[0])
        assert 32 <= registers <= 255, line


def test_refuses_to_run_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "unset TRITON_INTERPRET" in run.stderr
