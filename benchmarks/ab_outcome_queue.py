"""A/B in one process: where a speculative step waits for its outcome.

    python benchmarks/ab_outcome_queue.py        # H200: ~30 s; OUT=DIR for the JSON

``new`` is the executor as it is: the outcome's device-to-host copy is queued, the MTP follow-up is
queued behind it, then the host waits (for the copy alone) and books the step while the GPU runs the
follow-up. ``old`` waits for the outcome before queueing the follow-up (the order before 2026-11-30),
reproduced by waiting inside :meth:`StepOutcome.queue`. The embedded model, float32, bole with its
default settings, the held-out code prompts, 96 tokens a request, at batch 8, 16 and 32 (``BATCHES``),
``TRIALS`` interleaved pairs (order alternating); every run's tokens must equal the first run's.
Writes ``$OUT/ab_outcome_queue.json`` (tokens/s of every run and the medians). ``DEV=cpu`` smoke-runs it.
"""

import json
import os
import statistics
import time
from pathlib import Path

import torch

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.llm import LLM
from trtllm_bole.spec import executor as ex

PROMPTS = Path("benchmarks/data/heldout_code_prompts.jsonl")
prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
queue = ex.StepOutcome.queue


class Done:
    def __init__(self, outcome):
        self.outcome = outcome

    def wait(self):
        return self.outcome


def old_queue(*args):  # the previous order: wait for the outcome before queueing the follow-up
    return Done(queue(*args).wait())


out = {}
DEV = os.environ.get("DEV", "cuda")
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
for batch in [int(b) for b in os.environ.get("BATCHES", "8,16,32").split(",")]:
    llm = LLM(speculative_config=BoleConfig(), device=DEV, dtype="float32", max_batch_size=batch)
    llm.warm_up(use_tqdm=False)
    ps = (prompts * 8)[:batch]
    params = SamplingParams(max_tokens=96)
    res = {"old": [], "new": []}
    ref = None
    for trial in range(int(os.environ.get("TRIALS", "6"))):
        for name in ("old", "new") if trial % 2 == 0 else ("new", "old"):
            ex.StepOutcome.queue = staticmethod(old_queue) if name == "old" else staticmethod(queue)
            sync()
            t0 = time.perf_counter()
            outs = llm.generate(ps, params, use_tqdm=False)
            sync()
            dt = time.perf_counter() - t0
            toks = [o.outputs[0].token_ids for o in outs]
            ref = ref or toks
            assert toks == ref, "outputs differ"
            res[name].append(sum(map(len, toks)) / dt)
    ex.StepOutcome.queue = staticmethod(queue)
    out[batch] = {k: {"median": statistics.median(v), "runs": v} for k, v in res.items()}
    ratio = out[batch]["new"]["median"] / out[batch]["old"]["median"]
    print(batch, {k: round(v["median"]) for k, v in out[batch].items()}, round(ratio, 3), flush=True)
device = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"
result = {"device": device, "torch": torch.__version__, "ab": out}
(Path(os.environ.get("OUT", "/tmp")) / "ab_outcome_queue.json").write_text(json.dumps(result, indent=1))
