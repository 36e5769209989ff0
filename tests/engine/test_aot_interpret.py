"""The AOT adapters run in Triton's interpreter with TensorRT's argument order, against the references.

Each launch passes exactly ``spec.params`` — input tensors, int32 extra args, output tensors — with
the constexprs, grid and warps of ``spec`` for tactic 0: the numbers the PTX payload carries. (The PTX
itself is launched on the H200 by plugins/check_aot.py.)
"""

import pytest
import torch

from tests.kernels.helpers import rel_rms
from trtllm_bole.engine.aot import SPECS
from trtllm_bole.reference import conv_tree, gdn_tree
from trtllm_bole.testing import forest, random_gdn_inputs, topk_parents

pytestmark = pytest.mark.interpreter

H, HV, DK, DV, DEPTH = 1, 2, 64, 64, 5


def launch(plugin, tensors, attrs, tactic=0):
    spec = SPECS[plugin]
    shapes = {p.name: tuple(tensors[p.name].shape) for p in spec.inputs}
    dtypes = {p.name: str(tensors[p.name].dtype).removeprefix("torch.") for p in spec.inputs}
    spec.check(shapes, dtypes)
    cfg = spec.tactics(shapes)[tactic]
    constexprs = spec.constexprs(shapes, dtypes, attrs, cfg)
    extras = dict(zip(spec.extra_args, spec.extra_values(shapes), strict=True))
    args = [extras[name] if name in extras else tensors[name] for name in spec.params]
    grid = spec.grid(shapes, cfg, lambda a, b: -(-a // b))
    options = spec.launch_options(cfg)
    options.pop("maxnreg", None)  # a register cap means nothing to the interpreter
    spec.adapter()[grid](*args, **constexprs, **options)


def small_forest():
    return forest([topk_parents(9, 2, DEPTH), topk_parents(4, 3, 3)])


def verify_case(gen):
    """A ragged forest, fp32 inputs (3 state slots, requests in slots 2 and 0) and NaN-poisoned outputs of
    every verify plugin (o, u, log_p; the pair's factors and scratch)."""
    tree = small_forest()
    x = random_gdn_inputs(tree.num_nodes, 3, H, HV, DK, DV, generator=gen).cast(torch.float32)
    n, d, nan = tree.num_nodes, tree.paths.shape[1], float("nan")
    tensors = {
        "q": x.q, "k": x.k, "v": x.v, "g": x.g, "beta": x.beta, "state": x.state.clone(),
        "state_indices": torch.tensor([2, 0]), "cu_seqlens": tree.cu_seqlens, "dfs_order": tree.dfs_order,
        "subtree_size": tree.subtree_size, "depth": tree.depth, "paths": tree.paths,
        "factors": torch.full((2, HV, n, d), nan), "scratch": torch.full((n, HV, 128), nan),
        "o": torch.full_like(x.v, nan), "u": torch.full_like(x.v, nan), "log_p": torch.full_like(x.g, nan),
    }  # fmt: skip
    return tree, x, tensors


def assert_verified(tensors, x, tree):
    """o, u and log_p against the float64 serial recurrence and closed form; the state untouched."""
    args = (x.q.double(), x.k.double(), x.v.double(), x.g.double(), x.beta.double(), x.state.double(), tree)
    slots = tensors["state_indices"]
    o_ref, _ = gdn_tree.serial_tree_recurrence(*args, scale=x.scale, state_indices=slots)
    _, u_ref, lp_ref = gdn_tree.closed_form_tree_verify(*args, scale=x.scale, state_indices=slots)
    assert rel_rms(tensors["o"], o_ref) <= 1e-4
    assert rel_rms(tensors["u"], u_ref) <= 1e-4
    assert (tensors["log_p"].double() - lp_ref).abs().max() <= 1e-5
    assert torch.equal(tensors["state"], x.state)  # the verify never writes the state


def test_verify_adapter(gen):
    tree, x, tensors = verify_case(gen)
    launch("bole::gdn_tree_verify", tensors, {"scale": x.scale})
    assert_verified(tensors, x, tree)


def test_explicit_inverse_adapters_in_two_launches(gen):
    """bole::gdn_tree_factors, then bole::gdn_tree_values on its factors: the runtime's two-launch path."""
    tree, x, tensors = verify_case(gen)
    attrs = {"scale": x.scale, "max_nodes": 9, "max_depth": DEPTH}
    launch("bole::gdn_tree_factors", tensors, attrs)
    launch("bole::gdn_tree_values", tensors, attrs)
    assert_verified(tensors, x, tree)


@pytest.mark.parametrize("k_dtype", [torch.float32, torch.bfloat16], ids=["fp32 k", "bf16 k"])
def test_commit_adapter_in_place(gen, k_dtype):
    """The commit in place, k in the verify's dtype (bf16 when serving): the truth uses the rounded k."""
    tree = small_forest()
    x = random_gdn_inputs(tree.num_nodes, 2, H, HV, DK, DV, generator=gen)
    k = x.k.to(k_dtype)
    args = (x.q, k.double(), x.v, x.g, x.beta, x.state, tree)
    _, states = gdn_tree.serial_tree_recurrence(*args, scale=x.scale)
    _, u, lp = gdn_tree.closed_form_tree_verify(*args, scale=x.scale)
    pool = torch.randn(1, 4, HV, DK, DV, generator=gen)
    slots = torch.tensor([3, 1])
    pool[0, slots] = x.state.float()
    state = pool.clone()
    accepted = torch.tensor([8, -1])
    tensors = {
        "state": state, "k": k[None], "u": u.float()[None], "log_p": lp.float()[None],
        "accepted_leaf": accepted, "state_indices": slots, "cu_seqlens": tree.cu_seqlens, "depth": tree.depth,
        "paths": tree.paths, "state_out": state,
    }  # fmt: skip
    launch("bole::gdn_commit", tensors, {"max_depth": DEPTH})
    leaf = int(tree.accepted_nodes(accepted)[0])
    assert rel_rms(state[0, 3], states[leaf]) <= 1e-5
    assert torch.equal(state[0, [0, 1, 2]], pool[0, [0, 1, 2]])  # rejected request and free slots untouched


def test_conv_adapter(gen):
    tree = small_forest()
    c = 24
    tensors = {
        "x": torch.randn(tree.num_nodes, c, generator=gen),
        "weight": torch.randn(c, 4, generator=gen),
        "conv_state": torch.randn(3, c, 3, generator=gen),
        "state_indices": torch.tensor([1, 2]),
        "request": tree.request, "depth": tree.depth, "global_parents": tree.global_parents,
        "y": torch.full((tree.num_nodes, c), float("nan")),
    }  # fmt: skip
    launch("bole::tree_conv1d", tensors, {"silu": 1})
    ref = conv_tree.tree_conv1d(
        tensors["x"].double(), tensors["weight"].double(), tensors["conv_state"].double(), tree,
        state_indices=tensors["state_indices"],
    )  # fmt: skip
    assert rel_rms(tensors["y"], ref) <= 1e-6
