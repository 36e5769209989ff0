"""CUDA-graph capture after a failed capture (GPU only), and what a graph set counts."""

import pytest
import torch

from trtllm_bole.spec import graphs
from trtllm_bole.spec.graphs import CacheGraphs, capture


@pytest.mark.gpu
@pytest.mark.parametrize("failure", ["raises while captured", "host sync"])
def test_a_failed_capture_leaves_captures_and_launches_working(failure):
    """The call raises during the capture, or syncs with the host (refused before the capture begins: a
    sync inside one would leave torch unusable): either way the capture raises, the current stream is the
    one before it, the pool takes the next capture, a graph captured before still replays and random
    draws work."""
    x = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    before, five_x = capture(lambda: x * 5, pool)

    def fails():
        y = x * 2
        if failure == "host sync":
            return y.sum().item()
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("planted")
        return y

    stream = torch.cuda.current_stream()
    with pytest.raises(ValueError if failure == "raises while captured" else RuntimeError):
        capture(fails, pool)
    assert torch.cuda.current_stream() == stream
    for into in (pool, None):
        graph, out = capture(lambda: x * 3 + 1, into)
        graph.replay()
        before.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x * 3 + 1) and torch.equal(five_x, x * 5)
    assert torch.randn(8, device="cuda").isfinite().all()


class _Owner:
    def __init__(self):
        self.cache = object()


class _Graphs(CacheGraphs):
    def add(self, key):
        self._follow_cache()
        self._graphs[key], _ = self._capture(lambda: key)


def test_a_graph_set_counts_every_capture_through_a_cache_replacement(monkeypatch):
    """What a benchmark counts inside a timed run (``bench.py``'s ``graph_captures``): every capture, also
    of graphs captured again after a replaced cache dropped them (the set's size went down then)."""
    monkeypatch.setattr(graphs, "capture", lambda run, pool: (object(), run()))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
    owner = _Owner()
    shapes = _Graphs(owner)
    shapes.add(1)
    shapes.add(2)
    assert shapes.captured == [1, 2] and shapes.captures == 2
    owner.cache = object()  # a larger cache: the graphs read the old one's addresses
    shapes.add(2)
    assert shapes.captured == [2] and shapes.captures == 3
