"""Prometheus metrics of a serving engine, laid out as TensorRT-LLM's Triton backend lays out its own
(``nv_trt_llm_request_metrics{request_type=...}``, ``nv_trt_llm_kv_cache_block_metrics{...}``): one
family per subject, one label telling its samples apart, under a ``bole_`` prefix. The Triton model
(``triton_server/``) publishes them through the Python backend's custom metrics, next to Triton's own
``nv_inference_*``; from the counters a dashboard derives the acceptance rate
(``accepted_draft_tokens / draft_tokens``) and the mean accepted tokens per verify step
(``(accepted_draft_tokens + verify_steps) / verify_steps``). Histograms of the ended requests' latencies
(time to first token, to the end, per output token) complete them.

Everything here is pure: which samples an :class:`~trtllm_bole.serving.engine.EngineStats` gives, what
to apply to move the published values from one snapshot to the next (a counter only goes up), and what
each ended request's :class:`~trtllm_bole.serving.engine.RequestLatency` adds to the histograms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from trtllm_bole.serving.engine import FINISH_REASONS, REJECT_REASONS, EngineStats, RequestLatency

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


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
        "bole_engine_status",
        GAUGE,
        "1 while the engine takes requests; 0 once it drains or has stopped, closed or failed (then every "
        "request is refused: a server to restart)",
        "state",
        {"serving": "serving"},
    ),
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
        "bole_rejected_requests",
        COUNTER,
        "Requests refused: the queue full (max_queue_size), the engine shut down, invalid input, an internal "
        "error",
        "reject_reason",
        {reason: f"rejected_{reason}" for reason in REJECT_REASONS},
    ),
    Family(
        "bole_token_metrics",
        COUNTER,
        "Prompt tokens prefilled and tokens generated, of the requests ended",
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

HEARTBEAT = (
    "bole_engine_heartbeat_seconds",
    "When the model's process last published these metrics (Unix seconds; every second): one that stops "
    "moving is a process that died or hangs, whose requests never end (launch.py then stops the server)",
)
"""The heartbeat gauge's name and description: a sample of no engine stat, set at each publication."""


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


LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Histogram:
    """A histogram family: ``samples`` maps each value of ``label`` to what its histogram observes of an
    ended request's latency (nothing where that is None)."""

    name: str
    description: str
    label: str
    buckets: tuple[float, ...]
    samples: dict[str, Callable[[RequestLatency], float | None]]
    kind: str = HISTOGRAM


def _completed(latency: RequestLatency) -> bool:
    return latency.finish_reason in ("length", "stop")


def _per_output_token(latency: RequestLatency) -> float | None:
    """Seconds per token after the first, of a completed request with more than one."""
    if not _completed(latency) or latency.first_token_s is None or latency.output_tokens < 2:
        return None
    return (latency.total_s - latency.first_token_s) / (latency.output_tokens - 1)


HISTOGRAMS = (
    Histogram(
        "bole_request_latency_seconds",
        "Seconds from a request's submission to its first token, and to its end (completed requests)",
        "latency_type",
        LATENCY_BUCKETS,
        {"first_token": lambda x: x.first_token_s, "total": lambda x: x.total_s if _completed(x) else None},
    ),
    Histogram(
        "bole_time_per_output_token_seconds",
        "Seconds per generated token after the first (completed requests of two tokens or more)",
        "token_type",
        TOKEN_BUCKETS,
        {"generated": _per_output_token},
    ),
)


def observations(latencies: list[RequestLatency]) -> list[tuple[str, str, float]]:
    """What ended requests add to the histograms: ``(family, label value, observed value)``."""
    return [
        (h.name, label, value)
        for latency in latencies
        for h in HISTOGRAMS
        for label, measure in h.samples.items()
        if (value := measure(latency)) is not None
    ]
