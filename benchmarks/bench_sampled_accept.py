"""A verify's sampled acceptance at a real vocabulary: ``accept``, which reads the distributions where the
rejection walk reads them (``ProcessedLogits``: one probability a node from each row's floor, argmax and
softmax normaliser, and the leaves' rows), against every node's distribution processed at once.

    python benchmarks/bench_sampled_accept.py --out DIR     # H200, about a minute

Forests of top-4 trees of 64 nodes and depth 8, float32 logits ``[N, V]`` (the drafted tokens made
likely at their parents, so that walks go deep), temperature 0.8 alone (``filtered=False``: no floors)
or with top-p 0.9 (a floor a row, ``ops.filter_floor``), at the embedded model's vocabulary (8,192) and
Qwen3's (151,936). At every point both sides must accept the same leaves and bonus tokens on the same
coins, else nothing is timed. Times: CUDA-graph replays (``_bench_util.graph_timer``), and
``ops.softmax_stats`` alone on the rows (its read rate: the logits' bytes over its time); memory: the
peak allocated by one call above what was live before it (``_bench_util.peak_bytes``). Writes
``<out>/sampled_accept_<device>.json``. ``--device cpu`` smoke-runs the checks alone.

Drafting ranks each level's rows the same way (``ranking``): a level of 4 rows a request, their 4
likeliest tokens and log-probabilities by ``DraftSettings.top_log_probs`` (the top 4 logits and each
row's normaliser) against every row processed, its log and the top 4 of that, same tokens and values
checked first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole import ops
from trtllm_bole.spec.acceptance import Sampling, accept, sample_accept
from trtllm_bole.spec.drafter import DraftSettings
from trtllm_bole.spec.sampling import filter_floors, process_logits
from trtllm_bole.testing import forest, topk_parents

SETTINGS = {"temperature": 1.0, "top-p": 0.9}  # the top-p of each; temperature 0.8 in both


def inputs(batch: int, vocab: int, top_p: float, device: str, gen: torch.Generator, top_k: int = 0) -> tuple:
    """A forest, its tokens and logits, a :class:`Sampling` (temperature 0.8, ``top_k``, ``top_p``) and
    whether it filters."""
    tree = forest([topk_parents(64, 4, 8)] * batch, device=device)
    tokens = torch.randint(vocab, (tree.num_nodes,), generator=gen, device=device)
    logits = torch.randn(tree.num_nodes, vocab, generator=gen, device=device) * 2
    drafts = tree.global_parents >= 0
    logits[tree.global_parents[drafts], tokens[drafts]] += 6
    temperature, top_p = torch.full((batch,), 0.8, device=device), torch.full((batch,), top_p, device=device)
    top_k, coins = (
        torch.full((batch,), top_k, dtype=torch.long, device=device),
        torch.rand(batch, 66, generator=gen, device=device, dtype=torch.float64),  # as draw_coins draws
    )
    sampling = Sampling(temperature, top_k, top_p, coins)
    return tree, tokens, logits, sampling, bool(top_p[0] < 1 or top_k[0] > 0)


def whole(tree, tokens, logits, sampling, filtered):
    settings = (t[tree.request] for t in sampling[:3])
    return sample_accept(tree, tokens, process_logits(logits, *settings, filtered=filtered), sampling.coins)


def accepted(tree, tokens, logits, sampling, filtered):
    return accept(tree, tokens, logits, sampling, filtered=filtered)


def point(batch: int, vocab: int, setting: str, device: str, gen: torch.Generator, measure) -> dict:
    x = inputs(batch, vocab, SETTINGS[setting], device, gen)
    row = {"batch": batch, "nodes": x[0].num_nodes, "vocab": vocab, "setting": setting}
    a, b = whole(*x), accepted(*x)
    row["same_outcome"] = all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    row["mean_leaf_depth"] = float(x[0].depth[a[0] + x[0].cu_seqlens[:-1]].float().mean())
    if not row["same_outcome"] or measure is None:
        print(f"B={batch} V={vocab} {setting}: same outcome {row['same_outcome']}", flush=True)
        return row
    for name, fn in (("whole", whole), ("accept", accepted)):
        row[f"{name}_us"] = measure(lambda fn=fn: fn(*x))
        row[f"{name}_peak_bytes"] = U.peak_bytes(lambda fn=fn: fn(*x))
    tree, _, logits, sampling, _ = x
    settings = [t[tree.request] for t in sampling[:3]]
    floor = filter_floors(logits, *settings)
    row["stats_us"] = measure(lambda: ops.softmax_stats(logits, settings[0], floor))
    row["stats_read_tb_s"] = logits.numel() * logits.element_size() / row["stats_us"] / 1e6
    sides = ", ".join(
        f"{n} {row[f'{n}_us']:.0f} us {row[f'{n}_peak_bytes'] / 2**20:.0f} MiB" for n in ("whole", "accept")
    )
    stats = f"softmax_stats {row['stats_us']:.0f} us ({row['stats_read_tb_s']:.2f} TB/s read)"
    print(f"B={batch} V={vocab} {setting}: {sides}; {stats}", flush=True)
    return row


def ranked_whole(settings: DraftSettings, logits, request, k: int):
    """Drafting's ranking before ``top_log_probs``: every row processed, its log, the top k of that."""
    r = request
    processed = process_logits(logits, settings.temperature[r], settings.top_k[r], settings.top_p[r])
    return processed.log().topk(k, dim=-1)


