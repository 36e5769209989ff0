import json
import signal
import subprocess
import sys
import time
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
    flat = " ".join(out.split())
    assert "(default: 1024)" in flat and "(default: 1,2,4,8,16,32)" in flat  # --max-seq-len, the batches
    assert "(default: False)" not in flat and "(default: None)" not in flat  # flags; unset says its meaning


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


def test_a_terminated_build_leaves_nothing_behind(tmp_path):
    """SIGTERM (timeout, docker stop, a cancelled job) unwinds the build as Ctrl-C does: no staging
    folder, no engine, exit 128 + 15."""
    output = tmp_path / "engine"
    cmd = [sys.executable, str(ROOT / "build_scripts" / "build_engine.py"), "--output", str(output),
           "--device", "cpu", "--calibrate", "--quiet"]  # fmt: skip
    build = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".engine.building-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(tmp_path.glob(".engine.building-*")), "the build never started staging"
    build.send_signal(signal.SIGTERM)
    assert build.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_user_mistakes_get_one_line_errors(tmp_path):
    """Usage errors exit 2 (a flag out of range too: it exited 1, as a failed build does) and unwritable
    outputs 1, each with one line naming the problem (no traceback)."""
    (tmp_path / "file").write_text("")
    cases = [
        (["--calibration-repeats", "3"], 2, "--calibration-repeats applies only with --calibrate"),
        (["--calibrate", "--calibration-repeats", "0"], 2, "repeats must be at least 1"),
        (["--calibrate", "--epsilon", "nan"], 2, "epsilon must be a number >= 0, got nan"),
        (["--calibrate", "--epsilon", "-1"], 2, "epsilon must be a number >= 0, got -1.0"),
        (["--calibrate", "--epsilon", "inf"], 2, "epsilon must be finite to calibrate"),  # wrote Infinity
        (["--device", "tpu"], 2, "device must be 'cpu', 'cuda' or 'cuda:N'"),
        (["--calibrate", "--calibration-batches", "1,1"], 2, "batch_buckets must not repeat a value"),
        (["--calibrate", "--max-draft-depth", "-5"], 2, "max_draft_depth must be a positive integer, got -5"),
        (["--max-draft-depth", "9", "--max-draft-nodes", "1000"], 2, "cannot be served"),  # were exit 1
        (["--max-seq-len", "2"], 2, "max_seq_len must be at least"),
        (["--output", str(tmp_path / "file" / "engine")], 1, "error: "),
    ]
    for args, code, words in cases:
        done = subprocess.run([sys.executable, str(SCRIPT), *args, "--quiet"], capture_output=True, text=True)
        assert done.returncode == code and words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)


def test_the_default_output_is_named_after_the_checkpoint_even_given_as_dot(tmp_path, monkeypatch):
    """``--checkpoint .`` made ``engines/-cpu``."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from build_engine import default_output

    (tmp_path / "Qwen3.5-9B").mkdir()
    monkeypatch.chdir(tmp_path / "Qwen3.5-9B")
    assert default_output(Path("."), "sm_90") == ROOT / "engines" / "Qwen3.5-9B-sm_90"
