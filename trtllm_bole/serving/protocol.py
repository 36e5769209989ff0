"""The tensors of the Triton model: named as TensorRT-LLM's Triton models name them.

Requests carry a batch dimension of one (``max_batch_size > 0`` in ``config.pbtxt``):

| input | type | shape | meaning |
|---|---|---|---|
| ``text_input`` | BYTES | [1, 1] | the prompt as UTF-8 text (or ``input_ids``) |
| ``input_ids`` | INT32 | [1, L] | the prompt as token ids (or ``text_input``) |
| ``input_lengths`` | INT32 | [1, 1] | use only the first ``input_lengths`` of ``input_ids`` |
| ``max_tokens`` | INT32 | [1, 1] | most tokens to generate (default 64) |
| ``temperature`` / ``top_p`` | FP32 | [1, 1] | sampling (default 0 = greedy / 1 = off) |
| ``top_k`` | INT32 | [1, 1] | sampling (default 0 = off) |
| ``random_seed`` | UINT64 | [1, 1] | per-request sampling seed |
| ``stream`` | BOOL | [1, 1] | one response per committed delta (default false: one response) |
| ``end_id`` | INT32 | [1, 1] | end-of-sequence token replacing the model's (-1: none) |
| ``stop_words`` | BYTES | [1, S] | stop when the text contains any of these |

Every scalar may instead come as a request parameter of the same name (the HTTP ``generate``
endpoint's ``"parameters"``); a tensor wins over a parameter. An error's message opens with its status,
``[INVALID_ARG]``, ``[UNAVAILABLE]`` (retry later), ``[CANCELLED]`` or ``[INTERNAL]``: Triton (2.51)
hands clients no status code of a Python model's error (HTTP 400 for each, a gRPC stream error
without one). Outputs, on every response:
``text_output`` BYTES [1, 1] and ``output_ids`` INT32 [1, n] (the delta when streaming, the whole
output otherwise), ``finish_reason`` BYTES [1, 1] (empty until the final response), and the
request's running speculation totals ``acceptance_rate`` FP32, ``total_accepted_draft_tokens`` INT32,
``total_draft_tokens`` INT32, ``mean_accepted_tokens`` FP32 (all [1, 1]).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from trtllm_bole.config import FLOAT32_MAX, BoleConfig, SamplingParams, one_line, unused_drafts
from trtllm_bole.serving.engine import Update
from trtllm_bole.spec.executor import outside_vocabulary
from trtllm_bole.text import stops_never_met

# SamplingParams field -> (tensor name, Python type of its value)
SCALARS: dict[str, tuple[str, type]] = {
    "max_tokens": ("max_tokens", int),
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "seed": ("random_seed", int),
}
INPUT_NAMES = (
    "text_input", "input_ids", "input_lengths", "max_tokens", "temperature", "top_k", "top_p",
    "random_seed", "stream", "end_id", "stop_words",
)  # fmt: skip
PARAMETER_NAMES = frozenset({name for name, _ in SCALARS.values()} | {"input_lengths", "end_id", "stream"})
"""The inputs a client may also send as request parameters (the HTTP generate endpoint's JSON fields
that are not input tensors become parameters); others, but Triton's own ``triton_*``, are refused."""
OUTPUT_NAMES = (
    "text_output", "output_ids", "finish_reason", "acceptance_rate", "total_accepted_draft_tokens",
    "total_draft_tokens", "mean_accepted_tokens",
)  # fmt: skip


class RequestError(ValueError):
    """A request the server refuses: the message says what was wrong and how to fix it."""


@dataclass(slots=True)
class ParsedRequest:
    prompt: str | list[int]
    params: SamplingParams
    stream: bool


