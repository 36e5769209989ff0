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


def _run(device: str, tag: str, points: list[tuple[int, int, float]]) -> dict:
    rows = [{"prompts": b, "tokens_each": n, "ms": ms, "peak_mib": 1.0} for b, n, ms in points]
    return {"device": device, "model": "qwen35-code-tiny", "dtype": "float32", "tag": tag, "points": rows}


def test_compare_pairs_the_same_points_of_runs_on_one_device(tmp_path):
    """``--compare`` paired the two runs' points by position and never looked at their devices: an H100's
    8 x 4096 stood beside an H200's 1 x 4096 as its "before" (77 against 27 ms), under the H200's name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_long_prefill

    before = _run("NVIDIA H200", "before", [(8, 4096, 77.0), (1, 4096, 30.6)])
    after = _run("NVIDIA H200", "after", [(1, 4096, 27.3), (8, 4096, 71.2)])

    def compare(before: dict, after: dict) -> int:
        files = [tmp_path / "before.json", tmp_path / "after.json"]
        for path, run in zip(files, (before, after), strict=True):
            path.write_text(json.dumps(run))
        return bench_long_prefill.main(["--out", str(tmp_path), "--compare", *map(str, files)])

    assert compare({**before, "device": "NVIDIA H100 80GB HBM3"}, after) == 2  # another device
    other_points = _run("NVIDIA H200", "before", [(8, 512, 19.0), (1, 4096, 30.6)])
    assert compare(other_points, after) == 2
    assert not (tmp_path / "after.png").exists()
    pairs = bench_long_prefill.paired(before, after)  # the same points in another order: by their shape
    assert [(b["ms"], a["ms"]) for b, a in pairs] == [(30.6, 27.3), (77.0, 71.2)]
