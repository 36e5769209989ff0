"""User-facing configuration (pydantic: validated at the boundary, with descriptions)."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    import torch

Mode = Literal["ar", "chain", "tree-serial", "bole"]
MIN_TEMPERATURE = 1e-5  # logits / temperature stays finite in float32 for |logits| < 3e33
FLOAT32_MAX = 3.4028234663852886e38  # float32's largest
MAX_TEMPERATURE = FLOAT32_MAX  # the sampling kernels read settings in float32
MIN_TOP_P = 2.0**-126  # float32's smallest normal: below it top_p reads 0 (or a subnormal, 0 on a GPU)
MAX_STOPS, MAX_STOP_LENGTH = 16, 1024  # stop strings are matched on the engine thread, after every token


def no_bools(value: object, info: ValidationInfo) -> object:
    """A field validator (``mode="before"``): ``True`` is a number to Python and to pydantic's lax mode
    (``max_tokens=True`` was one token, ``temperature=True`` sampling at 1, ``BoleConfig(top_k=True)`` one
    child a node): refused, as the server refuses a BOOL tensor or parameter."""
    items = value if isinstance(value, list | tuple) else [value]
    if any(isinstance(v, bool) for v in items):
        kind = "numbers" if info.field_name in ("temperature", "top_p", "epsilon") else "integers"
        raise ValueError(f"takes {kind}, not booleans: got {value!r}")
    return value


class SamplingParams(BaseModel):
    """How one request is decoded. ``temperature == 0`` (the default) is greedy decoding, whatever
    ``top_k``, ``top_p`` and ``seed`` say: they shape sampling only (``temperature > 0``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_tokens: int = Field(64, ge=1, description="Most tokens to generate.")
    temperature: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        description=f"0 = greedy; otherwise softmax temperature, at least {MIN_TEMPERATURE} (below it the "
        "scaled logits overflow float32: sample greedily with 0 instead) and finite in float32.",
    )
    top_k: int = Field(0, ge=0, le=2**31 - 1, description="Keep the k most likely tokens; 0 = off.")
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description=f"Nucleus sampling mass; 1 = off. At least {MIN_TOP_P:.4g}, float32's smallest normal "
        "(smaller ones read 0 and kept no token); any top_p below the most likely token's probability "
        "keeps that token alone.",
    )
    seed: int | None = Field(
        None,
        ge=-(2**63),
        lt=2**64,  # torch.Generator's range
        description="Per-request RNG seed, read modulo 2**64 (-1 and 2**64 - 1 are one seed; on the CPU, "
        "whose generator takes 32 bits, seeds from 2**32 on are mixed down to 32): the same request, "
        "served with the same drafts in the same batch, samples the same tokens. Its coins do not depend "
        "on the batch, but the logits they are compared with may round differently in another batch (a "
        "verify's matmuls over more rows: ~1e-5 in float32), and speculation draws a coin per draft it "
        "tries, so in another batch, under a batch-shared budget (whose trees depend on the batch) or in "
        "another mode the tokens can differ; each is still a sample of the target distribution.",
    )
    stop_token_ids: list[int] = Field(
        default_factory=list, description="Stop at any of these tokens (not included in the output)."
    )
    stop: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_STOPS,
        description=f"Stop once the new text holds any of these, the text cut before it (at most "
        f"{MAX_STOPS}, of at most {MAX_STOP_LENGTH} characters each: every new token is checked against "
        "them; the token that completes one stays in the output's ids).",
    )
    ignore_eos: bool = Field(False, description="Keep generating past the tokenizer's end-of-text token.")

    _no_bools = field_validator(
        "max_tokens", "top_k", "seed", "stop_token_ids", "temperature", "top_p", mode="before"
    )(no_bools)

    @field_validator("temperature")
    @classmethod
    def _temperature_greedy_or_finite(cls, t: float) -> float:
        if 0.0 < t < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}"
            )  # pydantic shows the input
        if t > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be at most {MAX_TEMPERATURE:.4g}, float32's largest")
        return t

    @field_validator("top_p")
    @classmethod
    def _top_p_normal_in_float32(cls, p: float) -> float:
        if p < MIN_TOP_P:
            raise ValueError(
                f"top_p must be at least {MIN_TOP_P:.4g}, float32's smallest normal (any top_p below the "
                "most likely token's probability keeps that token alone)"
            )
        return p


DEFAULT_MAX_DEPTH = 8