def parse_request(
    tensors: Mapping[str, np.ndarray],
    parameters: Mapping[str, Any] | None = None,
    *,
    context_limit: int | None = None,
) -> ParsedRequest:
    """Read one request's input tensors (and request parameters) into a prompt and sampling params. With
    ``context_limit``, token ids that cannot fit are refused before they become Python ints (40M of them
    took 10 s and 2.3 GB, and held up every request behind them)."""
    parameters = parameters or {}
    for name, array in tensors.items():
        if array.ndim == 0 or array.shape[0] != 1:
            raise RequestError(
                f"input {name!r} has shape {list(array.shape)}: send one prompt per request "
                "(batch dimension 1); run several requests concurrently instead"
            )
    unknown = sorted(k for k in parameters if k not in PARAMETER_NAMES and not k.startswith("triton_"))
    if unknown:
        raise RequestError(
            f"unknown request parameters {unknown}: this model reads the prompt from text_input or "
            f"input_ids, stop strings from stop_words, and {sorted(PARAMETER_NAMES)} (as inputs or as "
            "request parameters)"
        )
    prompt = _prompt(tensors, parameters, context_limit)
    values: dict[str, Any] = {}
    for field_name, (name, kind) in SCALARS.items():
        value = _scalar(tensors, parameters, name, kind)
        if value is not None:
            values[field_name] = value
    end_id = _scalar(tensors, parameters, "end_id", int)
    if end_id is not None and end_id < -1:
        raise RequestError(f"end_id {end_id} is neither a token id nor -1 (no end token)")
    if end_id is not None:
        values["ignore_eos"] = True
        values["stop_token_ids"] = [end_id] if end_id >= 0 else []
    stop = _strings(tensors["stop_words"]) if "stop_words" in tensors else []
    if stop := [s for s in stop if s]:
        values["stop"] = stop
    try:
        params = SamplingParams(**values)
    except ValidationError as e:
        names = {"stop": "stop_words", **{f: n for f, (n, _) in SCALARS.items()}}
        raise RequestError(one_line(e, names)) from None
    stream = _scalar(tensors, parameters, "stream", bool)
    return ParsedRequest(prompt, params, bool(stream))


def check_prompt_text(text: str, *, context_limit: int, max_token_bytes: int) -> None:
    """Refuse a text prompt that cannot fit before tokenizing it (tokenizing megabytes takes seconds,
    and the model's ``execute`` tokenizes on the thread that takes every new request)."""
    size = len(text.encode())
    if size > context_limit * max_token_bytes:
        raise RequestError(
            f"prompt text of {size} bytes is too long: this server holds at most {context_limit} prompt + "
            f"output tokens per request, and no token stands for more than {max_token_bytes} bytes"
        )


def check_prompt_length(n: int, context_limit: int) -> None:
    if n >= context_limit:
        raise RequestError(
            f"prompt of {n} tokens is too long: this server holds at most {context_limit} prompt + "
            f"output tokens per request; shorten the prompt below {context_limit} tokens"
        )


def check_request(
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    context_limit: int,
    vocab_size: int,
    has_tokenizer: bool,
    special_texts: Collection[str] = (),
) -> None:
    """Refuse what the engine could only partly serve: an empty or too long prompt, ids (or an
    ``end_id``) outside the vocabulary, ``max_tokens`` that does not fit after the prompt, stop strings
    without a tokenizer or holding a special token (of ``special_texts``: never met)."""
    n = len(prompt_ids)
    if n == 0:
        raise RequestError("empty prompt: send a non-empty text_input or input_ids")
    check_prompt_length(n, context_limit)
    if bad := outside_vocabulary(prompt_ids, vocab_size):
        raise RequestError(f"input_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    if outside := outside_vocabulary(params.stop_token_ids, vocab_size):  # from end_id
        raise RequestError(
            f"end_id {outside[0]} is outside the vocabulary [0, {vocab_size}): it would never end"
        )
    if n + params.max_tokens > context_limit:
        raise RequestError(
            f"max_tokens {params.max_tokens} is out of range: the prompt has {n} tokens and this server "
            f"holds at most {context_limit} per request, so max_tokens must be at most {context_limit - n}"
        )
    if params.stop and not has_tokenizer:
        raise RequestError("stop_words need a tokenizer and this model has none; use end_id instead")
    if unmet := stops_never_met(params.stop, special_texts):
        raise RequestError(
            f"stop_words {unmet[:3]} hold a special token, which decoded text never does (it is skipped): "
            "send its id as end_id"
        )


STATUS = {
    "invalid": "INVALID_ARG",
    "cancelled": "CANCELLED",
    "unavailable": "UNAVAILABLE",
    "internal": "INTERNAL",
}
"""A reply's error code -> the name of its Triton status (``pb_utils.TritonError``'s constant)."""


@dataclass(slots=True)
class Reply:
    """What to send for one update: tensors, or an error (``code``: a key of ``STATUS``); ``final``
    marks the request's last response."""

    tensors: dict[str, np.ndarray] | None
    final: bool
    error: str | None = None
    code: str = ""

    @property
    def status(self) -> str:
        return STATUS[self.code]

    @property
    def message(self) -> str:
        """The error as clients read it, opening with its status (``[UNAVAILABLE] ...``): Triton passes
        them no status code of a Python model's error."""
        return f"[{self.status}] {self.error}"


@dataclass(slots=True)
class ResponseStream:
    """Turn a request's engine updates into replies: one per update when streaming, otherwise one
    with the whole output once the request finishes."""

    stream: bool
    _ids: list[int] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)

    def __call__(self, update: Update) -> Reply | None:
        if update.finish_reason == "abort":
            if update.error:
                return Reply(None, True, update.error, "unavailable")
            return Reply(None, True, "request cancelled", "cancelled")
        if update.finish_reason == "error":
            return Reply(None, True, update.error or "generation failed", "internal")
        if self.stream:
            if not (update.token_ids or update.text or update.finished):
                return None
            return Reply(_tensors(update.token_ids, update.text, update), update.finished)
        self._ids += update.token_ids
        self._text.append(update.text)
        if not update.finished:
            return None
        return Reply(_tensors(self._ids, "".join(self._text), update), True)


