"""Train the embedded default: a small Qwen3.5-architecture model and its MTP head, on Python code.

    python build_scripts/train_tiny.py --out trtllm_bole/assets/qwen35-code-tiny --device cuda
    python build_scripts/train_tiny.py --out /tmp/t --device cpu --steps 2 --preset smoke   # CPU check

Architecture: Qwen3.5 (Gated DeltaNet : full attention = 3 : 1, output-gated attention with partial
RoPE, zero-centred RMSNorm, tied embeddings) with the published MTP module. Data: the corpus of
``build_scripts/corpus.py`` (CPython's standard library and BSD-licensed packages, 2% of files held
out). Tokenizer: byte-level BPE trained with ``tokenizers`` on the training split.

Loss: next-token cross-entropy plus the MTP's next-next-token loss (the published recipe), unrolled
for ``--mtp-steps`` steps that feed the MTP its own output, as a deeper draft step does at inference
(step k's row p pairs the previous step's state with token p + k and predicts token p + k + 1).

Everything is seeded; the output is a checkpoint in the published Hugging Face layout (config.json,
bf16 safetensors sharded under 15 MB, mtp.* tensors, tokenizer files) and ``training.json`` (the loss
log, the step it stopped at, versions); the asset's model card (README.md) is written by hand. The
loop stops after ``--time-limit`` seconds (450 by default: the embedded model stopped at step 1,497 of
4,000, its cosine schedule laid out over the 4,000), so a slower machine stops at an earlier step;
``--time-limit inf`` runs every step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from corpus import EOT, corpus_built, read_split, write_corpus  # build_scripts/ is on sys.path as a script
from tqdm import tqdm

from trtllm_bole.cli_help import HelpWithDefaults
from trtllm_bole.models.checkpoint import export_tensors, write_safetensors
from trtllm_bole.models.config import load_config
from trtllm_bole.models.loader import random_model

PRESETS = {
    # ~18M parameters: 8 layers (6 GDN + 2 attention), hidden 384.
    "code-tiny": {
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "vocab_size": 8192,
    },
    # For CPU smoke tests of the script itself.
    "smoke": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "vocab_size": 512,
    },
}
SHARD_BYTES = 15 * 2**20


def model_config(preset: str, eos_token_id: int) -> dict:
    dims = PRESETS[preset]
    layers = dims["num_hidden_layers"]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **dims,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "max_position_embeddings": 4096,
        "eos_token_id": eos_token_id,
        "bos_token_id": eos_token_id,
        "mtp_num_hidden_layers": 1,
        "dtype": "bfloat16",
    }


def train_tokenizer(train_text: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(train_text.split(EOT), trainer=trainer)
    return tokenizer


def encode(tokenizer, text: str) -> torch.Tensor:
    """The token stream of a split: documents separated by the end-of-text token."""
    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch([d for d in text.split(EOT) if d]):
        ids.extend(encoding.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int32)


def sample_batch(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(stream.numel() - seq_len - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()]).long()


def losses(model, ids: torch.Tensor, mtp_steps: int) -> dict[str, torch.Tensor]:
    """Next-token loss, and the MTP's loss at each unrolled step (step 1 = next-next token)."""
    x = ids[:, :-1]
    hidden, logits = model.forward_sequences(x)
    out = {"lm": F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())}
    state, length = hidden, x.shape[1]
    for k in range(1, mtp_steps + 1):
        if length - k < 2:
            break
        state, mtp_logits = model.mtp.forward_sequences(state[:, : length - k], x[:, k:length])
        # Row p pairs the state that predicted token p + k with that token; it predicts p + k + 1.
        out[f"mtp{k}"] = F.cross_entropy(mtp_logits.flatten(0, 1).float(), ids[:, k + 1 :].flatten())
    return out


