"""Where an executor step's time goes, per decoding mode: wall time of each phase of a step (``prefill``
of the requests a step admits, ``draft``, ``select``, ``verify``, ``accept``, ``commit`` or, for a
greedy batch on CUDA graphs, ``verify_accept_commit``, ``mtp_follow``, ``outcome``: the step's wait
for the device and the host's booking; the executor's profiler ranges) over one throughput run of a
``bench.py`` dataset (``prepare_dataset.py``). Times are per speculative (or decode) step, the prefill's
too (``calls`` says how many times each phase ran); ``outside_phases_s`` is the synchronised run's time
that no phase holds (the serving loop, the scheduler's admission).

    python benchmarks/profile_step.py --dataset data.jsonl --device cuda --dtype float32 \\
        --modes tree-serial,bole --batch-sizes 8,32 --out /tmp/out
    python benchmarks/profile_step.py ... --temperature 0.8   # sampled: profile_step_<device>_sampled.json

Each (mode, batch) is warmed up as in ``bench.py``, then serves the whole dataset once as it runs there
(that run's time is reported as ``free``), then once more with the device
synchronised at the start and end of every phase, so that a phase's time is its host work plus the
device work it queued. The synchronised run is slower than the free-running one (no overlap of host
and device); their tokens must be identical. Writes ``profile_step_<device>.json``.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
from collections import defaultdict

import torch
import triton
from _bench_util import tagged_stem
from bench import PROFILED_SPECULATION, open_profiling_run, profiling_parser, run, warm_up

from trtllm_bole import LLM
from trtllm_bole.spec import executor as executor_module
from trtllm_bole.spec.calibration import device_name


class PhaseClock:
    """Stands in for the executor's ``phase`` ranges: synchronises and accumulates wall time per phase,
    and the host's part of it (until the phase's code returns, before the closing sync; waits for the
    device inside the phase, such as ``.tolist()``, count as host time)."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds: dict[str, float] = defaultdict(float)
        self.host_seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.host_seconds[name] += time.perf_counter() - start
            self.sync()
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1


def profile(llm: LLM, mode: str, bole_args: dict, data, batch: int, temperature: float = 0.0) -> dict:
    warm_up(llm, mode, bole_args, data, batch, tokens=16, temperature=temperature)
    free = run(llm, mode, bole_args, data, batch, sequential=False, temperature=temperature)
    clock = PhaseClock(llm.model.device)
    original, executor_module.phase = executor_module.phase, clock
    try:
        timed = run(llm, mode, bole_args, data, batch, sequential=False, temperature=temperature)
    finally:
        executor_module.phase = original
    if timed["_outputs"] != free["_outputs"]:
        raise RuntimeError(f"{mode} batch {batch}: the synchronised run's tokens differ from the free run's")
    # One target verify per speculative (or decode) step; a greedy batch's replays with its acceptance
    # and commit (verify_accept_commit).
    steps = clock.calls.get("verify", 0) + clock.calls.get("verify_accept_commit", 0)
    return {
        "mode": mode,
        "batch": batch,
        "steps": steps,
        "mean_accepted_tokens": free["mean_accepted_tokens"],
        "seconds_free": free["seconds"],
        "output_tokens_per_s_free": free["output_tokens_per_s"],
        "seconds_synchronised": timed["seconds"],
        "ms_per_step": {name: 1e3 * sec / steps for name, sec in clock.seconds.items()},
        "calls": dict(clock.calls),
        "outside_phases_s": timed["seconds"] - sum(clock.seconds.values()),
        "host_ms_per_step": {name: 1e3 * sec / steps for name, sec in clock.host_seconds.items()},
        "_outputs": free["_outputs"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = profiling_parser(__doc__, modes="tree-serial,bole", batch_sizes="8,32")
    args = parser.parse_args(argv)
    llm, data = open_profiling_run(parser, args)
    bole_args = PROFILED_SPECULATION
    runs = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        rows = [
            profile(llm, mode, bole_args, data, batch, args.temperature) for mode in args.modes.split(",")
        ]
        ar = next((r["_outputs"] for r in rows if r["mode"] == "ar" and args.temperature <= 0), None)
        # Greedy speculation must decode what plain decoding does (None: ar not profiled, or sampled).
        for r in rows:
            r["identical_to_ar"] = None if ar is None else r.pop("_outputs") == ar
            r.pop("_outputs", None)
            phases = " ".join(f"{k} {v:.1f}" for k, v in r["ms_per_step"].items())
            print(
                f"{r['mode']:<12} b{batch:>3}: {r['output_tokens_per_s_free']:7.1f} tok/s free, "
                f"{r['steps']} steps, identical to ar: {r['identical_to_ar']} | ms/step: {phases}"
            )
        runs += rows
    device = device_name(torch.device(args.device))
    result = {
        "what": "wall time per executor phase and step, device synchronised around each phase",
        "command": " ".join(["python benchmarks/profile_step.py", *(sys.argv[1:] if argv is None else argv)]),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "temperature": args.temperature,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = tagged_stem("profile_step", device, "sampled" if args.temperature > 0 else None)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    if any(r["identical_to_ar"] is False for r in runs):
        print(
            "a speculative mode decoded other tokens than plain decoding: its figures are not valid",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
