"""Where the host's time goes while serving: Python's cProfile over one throughput run of a ``bench.py``
dataset per (mode, batch), after the same warm-up as ``bench.py``.

    python benchmarks/profile_host.py --dataset data.jsonl --device cuda --modes ar,bole --batch-sizes 16 \\
        --out /tmp/out

A small model's serving step is host-bound: the device waits for Python. Time spent in a call that
synchronises with the device (``.tolist()``, ``.cpu()``, ``int(tensor)``) is time the host waits for
queued GPU work. cProfile slows Python down, so read the ranking, not the absolute times. Writes
``profile_host_<device>.txt`` (the top functions by own time and by cumulative time, per run, and with
``--callees`` where the named functions' calls go).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys

import torch
from _bench_util import tagged_stem
from bench import PROFILED_SPECULATION, open_profiling_run, profiling_parser, run, warm_up

from trtllm_bole import LLM
from trtllm_bole.spec.calibration import device_name


def profile(
    llm: LLM, mode: str, bole_args: dict, data, batch: int, top: int, callees: list[str], temperature: float
) -> str:
    warm_up(llm, mode, bole_args, data, batch, tokens=16, temperature=temperature)
    profiler = cProfile.Profile()
    profiler.enable()
    result = run(llm, mode, bole_args, data, batch, sequential=False, temperature=temperature)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(
        f"\n===== {mode} batch {batch}: {result['output_tokens_per_s']:.1f} tok/s under cProfile, "
        f"{result['seconds']:.2f} s, MAT {result['mean_accepted_tokens']:.2f} =====\n"
    )
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    for name in callees:  # where a function's own calls spend their time
        stats.print_callees(name)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = profiling_parser(__doc__, modes="ar,bole", batch_sizes="16")
    parser.add_argument("--top", type=int, default=45, help="functions listed per ranking")
    parser.add_argument(
        "--callees", nargs="*", default=[], metavar="REGEX",
        help="also list the callees of the functions these match (pstats' restrictions, e.g. _prefill_round)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    llm, data = open_profiling_run(parser, args)
    bole_args = PROFILED_SPECULATION
    device = device_name(torch.device(args.device))
    report = [
        f"host profile on {device}, torch {torch.__version__}, {args.dtype}, temperature {args.temperature}\n"
    ]
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for mode in args.modes.split(","):
            report.append(
                profile(llm, mode, bole_args, data, batch, args.top, args.callees, args.temperature)
            )
            print(report[-1].splitlines()[1])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{tagged_stem('profile_host', device, None)}.txt"
    path.write_text("".join(report))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
