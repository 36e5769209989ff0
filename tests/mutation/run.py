"""Mutation testing: does the suite notice a plausible bug? ``python tests/mutation/run.py``.

Each mutant of :mod:`mutants` (a one-place edit a developer could make: an off-by-one, a dropped term, a
swapped argument, another request's settings) is applied, alone, to a clone of the committed ``HEAD``
(the working tree is never touched), and the tests it names run against it (``pytest -x``, Triton's
kernels in its interpreter). A mutant is *killed* when a test fails, *survived* when all pass, and
*stale* when its text is no longer found exactly once (the code moved on: update or drop it) or its
tests select nothing (a renamed test or a ``-k`` that matches none). A
survivor is a test to write; an edit that changes no result is marked ``equivalent`` (with the reason)
and reported so, not as a failure.

    python tests/mutation/run.py                 # every mutant (about an hour on two cores)
    python tests/mutation/run.py --only A5 E4    # some of them
    python tests/mutation/run.py --out mutants.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from mutants import MUTANTS, Mutant  # noqa: E402

# pytest's exit codes that say no test ran: a usage error (a node id not found) and nothing collected.
NOTHING_RAN = {4: "stale (a named test not found)", 5: "stale (no test selected)"}


def outcome(returncode: int, equivalent: str | None) -> str:
    """A mutant's status from its tests' exit code: killed only when tests ran and one failed (or the
    collection broke: a mutant that cannot be imported is caught); a selection that ran nothing says
    so instead of counting as a kill."""
    if returncode in NOTHING_RAN:
        return NOTHING_RAN[returncode]
    return "killed" if returncode else "equivalent" if equivalent else "survived"


def run_mutant(clone: Path, mutant: Mutant, timeout: float) -> dict:
    """Apply ``mutant`` in ``clone``, run its tests, restore the file; the outcome as a record."""
    path = clone / mutant.file
    source = path.read_text()
    record = {"id": mutant.id, "file": mutant.file, "equivalent": mutant.equivalent}
    if source.count(mutant.old) != 1:
        return {**record, "status": "stale", "found": source.count(mutant.old)}
    record["line"] = source[: source.index(mutant.old)].count("\n") + 1
    path.write_text(source.replace(mutant.old, mutant.new))
    env = {**os.environ, "PYTHONPATH": str(clone), "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests]
    started = time.monotonic()
    # Its own process group, so that a timeout also stops what the tests started (a Triton server still
    # holding the output pipes would keep the run waiting for their end).
    tests = subprocess.Popen(command, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, _ = tests.communicate(timeout=timeout)
        status = outcome(tests.returncode, mutant.equivalent)
        failed = [line for line in stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    except subprocess.TimeoutExpired:
        os.killpg(tests.pid, signal.SIGKILL)
        tests.communicate()
        status, failed = "killed (timeout)", []
    finally:
        path.write_text(source)
    return {**record, "status": status, "seconds": round(time.monotonic() - started, 1), "failed": failed[:3]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--out", type=Path, help="write every mutant's record here (JSON)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant's tests")
    args = parser.parse_args(argv)
    repeated = sorted({m.id for m in MUTANTS if [n.id for n in MUTANTS].count(m.id) > 1})
    if repeated:
        parser.error(f"mutant ids used twice: {repeated}")
    chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
    unknown = set(args.only or ()) - {m.id for m in MUTANTS}
    if unknown or not chosen:
        parser.error(f"no such mutants: {sorted(unknown)}" if unknown else "no mutants chosen")
    with tempfile.TemporaryDirectory(prefix="bole-mutants-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        records = [run_mutant(clone, m, args.timeout) for m in tqdm(chosen, desc="mutants", unit="mutant")]
    for r in records:
        print(f"{r['id']:>5}  {r['status']:<10} {r['file']}:{r.get('line', '?')}  {r['equivalent']}")
    statuses = ("killed", "survived", "equivalent", "stale")
    counts = {s: sum(r["status"].startswith(s) for r in records) for s in statuses}
    print(f"at {head}, of {len(records)}: " + ", ".join(f"{counts[s]} {s}" for s in statuses))
    if args.out:
        args.out.write_text(json.dumps({"head": head, "counts": counts, "mutants": records}, indent=1) + "\n")
    return 1 if counts["survived"] or counts["stale"] else 0


if __name__ == "__main__":
    sys.exit(main())
