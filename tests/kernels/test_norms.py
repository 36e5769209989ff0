"""The norm kernels (RMSNorm alone and with the rotary embedding, the GDN layer's q/k norms with its gates,
and its gated output norm) against a float64 truth and the torch reference, and their dispatch."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole import ops
from trtllm_bole.kernels.norms import gated_rms_norm, gdn_inputs, rms_norm, rms_norm_rope
from trtllm_bole.reference import norms, rope


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


def test_the_norms_refuse_integer_tensors():
    """An integer x came back truncated from rms_norm and gated_rms_norm, and an integer qk gave
    gdn_inputs q and k of zeros, without a word."""
    x, w = torch.ones(3, 2, 8, dtype=torch.long, device=DEVICE), torch.zeros(8, device=DEVICE)
    f = x.float()
    cos = torch.ones(3, 4, device=DEVICE)
    calls = {
        "x": [lambda: ops.rms_norm(x, w, 1e-6), lambda: ops.rms_norm_rope(x, w, 1e-6, cos, cos),
              lambda: ops.gated_rms_norm(x, f, w, 1e-6)],
        "gate": [lambda: ops.gated_rms_norm(f, x, w, 1e-6)],
        "qk": [lambda: ops.gdn_inputs(x[:, 0], f[:, 0, :2], f[:, 0, :2], w[:2], w[:2], 2)],
    }  # fmt: skip
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError, match=f"{name} must be a floating-point tensor, got torch.int64"):
                fn()


@pytest.mark.gpu
def test_cuda_inference_runs_the_kernel_and_training_the_reference(gen):
    x = torch.randn(3, 16, generator=gen).cuda()
    weight = torch.randn(16, generator=gen).cuda()
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6))
    x.requires_grad_(True)
    y = ops.rms_norm(x, weight, 1e-6)
    assert y.grad_fn is not None and torch.equal(y, norms.rms_norm(x, weight, 1e-6))


def rope_truth(x, weight, eps, cos, sin):
    """Norm then rotate-half RoPE in float64 (the full-width tables of transformers)."""
    y = truth(x, weight, eps)
    half = cos.shape[-1]
    c, s = (torch.cat([t, t], dim=-1).double()[:, None, :] for t in (cos, sin))
    rotated = torch.cat([-y[..., half : 2 * half], y[..., :half]], dim=-1)
    return torch.cat([y[..., : 2 * half] * c + rotated * s, y[..., 2 * half :]], dim=-1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rotary_dim", [16, 64], ids=["partial", "full"])
def test_norm_rope_matches_the_reference_and_float64(rotary_dim, dtype, tol, gen, nan_outputs):
    """q as the attention splits it (strided: q and gate interleaved per head), positions up to 5,000."""
    q_gate = (3 * torch.randn(6, 4, 2 * 64, generator=gen)).to(DEVICE, dtype)
    q = q_gate.chunk(2, dim=-1)[0]
    weight = (0.1 * torch.randn(64, generator=gen)).to(DEVICE, dtype)
    positions = torch.tensor([0, 1, 7, 300, 4095, 5000], device=DEVICE)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(10000.0, rotary_dim, torch.device(DEVICE)), dtype)
    y = rms_norm_rope(q, weight, 1e-6, cos, sin)
    assert y.shape == q.shape and y.dtype == dtype and y.is_contiguous()
    assert rel_rms(y, rope_truth(q, weight, 1e-6, cos, sin)) <= tol
    reference = rope.rms_norm_rope(q, weight, 1e-6, cos, sin)
    # Triton's interpreter truncates to bf16 where the GPU rounds: the GPU test below holds the kernel
    # to the torch path bit for bit.
    assert rel_rms(y, reference) <= (1e-6 if dtype == torch.float32 else 1e-2)
    assert rms_norm_rope(q[:0], weight, 1e-6, cos[:0], sin[:0]).shape == (0, 4, 64)


def test_ops_norm_rope_checks_its_tables(gen):
    x = torch.randn(3, 2, 32, generator=gen)
    cos, sin = rope.cos_sin(torch.arange(3), rope.inv_freq(10000.0, 8, torch.device("cpu")), torch.float32)
    torch.testing.assert_close(
        ops.rms_norm_rope(x, torch.zeros(32), 1e-6, cos, sin),
        rope.rms_norm_rope(x, torch.zeros(32), 1e-6, cos, sin),
    )
    with pytest.raises(ValueError, match="x \\[N, heads, head_dim\\]"):
        ops.rms_norm_rope(x[0], torch.zeros(32), 1e-6, cos, sin)
    with pytest.raises(ValueError, match="rotary_dim / 2"):
        ops.rms_norm_rope(x, torch.zeros(32), 1e-6, cos[:2], sin[:2])
    with pytest.raises(ValueError, match="dtype"):
        ops.rms_norm_rope(x, torch.zeros(32), 1e-6, cos.double(), sin.double())
    x.requires_grad_(True)
    ops.rms_norm_rope(x, torch.zeros(32), 1e-6, cos, sin).sum().backward()  # training takes the reference
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.gpu
def test_cuda_norm_rope_is_the_torch_path_bit_for_bit_in_bf16(gen):
    """The kernel rounds each product and the sum to bf16 as the torch path (the norm kernel, then
    transformers' rotate-half in bf16) does on the GPU."""
    q = (3 * torch.randn(64, 8, 256, generator=gen)).cuda().bfloat16()
    weight = (0.1 * torch.randn(256, generator=gen)).cuda().bfloat16()
    cos, sin = rope.cos_sin(
        torch.arange(1000, 1064).cuda(), rope.inv_freq(1e7, 64, torch.device("cuda")), q.dtype
    )
    assert torch.equal(
        rms_norm_rope(q, weight, 1e-6, cos, sin), rope.apply_rope(rms_norm(q, weight, 1e-6), cos, sin)
    )


def test_norm_rope_rounds_as_the_reference_in_fp16(gen, nan_outputs):
    """Each product and the sum rounded to x's dtype where the reference rounds them. fp16, which the
    interpreter rounds as the GPU does (it truncates bf16): at most 1% of the outputs may differ (a
    reduction order can move a norm by an ulp), where skipping one of the roundings moves ~5%."""
    q = (3 * torch.randn(16, 4, 2 * 64, generator=gen)).to(DEVICE, torch.float16).chunk(2, dim=-1)[0]
    weight = (0.4 * torch.randn(64, generator=gen)).to(DEVICE, torch.float16)
    positions = torch.arange(100, 116, device=DEVICE)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(10000.0, 32, torch.device(DEVICE)), torch.float16)
    y = rms_norm_rope(q, weight, 1e-6, cos, sin)
    assert (y != rope.rms_norm_rope(q, weight, 1e-6, cos, sin)).float().mean() <= 0.01


