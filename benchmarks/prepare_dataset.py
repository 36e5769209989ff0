"""Benchmark datasets in trtllm-bench's format: JSON lines with ``task_id``, ``prompt`` or
``input_ids``, and ``output_tokens``.

    python benchmarks/prepare_dataset.py --out data.jsonl token-norm-dist --num-requests 256 \\
        --input-mean 128 --input-stdev 32 --output-mean 64 --output-stdev 16 --vocab-size 8192
    python benchmarks/prepare_dataset.py --out data.jsonl token-unif-dist --num-requests 256 \\
        --input-min 32 --input-max 256 --output-min 16 --output-max 128 --vocab-size 8192
    python benchmarks/prepare_dataset.py --out data.jsonl code --num-requests 64 --output-tokens 128

``code`` uses the held-out code prompts (``benchmarks/data/heldout_code_prompts.jsonl``, never seen
in training): real text, so speculation sees real acceptance. Synthetic modes draw token ids
uniformly; seeded.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

HELDOUT = Path(__file__).resolve().parent / "data" / "heldout_code_prompts.jsonl"


def _positive(text: str) -> int:
    """An argparse type: an integer of 1 or more (a request of no tokens, or no requests, is no benchmark)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not an integer of 1 or more")
    return value


def _finite(text: str) -> float:
    """An argparse type: a finite number (nan and inf drew no length)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def _mean(text: str) -> float:
    """An argparse type: a finite mean length of 1 or more (below it every length drawn was clamped to 1)."""
    value = _finite(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is below 1: a mean length is 1 or more")
    return value


def _spread(text: str) -> float:
    """An argparse type: a finite standard deviation of 0 or more."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: a standard deviation is 0 or more")
    return value


def _clamped_normal(rng: random.Random, mean: float, stdev: float) -> int:
    return max(1, round(rng.gauss(mean, stdev)))


def _synthetic(args: argparse.Namespace, rng: random.Random, input_len, output_len) -> list[dict]:
    rows = []
    for i in range(args.num_requests):
        ids = [rng.randrange(args.vocab_size) for _ in range(input_len())]
        rows.append({"task_id": i, "input_ids": ids, "output_tokens": output_len()})
    return rows


def token_norm_dist(args: argparse.Namespace, rng: random.Random) -> list[dict]:
    return _synthetic(
        args, rng,
        lambda: _clamped_normal(rng, args.input_mean, args.input_stdev),
        lambda: _clamped_normal(rng, args.output_mean, args.output_stdev),
    )  # fmt: skip


def token_unif_dist(args: argparse.Namespace, rng: random.Random) -> list[dict]:
    return _synthetic(
        args, rng,
        lambda: rng.randint(args.input_min, args.input_max),
        lambda: rng.randint(args.output_min, args.output_max),
    )  # fmt: skip


def code(args: argparse.Namespace, rng: random.Random) -> list[dict]:
    prompts = [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines()]
    return [
        {"task_id": i, "prompt": prompts[i % len(prompts)], "output_tokens": args.output_tokens}
        for i in range(args.num_requests)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=None, help="the synthetic modes' draws (default 0)")
    modes = parser.add_subparsers(dest="mode", required=True)
    norm = modes.add_parser("token-norm-dist")
    unif = modes.add_parser("token-unif-dist")
    real = modes.add_parser("code")
    for sub in (norm, unif, real):
        sub.add_argument("--num-requests", type=_positive, required=True)
    for sub in (norm, unif):
        sub.add_argument("--vocab-size", type=_positive, required=True)
    norm.add_argument("--input-mean", type=_mean, required=True)
    norm.add_argument("--input-stdev", type=_spread, default=0.0)
    norm.add_argument("--output-mean", type=_mean, required=True)
    norm.add_argument("--output-stdev", type=_spread, default=0.0)
    unif.add_argument("--input-min", type=_positive, required=True)
    unif.add_argument("--input-max", type=_positive, required=True)
    unif.add_argument("--output-min", type=_positive, required=True)
    unif.add_argument("--output-max", type=_positive, required=True)
    real.add_argument("--output-tokens", type=_positive, default=128)
    args = parser.parse_args(argv)
    if args.mode == "token-unif-dist" and (
        args.input_min > args.input_max or args.output_min > args.output_max
    ):
        parser.error("token-unif-dist: --input-min and --output-min must not exceed their --*-max")
    if args.mode == "code" and args.seed is not None:
        parser.error("code takes the held-out prompts in order: --seed has no use there")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a directory: name the dataset file to write")
    make = {"token-norm-dist": token_norm_dist, "token-unif-dist": token_unif_dist, "code": code}[args.mode]
    rows = make(args, random.Random(args.seed or 0))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
