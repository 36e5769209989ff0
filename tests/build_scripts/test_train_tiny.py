"""The training script runs on CPU, is deterministic given its seed, and writes a loadable checkpoint."""

import json
import lzma
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
