import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "build_scripts" / "build_engine.py"


def test_help_documents_every_option():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in (
        "--checkpoint", "--output", "--dtype", "--max-batch-size", "--max-seq-len", "--max-draft-depth",
        "--max-draft-nodes", "--calibrate", "--tensorrt", "--force", "--epsilon", "--calibration-batches",
    ):  # fmt: skip
        assert option in out


def test_cli_builds_then_keeps_then_refuses(tmp_path):
    out = tmp_path / "engine"
    cmd = [sys.executable, str(SCRIPT), "--output", str(out), "--quiet"]
    first = json.loads(
        subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    )
    assert first["built"] and first["arch"] == "cpu" and first["budget"] is None
    again = json.loads(
        subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    )
    assert not again["built"]
    other = subprocess.run([*cmd, "--max-batch-size", "2"], capture_output=True, text=True)
    assert other.returncode == 1 and "--force" in other.stderr
    bad = subprocess.run([*cmd, "--checkpoint", str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode == 1 and "not a directory" in bad.stderr