def _floats(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """Loss parts as numbers for the log (one host sync; only when logging)."""
    return {k: float(v.detach()) for k, v in parts.items()}


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, *, seq_len: int, batch: int, device, mtp_steps: int) -> dict:
    """Mean losses over non-overlapping windows of a held-out stream (at most 64 windows)."""
    windows = min(64, (stream.numel() - 1) // (seq_len + 1))
    totals: dict[str, float] = {}
    for start in range(0, windows, batch):
        rows = [
            stream[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]
            for i in range(start, min(windows, start + batch))
        ]
        with _autocast(device):
            parts = losses(model, torch.stack(rows).long().to(device), mtp_steps)
        for name, value in parts.items():
            totals[name] = totals.get(name, 0.0) + float(value) * len(rows)
    return {name: total / windows for name, total in totals.items()}


def _autocast(device: torch.device):
    return (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )


def _optimizer(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda",
    )  # fmt: skip


def _write_checkpoint(out: Path, model, config, config_json: dict, tokenizer) -> None:
    """The trained model as a Hugging Face checkpoint in bf16 (its MTP head included), with its config
    and tokenizer; earlier weight shards in ``out`` are removed first."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.to(torch.bfloat16) for n, t in export_tensors(model, config, mtp=True).items()}
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    write_safetensors(out, tensors, shard_bytes=SHARD_BYTES)
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "pad_token": EOT,
        "model_max_length": config_json["max_position_embeddings"], "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpWithDefaults)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    parser.add_argument("--corpus", type=Path, default=Path(".data/corpus"), help="built if missing")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="code-tiny", help="the model's shape")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where to train"
    )
    parser.add_argument("--seed", type=int, default=0, help="weights' initialisation and batches' order")
    parser.add_argument("--steps", type=int, default=4000, help="optimiser steps (the LR schedule's length)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    parser.add_argument(
        "--stop-after", type=int, default=None,
        help="stop the loop after this many steps (the LR schedule still spans --steps)",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=200, help="linear warm-up steps")
    parser.add_argument("--mtp-steps", type=int, default=3, help="unrolled MTP steps in the loss")
    parser.add_argument("--mtp-weight", type=float, default=0.5, help="total weight of the MTP losses")
    parser.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    parser.add_argument(
        "--time-limit", type=float, default=450.0, help="stop the training loop early after this many seconds"
    )
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Values no training can use, refused before the corpus loads (a run of --steps 0 wrote an untrained
    checkpoint and exited 0; --eval-every 0 failed after the first step, --lr nan after the tokenizer)."""
    counts = {"--steps": args.steps, "--batch-size": args.batch_size, "--eval-every": args.eval_every}
    counts |= {"--stop-after": args.stop_after} if args.stop_after is not None else {}
    for flag, value in counts.items():
        if value < 1:
            parser.error(f"{flag} takes a positive integer, got {value}")
    if args.warmup < 0 or args.mtp_steps < 0:
        parser.error(f"--warmup and --mtp-steps take integers >= 0, got {args.warmup}, {args.mtp_steps}")
    if args.seq_len < args.mtp_steps + 2:  # every unrolled MTP step needs a token past the last one's
        parser.error(
            f"--seq-len {args.seq_len} is too short for {args.mtp_steps} MTP steps: "
            f"at least {args.mtp_steps + 2}"
        )
    if not (math.isfinite(args.lr) and args.lr > 0) or not (
        math.isfinite(args.mtp_weight) and args.mtp_weight >= 0
    ):
        parser.error(
            f"--lr takes a number above 0 and --mtp-weight one >= 0, got {args.lr}, {args.mtp_weight}"
        )
    if not args.time_limit > 0:  # inf runs every step; NaN would stop nothing and say nothing
        parser.error(f"--time-limit takes seconds above 0 (inf: no limit), got {args.time_limit}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a checkpoint directory")


def check_streams(parser: argparse.ArgumentParser, args: argparse.Namespace, streams: dict) -> None:
    """Each split holds a window of --seq-len + 1 tokens (training samples them, evaluation needs one)."""
    for name, stream in streams.items():
        if stream.numel() < args.seq_len + 2:
            parser.error(f"--seq-len {args.seq_len}: the {name} split has only {stream.numel()} tokens")


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    check_args(parser, args)

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    started = time.time()

    if not corpus_built(args.corpus):
        print(f"building the corpus in {args.corpus} ...")
        write_corpus(args.corpus)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    train_text, heldout_text = read_split(args.corpus, "train"), read_split(args.corpus, "heldout")
    vocab_size = PRESETS[args.preset]["vocab_size"]
    tokenizer = train_tokenizer(train_text, vocab_size)
    train_stream, heldout_stream = encode(tokenizer, train_text), encode(tokenizer, heldout_text)
    check_streams(parser, args, {"training": train_stream, "held-out": heldout_stream})
    print(f"tokens: train {train_stream.numel() / 1e6:.1f} M, held-out {heldout_stream.numel() / 1e6:.2f} M")

    config_json = model_config(args.preset, tokenizer.token_to_id(EOT))
    config = load_config(config_json)
    model = random_model(config, seed=args.seed, dtype=torch.float32, device=device, mtp=True)
    model.requires_grad_(True)
    params = sum(p.numel() for p in model.parameters())
    optimizer = _optimizer(model, args.lr, device)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    log, steps_done, loop_start = [], 0, time.time()
    bar = tqdm(range(args.steps), desc=f"training {params / 1e6:.1f}M params", unit="step")
    for step in bar:
        if time.time() - loop_start > args.time_limit or step == args.stop_after:
            print(f"stopping at step {step} of {args.steps} (time limit or --stop-after)")
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        ids = sample_batch(train_stream, args.batch_size, args.seq_len, gen).to(device)
        with _autocast(device):
            parts = losses(model, ids, args.mtp_steps)
        mtp_parts = [v for k, v in parts.items() if k.startswith("mtp")]
        loss = parts["lm"] + args.mtp_weight * sum(mtp_parts) / max(1, len(mtp_parts))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps_done = step + 1
        if step % 10 == 0:
            bar.set_postfix({k: f"{v:.3f}" for k, v in _floats(parts).items() if k in ("lm", "mtp1")})
        if steps_done % args.eval_every == 0 or steps_done == args.steps:
            model.eval()
            held = evaluate(model, heldout_stream, seq_len=args.seq_len, batch=args.batch_size,
                            device=device, mtp_steps=args.mtp_steps)  # fmt: skip
            model.train()
            train = _floats(parts)
            log.append({"step": steps_done, "train": train, "heldout": held})
            bar.write(f"step {steps_done}: train lm {train['lm']:.3f} | held-out {held}")
    train_seconds = time.time() - loop_start
    if steps_done == 0:  # as --steps 0 is refused: an untrained checkpoint is no result
        raise SystemExit(f"no step ran within --time-limit {args.time_limit} s: nothing written")
    model.eval()
    final = evaluate(model, heldout_stream, seq_len=args.seq_len, batch=args.batch_size,
                     device=device, mtp_steps=args.mtp_steps)  # fmt: skip
    if not all(math.isfinite(v) for v in final.values()):  # every load would refuse its weights
        raise SystemExit(f"training diverged (held-out losses {final}): nothing written; try a lower --lr")

    _write_checkpoint(args.out, model, config, config_json, tokenizer)
    record = {
        "command": "python build_scripts/train_tiny.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "parameters": params,
        "steps": steps_done,
        "tokens_seen": steps_done * args.batch_size * args.seq_len,
        "train_tokens": train_stream.numel(),
        "heldout_tokens": heldout_stream.numel(),
        "train_seconds": train_seconds,
        "total_seconds": time.time() - started,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "final_heldout": final,
        "heldout_perplexity": math.exp(final["lm"]),
        "corpus": {k: manifest[k] for k in ("python", "packages", "stdlib_license", "heldout_percent")},
        "corpus_sha256": {s: manifest["splits"][s]["sha256"] for s in ("train", "heldout")},
        "log": log,
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: record[k]
                for k in ("parameters", "steps", "train_seconds", "final_heldout", "heldout_perplexity")
            }
        )
    )


if __name__ == "__main__":
    main()