def default_depth(max_nodes: int | None, deepest: int = DEFAULT_MAX_DEPTH) -> int:
    """The ``max_depth`` left unset: ``deepest`` (8, or an engine's), or ``max_nodes`` where that is fewer,
    so that ``BoleConfig(max_nodes=3)`` is valid (a chain's ``max_nodes`` is its default, 63: it has the
    whole depth)."""
    return deepest if max_nodes is None else min(deepest, max_nodes)


UNUSED_DRAFTS: dict[str, tuple[tuple[str, ...], str]] = {
    "ar": (("top_k", "max_depth", "max_nodes"), "it drafts nothing"),
    "chain": (("top_k", "max_nodes"), "a chain drafts one token a level, as deep as its depth"),
}
"""The draft settings a mode has no use for, and why. :class:`BoleConfig` refuses one given another value
than its default (the default changes nothing and is let through, so that a config rebuilt from its
``model_dump()`` is the same config); a command line refuses one given at all (:func:`unused_drafts`)."""


def unused_drafts(mode: str, given: Iterable[str]) -> tuple[list[str], str]:
    """Of the draft settings ``given`` (field names), those ``mode`` has no use for, and why."""
    names, why = UNUSED_DRAFTS.get(mode, ((), ""))
    given = set(given)
    return [name for name in names if name in given], why


class BoleConfig(BaseModel):
    """The speculative decoding scheme (``speculative_config`` of :class:`trtllm_bole.LLM`).

    All four modes run in the same executor on the same requests:

    - ``ar``: no speculation, one token per target forward;
    - ``chain``: an MTP chain of ``max_depth`` drafts, verified node by node with a state per token
      (the vLLM / TensorRT-LLM scheme);
    - ``tree-serial``: an MTP tree verified node by node with a full GDN state snapshot per node and
      a copy of the accepted one (SGLang's tree scheme);
    - ``bole``: the same tree, verified in closed form, committed from factors, and pruned to the
      calibrated batch-shared budget where there is a table (``budget_table``, or an engine built with
      ``--calibrate``), above a floor of each request's pending token and its children (BOLE.md §2–§5).
    """

    # Frozen: an executor sizes its KV headroom, coins and graphs from it once (a changed one is a new one).
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = Field("bole", description="Decoding scheme: ar, chain, tree-serial or bole.")
    top_k: int = Field(
        4, ge=1, le=16, description="Children expanded per draft node (and beam width); a chain has one."
    )
    max_nodes: int = Field(
        63,
        ge=1,
        le=512,
        description="Draft tokens per request and step in a tree, at most (a chain drafts max_depth). "
        "63 + the pending token = 64 tree tokens, "
        "one tile of the GPU verify's explicit-inverse path (65 send every request to the blocked kernel, "
        "which is already 1.2-1.3x slower at 64 nodes on the H200).",
    )
    # After max_nodes, whose value its default reads. Left unset it is not in model_fields_set, so an
    # engine's own depth replaces it, as far as max_nodes reaches (BoleConfig(max_nodes=3) for an engine of
    # depth 2 is depth 2, for one of depth 8 depth 3).
    max_depth: int = Field(
        default_factory=lambda given: default_depth(given.get("max_nodes")),
        ge=1,
        le=15,
        description=f"Draft tokens on the longest path of a tree (default {DEFAULT_MAX_DEPTH}, or max_nodes "
        "where that is fewer).",
    )
    epsilon: float | None = Field(
        None,
        ge=0.0,
        description="Budget slack: verify may cost up to (1 + epsilon) x a decode step. None: the budget "
        "table's own (calibrated at build_engine.py --epsilon, 0.2 by default); another is re-derived from "
        "the table's timings.",
    )
    budget_table: Path | None = Field(
        None,
        description="Calibrated budget table (JSON); an engine's own table is used when omitted. "
        "Without any, each request keeps up to max_nodes draft tokens.",
    )

    _no_bools = field_validator("top_k", "max_nodes", "max_depth", "epsilon", mode="before")(no_bools)

    @classmethod
    def for_mode(cls, mode: Mode, **drafts: object) -> BoleConfig:
        """Mode ``mode`` from draft settings shared by several modes: those it does not use are left out."""
        unused, _ = unused_drafts(mode, drafts)
        return cls(mode=mode, **{name: value for name, value in drafts.items() if name not in unused})

    @model_validator(mode="after")
    def _settings_fit_mode(self) -> BoleConfig:
        if self.mode != "bole" and (self.epsilon is not None or self.budget_table is not None):
            raise ValueError(
                f"epsilon and budget_table set the verify budget of mode 'bole' only; mode {self.mode!r} "
                "has none (each request verifies its own tree in full)"
            )
        unused, why = unused_drafts(self.mode, filter(self._set_off_default, self.model_fields_set))
        if unused:
            given = " or ".join(f"{name} ({getattr(self, name)})" for name in unused)
            raise ValueError(f"mode {self.mode!r} does not use {given}: {why}")
        if self.mode == "ar":
            return self
        if self.max_nodes < self.max_depth:  # never a chain's: its max_nodes is the default, 63
            raise ValueError(
                f"max_nodes ({self.max_nodes}) must be at least max_depth ({self.max_depth}) "
                "so that a full-depth path fits in the tree"
            )
        return self

    def _set_off_default(self, name: str) -> bool:
        """Whether field ``name`` was given a value other than its default (``max_depth``'s reads
        ``max_nodes``)."""
        field = type(self).model_fields[name]
        given = {"max_nodes": self.max_nodes}
        default = field.get_default(call_default_factory=True, validated_data=given)
        return name in self.model_fields_set and getattr(self, name) != default

    @property
    def speculates(self) -> bool:
        return self.mode != "ar"

    @property
    def branching(self) -> int:
        """Children per node actually drafted: a chain has one."""
        return 1 if self.mode == "chain" else self.top_k

    @property
    def pool_size(self) -> int:
        """Candidates drafting makes per request: the pending token, its ``branching`` children, then
        ``branching`` children of each of the ``branching`` beam nodes at every further level."""
        return 1 + self.branching + (self.max_depth - 1) * self.branching**2

    @property
    def draft_tokens(self) -> int:
        """Most draft tokens one request verifies in a step: ``max_nodes``, or all a shallow tree drafts
        where that is fewer (the graphs captured ahead of traffic are of this size)."""
        if self.mode == "ar":
            return 0
        return min(self.max_nodes, self.pool_size - 1)  # a chain's pool: its max_depth drafts


