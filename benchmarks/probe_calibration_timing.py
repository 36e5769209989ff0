"""Whether the budget's step timings see the host: the embedded model's steps timed as the calibration
times them and with the host's enqueueing hidden from the events.

    python benchmarks/probe_calibration_timing.py --out DIR    # a GPU, under a minute

:class:`~trtllm_bole.spec.calibration.StepTimer` recorded a CUDA event, launched the step (its graph's
replay and its commit's kernels, from Python) and recorded another, each time onto an idle GPU: the
events then also bracketed the host's time to enqueue the step. Held busy (``torch.cuda._sleep`` before
the start event, longer than the host takes to enqueue), the GPU meets the start event with the whole
step already queued, so the events bracket its work alone: what the timer does since this probe's first
run (``idle GPU`` below reproduces the timer before it: a wait of 0 cycles, over before the step is
queued). At batch 16 and 256 positions (the bucket that two H100 builds of 2026-12-05 calibrated at 384
and at 16 tree tokens), bfloat16 as an engine builds: the decoding step and verify steps of 16-768 tree
tokens, each timed ``ROUNDS`` times both ways, interleaved (each time the median of the timer's five
repeats); per step and way the median, min and max, and the budget each way's medians give at ε = 0.2.
Writes ``<out>/probe_calibration_timing_<device>.json``.
"""

from __future__ import annotations

import statistics
import sys

import _bench_util as U
import torch

from trtllm_bole.config import on_device
from trtllm_bole.llm import DEFAULT_MODEL
from trtllm_bole.models.loader import load_model
from trtllm_bole.spec import calibration
from trtllm_bole.spec.budget import DEFAULT_EPSILON, budget_from_timings
from trtllm_bole.spec.calibration import HOST_HIDING_CYCLES, StepTimer

BATCH, KV_LEN = 16, 256
CAPACITIES = (16, 32, 64, 128, 256, 512, 768)
ROUNDS = 5


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_calibration_timing.py", argv)
    if start is None:
        return 2
    args = start[0]
    model = load_model(DEFAULT_MODEL, dtype=torch.bfloat16, device="cuda", progress=False)
    steps = {"decode": lambda t: t.decode(BATCH, KV_LEN)}
    steps |= {f"verify {n}": (lambda t, n=n: t.verify(BATCH, KV_LEN, n)) for n in CAPACITIES}
    times = {way: {name: [] for name in steps} for way in ("idle GPU", "host hidden")}
    with on_device(model.device):
        timer = StepTimer(model, max_batch=BATCH, max_kv_len=KV_LEN, max_tokens=max(CAPACITIES))
        for _ in range(ROUNDS):
            for name, step in steps.items():
                for way in times:  # a wait of 0 cycles ends before the host enqueues: the timer before
                    calibration.HOST_HIDING_CYCLES = 0 if way == "idle GPU" else HOST_HIDING_CYCLES
                    times[way][name].append(step(timer) * 1e3)
    calibration.HOST_HIDING_CYCLES = HOST_HIDING_CYCLES
    summary = {}
    for way, by_step in times.items():
        medians = {name: statistics.median(ms) for name, ms in by_step.items()}
        budget = budget_from_timings(
            CAPACITIES, [medians[f"verify {n}"] for n in CAPACITIES], medians["decode"], DEFAULT_EPSILON
        )
        summary[way] = {"budget": budget, "median_ms": medians,
                        "spread_ms": {n: [min(ms), max(ms)] for n, ms in by_step.items()}}  # fmt: skip
        print(f"{way}: budget {budget}; " + ", ".join(f"{n} {m:.3f} ms" for n, m in medians.items()))
    meta = U.run_meta(
        batch=BATCH, kv_len=KV_LEN, rounds=ROUNDS, sleep_cycles=HOST_HIDING_CYCLES, dtype="bfloat16"
    )
    data = {"meta": meta, "summary": summary, "times_ms": times}
    print(f"wrote {U.write_result(args.out, U.result_name('probe_calibration_timing'), data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