def gdn_inputs_truth(qk, a, b, a_log, dt_bias, heads):
    q, k = qk.double().unflatten(-1, (2, heads, -1)).unbind(-3)
    q, k = (x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for x in (q, k))
    g = -a_log.double().exp() * torch.nn.functional.softplus(a.double() + dt_bias.double())
    return q, k, g, b.double().sigmoid()


def gdn_layer_inputs(n, heads, dk, hv, dtype, gen):
    """q|k as the layer splits them off its conv output (strided rows, v beside them), and a and b as
    splits of its projection."""
    mixed = (3 * torch.randn(n, 2 * heads * dk + hv * 8, generator=gen)).to(DEVICE, dtype)
    ba = (4 * torch.randn(n, 5 + 2 * hv, generator=gen)).to(DEVICE, dtype)
    a_log = torch.randn(hv, generator=gen).to(DEVICE)
    dt_bias = torch.randn(hv, generator=gen).to(DEVICE, dtype)
    return mixed[:, : 2 * heads * dk], ba[:, 5 + hv :], ba[:, 5 : 5 + hv], a_log, dt_bias


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads, dk, hv", [(2, 16, 4), (3, 24, 6)], ids=["pow2", "odd"])
def test_gdn_inputs_match_float64_and_the_reference(heads, dk, hv, dtype, tol, gen, nan_outputs):
    qk, a, b, a_log, dt_bias = gdn_layer_inputs(7, heads, dk, hv, dtype, gen)
    assert not qk.is_contiguous() and not a.is_contiguous()
    out = gdn_inputs(qk, a, b, a_log, dt_bias, heads)
    reference = norms.gdn_inputs(qk, a, b, a_log, dt_bias, heads)
    for ours, truth, ref in zip(
        out, gdn_inputs_truth(qk, a, b, a_log, dt_bias, heads), reference, strict=True
    ):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype and ours.is_contiguous()
        assert rel_rms(ours, truth) <= tol
        assert rel_rms(ours, ref) <= tol
    assert [t.shape for t in gdn_inputs(qk[:0], a[:0], b[:0], a_log, dt_bias, heads)] == [
        (0, heads, dk), (0, heads, dk), (0, hv), (0, hv)
    ]  # fmt: skip


