"""Host-to-device copies without a stream sync keep the values they were given."""

import pytest
import torch

from trtllm_bole.transfer import HostCopy, device_tensor, to_device


def test_on_cpu_it_is_a_plain_copy():
    t = torch.arange(5)
    assert to_device(t, "cpu") is t
    assert torch.equal(device_tensor([1, 2], "cpu", torch.int32), torch.tensor([1, 2], dtype=torch.int32))
    assert HostCopy(torch.tensor([[1, 2], [3, 4]])).tolist() == [[1, 2], [3, 4]]


@pytest.mark.gpu
def test_gpu_copy_is_ordered_and_keeps_the_values_given():
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # queue work, so that an unordered or lazy copy would show
        busy = busy @ busy / 64
    host = torch.arange(1000)
    moved = to_device(host, "cuda")
    host.zero_()  # the copy went from a pinned snapshot: later host writes do not reach it
    assert torch.equal(moved.cpu(), torch.arange(1000))
    assert device_tensor([3, 4], "cuda").tolist() == [3, 4]
    assert to_device(moved, "cuda") is moved  # already there: no pinning of device memory


@pytest.mark.gpu
def test_host_copy_holds_the_values_at_its_place_in_the_stream():
    """Queued behind slow work and before a kernel that overwrites the tensor, the copy holds the values
    in between."""
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        busy = busy @ busy / 64
    values = torch.arange(1000, device="cuda") + busy[0, :1].long() * 0
    copy = HostCopy(values)
    values.zero_()
    for _ in range(20):
        busy = busy @ busy / 64
    assert copy.tolist() == list(range(1000))
