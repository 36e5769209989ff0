"""The hardware-calibrated, batch-shared verification budget (BOLE.md §5).

Offline, for each bucket ``c`` = (batch size bucket, KV-length bucket) of one model, GPU and tree
depth, measure the full-model verify latency ``T_ver(N | c)`` for every capacity ``N`` in a fixed set
and the plain decode latency ``T_dec(c)``; keep

    B_ver(c) = max { N : T_ver(N | c) <= (1 + ε) T_dec(c) }

in a :class:`BudgetTable` shipped with the engine. Online, the executor looks up ``B_ver`` for the
live batch and keeps that many tree tokens across the batch, or more where the fairness floor (each
request's pending token and its children) needs more (``drafter.select_tree``).
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

# Up to 2,048 tree tokens: the largest batch bucket (32) of full 64-token trees (the default draft nodes and
# the pending token). A build caps the grid at its engine's own largest step (CalibrationSettings.fitted).
DEFAULT_CAPACITIES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
DEFAULT_KV_BUCKETS = (256, 1024, 4096)
DEFAULT_EPSILON = 0.2

SCHEMA_VERSION = 1


def check_epsilon(epsilon: float) -> None:
    """ε is a number >= 0 (infinity: any verify cost fits). A NaN compares false everywhere, which made
    every budget the smallest capacity without a word."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon >= 0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")


def check_buckets(capacities: Sequence[int], batch_buckets: Sequence[int]) -> None:
    """Every batch bucket needs a capacity at least as large: each request verifies its pending token."""
    unserved = [b for b in batch_buckets if not any(n >= b for n in capacities)]
    if unserved:
        raise ValueError(
            f"batch buckets {unserved} exceed every capacity {list(capacities)}: a verify of B requests "
            "holds at least B tree tokens; add a capacity at least as large"
        )


def budget_from_timings(
    capacities: Sequence[int], t_ver: Sequence[float], t_dec: float, epsilon: float
) -> int:
    """``max{N : T_ver(N) <= (1 + ε) T_dec}``; the smallest capacity if none qualifies."""
    if len(capacities) != len(t_ver) or not capacities:
        raise ValueError("capacities and t_ver must be non-empty and of equal length")
    check_epsilon(epsilon)
    fitting = [n for n, t in zip(capacities, t_ver, strict=True) if t <= (1 + epsilon) * t_dec]
    return max(fitting) if fitting else min(capacities)


@dataclass(slots=True)
class BudgetEntry:
    batch_max: int  # bucket covers batch sizes up to this (inclusive)
    kv_max: int  # and committed KV lengths up to this (inclusive)
    budget: int  # B_ver: total tree tokens across the batch
    t_dec_ms: float
    t_ver_ms: list[float]


@dataclass(slots=True)
class BudgetTable:
    epsilon: float
    capacities: list[int]
    max_depth: int
    device: str
    entries: list[BudgetEntry] = field(default_factory=list)
    gpu_seconds: float = 0.0  # what calibration cost
    model: str = ""  # the calibrated model's Qwen35Config.architecture_id ("": a table from before it)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)  # a table saved with a NaN epsilon (not even valid JSON) is refused

    def check_grid(self) -> None:
        """One entry for every (batch bucket, KV bucket) pair of positive integers, each with a positive
        integer budget and positive finite timings, over increasing capacities: else a step whose sizes
        fall in a hole, or an ε re-derived from bad timings, fails or misleads at serving time, not at
        load (a hand-edited table: string buckets crashed the first step, NaN timings gave the smallest
        budget, unsorted capacities paired timings with the wrong ones)."""
        if not self.entries:
            raise ValueError("the budget table has no entries")
        if not positive_ints(self.capacities) or list(self.capacities) != sorted(set(self.capacities)):
            raise ValueError(f"capacities must be increasing positive integers, got {self.capacities!r}")
        for e in self.entries:
            if not positive_ints([e.batch_max, e.kv_max]):
                raise ValueError(f"buckets must be positive integers, got {e.batch_max!r} x {e.kv_max!r}")
            times = [e.t_dec_ms, *e.t_ver_ms] if isinstance(e.t_ver_ms, list) else None
            if times is None or not all(_positive_number(t) for t in times):
                raise ValueError(
                    f"timings must be positive finite numbers, got t_dec_ms {e.t_dec_ms!r} and t_ver_ms "
                    f"{e.t_ver_ms!r} for batches up to {e.batch_max}"
                )
        cells = [(e.batch_max, e.kv_max) for e in self.entries]
        batches, kvs = sorted({b for b, _ in cells}), sorted({kv for _, kv in cells})
        missing = [(b, kv) for b in batches for kv in kvs if (b, kv) not in cells]
        duplicated = len(cells) != len(set(cells))
        if missing or duplicated:
            raise ValueError(
                f"the budget table must hold one entry per batch and KV bucket ({batches} x {kvs}), "
                f"missing {missing}" + (", with duplicates" if duplicated else "")
            )
        bad = [e.budget for e in self.entries if isinstance(e.budget, bool) or not isinstance(e.budget, int)
               or e.budget < 1]  # fmt: skip
        if bad:
            raise ValueError(f"budgets must be positive integers, got {bad}")

    def lookup(self, batch_size: int, kv_len: int, epsilon: float | None = None) -> int:
        """B_ver for the smallest bucket that covers (batch_size, kv_len); the largest bucket
        beyond the calibrated range (budgets grow with batch, so this is conservative).

        ``epsilon`` other than the table's own re-derives the budget from the stored timings, so ε
        can be changed at serving time without recalibrating.
        """
        if not self.entries:
            raise ValueError("the budget table has no entries")
        batch_keys = sorted({e.batch_max for e in self.entries})
        kv_keys = sorted({e.kv_max for e in self.entries})
        b = batch_keys[min(bisect.bisect_left(batch_keys, batch_size), len(batch_keys) - 1)]
        kv = kv_keys[min(bisect.bisect_left(kv_keys, kv_len), len(kv_keys) - 1)]
        entry = next((e for e in self.entries if e.batch_max == b and e.kv_max == kv), None)
        if entry is None:
            raise ValueError(f"the budget table has no entry for batch bucket {b} and KV bucket {kv}")
        if epsilon is None or epsilon == self.epsilon:
            return entry.budget
        usable = [n for n in self.capacities if n >= entry.batch_max][: len(entry.t_ver_ms)]
        if len(usable) != len(entry.t_ver_ms) or not usable:
            raise ValueError(
                f"the budget table cannot re-derive a budget at epsilon {epsilon}: its entry for batches "
                f"up to {entry.batch_max} holds {len(entry.t_ver_ms)} verify timings for {len(usable)} "
                f"capacities >= {entry.batch_max}; serve at its own epsilon {self.epsilon} or recalibrate"
            )
        return budget_from_timings(usable, entry.t_ver_ms, entry.t_dec_ms, epsilon)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> BudgetTable:
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict):
                raise ValueError(f"a JSON object was expected, got {type(data).__name__}")
            if data.get("schema_version") != SCHEMA_VERSION:
                raise ValueError(f"schema version {data.get('schema_version')}, expected {SCHEMA_VERSION}")
            data["entries"] = [BudgetEntry(**e) for e in data["entries"]]
            table = cls(**data)
            table.check_grid()
            return table
        except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"{path}: not a valid budget table ({exc})") from exc