def test_gdn_decay_is_exact_at_both_ends_of_softplus(nan_outputs):
    """``a + dt_bias`` from -40 (softplus ~4e-18: ``log(1 + e)`` alone would give 0, a decay of exactly 1)
    to 40 (past torch's threshold of 20, where softplus is the identity), to a few float32 ulps (the
    GPU's exp and log are approximate: its ``log(1 + e)`` near 1 was 1e-5 off)."""
    x = torch.linspace(-40, 40, 321, dtype=torch.float64)
    qk = torch.ones(321, 4, device=DEVICE)
    a_log = torch.tensor([0.5], device=DEVICE)
    _, _, g, _ = gdn_inputs(
        qk, x[:, None].float().to(DEVICE), qk[:, :1], a_log, torch.zeros(1, device=DEVICE), 1
    )
    truth = -torch.tensor(0.5).exp().double() * torch.nn.functional.softplus(x.float().double())
    assert ((g[:, 0].double().cpu() - truth).abs() <= 2e-6 * truth.abs()).all()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_gated_rms_norm_matches_float64_and_the_reference(dtype, tol, gen, nan_outputs):
    """x as the recurrence returns it, the gate a strided split of the projection."""
    x = (3 * torch.randn(6, 4, 32, generator=gen)).to(DEVICE, dtype)
    z = (2 * torch.randn(6, 4 * 32 + 10, generator=gen)).to(DEVICE, dtype)[:, 10:].unflatten(-1, (4, 32))
    weight = (1 + 0.1 * torch.randn(32, generator=gen)).to(DEVICE, dtype)
    assert not z.is_contiguous()
    y = gated_rms_norm(x, z, weight, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    x64, z64 = x.double(), z.double()
    truth = (
        x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double() * z64 * z64.sigmoid()
    )
    assert rel_rms(y, truth) <= tol
    # Triton's interpreter truncates to bf16 where the GPU and torch round, at each of three roundings;
    # the fp16 test below holds the kernel to the reference's roundings.
    assert rel_rms(y, norms.gated_rms_norm(x, z, weight, 1e-6)) <= 2 * tol
    assert gated_rms_norm(x[:0], z[:0], weight, 1e-6).shape == (0, 4, 32)


@pytest.mark.parametrize("weight_dtype", [torch.float16, torch.float32])
def test_gated_rms_norm_rounds_as_the_reference_in_fp16(weight_dtype, gen, nan_outputs):
    """The norm and its product with the weight rounded to x's dtype where the reference rounds them
    (fp16, which the interpreter rounds as the GPU does; with a float32 weight torch's product stays
    float32): at most 1% of the outputs may differ by a reduction order or an exp, where a rounding
    skipped or added moves far more (rounding the product of a float32 weight moved 25%)."""
    x = (3 * torch.randn(32, 4, 64, generator=gen)).to(DEVICE, torch.float16)
    z = (2 * torch.randn(32, 4, 64, generator=gen)).to(DEVICE, torch.float16)
    weight = (1 + 0.4 * torch.randn(64, generator=gen)).to(DEVICE, weight_dtype)
    y = gated_rms_norm(x, z, weight, 1e-6)
    assert (y != norms.gated_rms_norm(x, z, weight, 1e-6)).float().mean() <= 0.01


def test_ops_gdn_inputs_and_gated_norm_check_shapes_and_keep_gradients(gen):
    """Any leading dims (training's ``[B, L]``, serving's ``[N]``); training differentiates the reference."""
    qk, a, b, a_log, dt_bias = (t.cpu() for t in gdn_layer_inputs(6, 2, 8, 4, torch.float32, gen))
    batched = [t.unflatten(0, (2, 3)) for t in (qk, a, b)]
    flat = ops.gdn_inputs(qk, a, b, a_log, dt_bias, 2)
    for ours, rows in zip(ops.gdn_inputs(*batched, a_log, dt_bias, 2), flat, strict=True):
        assert torch.equal(ours, rows.unflatten(0, (2, 3)))
    for ours, rows in zip(ops.gdn_inputs(qk[0], a[0], b[0], a_log, dt_bias, 2), flat, strict=True):
        assert torch.equal(ours, rows[0])  # one token, no leading dims (unflatten once refused it)
    with pytest.raises(ValueError, match="2 \\* heads \\* dk"):
        ops.gdn_inputs(qk, a, b, a_log, dt_bias, 3)
    with pytest.raises(ValueError, match="b must be \\[6, 4\\]"):
        ops.gdn_inputs(qk, a, b[:, :3], a_log, dt_bias, 2)
    with pytest.raises(ValueError, match="dt_bias must be \\[4\\]"):
        ops.gdn_inputs(qk, a, b, a_log, dt_bias[:2], 2)
    x, z = torch.randn(2, 3, 4, 8, generator=gen), torch.randn(2, 3, 4, 8, generator=gen)
    assert torch.equal(
        ops.gated_rms_norm(x, z, torch.ones(8), 1e-6), norms.gated_rms_norm(x, z, torch.ones(8), 1e-6)
    )
    with pytest.raises(ValueError, match="a gate of its shape"):
        ops.gated_rms_norm(x, z[..., :4], torch.ones(8), 1e-6)
    qk.requires_grad_(True)
    x.requires_grad_(True)
    (
        ops.gdn_inputs(qk, a, b, a_log, dt_bias, 2)[0].sum()
        + ops.gated_rms_norm(x, z, torch.ones(8), 1e-6).sum()
    ).backward()
    assert qk.grad is not None and x.grad is not None
