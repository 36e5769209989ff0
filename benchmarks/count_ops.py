"""How many operators a greedy draft and a prefill forward dispatch, by the source line that called them:
the kernels a step launches, counted on any device (the ``bole::*`` operators count once, as their one
CUDA launch; views launch nothing and are left out), to see where fusing would cut launches before
timing it on a GPU.

    python benchmarks/count_ops.py > results/count_ops_cpu.txt   # the embedded model, CPU, ~20 s
"""

from __future__ import annotations

import argparse
import collections
import json
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trtllm_bole import LLM, BoleConfig
from trtllm_bole.models.cache import StepContext
from trtllm_bole.spec.drafter import DraftSettings, draft

PACKAGE = "trtllm_bole/"
VIEWS = {
    "aten.alias", "aten.as_strided", "aten.detach", "aten.expand", "aten.permute", "aten.reshape",
    "aten.select", "aten.slice", "aten.split", "aten.split_with_sizes", "aten.squeeze", "aten.t",
    "aten.transpose", "aten.unflatten", "aten.unsqueeze", "aten.view", "aten._unsafe_view",
}  # fmt: skip
PROMPTS = Path(__file__).resolve().parent / "data" / "heldout_code_prompts.jsonl"


class OpCounter(TorchDispatchMode):
    """Counts every non-view operator by name and by the innermost ``trtllm_bole`` line that called it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter[str] = collections.Counter()
        self.by_line: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in VIEWS:
            ours = [f for f in traceback.extract_stack() if PACKAGE in f.filename]
            at = ours[-1] if ours else None
            line = f"{at.filename.split(PACKAGE)[-1]}:{at.lineno} {at.name}" if at else "outside the package"
            self.by_op[name] += 1
            self.by_line[line] += 1
        return func(*args, **(kwargs or {}))

    def report(self, title: str, top: int, *, levels: int | None = None) -> dict:
        """Prints the total (per level where the counted call ran ``levels`` of them) and the top lines."""
        total = sum(self.by_op.values())
        print(f"== {title}: {total} operators" + (f" ({total / levels:.1f} a level)" if levels else ""))
        for line, n in self.by_line.most_common(top):
            print(f"  {n:5d}  {line}")
        return {"operators": total, "by_op": dict(self.by_op.most_common()), "by_line": dict(self.by_line)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--top", type=int, default=25, help="source lines listed per count")
    p.add_argument("--json", type=Path, default=None, help="also write the counts here")
    args = p.parse_args(argv)
    llm = LLM(speculative_config=BoleConfig(), device=args.device, dtype="float32", max_batch_size=args.batch)
    executor, b = llm.executor, args.batch
    model, bole, device = executor.model, executor.bole, executor.model.device
    layers, top_k, depth = model.config.num_hidden_layers, bole.branching, bole.max_depth
    print(f"the embedded model ({layers} layers) on {device}, batch {b}, top-{top_k} drafts {depth} deep")
    results = {}

    slots = torch.arange(b, device=device)
    tables = torch.full((b, 1), -1, dtype=torch.int32, device=device)
    zeros = torch.zeros(b, dtype=torch.long, device=device)
    pending = torch.zeros(b, dtype=torch.long, device=device)
    hidden = torch.zeros(b, model.config.hidden_size, device=device)
    settings = DraftSettings.of([0.0] * b, [0] * b, [1.0] * b, device)
    with OpCounter() as counted:
        draft(model.mtp, pending, hidden, slots, tables, zeros, settings, top_k=top_k, depth=depth)
    results["draft"] = counted.report(f"greedy draft, batch {b}", args.top, levels=depth)

    prompt = llm.encode(json.loads(PROMPTS.read_text().splitlines()[0])["prompt"])
    tables = torch.arange(len(prompt) // model.cache.block_size + 1, dtype=torch.int32, device=device)[None]
    ctx = StepContext.chains([len(prompt)], slots[:1], tables, zeros[:1])
    with OpCounter() as counted:
        model.prefill(torch.tensor(prompt, device=device), ctx, check=False)
    results["prefill"] = counted.report(f"target prefill of one {len(prompt)}-token prompt", args.top)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
