"""The training corpus of the embedded tiny model: Python source that ships with this machine.

Sources (all permissively licensed, recorded in the model card): CPython 3.11's standard library
(PSF-2.0) and the installed sympy (BSD-3-Clause), numpy (BSD-3-Clause) and networkx
(BSD-3-Clause) packages. Files are split deterministically by a hash of their path: 2% are held
out, never trained on, and the evaluation prompts are cut from them. The split is by file, not by
text: a held-out file's lines can also stand in a training file (the codec tables of
``stdlib/encodings`` repeat across files), and 4 of the 64 committed prompts (task ids 3, 27, 28, 29) do;
``--check-prompts`` lists them.

    python build_scripts/corpus.py --out .data/corpus   # writes train.txt.xz, heldout.txt.xz, manifest.json
    python build_scripts/corpus.py --out .data/corpus --prompts benchmarks/data/heldout_code_prompts.jsonl
                                                        # and the 64 evaluation prompts (byte-identical to
                                                        # the committed file on CPython 3.11.7 with the
                                                        # package versions of the model card)
    python build_scripts/corpus.py --check-prompts benchmarks/data/heldout_code_prompts.jsonl
                                                        # which prompts' text stands in the training split
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import lzma
import platform
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"
PACKAGES = {"sympy": "BSD-3-Clause", "numpy": "BSD-3-Clause", "networkx": "BSD-3-Clause"}
HELDOUT_PERCENT = 2


@dataclass(slots=True)
class SourceFile:
    name: str  # stable, machine-independent name: "<origin>/<relative path>"
    path: Path

    @property
    def heldout(self) -> bool:
        digest = hashlib.sha1(self.name.encode()).digest()
        return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def source_files() -> list[SourceFile]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        SourceFile(f"stdlib/{p.relative_to(stdlib).as_posix()}", p)
        for p in stdlib.rglob("*.py")
        if "site-packages" not in p.parts
    ]
    site = Path(sysconfig.get_paths()["purelib"])
    for package in PACKAGES:
        root = site / package
        if not root.is_dir():
            raise SystemExit(f"package {package} is not installed in {site}; pip install {package}")
        files += [SourceFile(f"{package}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py")]
    return sorted(files, key=lambda f: f.name)


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def corpus_built(out: Path) -> bool:
    """Whether ``out`` holds a whole corpus: its manifest, written last (a build cut short has none)."""
    return (out / "manifest.json").is_file()


def write_corpus(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # a rebuild cut short must not pass for built
    files = source_files()
    manifest = {
        "python": platform.python_version(),
        "packages": {
            p: {"version": importlib.metadata.version(p), "license": lic} for p, lic in PACKAGES.items()
        },
        "stdlib_license": "PSF-2.0",
        "heldout_percent": HELDOUT_PERCENT,
        "splits": {},
    }
    for split in ("train", "heldout"):
        chosen = [f for f in files if f.heldout == (split == "heldout")]
        text = "".join(read_source(f.path) + EOT for f in chosen)
        with lzma.open(out / f"{split}.txt.xz", "wt", encoding="utf-8", preset=6) as fh:
            fh.write(text)
        manifest["splits"][split] = {
            "files": [f.name for f in chosen],
            "chars": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_split(corpus: Path, split: str) -> str:
    with lzma.open(corpus / f"{split}.txt.xz", "rt", encoding="utf-8") as fh:
        return fh.read()


def heldout_prompts(corpus: Path, count: int, *, seed: int = 0, lines: int = 24) -> list[dict]:
    """Code prompts cut from held-out files (never trained on): ``lines`` consecutive lines of a file,
    ending at a line break, from a seeded position past the file's first lines."""
    rng = random.Random(seed)
    files = [f for f in read_split(corpus, "heldout").split(EOT) if f.count("\n") > 2 * lines]
    prompts = []
    for i in range(count):
        text = files[i % len(files)].split("\n")
        end = rng.randrange(lines, len(text) - 1)
        prompt = "\n".join(text[end - lines : end]) + "\n"
        prompts.append({"task_id": i, "prompt": prompt})
    return prompts


def prompts_in_training(corpus: Path, prompts: list[dict]) -> list[int]:
    """The task ids of ``prompts`` whose whole text stands in the corpus's training split."""
    train = read_split(corpus, "train")
    return [p["task_id"] for p in prompts if p["prompt"] in train]


def write_prompts(prompts: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".data/corpus"))
    parser.add_argument(
        "--prompts", type=Path, help="also cut the evaluation prompts from the held-out split into this JSONL"
    )
    parser.add_argument("--prompt-count", type=int, default=64)
    parser.add_argument(
        "--check-prompts", type=Path, metavar="JSONL",
        help="list this file's prompts whose text stands in the training split of --out (built if missing)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.check_prompts:
        if not corpus_built(args.out):
            write_corpus(args.out)
        prompts = [json.loads(line) for line in args.check_prompts.read_text().splitlines()]
        found = prompts_in_training(args.out, prompts)
        print(f"{len(found)} of {len(prompts)} prompts stand in the training split: task ids {found}")
        return
    manifest = write_corpus(args.out)
    for split, info in manifest["splits"].items():
        files, chars = len(info["files"]), info["chars"] / 1e6
        print(f"{split}: {files} files, {chars:.1f} M chars, sha256 {info['sha256'][:12]}")
    if args.prompts:
        write_prompts(heldout_prompts(args.out, args.prompt_count), args.prompts)
        print(f"{args.prompt_count} held-out prompts -> {args.prompts}")


if __name__ == "__main__":
    main()
