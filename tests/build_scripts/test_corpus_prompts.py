"""The evaluation prompts are cut from the held-out split only, deterministically, as whole lines."""

import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build_scripts"))

from corpus import EOT, heldout_prompts, prompts_in_training, write_prompts  # noqa: E402


def corpus_with(path: Path, train: list[str], heldout: list[str]) -> Path:
    path.mkdir()
    for split, texts in (("train", train), ("heldout", heldout)):
        with lzma.open(path / f"{split}.txt.xz", "wt", encoding="utf-8") as fh:
            fh.write("".join(t + EOT for t in texts))
    return path


def numbered(tag: str, lines: int) -> str:
    return "".join(f"{tag} line {i}\n" for i in range(lines))


def test_prompts_come_from_heldout_files_as_consecutive_lines(tmp_path):
    heldout = [numbered("held-a", 80), numbered("held-b", 120), numbered("short", 30)]  # short: < 2 x 24
    corpus = corpus_with(tmp_path / "c", [numbered("train", 200)], heldout)
    prompts = heldout_prompts(corpus, 5, lines=24)
    assert [p["task_id"] for p in prompts] == list(range(5))
    for p in prompts:
        rows = p["prompt"].split("\n")
        assert rows[-1] == "" and len(rows) == 25  # 24 whole lines, ending at a line break
        tags = {r.split(" line ")[0] for r in rows[:-1]}
        assert tags in ({"held-a"}, {"held-b"})  # never the training split, never a file under 2 x 24 lines
        numbers = [int(r.rsplit(" ", 1)[1]) for r in rows[:-1]]
        assert numbers == list(range(numbers[0], numbers[0] + 24)) and numbers[0] >= 0
    assert heldout_prompts(corpus, 5, lines=24) == prompts  # seeded
    assert heldout_prompts(corpus, 5, lines=24, seed=1) != prompts


def test_written_prompts_read_back_as_jsonl(tmp_path):
    prompts = [{"task_id": 0, "prompt": 'x = "é"\n'}, {"task_id": 1, "prompt": "y\n"}]
    write_prompts(prompts, tmp_path / "out" / "p.jsonl")
    lines = (tmp_path / "out" / "p.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == prompts


def test_prompts_whose_text_stands_in_training_are_found(tmp_path):
    """The split is by file: a held-out file's lines can stand in a training file too (4 of the committed
    64 prompts do); those are the ones listed."""
    shared = numbered("shared", 30)
    corpus = corpus_with(tmp_path / "c", [numbered("train", 50) + shared], [numbered("held", 60), shared])
    prompts = [
        {"task_id": 7, "prompt": numbered("held", 24)},
        {"task_id": 9, "prompt": shared[: len(shared) // 2]},
    ]
    assert prompts_in_training(corpus, prompts) == [9]