def one_line(error: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """A validation error on one line: each failure's field (``names`` renames the first part, and the
    fields a check of several names in its message), the reason, and the input it got, shortened."""
    names = names or {}
    # A default read from a field that failed is not computed: pydantic says so, a consequence only.
    failures = [e for e in error.errors() if e["type"] != "default_factory_not_called"]
    return "; ".join(_failure(e, names) for e in failures)


def _failure(error: Mapping, names: Mapping[str, str]) -> str:
    loc = error["loc"]
    if not loc:  # a check of several fields (a model validator): its message names them and their values
        message = error["msg"].removeprefix("Value error, ")
        return re.sub(rf"\b({'|'.join(names)})\b", lambda m: names[m[0]], message) if names else message
    field = ".".join([names.get(str(loc[0]), str(loc[0])), *map(str, loc[1:])])
    return f"{field}: {error['msg']} (got {short_repr(error['input'])})"


def short_repr(value: object) -> str:
    """``repr`` of a user's input, shortened to a line (long strings and lists elided in the middle)."""
    short = reprlib.Repr()  # keyword arguments only from Python 3.12
    short.maxstring, short.maxlist, short.maxother = 60, 8, 60
    return short.repr(value)


def check_device(device: str) -> None:
    """``cpu``, ``cuda`` or ``cuda:N``, and a CUDA device only where torch sees a GPU."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; "
            "use device='cpu' (or install a CUDA build of torch on a GPU machine)"
        )
    if kind == "cuda" and (torch.device(device).index or 0) >= (count := torch.cuda.device_count()):
        raise ValueError(
            f"device {device!r} asked for, but torch sees {count} CUDA GPU{'s' * (count > 1)} (cuda:0"
            f"{f' to cuda:{count - 1}' if count > 1 else ''}; CUDA_VISIBLE_DEVICES picks which ones)"
        )


def on_device(device: torch.device) -> AbstractContextManager:
    """``device`` as the calling thread's current CUDA device while the context lasts (nothing on CPU).
    Triton launches its kernels, and torch makes its streams, events and graph captures, on the current
    device, not on their tensors': work on another GPU (``cuda:1``, or any GPU from a thread that never
    chose one, such as a server's) runs there only inside this. The executor's steps and captures and a
    calibration take it; a model called directly needs it around its calls."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
