"""The closed form on the inputs that break a power series: a run of repeated tokens.

A prompt that repeats a token (indentation, a ruler of ``=``) gives its GDN layers the same unit key,
the same β and the same decay at every position. On such a chain ``(G^m)_ij`` sums ``C(i - j - 1, m - 1)``
paths, so the Neumann series of BOLE.md's Lemma 3, and its squared form ``(I - G)(I + G²)(I + G⁴)…``,
add terms of ~β(1 + β)^n that cancel to a result of order one: before 2026-12-04 the kernels' fp32 O
was off by 30-300x on chains of 32-64 such nodes (β 0.9-0.99, no decay), while random keys passed. The
solves now are back substitution (the compact factors, the reference) and block doubling (the blocked
kernel, the dense factors, the prefill), whose products only see bounded entries of exact inverses.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.helpers import DEVICE, rel_rms
from tests.kernels.test_gdn_tree_verify import EXACT, SERVING, check, run, truth
from trtllm_bole.kernels import gdn_prefill
from trtllm_bole.kernels.gdn_tree_verify import InverseConfig, VerifyConfig, exact_config
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import GDNInputs, chain_parents, forest, topk_parents
from trtllm_bole.tree import TreeBatch

HARD = {"beta=0.99, no decay": (0.99, 0.0), "beta=0.9, slow decay": (0.9, -0.01)}


def repeated_keys(n, h, hv, dk, dv, beta, g, gen, num_requests=1, dtype=torch.float32):
    """One key for every node and head (unit norm), constant gates; random q, v and state (float64,
    q/k/v rounded to ``dtype`` first, so the oracle sees what the kernel sees)."""
    key = F.normalize(torch.randn(dk, generator=gen, dtype=torch.float64), dim=0)
    q = F.normalize(torch.randn(n, h, dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen, dtype=torch.float64)
    state = torch.randn(num_requests, hv, dk, dv, generator=gen, dtype=torch.float64) * 0.1
    x = GDNInputs(
        q.to(dtype).double(),
        key.expand(n, h, dk).to(dtype).double(),
        v.to(dtype).double(),
        torch.full((n, hv), g, dtype=torch.float64),
        torch.full((n, hv), beta, dtype=torch.float64).float().double(),
        state.float().double(),
        dk**-0.5,
    )
    return GDNInputs(*(t.to(DEVICE) for t in (x.q, x.k, x.v, x.g, x.beta, x.state)), x.scale)


def _deep_tree(n: int) -> list[int]:
    """A chain of ``n - 8`` nodes with eight side twigs: a tree, and as deep as the chain."""
    parents = chain_parents(n - 8)
    return parents + [2 * i for i in range(8)]


@pytest.mark.parametrize("gates", list(HARD), ids=list(HARD))
def test_reference_closed_form_in_float32(gates, gen):
    """The CPU serving path's closed form (float32 in, float32 out) against the float64 walk."""
    tree = forest([chain_parents(64), _deep_tree(40)], device=DEVICE)
    x = repeated_keys(tree.num_nodes, 1, 2, 16, 16, *HARD[gates], gen, num_requests=2)
    o, _ = gdn_tree.serial_tree_recurrence(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    args = (t.float() for t in (x.q, x.k, x.v, x.g, x.beta, x.state))
    o32, _, _ = gdn_tree.closed_form_tree_verify(*args, tree, scale=x.scale)
    assert rel_rms(o32, o) <= EXACT


@pytest.mark.parametrize("gates", list(HARD), ids=list(HARD))
@pytest.mark.parametrize(
    "config",
    [VerifyConfig(bt=16, bk=16, bv=16), exact_config(16, 16), VerifyConfig(bt=64, bk=16, bv=16, num_warps=4)],
    ids=["blocked-16", "blocked-32", "blocked-64"],
)
def test_blocked_kernel_fp32(config, gates, gen, nan_outputs):
    tree = forest([chain_parents(64), _deep_tree(40), topk_parents(30, 2, 12)], device=DEVICE)
    x = repeated_keys(tree.num_nodes, 1, 2, 16, 16, *HARD[gates], gen, num_requests=3)
    check(run(x, tree, torch.float32, config=config), truth(x, tree), EXACT)


@pytest.mark.parametrize("gates", list(HARD), ids=list(HARD))
@pytest.mark.parametrize("launches", [1, 2])
@pytest.mark.parametrize("nodes", [16, 64], ids=["compact-depth-16", "dense-depth-40"])
def test_explicit_inverse_fp32(nodes, launches, gates, gen, nan_outputs):
    """Depth 16 takes the compact factors (back substitution), deeper trees the dense ones."""
    tree = forest([chain_parents(16) if nodes == 16 else _deep_tree(48)], device=DEVICE)
    x = repeated_keys(tree.num_nodes, 1, 2, 16, 16, *HARD[gates], gen)
    config = InverseConfig(bt=nodes, bk=16, bv=16, num_warps=4, launches=launches, warps1=4)
    check(run(x, tree, torch.float32, config=config), truth(x, tree), EXACT)


@pytest.mark.parametrize("gates", list(HARD), ids=list(HARD))
def test_prefill_fp32(gates, gen, nan_outputs):
    lengths = [100, 64]
    x = repeated_keys(sum(lengths), 1, 2, 16, 16, *HARD[gates], gen, num_requests=2)
    pool = x.state.float()
    o = gdn_prefill.gdn_prefill(
        *(t.float() for t in (x.q, x.k, x.v, x.g, x.beta)), pool, lengths, scale=x.scale
    )
    chains = TreeBatch.chains(lengths, device=DEVICE)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        x.q, x.k, x.v, x.g, x.beta, x.state, chains, scale=x.scale
    )
    assert rel_rms(o, o_ref) <= EXACT
    assert rel_rms(pool, states[chains.cu_seqlens[1:] - 1]) <= EXACT


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_size_prefill_and_verify(dtype, gen, nan_outputs):
    """Qwen3.5-9B heads: a 256-token run through the prefill, and a chain of 64 and the engine's tree
    through the launcher's default verify, each in its precision's tolerance."""
    tol = EXACT if dtype == torch.float32 else SERVING
    x = repeated_keys(256, 16, 32, 128, 128, *HARD["beta=0.99, no decay"], gen, dtype=dtype)
    pool = x.state.float()
    o = gdn_prefill.gdn_prefill(
        *(t.to(dtype) for t in (x.q, x.k, x.v)), x.g.float(), x.beta.float(), pool, [256], scale=x.scale
    )
    chains = TreeBatch.chains([256], device=DEVICE)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        x.q, x.k, x.v, x.g, x.beta, x.state, chains, scale=x.scale
    )
    assert rel_rms(o, o_ref) <= tol
    assert rel_rms(pool, states[-1:]) <= tol
    tree = forest([chain_parents(64), topk_parents(64, 4, 9)], device=DEVICE)
    x = repeated_keys(tree.num_nodes, 16, 32, 128, 128, 0.99, 0.0, gen, num_requests=2, dtype=dtype)
    check(run(x, tree, dtype), truth(x, tree), tol)
