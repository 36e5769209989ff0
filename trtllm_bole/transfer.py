"""Host-to-device copies that do not wait for the device.

A plain ``tensor.to("cuda")`` (or ``torch.tensor(data, device="cuda")``) synchronises the stream after
the copy: the host waits for every kernel queued before it. The executor makes a few small tensors
per step and per draft level from host lists; copied from pinned memory without blocking, they join
the stream in order (kernels queued after the copy see the data) and the host runs on.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``; to a GPU through pinned memory, without a stream sync."""
    device = torch.device(device)
    if device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def device_tensor(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype)`` made on the host and moved by :func:`to_device`."""
    return to_device(torch.tensor(data, dtype=dtype), device)