def _tensors(token_ids: list[int], text: str, update: Update) -> dict[str, np.ndarray]:
    stats = update.stats
    return {
        "text_output": np.array([[text.encode()]], dtype=np.object_),
        "output_ids": np.array([token_ids], dtype=np.int32).reshape(1, -1),
        "finish_reason": np.array([[(update.finish_reason or "").encode()]], dtype=np.object_),
        "acceptance_rate": np.array([[stats.acceptance_rate]], dtype=np.float32),
        "total_accepted_draft_tokens": np.array([[stats.accepted]], dtype=np.int32),
        "total_draft_tokens": np.array([[stats.drafted]], dtype=np.int32),
        "mean_accepted_tokens": np.array([[stats.mean_accepted_tokens]], dtype=np.float32),
    }


def _prompt(
    tensors: Mapping[str, np.ndarray], parameters: Mapping[str, Any], context_limit: int | None
) -> str | list[int]:
    has_text, has_ids = "text_input" in tensors, "input_ids" in tensors
    length = _scalar(tensors, parameters, "input_lengths", int)
    if has_text == has_ids:
        raise RequestError(
            "send exactly one of text_input (BYTES, the prompt text) and input_ids (INT32 token ids), "
            f"got {'both' if has_text else 'neither'}"
        )
    if has_text:
        if length is not None:
            raise RequestError("input_lengths trims input_ids; it does not apply to text_input")
        texts = _strings(tensors["text_input"])
        if len(texts) != 1:
            raise RequestError(f"text_input must hold one string, got {len(texts)}")
        return texts[0]
    ids = tensors["input_ids"]
    if ids.dtype.kind not in "iu":
        raise RequestError(f"input_ids must be integers, got {ids.dtype}")
    ids = ids.reshape(-1)
    if length is not None:
        if not 0 <= length <= ids.size:
            raise RequestError(f"input_lengths {length} is outside [0, {ids.size}] (the input_ids given)")
        ids = ids[:length]
    if context_limit is not None:
        check_prompt_length(ids.size, context_limit)
    return ids.tolist()


def _strings(array: np.ndarray) -> list[str]:
    out = []
    for item in array.reshape(-1):
        if isinstance(item, bytes | np.bytes_):
            try:
                item = item.decode()
            except UnicodeDecodeError as e:
                raise RequestError(f"text is not valid UTF-8: {e}") from None
        if not isinstance(item, str):
            raise RequestError(f"expected text (BYTES), got {type(item).__name__}")
        out.append(item)
    return out


def _scalar(tensors: Mapping[str, np.ndarray], parameters: Mapping[str, Any], name: str, kind: type) -> Any:
    if name in tensors:
        return _one(tensors[name], name, kind)
    if name not in parameters:
        return None
    value = parameters[name]
    ok = isinstance(value, bool) if kind is bool else isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        ok = ok or isinstance(value, float)
    if not ok:
        raise RequestError(f"parameter {name!r} must be {kind.__name__}, got {value!r}")
    return kind(value)


