"""The RMSNorm kernel against a float64 truth, and the dispatch of ``ops.rms_norm``."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole import ops
from trtllm_bole.kernels.norms import rms_norm
from trtllm_bole.reference import norms


def truth(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight.double())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(5, 384), (3, 4, 96), (1, 7)])
def test_matches_float64(shape, dtype, tol, gen, nan_outputs):
    x = (3 * torch.randn(shape, generator=gen)).to(DEVICE, dtype)
    weight = (0.1 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype)
    y = rms_norm(x, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    assert rel_rms(y, truth(x, weight, 1e-6)) <= tol
    assert rel_rms(y, norms.rms_norm(x, weight, 1e-6)) <= tol


def test_a_strided_weight_is_read_as_its_values(gen, nan_outputs):
    x = torch.randn(5, 48, generator=gen).to(DEVICE)
    weights = (0.1 * torch.randn(48, 2, generator=gen)).to(DEVICE)
    assert not weights[:, 0].is_contiguous()
    assert torch.equal(rms_norm(x, weights[:, 0], 1e-6), rms_norm(x, weights[:, 0].contiguous(), 1e-6))


def test_strided_rows_and_empty_input(gen, nan_outputs):
    """The attention's q is a strided split of its projection (q and gate interleaved per head)."""
    q_gate = torch.randn(6, 4, 2 * 32, generator=gen).to(DEVICE)
    q = q_gate.chunk(2, dim=-1)[0]
    weight = torch.randn(32, generator=gen).to(DEVICE)
    assert not q.is_contiguous()
    assert rel_rms(rms_norm(q, weight, 1e-6), truth(q, weight, 1e-6)) <= 1e-6
    assert rms_norm(q[:0], weight, 1e-6).shape == (0, 4, 32)
    assert rms_norm(torch.zeros(3, 0, device=DEVICE), torch.zeros(0, device=DEVICE), 1e-6).shape == (3, 0)


def test_dispatch_checks_the_weight_and_keeps_gradients(gen):
    x = torch.randn(3, 16, generator=gen, requires_grad=True)
    weight = torch.randn(16, generator=gen)
    with pytest.raises(ValueError, match=r"rms_norm weight must be \[16\]"):
        ops.rms_norm(x, weight[:8], 1e-6)
    ops.rms_norm(x, weight, 1e-6).sum().backward()  # training differentiates the norm
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.gpu
def test_cuda_inference_runs_the_kernel_and_training_the_reference(gen):
    x = torch.randn(3, 16, generator=gen).cuda()
    weight = torch.randn(16, generator=gen).cuda()
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6))
    x.requires_grad_(True)
    y = ops.rms_norm(x, weight, 1e-6)
    assert y.grad_fn is not None and torch.equal(y, norms.rms_norm(x, weight, 1e-6))
