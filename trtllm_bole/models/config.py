"""Qwen3.5 text-model settings, read from a Hugging Face ``config.json``.

Two published layouts are accepted:

- ``model_type: qwen3_5_text`` (``Qwen3_5ForCausalLM``): settings at the top level, weights under
  ``model.``;
- ``model_type: qwen3_5`` (``Qwen3_5ForConditionalGeneration``, the released vision-language
  wrapper): text settings under ``text_config``, weights under ``model.language_model.``; the
  vision tower is ignored.

Mixture-of-experts variants (``qwen3_5_moe``) are refused with a message saying so: they are never
half-loaded. Every error names the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

_TEXT_PREFIX = "model."
_WRAPPER_PREFIX = "model.language_model."
WEIGHT_LAYOUTS = {  # a checkpoint's weight prefix -> the config.json that goes with it
    _TEXT_PREFIX: "the text model's layout: its config.json is the text config (model_type qwen3_5_text)",
    _WRAPPER_PREFIX: "the vision-language wrapper's: its config.json, model_type qwen3_5, has a text_config",
}
_MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


@dataclass(slots=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    layer_types: tuple[str, ...]
    # Where config.json omits one of these, _parse gives it transformers' default.
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    tie_word_embeddings: bool
    mtp_num_hidden_layers: int
    max_position_embeddings: int
    """The longest sequence the model was trained for."""
    weight_prefix: str
    """Where the text model's tensors live in the checkpoint (``model.`` or ``model.language_model.``)."""
    source: str
    """The file the settings came from, for error messages."""

    # Derived in __post_init__.
    gdn_layer_ids: tuple[int, ...] = field(init=False)
    attn_layer_ids: tuple[int, ...] = field(init=False)
    rotary_dim: int = field(init=False)
    key_dim: int = field(init=False)  # H * dk: width of q and of k in the GDN in-projection
    value_dim: int = field(init=False)  # HV * dv
    conv_dim: int = field(init=False)  # q, k and v channels through the short conv

    def __post_init__(self) -> None:
        self._check_integers()
        self.layer_types = tuple(self.layer_types)
        self.gdn_layer_ids = tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)
        self.attn_layer_ids = tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)
        self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        self.key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        self.value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self._validate()

    @property
    def num_gdn_layers(self) -> int:
        return len(self.gdn_layer_ids)

    @property
    def num_attn_layers(self) -> int:
        return len(self.attn_layer_ids)

    @property
    def architecture_id(self) -> str:
        """A short hash of the fields that say what the model computes (not where they were read from):
        what a step's cost depends on (the weights' values do not), so a budget table calibrated on
        this config fits any checkpoint of it."""
        where = ("source", "weight_prefix")
        fields = {n: getattr(self, n) for n in self.__dataclass_fields__ if n not in where}
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def check_seq_len(self, max_seq_len: int) -> None:
        """Refuse to serve sequences longer than the model's positions were trained for."""
        if max_seq_len > self.max_position_embeddings:
            raise ValueError(
                f"max_seq_len {max_seq_len} exceeds the model's {self.text_scope}max_position_embeddings "
                f"{self.max_position_embeddings} ({self.source}); positions past it were never trained"
            )

    def check_cuda_tiles(self) -> None:
        """Refuse GDN head dims the CUDA kernels cannot tile: their tensor-core tiles take dk and dv in
        multiples of 16 (the CPU path takes any)."""
        from trtllm_bole.kernels._common import tiles_head_dims

        dk, dv = self.linear_key_head_dim, self.linear_value_head_dim
        if self.gdn_layer_ids and not tiles_head_dims(dk, dv):
            dims = {"linear_key_head_dim": dk, "linear_value_head_dim": dv}
            odd = [
                f"{self.text_scope}{name} = {value}"
                for name, value in dims.items()
                if not tiles_head_dims(value)
            ]
            raise ValueError(
                f"{self.source}: {' and '.join(odd)}: the GDN kernels on CUDA take head dims in multiples of "
                "16 (tensor-core tile sides); run this model on the CPU"
            )

    @property
    def text_scope(self) -> str:
        """Where the text model's fields sit in config.json: ``"text_config."`` in a multimodal wrapper."""
        return _field_scope(self.weight_prefix)

    def _check_integers(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "max_position_embeddings",
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                where = f"{self.source}: {self.text_scope}{name}"
                raise ValueError(f"{where} = {value!r} must be a positive integer")
        if isinstance(self.linear_conv_kernel_dim, bool) or not isinstance(self.linear_conv_kernel_dim, int):
            raise ValueError(
                f"{self.source}: {self.text_scope}linear_conv_kernel_dim = {self.linear_conv_kernel_dim!r} "
                f"must be an integer >= 2"
            )

    def _validate(self) -> None:
        where = self.text_scope
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"{self.source}: {where}layer_types has {len(self.layer_types)} entries but "
                f"{where}num_hidden_layers = {self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in (LINEAR_ATTENTION, FULL_ATTENTION):
                raise ValueError(
                    f"{self.source}: {where}layer_types[{i}] = {kind!r}; expected "
                    f"{LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}"
                )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"{self.source}: {where}linear_num_value_heads = {self.linear_num_value_heads} must be a "
                f"multiple of {where}linear_num_key_heads = {self.linear_num_key_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{self.source}: {where}num_attention_heads = {self.num_attention_heads} must be a multiple "
                f"of {where}num_key_value_heads = {self.num_key_value_heads}"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(
                f"{self.source}: {where}linear_conv_kernel_dim = {self.linear_conv_kernel_dim} must be >= 2"
            )
        if self.rotary_dim <= 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(
                f"{self.source}: {where}partial_rotary_factor = {self.partial_rotary_factor} gives a rotary "
                f"width of {self.rotary_dim} on head_dim {self.head_dim}; it must be even and in "
                f"[2, head_dim]"
            )
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(
                f"{self.source}: {where}rms_norm_eps = {self.rms_norm_eps} and rope_theta = "
                f"{self.rope_theta} must be positive"
            )
        if isinstance(self.mtp_num_hidden_layers, bool) or self.mtp_num_hidden_layers not in (0, 1):
            raise ValueError(
                f"{self.source}: {where}mtp_num_hidden_layers = {self.mtp_num_hidden_layers!r}; only 0 or 1 "
                f"MTP layer is supported (the published Qwen3.5 checkpoints ship one)"
            )


def load_config(source: str | Path | dict[str, Any]) -> Qwen35Config:
    """Read a checkpoint directory, a ``config.json`` path, or an already parsed dict."""
    if isinstance(source, dict):
        return _parse(source, "<dict>")
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{path}: no such file; a checkpoint directory needs a config.json")
    return _parse(load_json(path), str(path))


def load_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; errors name the file."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # bytes that are not UTF-8 are not JSON either
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return raw


GENERATION_CONFIG = "generation_config.json"


def read_generation_config(checkpoint: Path) -> dict[str, Any] | None:
    """The checkpoint's ``generation_config.json``, None when it has none."""
    path = checkpoint / GENERATION_CONFIG
    return load_json(path) if path.exists() else None


def _field_scope(weight_prefix: str) -> str:
    """How errors name a field: ``text_config.`` inside the ``qwen3_5`` wrapper, else nothing."""
    return "text_config." if weight_prefix == _WRAPPER_PREFIX else ""


def _text_section(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """The text model's fields (``raw`` itself, or the ``qwen3_5`` wrapper's ``text_config``) and its
    weights' prefix; refuses what is not a dense, unquantized Qwen3.5."""
    model_type = raw.get("model_type")
    text, prefix = raw, _TEXT_PREFIX
    if model_type == "qwen3_5":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"{source}: model_type 'qwen3_5' needs a text_config object")
        prefix = _WRAPPER_PREFIX
        if text.get("model_type", "qwen3_5_text") != "qwen3_5_text":
            model_type = text["model_type"]
    if model_type in _MOE_TYPES or "num_experts" in text:
        raise ValueError(
            f"{source}: {model_type or 'this'} is a Qwen3.5 mixture-of-experts model; only dense Qwen3.5 "
            f"(qwen3_5_text, or qwen3_5 with a dense text_config) is supported, and MoE checkpoints are "
            f"refused rather than half-loaded"
        )
    quantized = raw.get("quantization_config") or text.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
        raise ValueError(
            f"{source}: a quantized checkpoint (quantization_config, {method}); only float32, float16 and "
            "bfloat16 weights are supported: dequantize it first"
        )
    if model_type not in ("qwen3_5", "qwen3_5_text"):
        raise ValueError(
            f"{source}: model_type = {model_type!r}; expected 'qwen3_5_text' (Qwen3_5ForCausalLM) or "
            f"'qwen3_5' (the vision-language wrapper with a text_config)"
        )
    return text, prefix


@dataclass(frozen=True)
class _Fields:
    """The text model's fields, read with errors that name the file and the field."""

    text: dict[str, Any]
    source: str
    where: str  # "text_config." inside the wrapper, else ""

    def get(self, name: str, default: Any = ...) -> Any:
        if name in self.text:
            return self.text[name]
        if default is ...:
            raise ValueError(f"{self.source}: required field {self.where}{name} is missing")
        return default

    def number(self, name: str, value: Any) -> float:
        """A finite number (Python's json reads NaN, Infinity and 1e400 as floats)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{self.source}: {self.where}{name} = {value!r} must be a finite number")
        return float(value)

    def positive_int(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{self.source}: {self.where}{name} = {value!r} must be a positive integer")
        return value


_FIXED = (
    ("hidden_act", "silu"),
    ("attention_bias", False),
    ("attn_output_gate", True),
    ("mtp_use_dedicated_embeddings", False),
)
"""Fields whose other values Qwen3.5 never uses and this package does not implement."""


def _refuse_unsupported(f: _Fields) -> None:
    for name, ok in _FIXED:
        if f.get(name, ok) != ok:
            raise ValueError(
                f"{f.source}: {f.where}{name} = {f.get(name)!r} is not supported (Qwen3.5 uses {ok!r})"
            )


def _layer_types(f: _Fields, num_layers: Any) -> tuple[str, ...]:
    """``layer_types``, or transformers' rule when only the interval is given: every interval-th layer is
    full attention."""
    layer_types = f.get("layer_types", None)
    if layer_types is None:
        interval = f.positive_int("full_attention_interval", f.get("full_attention_interval", 4))
        num_layers = f.positive_int("num_hidden_layers", num_layers)
        return tuple(LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(num_layers))
    if not isinstance(layer_types, list):
        raise ValueError(f"{f.source}: {f.where}layer_types must be a list, got {layer_types!r}")
    return tuple(layer_types)


def _rope(f: _Fields) -> tuple[str, dict[str, Any]]:
    """``rope_parameters``, or the older ``rope_scaling``, which transformers takes first when a config has
    both (with the field's name, for errors); only default RoPE."""
    name = "rope_scaling" if f.get("rope_scaling", None) else "rope_parameters"
    rope = f.get(name, None) or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{f.source}: {f.where}{name} = {rope!r} must be an object")
    if nested := [key for key, value in rope.items() if isinstance(value, dict)]:
        raise ValueError(
            f"{f.source}: {f.where}{name} holds settings per layer type ({', '.join(nested)}); "
            "Qwen3.5 takes one set for all its attention layers (transformers' qwen3_5 cannot build it)"
        )
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"{f.source}: {f.where}{name}.rope_type = {rope_type!r}; only 'default' RoPE is "
            f"supported (Qwen3.5's multimodal sections reduce to plain 1-D positions for text)"
        )
    return name, rope


def _rope_number(f: _Fields, rope: tuple[str, dict[str, Any]], name: str, default: float) -> float:
    """A RoPE setting as transformers reads it: from the RoPE object, else the top level, else ``default``;
    errors name the field it came from."""
    field, values = rope
    if name in values:
        return f.number(f"{field}.{name}", values[name])
    return f.number(name, f.get(name, default))


def _parse(raw: dict[str, Any], source: str) -> Qwen35Config:
    text, prefix = _text_section(raw, source)
    f = _Fields(text, source, _field_scope(prefix))
    _refuse_unsupported(f)
    get = f.get
    num_layers = get("num_hidden_layers")
    layer_types = _layer_types(f, num_layers)
    rope = _rope(f)
    tie = raw.get("tie_word_embeddings", False)  # the wrapper's own field, as transformers reads it
    if not isinstance(tie, bool):
        raise ValueError(f"{source}: tie_word_embeddings = {tie!r} must be true or false")
    return Qwen35Config(
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=get("num_attention_heads"),
        num_key_value_heads=get("num_key_value_heads"),
        head_dim=get("head_dim"),
        linear_num_key_heads=get("linear_num_key_heads"),
        linear_num_value_heads=get("linear_num_value_heads"),
        linear_key_head_dim=get("linear_key_head_dim"),
        linear_value_head_dim=get("linear_value_head_dim"),
        layer_types=layer_types,
        linear_conv_kernel_dim=get("linear_conv_kernel_dim", 4),
        rms_norm_eps=f.number("rms_norm_eps", get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_number(f, rope, "rope_theta", 10000.0),
        partial_rotary_factor=_rope_number(f, rope, "partial_rotary_factor", 0.25),
        tie_word_embeddings=tie,
        mtp_num_hidden_layers=get("mtp_num_hidden_layers", 1),
        max_position_embeddings=get("max_position_embeddings", 32768),
        weight_prefix=prefix,
        source=source,
    )


def eos_token_ids(
    source: Path, hf_config: dict[str, Any], generation_config: dict[str, Any] | None
) -> list[int]:
    """Every end-of-text id a checkpoint declares: ``eos_token_id`` (one id or a list) of its
    ``generation_config.json`` (where chat checkpoints list their end-of-turn token), of its ``config.json``
    and of that file's ``text_config``, in that order, each once."""
    ids: list[int] = []
    for where, config in (
        (GENERATION_CONFIG, generation_config or {}),
        ("config.json", hf_config),
        ("config.json: text_config", hf_config.get("text_config") or {}),
    ):
        eos = config.get("eos_token_id")
        listed = [] if eos is None else eos if isinstance(eos, list) else [eos]
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in listed):
            raise ValueError(
                f"{source} ({where}): eos_token_id must be a token id or a list of ids, got {eos!r}"
            )
        ids += [t for t in listed if t not in ids]
    vocab = (hf_config.get("text_config") or hf_config).get("vocab_size")
    if isinstance(vocab, int) and (outside := [t for t in ids if t >= vocab]):  # never met: no end at all
        raise ValueError(
            f"{source}: eos_token_id {outside} outside the vocabulary [0, {vocab}) (a stale "
            f"{GENERATION_CONFIG}?): such an id never ends a request"
        )
    return ids
