"""What the executor's CUDA graphs share (:mod:`.draft_graphs`, :mod:`.verify_graphs`).

A graph replays the kernels of one captured call on fixed addresses: its inputs are copied into static
buffers, its outputs are the captured call's tensors, refilled by every replay, and the caches it
reads must be the ones it was captured on. :class:`CacheGraphs` keeps a model part's graphs by key,
holds the part weakly (a shared registry must not keep a model alive) and drops the graphs when the
part's cache is replaced; :func:`capture` records one call.

The graphs of one :class:`CacheGraphs` share one memory pool: each keeps its outputs, the temporaries
are shared. So a graph's outputs are valid until the next replay of any graph of the set (the executor
reads a step's draft pool, selected forest, logits and pending commit before the next draft, selection
or verify, and copies what it keeps longer).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, Self, TypeVar

import torch

T = TypeVar("T")
Owner = TypeVar("Owner")


def capture(run: Callable[[], T], pool: Any = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """``run()`` captured into a CUDA graph (memory from ``pool``, a ``torch.cuda.graph_pool_handle()``
    shared by graphs that never replay at the same time, or a private pool). Returns the graph and the
    captured call's outputs.

    Two runs on a side stream come first, outside the capture: the first does the lazy initialisations,
    compiles and autotuning, which must not be recorded; the second runs with torch's sync debug mode set
    to ``"error"``, so that a call which syncs with the host raises before any capture begins. A sync
    inside a capture invalidates it, and ending an invalidated capture leaves torch unusable in the
    process (measured with torch 2.11 on the H200: the current stream stays the capture stream, the
    memory pool refuses the next capture, "already recording to mempool_id", and every later CUDA random
    draw fails, "Offset increment outside graph capture"). A call that raises while captured, without
    syncing, leaves nothing behind: torch's graph context ends that capture.

    The runs and the capture are on one stream of the device's (:func:`_capture_stream`)."""
    side = _capture_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
        with _host_syncs_refused():
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        outputs = run()
    return graph, outputs


@functools.cache
def _capture_stream(device: int) -> torch.cuda.Stream:
    """The stream of every capture on ``device`` and of its runs before it. One, not one a capture: torch
    keeps a cuBLAS workspace for each stream a GEMM ran on (32 MiB on Hopper) for the life of the
    process, and a new stream a capture had left 19 of them, 608 MiB, allocated after a warmed-up LLM
    was shut down (an H100; torch draws streams from a pool of 32, so it grows no further than that)."""
    return torch.cuda.Stream(device)


@contextmanager
def _host_syncs_refused() -> Iterator[None]:
    """Torch's sync debug mode at ``"error"`` (its warning that the mode is a prototype which may miss
    some syncs silenced: a sync it misses still fails the capture, as before)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class CacheGraphs(Generic[Owner]):
    """Graphs captured on ``owner``'s cache (``owner.cache``), by key. :meth:`of` shares one set per
    owner and settings among the executors that serve it, through a weak registry per subclass."""

    _registry: ClassVar[weakref.WeakKeyDictionary]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._registry = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, owner: Owner, **settings: Any) -> Self:
        """The graphs of this owner and these settings (the constructor's keywords), made once."""
        per_owner = cls._registry.setdefault(owner, {})
        key = tuple(sorted(settings.items()))
        if key not in per_owner:
            per_owner[key] = cls(owner, **settings)
        return per_owner[key]

    def __init__(self, owner: Owner) -> None:
        self._owner = weakref.ref(owner)
        self._cache = owner.cache
        self._graphs: dict[Hashable, Any] = {}
        self._pool: Any = None  # the graphs' shared memory pool, made by the first capture
        self.captures = 0  # graphs captured in this set's life, those a replaced cache dropped included

    def _capture(self, run: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        captured = capture(run, self._pool)
        self.captures += 1
        return captured

    @property
    def owner(self) -> Owner:
        owner = self._owner()
        if owner is None:
            raise RuntimeError(f"the model part of these {type(self).__name__} no longer exists")
        return owner

    @property
    def captured(self) -> list:
        """Keys with a captured graph, sorted."""
        return sorted(self._graphs)

    def release(self) -> None:
        """Drop every graph, their memory pool (whose memory their outputs hold) and the cache they were
        captured on: what a shut-down executor does, not leaving it to the last reference to this set (a
        later capture makes a new pool on the owner's cache)."""
        self._graphs.clear()
        self._pool = None
        self._cache = None

    def _follow_cache(self) -> None:
        """Drop the graphs of a replaced cache (they read its addresses), and their memory pool with them:
        a pool whose graphs are all gone is released, and cannot take a new capture."""
        if self.owner.cache is not self._cache:
            self.release()
            self._cache = self.owner.cache


__all__ = ["CacheGraphs", "capture"]
