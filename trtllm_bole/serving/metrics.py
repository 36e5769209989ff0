"""Prometheus metrics of a serving engine, laid out as TensorRT-LLM's Triton backend lays out its own
(``nv_trt_llm_request_metrics{request_type=...}``, ``nv_trt_llm_kv_cache_block_metrics{...}``): one
family per subject, one label telling its samples apart, under a ``bole_`` prefix. The Triton model
(``triton_server/``) publishes them through the Python backend's custom metrics, next to Triton's own
``nv_inference_*``; from the counters a dashboard derives the acceptance rate
(``accepted_draft_tokens / draft_tokens``) and the mean accepted tokens per verify step
(``(accepted_draft_tokens + verify_steps) / verify_steps``).

Everything here is pure: which samples an :class:`~trtllm_bole.serving.engine.EngineStats` gives, and
what to apply to move the published values from one snapshot to the next (a counter only goes up).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trtllm_bole.serving.engine import FINISH_REASONS, EngineStats

GAUGE, COUNTER = "gauge", "counter"


@dataclass(frozen=True)
class Family:
    """A metric family: ``samples`` maps each value of ``label`` to the :class:`EngineStats` field it
    reports."""

    name: str
    kind: str
    description: str
    label: str
    samples: dict[str, str]


FAMILIES = (
    Family(
        "bole_request_metrics",
        GAUGE,
        "Requests in the engine's batch, waiting for it, and the batch's bound",
        "request_type",
        {"active": "active", "waiting": "waiting", "max": "max_batch_size"},
    ),
    Family(
        "bole_kv_cache_block_metrics",
        GAUGE,
        "Paged KV cache blocks used, free and in all, and their size in tokens",
        "kv_cache_block_type",
        {
            "used": "kv_blocks_used",
            "free": "kv_blocks_free",
            "max": "kv_blocks_max",
            "tokens_per": "kv_tokens_per_block",
        },
    ),
    Family(
        "bole_iteration_metrics",
        COUNTER,
        "Engine steps run (each a batched prefill and/or speculative step)",
        "iteration_type",
        {"steps": "iterations"},
    ),
    Family(
        "bole_finished_requests",
        COUNTER,
        "Requests ended, by finish reason",
        "finish_reason",
        {reason: f"finished_{reason}" for reason in FINISH_REASONS},
    ),
    Family(
        "bole_token_metrics",
        COUNTER,
        "Prompt and generated tokens of the requests ended",
        "token_type",
        {"prompt": "prompt_tokens", "generated": "generated_tokens"},
    ),
    Family(
        "bole_spec_decode_metrics",
        COUNTER,
        "Draft tokens verified and accepted, verify steps and prefill forwards of the requests ended",
        "spec_decode_type",
        {
            "draft_tokens": "draft_tokens",
            "accepted_draft_tokens": "accepted_draft_tokens",
            "verify_steps": "verify_steps",
            "prefill_forwards": "prefill_forwards",
        },
    ),
)


def samples(stats: EngineStats) -> dict[tuple[str, str], int]:
    """Every sample's value, by ``(family name, label value)``."""
    values = dataclasses.asdict(stats) | {"kv_blocks_free": stats.kv_blocks_max - stats.kv_blocks_used}
    return {(f.name, label): values[field] for f in FAMILIES for label, field in f.samples.items()}


def updates(before: EngineStats | None, now: EngineStats) -> list[tuple[str, str, str, int]]:
    """What moves the published samples from ``before`` (None: nothing published yet, every value 0) to
    ``now``: ``(family, label value, "set" | "increment", amount)``, a gauge set to its value and a
    counter increased by its growth (none where it did not grow). A counter that shrank means a new engine
    behind the same metrics: refused."""
    old = samples(before) if before is not None else {}
    kinds = {f.name: f.kind for f in FAMILIES}
    moves = []
    for (name, label), value in samples(now).items():
        if kinds[name] == GAUGE:
            moves.append((name, label, "set", value))
            continue
        grown = value - old.get((name, label), 0)
        if grown < 0:
            raise ValueError(f"counter {name}{{{label}}} went down from {old[name, label]} to {value}")
        if grown:
            moves.append((name, label, "increment", grown))
    return moves
