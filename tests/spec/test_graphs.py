"""CUDA-graph capture after a failed capture (GPU only)."""

import pytest
import torch

from trtllm_bole.spec.graphs import capture


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