def _one(array: np.ndarray, name: str, kind: type) -> Any:
    if array.size != 1:
        raise RequestError(f"input {name!r} must hold one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    want = {bool: "b", int: "iu", float: "f"}[kind]
    if array.dtype.kind not in want:
        raise RequestError(f"input {name!r} must be {kind.__name__}, got {array.dtype}")
    if kind is float:  # the shortest decimal of its own precision: FP32 1e-5 is 1e-5, not 9.9999997e-06
        short = float(str(value))  # but float32's largest, 3.4028235e+38 so written, is past it as a double
        return short if abs(short) <= FLOAT32_MAX else float(value)
    return kind(value)


SPECULATIVE_PARAMETERS = {
    "mode": "speculative_mode", "max_depth": "max_depth", "max_nodes": "max_nodes", "top_k": "draft_top_k"
}  # fmt: skip
"""The model's parameter of each :class:`~trtllm_bole.BoleConfig` field it sets."""


def llm_kwargs(
    parameters: Mapping[str, str],
    instance_kind: str = "CPU",
    device_id: str = "0",
    names: Mapping[str, str] = SPECULATIVE_PARAMETERS,
) -> dict[str, Any]:
    """Keyword arguments of :class:`~trtllm_bole.LLM` from the model's ``config.pbtxt`` parameters.

    A parameter that is empty or still a ``${...}`` placeholder is unset: the LLM (or the engine
    directory) decides. ``device`` defaults to ``cpu`` for a CPU instance and to the instance's GPU
    for a GPU instance (``cuda`` is bound to that GPU too). Speculative settings that make no valid
    :class:`~trtllm_bole.BoleConfig` are a ``ValueError`` on one line naming each by ``names`` (the
    model's parameters; the launcher's flags).
    """
    given = _given(parameters)
    kwargs: dict[str, Any] = {"model": given.get("engine_dir")}
    device = given.get("device", "cuda" if "GPU" in instance_kind.upper() else "cpu")
    kwargs["device"] = f"cuda:{device_id}" if device == "cuda" else device
    if "dtype" in given:
        kwargs["dtype"] = given["dtype"]
    for name in ("max_batch_size", "max_seq_len", "kv_cache_tokens", "max_prefill_tokens"):
        if name in given:
            kwargs[name] = _positive_int(name, given[name])
    bole = {}
    if "speculative_mode" in given:
        bole["mode"] = given["speculative_mode"]
    params = {name: SPECULATIVE_PARAMETERS[name] for name in ("max_depth", "max_nodes", "top_k")}
    for field_name, param in params.items():
        if param in given:
            bole[field_name] = _positive_int(param, given[param])
    unused, why = unused_drafts(bole.get("mode", BoleConfig.model_fields["mode"].default), bole)
    if unused:  # given at all: a parameter for nothing is a mistake, whatever its value
        listed = " or ".join(names[name] for name in unused)
        raise ValueError(f"{names['mode']} {bole['mode']} does not use {listed}: {why}")
    if bole:
        try:
            kwargs["speculative_config"] = BoleConfig(**bole)
        except ValidationError as e:  # pydantic's own text spans lines and names the fields
            raise ValueError(one_line(e, names)) from None
    return kwargs


def engine_kwargs(parameters: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments of :meth:`~trtllm_bole.serving.ServingEngine.for_llm` from the same parameters:
    ``max_queue_size``, where set."""
    given = _given(parameters)
    return (
        {"max_queue_size": _positive_int("max_queue_size", given["max_queue_size"])}
        if "max_queue_size" in given
        else {}
    )


def drain_file(parameters: Mapping[str, str]) -> Path | None:
    """The file whose appearance tells the model to drain (``triton_server/launch.py`` writes it on
    SIGTERM), from the ``drain_file`` parameter; None where it is unset."""
    path = _given(parameters).get("drain_file")
    return None if path is None else Path(path)


def _given(parameters: Mapping[str, str]) -> dict[str, str]:
    """The parameters that are set: neither empty nor still a ``${...}`` placeholder."""
    return {k: v.strip() for k, v in parameters.items() if v.strip() and not v.strip().startswith("${")}


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"model parameter {name} must be an integer, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"model parameter {name} must be positive, got {value}")
    return value
