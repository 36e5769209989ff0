"""What one prefill forward costs the host: a step that only admits and prefills ``k`` held-out code
prompts (the embedded model, float32, bole), timed on the host and with the device synchronised (medians
of 15, after 5 unmeasured), then the torch profiler's ranking of three such steps (k = 1) by CPU time
and cProfile's of twenty by cumulative time (which Python functions the host's time goes through).

    python benchmarks/probe_prefill_host.py > results/probe_prefill_host_h200.txt   # H200: ~40 s
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trtllm_bole import LLM, BoleConfig, SamplingParams

PROMPTS = Path(__file__).resolve().parent / "data" / "heldout_code_prompts.jsonl"


def main() -> None:
    llm = LLM(speculative_config=BoleConfig(), device="cuda", dtype="float32", max_batch_size=8)
    llm.warm_up(use_tqdm=False)
    executor = llm.executor
    ids = [llm.encode(json.loads(line)["prompt"]) for line in PROMPTS.read_text().splitlines()]
    params = SamplingParams(max_tokens=8)

    def prefill_step(k: int) -> tuple[float, float]:
        requests = [executor.submit(ids[i % len(ids)], params) for i in range(k)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        executor.step()  # nothing runs yet: the step only admits and prefills
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        total = time.perf_counter() - start
        for r in requests:
            executor.abort(r)
        return host, total

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for k in (1, 8):
        for _ in range(5):
            prefill_step(k)
        runs = [prefill_step(k) for _ in range(15)]
        host, total = (statistics.median(r[i] for r in runs) * 1e3 for i in (0, 1))
        tokens = sum(len(ids[i % len(ids)]) for i in range(k))
        print(
            f"k={k}: {tokens} prompt tokens, host {host:.2f} ms, with the device {total:.2f} ms", flush=True
        )
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            prefill_step(1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    with cProfile.Profile() as python_prof:
        for _ in range(20):
            prefill_step(1)
    pstats.Stats(python_prof).sort_stats("cumulative").print_stats(70)


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main()
