"""Does a re-run of ``train_tiny.py`` reproduce a committed training run?

    python build_scripts/compare_training.py COMMITTED/training.json RERUN/training.json --out repro.json

Compares the held-out losses (final and at every logged step both runs reached) and the corpus
hashes of two ``training.json`` records, writes the comparison as JSON, and exits non-zero when the
corpora or step counts differ, a held-out loss moved by more than ``--tolerance`` (relative) or is not
a finite number, or the re-run lacks a loss or a logged step the committed run has.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from trtllm_bole.cli_help import HelpWithDefaults


def relative_gaps(committed: dict[str, float], rerun: dict[str, float]) -> dict[str, float]:
    """``(rerun - committed) / committed`` for each loss both records hold."""
    return {k: (rerun[k] - committed[k]) / committed[k] for k in committed if k in rerun}


def check_record(name: str, record: object) -> None:
    """A ``training.json`` as train_tiny.py writes it: final held-out losses, and a log of steps."""
    final = record.get("final_heldout") if isinstance(record, dict) else None
    if not isinstance(final, dict) or not final:
        raise ValueError(f"{name}: not a training record (no final_heldout losses)")
    if any(not isinstance(e, dict) or "step" not in e or "heldout" not in e for e in record.get("log", [])):
        raise ValueError(f"{name}: not a training record (a log entry without step and heldout)")


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
    # A NaN gap is the worst: max() would keep whatever came before it.
    worst = max((abs(g) for g in gaps), default=math.nan)
    worst = worst if all(math.isfinite(g) for g in gaps) else math.nan
    missing = [f"final {k}" for k in committed["final_heldout"] if k not in rerun["final_heldout"]]
    missing += [f"step {e['step']}" for e in committed.get("log", []) if e["step"] not in rerun_log]
    missing += [f"step {s['step']} {k}" for s in per_step for k in s["committed"] if k not in s["rerun"]]
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
        "missing_in_rerun": missing,
        "tolerance": tolerance,
        "reproduced": same_corpus and same_steps and not missing and worst <= tolerance,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpWithDefaults)
    parser.add_argument("committed", type=Path, help="the committed training.json")
    parser.add_argument("rerun", type=Path, help="the re-run's training.json")
    parser.add_argument("--tolerance", type=float, default=0.03, help="largest relative held-out loss gap")
    parser.add_argument("--out", type=Path, default=None, help="also write the comparison here (JSON)")
    args = parser.parse_args(argv)
    records = {
        "committed": json.loads(args.committed.read_text()),
        "rerun": json.loads(args.rerun.read_text()),
    }
    try:
        for name, record in records.items():
            check_record(f"{name} {getattr(args, name)}", record)
    except ValueError as e:
        parser.error(str(e))
    result = compare(records["committed"], records["rerun"], args.tolerance)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    lm = result["final_relative_gap"].get("lm", float("nan"))
    verdict = "REPRODUCED" if result["reproduced"] else "NOT reproduced"
    missing = (
        f"; missing in the re-run: {', '.join(result['missing_in_rerun'])}"
        if result["missing_in_rerun"]
        else ""
    )
    print(
        f"final held-out lm gap {lm:+.2%}, worst {result['worst_relative_gap']:.2%} "
        f"(tolerance {args.tolerance:.0%}); same corpus: {result['same_corpus']}, "
        f"same steps: {result['same_steps']}{missing} -> {verdict}"
    )
    return 0 if result["reproduced"] else 1


if __name__ == "__main__":
    sys.exit(main())
