"""Does a re-run of ``train_tiny.py`` reproduce a committed training run?

    python build_scripts/compare_training.py COMMITTED/training.json RERUN/training.json --out repro.json

Compares the held-out losses (final and at every logged step both runs reached) and the corpus
hashes of two ``training.json`` records, writes the comparison as JSON, and exits non-zero when the
corpora differ or a held-out loss moved by more than ``--tolerance`` (relative).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def relative_gaps(committed: dict[str, float], rerun: dict[str, float]) -> dict[str, float]:
    """``(rerun - committed) / committed`` for each loss both records hold."""
    return {k: (rerun[k] - committed[k]) / committed[k] for k in committed if k in rerun}


def compare(committed: dict, rerun: dict, tolerance: float) -> dict:
    """The comparison of two training records (the dicts ``train_tiny.py`` writes)."""
    rerun_log = {entry["step"]: entry["heldout"] for entry in rerun.get("log", [])}
    per_step = [
        {
            "step": e["step"],
            "committed": e["heldout"],
            "rerun": rerun_log[e["step"]],
            "relative_gap": relative_gaps(e["heldout"], rerun_log[e["step"]]),
        }
        for e in committed.get("log", [])
        if e["step"] in rerun_log
    ]
    final_gap = relative_gaps(committed["final_heldout"], rerun["final_heldout"])
    gaps = [*final_gap.values(), *(g for s in per_step for g in s["relative_gap"].values())]
    worst = max(abs(g) for g in gaps)
    same_corpus = committed.get("corpus_sha256") == rerun.get("corpus_sha256")
    same_steps = committed.get("steps") == rerun.get("steps")
    return {
        "committed": {k: committed.get(k) for k in ("steps", "device", "torch", "final_heldout")},
        "rerun": {
            k: rerun.get(k) for k in ("command", "steps", "device", "torch", "final_heldout", "train_seconds")
        },
        "same_corpus": same_corpus,
        "same_steps": same_steps,
        "final_relative_gap": final_gap,
        "per_step": per_step,
        "worst_relative_gap": worst,
        "tolerance": tolerance,
        "reproduced": same_corpus and same_steps and worst <= tolerance,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("committed", type=Path)
    parser.add_argument("rerun", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.03, help="largest relative held-out loss gap")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = compare(
        json.loads(args.committed.read_text()), json.loads(args.rerun.read_text()), args.tolerance
    )
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    lm = result["final_relative_gap"].get("lm", float("nan"))
    verdict = "REPRODUCED" if result["reproduced"] else "NOT reproduced"
    print(
        f"final held-out lm gap {lm:+.2%}, worst {result['worst_relative_gap']:.2%} "
        f"(tolerance {args.tolerance:.0%}); same corpus: {result['same_corpus']}, "
        f"same steps: {result['same_steps']} -> {verdict}"
    )
    return 0 if result["reproduced"] else 1


if __name__ == "__main__":
    sys.exit(main())