def ranking(batch: int, vocab: int, setting: str, device: str, gen: torch.Generator, measure) -> dict:
    """A drafting level's ranking (``DraftSettings.top_log_probs``: 4 rows a request, their 4 likeliest
    tokens) against every row processed whole; both must give the same tokens where the log-probabilities
    are finite, and those within float32 rounding."""
    logits = torch.randn(batch * 4, vocab, generator=gen, device=device) * 2
    request = torch.arange(batch, device=device).repeat_interleave(4)
    settings = DraftSettings.of([0.8] * batch, [0] * batch, [SETTINGS[setting]] * batch, device)
    row = {"batch": batch, "rows": batch * 4, "vocab": vocab, "setting": setting}
    (log_q, tokens), (want, want_tokens) = (
        settings.top_log_probs(logits, request, 4),
        ranked_whole(settings, logits, request, 4),
    )
    finite = torch.isfinite(want)
    row["same_outcome"] = bool(
        torch.equal(finite, torch.isfinite(log_q))
        and torch.equal(tokens[finite], want_tokens[finite])
        and torch.allclose(log_q[finite], want[finite], rtol=1e-5, atol=1e-5)
    )
    if row["same_outcome"] and measure is not None:
        row["whole_us"] = measure(lambda: ranked_whole(settings, logits, request, 4))
        row["top_us"] = measure(lambda: settings.top_log_probs(logits, request, 4))
        print(f"ranking B={batch} V={vocab} {setting}: whole {row['whole_us']:.0f} us, top "
              f"{row['top_us']:.0f} us", flush=True)  # fmt: skip
    else:
        print(f"ranking B={batch} V={vocab} {setting}: same outcome {row['same_outcome']}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--vocabs", default="8192,151936")
    ap.add_argument("--device", default="cuda", choices=U.DEVICES)
    ap.add_argument("--rep-ms", type=int, default=50)
    args = ap.parse_args(argv)
    if U.cuda_missing("bench_sampled_accept.py", args.device):
        return 2
    cuda = args.device == "cuda"
    gen = torch.Generator(device=args.device).manual_seed(0)
    measure = U.graph_timer(args.rep_ms) if cuda else None
    rows = [
        point(batch, vocab, setting, args.device, gen, measure)
        for vocab in (int(v) for v in args.vocabs.split(","))
        for batch in (int(b) for b in args.batches.split(","))
        for setting in SETTINGS
    ]
    ranked = [
        ranking(batch, vocab, setting, args.device, gen, measure)
        for vocab in (int(v) for v in args.vocabs.split(","))
        for batch in (int(b) for b in args.batches.split(","))
        for setting in SETTINGS
    ]
    if not all(r["same_outcome"] for r in rows + ranked):
        print("the two sides accepted or ranked differently: nothing reported", file=sys.stderr)
        return 1
    if cuda:
        result = {"meta": U.run_meta(), "rows": rows, "ranking": ranked}
        path = U.write_result(args.out, U.result_name("sampled_accept"), result)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
