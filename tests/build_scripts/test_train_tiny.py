"""The training script runs on CPU, is deterministic given its seed, and writes a loadable checkpoint."""

import json
import lzma
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build_scripts"))

import train_tiny  # noqa: E402
from corpus import EOT  # noqa: E402

from trtllm_bole.models.loader import load_model  # noqa: E402


def tiny_corpus(path: Path) -> Path:
    stdlib = Path(torch.__file__).parents[1]  # any installed Python sources will do
    texts = [p.read_text(errors="replace") for p in sorted(stdlib.glob("torch/nn/modules/*.py"))[:12]]
    path.mkdir()
    for split, chosen in (("train", texts[:10]), ("heldout", texts[10:])):
        with lzma.open(path / f"{split}.txt.xz", "wt", encoding="utf-8") as f:
            f.write("".join(t + EOT for t in chosen))
    manifest = {"python": "x", "packages": {}, "stdlib_license": "PSF-2.0", "heldout_percent": 2,
                "splits": {"train": {"sha256": "t"}, "heldout": {"sha256": "h"}}}  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_two_seeded_runs_agree_and_the_checkpoint_loads(tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus")
    args = ["--corpus", str(corpus), "--device", "cpu", "--preset", "smoke", "--steps", "3",
            "--batch-size", "2", "--seq-len", "32", "--eval-every", "3", "--warmup", "1"]  # fmt: skip
    runs = []
    for name in ("a", "b"):
        train_tiny.main(["--out", str(tmp_path / name), *args])
        runs.append(json.loads((tmp_path / name / "training.json").read_text()))
    assert runs[0]["log"] == runs[1]["log"] and runs[0]["final_heldout"] == runs[1]["final_heldout"]
    model = load_model(tmp_path / "a", dtype=torch.float32, progress=False)
    assert model.mtp is not None
    assert (tmp_path / "a" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--lr", "1e4"], "training diverged (held-out losses"),  # NaN weights every load refuses
        (["--time-limit", "1e-9"], "no step ran within --time-limit"),  # as --steps 0 is refused
    ],
)
def test_a_run_with_no_trained_result_writes_nothing_and_fails(tmp_path, flags, words):
    """Both had written a checkpoint and exited 0 (a diverged one that LLM() then refused as corrupt)."""
    corpus = tiny_corpus(tmp_path / "corpus")
    args = ["--out", str(tmp_path / "out"), "--corpus", str(corpus), "--device", "cpu",
            "--preset", "smoke", "--steps", "5", "--batch-size", "2", "--seq-len", "32",
            "--eval-every", "5", "--warmup", "1"]  # fmt: skip
    with pytest.raises(SystemExit, match=re.escape(words)):
        train_tiny.main([*args, *flags])
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_corpus_build_cut_short_is_not_taken_for_built(tmp_path, monkeypatch):
    """The training split is written first and the manifest last: a build interrupted in between (or a
    rebuild over an old manifest) had passed for built, and training failed on the missing manifest."""
    import corpus

    built = tiny_corpus(tmp_path / "c")
    assert corpus.corpus_built(built)
    monkeypatch.setattr(corpus, "source_files", lambda: [])
    monkeypatch.setattr(corpus.lzma, "open", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        corpus.write_corpus(built)  # a rebuild cut short in its first split
    assert not corpus.corpus_built(built)


def test_compare_training_flags_a_moved_loss_and_another_corpus():
    from compare_training import compare

    def record(lm: float, sha: str = "abc") -> dict:
        held = {"lm": lm, "mtp1": lm + 0.1}
        return {"steps": 10, "corpus_sha256": {"train": sha}, "final_heldout": held,
                "log": [{"step": 5, "heldout": {"lm": lm + 1.0, "mtp1": lm + 1.1}}]}  # fmt: skip

    same = compare(record(2.5), record(2.55), tolerance=0.03)
    assert same["reproduced"] and same["final_relative_gap"]["lm"] == pytest.approx(0.02)
    assert same["per_step"][0]["step"] == 5
    assert not compare(record(2.5), record(2.7), tolerance=0.03)["reproduced"]
    assert not compare(record(2.5), record(2.5, sha="other"), tolerance=0.03)["same_corpus"]
    # A NaN loss, a loss or a logged step the re-run lacks: not reproduced (each passed: max() kept the
    # gap before a NaN, and the gaps skipped what the re-run did not hold).
    nan_step = record(2.5)
    nan_step["log"][0]["heldout"]["lm"] = float("nan")
    no_mtp, no_log = record(2.5), record(2.5)
    del no_mtp["final_heldout"]["mtp1"], no_mtp["log"][0]["heldout"]["mtp1"]
    no_log["log"] = []
    for rerun, missing in ((nan_step, []), (no_mtp, ["final mtp1", "step 5 mtp1"]), (no_log, ["step 5"])):
        result = compare(record(2.5), rerun, tolerance=0.03)
        assert not result["reproduced"] and result["missing_in_rerun"] == missing


def test_compare_training_refuses_what_is_not_a_training_record(tmp_path, capsys):
    from compare_training import main

    good = {"final_heldout": {"lm": 2.5}, "log": []}
    (tmp_path / "good.json").write_text(json.dumps(good))
    for bad in ({"final_heldout": {}}, [], {"final_heldout": {"lm": 2.5}, "log": [{"step": 5}]}):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(SystemExit) as exit_info:
            main([str(tmp_path / "good.json"), str(tmp_path / "bad.json")])
        assert exit_info.value.code == 2 and "not a training record" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "0"], "--steps takes a positive integer, got 0"),
        (["--batch-size", "0"], "--batch-size takes a positive integer, got 0"),
        (["--eval-every", "0"], "--eval-every takes a positive integer, got 0"),
        (["--stop-after", "0"], "--stop-after takes a positive integer, got 0"),
        (["--warmup", "-1"], "--warmup and --mtp-steps take integers >= 0"),
        (["--seq-len", "4"], "--seq-len 4 is too short for 3 MTP steps: at least 5"),
        (["--lr", "nan"], "--lr takes a number above 0"),
        (["--mtp-weight", "-1"], "--mtp-weight one >= 0"),
        (["--time-limit", "-1"], "--time-limit takes seconds above 0"),
        (["--time-limit", "nan"], "--time-limit takes seconds above 0"),
    ],
)
def test_training_refuses_values_it_cannot_use(tmp_path, capsys, flags, message):
    """Refused before the corpus loads: --steps 0 wrote an untrained checkpoint and exited 0, --eval-every 0
    failed after a step, --lr nan after the tokenizer, a NaN time limit never stopped the loop."""
    with pytest.raises(SystemExit) as exit_info:
        train_tiny.main(["--out", str(tmp_path / "out"), "--corpus", str(tmp_path / "none"), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "none").exists()


def test_training_refuses_an_out_file_and_windows_past_a_split(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        train_tiny.main(["--out", str(tmp_path / "afile"), "--corpus", str(tmp_path / "none")])
    assert exit_info.value.code == 2 and "is a file, not a checkpoint directory" in capsys.readouterr().err
    corpus = tiny_corpus(tmp_path / "corpus")
    with pytest.raises(SystemExit) as exit_info:
        train_tiny.main(["--out", str(tmp_path / "out"), "--corpus", str(corpus), "--device", "cpu",
                         "--preset", "smoke", "--seq-len", "100000"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--seq-len 100000: the held-out split has only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