def positive_ints(values: Sequence[object]) -> bool:
    """Every value an integer of 1 or more (a bool is not one)."""
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def timed_capacities(capacities: Sequence[int], batch: int, per_request: int | None) -> list[int]:
    """The capacities (sorted) a bucket of ``batch`` requests is timed at: from ``batch`` (every request
    verifies its pending token) up to the first that holds ``batch`` trees of ``per_request`` tokens, the
    largest a step of theirs can verify (a larger budget keeps the same trees: timing it is wasted)."""
    usable = sorted(n for n in capacities if n >= batch)
    if per_request is None:
        return usable
    reach = batch * per_request
    return [n for n in usable if n < reach] + [n for n in usable if n >= reach][:1]


def calibrate(
    time_verify: Callable[[int, int, int], float],
    time_decode: Callable[[int, int], float],
    *,
    device: str,
    max_depth: int,
    epsilon: float = DEFAULT_EPSILON,
    capacities: Sequence[int] = DEFAULT_CAPACITIES,
    batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    kv_buckets: Sequence[int] = DEFAULT_KV_BUCKETS,
    per_request: int | None = None,
    model: str = "",
    progress: bool = True,
) -> BudgetTable:
    """Measure every bucket with the given timers (seconds per step) and build the table (``model``: the
    timed model's architecture id, recorded).

    ``time_verify(batch, kv_len, capacity)``: a full-model verify step of ``capacity`` tree tokens
    spread over ``batch`` requests with ``kv_len`` committed tokens each; ``time_decode(batch,
    kv_len)``: one plain decode step. A bucket is timed at :func:`timed_capacities` (``per_request``:
    the most tree tokens one request verifies, if the engine bounds it).
    """
    check_buckets(capacities, batch_buckets)
    start = time.perf_counter()
    # Sorted: an entry's timings are a prefix of the table's capacities from its batch on.
    capacities = sorted(capacities)
    table = BudgetTable(epsilon, capacities, max_depth, device, model=model)
    buckets = [(b, kv) for b in batch_buckets for kv in kv_buckets]
    for batch, kv_len in tqdm(
        buckets, desc="calibrating verification budget", unit="bucket", disable=not progress
    ):
        usable = timed_capacities(capacities, batch, per_request)
        t_dec = time_decode(batch, kv_len)
        t_ver = [time_verify(batch, kv_len, n) for n in usable]
        table.entries.append(
            BudgetEntry(
                batch_max=batch,
                kv_max=kv_len,
                budget=budget_from_timings(usable, t_ver, t_dec, epsilon),
                t_dec_ms=t_dec * 1e3,
                t_ver_ms=[t * 1e3 for t in t_ver],
            )
        )
    table.gpu_seconds = time.perf_counter() - start
    return table
