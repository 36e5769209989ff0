"""The published Qwen3.5 checkpoint layout: tensor names, shapes, and where each lands in our model.

One table (:func:`checkpoint_layout`) serves the loader (name map + shape check), the tiny-checkpoint
writer (``build_scripts/make_checkpoint.py``) and the tests. Names follow transformers'
``Qwen3_5ForCausalLM`` (``model.layers.N...``, ``lm_head.weight``) or, for the vision-language
wrapper, ``model.language_model.layers.N...``; the MTP module is ``mtp.*`` as in the released
checkpoints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtllm_bole.models.config import LINEAR_ATTENTION, Qwen35Config

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True, slots=True)
class TensorSlot:
    param: str  # our parameter (a ``Qwen35Model.get_parameter`` name)
    shape: tuple[int, ...]  # shape in the checkpoint
    rows: tuple[int, int] | None = None  # rows of a fused parameter that this tensor fills


def checkpoint_layout(config: Qwen35Config, *, mtp: bool) -> dict[str, TensorSlot]:
    """Checkpoint tensor name -> :class:`TensorSlot`, for every tensor a complete checkpoint holds."""
    c = config
    h, p = c.hidden_size, c.weight_prefix
    layout: dict[str, TensorSlot] = {f"{p}embed_tokens.weight": TensorSlot("embed_tokens", (c.vocab_size, h))}
    for i, kind in enumerate(c.layer_types):
        layout.update(_decoder_layer(c, kind, f"{p}layers.{i}.", f"layers.{i}."))
    layout[f"{p}norm.weight"] = TensorSlot("norm", (h,))
    if not c.tie_word_embeddings:
        layout["lm_head.weight"] = TensorSlot("lm_head", (c.vocab_size, h))
    if mtp:
        layout["mtp.fc.weight"] = TensorSlot("mtp.fc", (h, 2 * h))
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            layout[f"mtp.{name}.weight"] = TensorSlot(f"mtp.{name}", (h,))
        layout.update(_decoder_layer(c, "full_attention", "mtp.layers.0.", "mtp.layer."))
    return layout


def _decoder_layer(c: Qwen35Config, kind: str, src: str, dst: str) -> dict[str, TensorSlot]:
    h, inter = c.hidden_size, c.intermediate_size
    out = {
        f"{src}input_layernorm.weight": TensorSlot(f"{dst}input_norm", (h,)),
        f"{src}post_attention_layernorm.weight": TensorSlot(f"{dst}post_attention_norm", (h,)),
        f"{src}mlp.down_proj.weight": TensorSlot(f"{dst}mlp.down_proj", (h, inter)),
    }
    out.update(_fused(f"{src}mlp.", f"{dst}mlp.gate_up_proj", h, {"gate_proj": inter, "up_proj": inter}))
    if kind == LINEAR_ATTENTION:
        src, dst = f"{src}linear_attn.", f"{dst}mixer."
        hv = c.linear_num_value_heads
        widths = {"in_proj_qkv": c.conv_dim, "in_proj_z": c.value_dim, "in_proj_b": hv, "in_proj_a": hv}
        out.update(_fused(src, f"{dst}in_proj", h, widths))
        out[f"{src}conv1d.weight"] = TensorSlot(
            f"{dst}conv_weight", (c.conv_dim, 1, c.linear_conv_kernel_dim)
        )
        out[f"{src}A_log"] = TensorSlot(f"{dst}A_log", (hv,))
        out[f"{src}dt_bias"] = TensorSlot(f"{dst}dt_bias", (hv,))
        out[f"{src}norm.weight"] = TensorSlot(f"{dst}norm", (c.linear_value_head_dim,))
        out[f"{src}out_proj.weight"] = TensorSlot(f"{dst}out_proj", (h, c.value_dim))
    else:
        src, dst = f"{src}self_attn.", f"{dst}mixer."
        kv = c.num_key_value_heads * c.head_dim
        widths = {"q_proj": 2 * c.num_attention_heads * c.head_dim, "k_proj": kv, "v_proj": kv}
        out.update(_fused(src, f"{dst}qkv_proj", h, widths))
        out[f"{src}q_norm.weight"] = TensorSlot(f"{dst}q_norm", (c.head_dim,))
        out[f"{src}k_norm.weight"] = TensorSlot(f"{dst}k_norm", (c.head_dim,))
        out[f"{src}o_proj.weight"] = TensorSlot(f"{dst}o_proj", (h, c.num_attention_heads * c.head_dim))
    return out


def _fused(src: str, param: str, fan_in: int, widths: dict[str, int]) -> dict[str, TensorSlot]:
    """Projections concatenated along the output rows of one fused weight, in the given order."""
    out, start = {}, 0
    for name, width in widths.items():
        out[f"{src}{name}.weight"] = TensorSlot(param, (width, fan_in), (start, start + width))
        start += width
    return out


# ------------------------------------------------------------------------------------------- #
# Random weights and writing (tiny checkpoints for tests and the embedded default)              #
# ------------------------------------------------------------------------------------------- #


def random_tensors(config: Qwen35Config, *, seed: int, mtp: bool = True) -> dict[str, torch.Tensor]:
    """Seeded float32 weights in the published layout, scaled so that nothing is degenerate.

    Linear weights and embeddings ~ N(0, 1/fan_in) keep activations and logits (tied or not) near
    unit scale, where float32 rounding stays well below the tests' 1e-4; zero-centred norm weights are
    perturbed around 0 (transformers initialises them to exactly 0); GDN decays land in ~[0.8, 0.99]
    so that the recurrent state carries information across many tokens.
    """
    gen = torch.Generator().manual_seed(seed)
    rules: list[tuple[Callable[[str], bool], Callable[[tuple[int, ...]], torch.Tensor]]] = [
        (lambda n: n.endswith("linear_attn.norm.weight"), lambda s: 1.0 + 0.1 * _randn(s, gen)),
        (lambda n: n.endswith("norm.weight"), lambda s: 0.1 * _randn(s, gen)),
        (lambda n: n.endswith("A_log"), lambda s: torch.empty(s).uniform_(0.5, 4.0, generator=gen).log()),
        (lambda n: n.endswith("dt_bias"), lambda s: -3.0 + 0.5 * _randn(s, gen)),
        (lambda n: n.endswith("conv1d.weight"), lambda s: _randn(s, gen) / math.sqrt(s[-1])),
        (lambda n: True, lambda s: _randn(s, gen) / math.sqrt(s[-1])),
    ]
    tensors = {}
    for name, slot in sorted(checkpoint_layout(config, mtp=mtp).items()):
        init = next(make for match, make in rules if match(name))
        tensors[name] = init(slot.shape)
    return tensors


def export_tensors(model: torch.nn.Module, config: Qwen35Config, *, mtp: bool) -> dict[str, torch.Tensor]:
    """The model's weights under their published names and shapes (the loader's name map, inverted)."""
    tensors = {}
    for name, slot in checkpoint_layout(config, mtp=mtp).items():
        param = model.get_parameter(slot.param).detach()
        if slot.rows is not None:
            param = param[slot.rows[0] : slot.rows[1]]
        tensors[name] = param.reshape(slot.shape).cpu()
    return tensors


def _randn(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen)


def write_safetensors(
    out_dir: str | Path, tensors: dict[str, torch.Tensor], *, shard_bytes: int | None = None
) -> list[Path]:
    """``model.safetensors``, or shards ``model-0000i-of-0000n.safetensors`` of at most ``shard_bytes``
    (at least one tensor each) plus ``model.safetensors.index.json``, as ``save_pretrained`` writes. The
    weights a previous write left in ``out_dir`` go first (a single file beside an index is refused at
    load)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in (*out_dir.glob("model-*-of-*.safetensors"), out_dir / SINGLE_FILE, out_dir / INDEX_FILE):
        old.unlink(missing_ok=True)
    tensors = {name: t.contiguous() for name, t in sorted(tensors.items())}
    if shard_bytes is None:
        _save(tensors, out_dir / SINGLE_FILE)
        return [out_dir / SINGLE_FILE]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    files, weight_map = [], {}
    for i, shard in enumerate(shards, start=1):
        file = out_dir / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _save(shard, file)
        files.append(file)
        weight_map.update(dict.fromkeys(shard, file.name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return files


def _save(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """``save_file``, readable by others as the config and tokenizer beside it are: safetensors creates its
    files owner-only (0600, whatever the umask), so a server running as another user could not load them."""
    save_file(tensors, file, metadata={"format": "pt"})
    file.chmod(0o644)
