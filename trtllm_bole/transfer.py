"""Copies between host and device that do not wait for the device.

A plain ``tensor.to("cuda")`` (or ``torch.tensor(data, device="cuda")``) synchronises the stream after
the copy: the host waits for every kernel queued before it. The executor makes a few small tensors
per step and per draft level from host lists; copied from pinned memory without blocking, they join
the stream in order (kernels queued after the copy see the data) and the host runs on. The other way,
:class:`HostCopy` queues a device tensor's copy to pinned memory, so that more work can be queued
before the host waits, and then waits for the copy alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``; to a GPU through pinned memory, without a stream sync."""
    device = torch.device(device)
    if device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def device_tensor(
    data: Sequence, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype)`` made on the host and moved by :func:`to_device`."""
    return to_device(torch.tensor(data, dtype=dtype), device)


class HostCopy:
    """``t``'s values on the host: on a GPU the copy joins the stream now (into pinned memory) and
    :meth:`tolist` waits for it alone, not for the work queued after it; on the CPU a plain view."""

    def __init__(self, t: torch.Tensor) -> None:
        self._done: torch.cuda.Event | None = None
        if not t.is_cuda:
            self._host = t
            return
        self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._host.copy_(t, non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record()

    def tolist(self) -> list:
        if self._done is not None:
            self._done.synchronize()
        return self._host.tolist()
