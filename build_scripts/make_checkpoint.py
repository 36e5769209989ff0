"""Write a tiny random Qwen3.5 checkpoint in the published Hugging Face layout.

    python build_scripts/make_checkpoint.py --out /tmp/qwen35-tiny [--seed 0] [--preset tiny]
        [--dtype float32|bfloat16] [--no-mtp] [--shard-size MB] [--wrapper]

Writes ``config.json`` (``qwen3_5_text``, or with ``--wrapper`` the ``qwen3_5`` vision-language
layout: ``text_config`` and weights under ``model.language_model.``), seeded random weights (with the
``mtp.*`` module unless ``--no-mtp``; sharded with an index when ``--shard-size`` is given), and a
small byte-level BPE tokenizer trained on Python standard-library sources (``tokenizer.json`` +
``tokenizer_config.json``, loadable by ``transformers.AutoTokenizer``). Needs the ``tokenizers``
package (the ``hf`` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
from pathlib import Path

import torch

from trtllm_bole.models.checkpoint import random_tensors, write_safetensors
from trtllm_bole.models.config import load_config
from trtllm_bole.models.presets import TINY_PRESETS

# Fixed, version-stable inputs for the tokenizer: a few standard-library modules.
_CORPUS = ("argparse.py", "dataclasses.py", "functools.py", "json/__init__.py", "pathlib.py", "textwrap.py")
_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def train_tokenizer(vocab_size: int):  # -> tokenizers.Tokenizer (optional dependency, imported here)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in _CORPUS]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def text_config(preset: str, vocab_size: int, eos_token_id: int, *, mtp: bool, dtype: str) -> dict:
    config = dict(TINY_PRESETS[preset], vocab_size=vocab_size, eos_token_id=eos_token_id)
    interval = config["full_attention_interval"]
    config["layer_types"] = [
        "linear_attention" if (i + 1) % interval else "full_attention"
        for i in range(config["num_hidden_layers"])
    ]
    config["mtp_num_hidden_layers"] = 1 if mtp else 0
    config["dtype"] = dtype
    return config


def wrapper_config(text: dict) -> dict:
    """The ``qwen3_5`` layout: text settings nested, plus a (tiny, unused here) vision tower config."""
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
              "out_hidden_size": text["hidden_size"], "model_type": "qwen3_5_vision"}  # fmt: skip
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": text["tie_word_embeddings"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory (created)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", choices=sorted(TINY_PRESETS), default="tiny")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    parser.add_argument("--no-mtp", action="store_true", help="leave out the mtp.* module")
    parser.add_argument("--shard-size", type=float, default=None, help="shard size in MB (default: one file)")
    parser.add_argument("--wrapper", action="store_true", help="write the qwen3_5 vision-language layout")
    parser.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size to train")
    args = parser.parse_args(argv)
    # Refused before anything is written (a NaN shard size left a folder holding only config.json).
    if args.shard_size is not None and not (math.isfinite(args.shard_size) and args.shard_size > 0):
        parser.error(f"--shard-size takes megabytes above 0, got {args.shard_size}")
    least = 256 + len(_SPECIAL)  # the bytes and the special tokens: below, 259 all the same (or a traceback)
    if args.vocab_size < least:
        parser.error(f"--vocab-size must be at least {least} (256 bytes + {len(_SPECIAL)} special tokens), "
                     f"got {args.vocab_size}")  # fmt: skip
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a checkpoint directory")

    tokenizer = train_tokenizer(args.vocab_size)
    eos = tokenizer.token_to_id(_SPECIAL[0])
    text = text_config(args.preset, tokenizer.get_vocab_size(), eos, mtp=not args.no_mtp, dtype=args.dtype)
    config_json = wrapper_config(text) if args.wrapper else {"architectures": ["Qwen3_5ForCausalLM"], **text}
    config = load_config(config_json)  # validates, and gives the weight prefix of the layout
    tensors = random_tensors(config, seed=args.seed, mtp=not args.no_mtp)
    tensors = {name: t.to(_DTYPES[args.dtype]) for name, t in tensors.items()}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    shard_bytes = None if args.shard_size is None else int(args.shard_size * 2**20)
    files = write_safetensors(args.out, tensors, shard_bytes=shard_bytes)
    tokenizer.save(str(args.out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": _SPECIAL[0],
        "pad_token": _SPECIAL[0],
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    size = sum(f.stat().st_size for f in files)
    print(
        f"wrote {args.out}: {args.preset}, {len(tensors)} tensors in {len(files)} file(s), "
        f"{size / 2**20:.2f} MB, vocab {config.vocab_size}, mtp {'no' if args.no_mtp else 'yes'}, "
        f"{'qwen3_5 wrapper' if args.wrapper else 'qwen3_5_text'} layout"
    )


if __name__ == "__main__":
    main()
