import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_command_verifies_exactly():
    out = subprocess.run(
        [sys.executable, "-m", "trtllm_bole", "demo"], capture_output=True, text=True, check=True
    ).stdout
    assert "EXACT (<= 1e-10)" in out


def test_memory_table_writes_json(tmp_path):
    target = tmp_path / "m.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_table.py"), "--json", str(target)],
        check=True,
        capture_output=True,
    )
    rows = json.loads(target.read_text())["rows"]
    nine_b_100 = next(r for r in rows if r["model"] == "qwen3.5-9b" and r["tree_size"] == 100)
    # 100 nodes x 24 GDN layers x 32 heads x 128 x 128 fp32 = 5.03e9 bytes (paper: 4.7 GiB)
    assert nine_b_100["snapshots"] == 100 * 24 * 32 * 128 * 128 * 4
    assert nine_b_100["ratio"] > 60
