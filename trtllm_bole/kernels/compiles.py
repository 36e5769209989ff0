"""Which kernel variants Triton compiles, and when: a compile inside a timed run or under traffic costs
a tenth of a second to seconds (a latency spike), so warm-ups must meet every variant first.

Triton compiles one binary per kernel, constexprs and *specialisation* of the runtime arguments (an
integer equal to 1 or divisible by 16, a pointer aligned to 16 bytes), the first time a launch in the
process meets it (loading it from Triton's disk cache when an earlier process compiled it: still tens of
milliseconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def recording_compiles() -> Iterator[list[str]]:
    """Yields a list that collects the name of each kernel variant Triton compiles (or loads from its disk
    cache) inside the block: Triton's post-compile hook, chained to any hook already set. The
    interpreter compiles nothing."""
    from triton import knobs

    compiled: list[str] = []
    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, fn: Any, **kwargs: Any) -> Any:
        compiled.append(fn.name)
        return previous(fn=fn, **kwargs) if previous else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield compiled
    finally:
        knobs.runtime.jit_post_compile_hook = previous


__all__ = ["recording_compiles"]
