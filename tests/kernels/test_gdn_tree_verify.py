"""The closed-form verify kernel against the serial float64 oracle (BOLE.md §2)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole.config import BoleConfig
from trtllm_bole.kernels import MAX_DEPTH
from trtllm_bole.kernels import gdn_tree_verify_inverse as inverse_kernels
from trtllm_bole.kernels._common import VerifyCall
from trtllm_bole.kernels.gdn_tree_verify import (
    CONFIGS,
    INVERSE_CONFIGS,
    InverseConfig,
    VerifyConfig,
    check_inverse_config,
    default_config,
    default_plan,
    default_precision,
    exact_config,
    gdn_tree_verify,
)
from trtllm_bole.kernels.gdn_tree_verify_inverse import compact_factors, inverse_launch_args
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import (
    chain_parents,
    forest,
    random_gdn_inputs,
    star_parents,
    topk_parents,
)

SHAPES = {
    "single": [[-1]],
    "seven": [topk_parents(7, 2, 3)],
    "chain16": [chain_parents(16)],
    "star64": [star_parents(64)],
    "topk63": [topk_parents(63, 4, 8)],
    "topk64": [topk_parents(64, 4, 8)],
    "topk100": [topk_parents(100, 4, 8)],
    "ragged": [topk_parents(40, 4, 8), [-1], chain_parents(9), star_parents(5)],
}
SMALL = VerifyConfig(bt=16, bk=16, bv=16)
INV = {launches: InverseConfig(bt=16, bk=16, bv=16, num_warps=1, launches=launches) for launches in (1, 2)}
ROOT = Path(__file__).resolve().parents[2]
EXACT, SERVING = 1e-4, 1e-2  # fp32 inputs with IEEE dots; bf16 q/k/v with tensor-core dots


def make(trees, h, hv, dk, dv, gen, dtype=torch.float32, num_slots=None, max_depth=MAX_DEPTH):
    """A tree and inputs on DEVICE: q/k/v rounded to ``dtype``, gates and state to fp32, all held in
    float64 so that the oracle sees exactly what the kernel sees."""
    tree = forest(trees, device=DEVICE, max_depth=max_depth)
    x = random_gdn_inputs(
        tree.num_nodes, num_slots or tree.num_requests, h, hv, dk, dv, generator=gen, device=DEVICE
    )
    x.q, x.k, x.v = (t.to(dtype).double() for t in (x.q, x.k, x.v))
    x.g, x.beta, x.state = (t.float().double() for t in (x.g, x.beta, x.state))
    return tree, x


def raw_gate_inputs(x, gen):
    """Random raw gate inputs ``a``, ``b`` ``[N, HV]`` and ``(A_log, dt_bias)`` on DEVICE; ``x.g`` and
    ``x.beta`` become the gates Qwen3.5 computes from them (float64, for the oracle)."""
    n, hv = x.g.shape
    a = (torch.randn(n, hv, generator=gen) * 3).to(DEVICE)
    a[0, 0] = 30.0  # above softplus' threshold
    b = torch.randn(n, hv, generator=gen).to(DEVICE)
    a_log = torch.log(torch.rand(hv, generator=gen) * 15.99 + 0.01).to(DEVICE)
    dt_bias = torch.randn(hv, generator=gen).to(DEVICE)
    x.g = -a_log.double().exp() * torch.nn.functional.softplus(a.double() + dt_bias.double())
    x.beta = torch.sigmoid(b.double())
    return a, b, (a_log, dt_bias)


def run(x, tree, dtype, **kw):
    q, k, v = (t.to(dtype) for t in (x.q, x.k, x.v))
    return gdn_tree_verify(q, k, v, x.g.float(), x.beta.float(), x.state.float(), tree, scale=x.scale, **kw)


def truth(x, tree, indices=None):
    """Serial-walk outputs plus the closed form's u and logP (themselves checked against the walk)."""
    args = (x.q, x.k, x.v, x.g, x.beta, x.state, tree)
    o, _ = gdn_tree.serial_tree_recurrence(*args, scale=x.scale, state_indices=indices)
    o_cf, u, log_p = gdn_tree.closed_form_tree_verify(*args, scale=x.scale, state_indices=indices)
    assert (o_cf - o).abs().max() <= 1e-9
    return o, u, log_p


def check(out, ref, tol):
    (o, u, log_p), (o_ref, u_ref, lp_ref) = out, ref
    assert rel_rms(o, o_ref) <= tol
    assert rel_rms(u, u_ref) <= tol
    assert (log_p.double() - lp_ref).abs().max() <= 1e-5 * max(1.0, float(lp_ref.abs().max()))


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_fp32_exact_mode(shape, gen, nan_outputs):
    tree, x = make(SHAPES[shape], 2, 4, 32, 32, gen)
    out = run(x, tree, torch.float32, config=SMALL)
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float32
    check(out, truth(x, tree), EXACT)


@pytest.mark.parametrize("shape", ["seven", "topk100", "ragged"])
def test_bf16_serving_mode(shape, gen, nan_outputs):
    tree, x = make(SHAPES[shape], 2, 4, 32, 32, gen, torch.bfloat16)
    out = run(x, tree, torch.bfloat16, config=SMALL)
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.float32
    check(out, truth(x, tree), SERVING)


@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 3), (2, 6)], ids=["H=HV", "2H", "3H/1", "3H"])
def test_grouped_heads(heads, gen, nan_outputs):
    tree, x = make(SHAPES["ragged"], *heads, 16, 32, gen)
    check(run(x, tree, torch.float32, config=SMALL), truth(x, tree), EXACT)


@pytest.mark.parametrize(
    "cfg",
    [
        VerifyConfig(32, 16, 32),
        VerifyConfig(32, 16, 32, fused=False),
        VerifyConfig(64, 32, 16, fused=False),
        VerifyConfig(16, 32, 32, num_warps=2),
    ],
    ids=str,
)
def test_row_block_sizes(cfg, gen, nan_outputs):
    """Several row blocks per tree (blocked forward substitution across blocks) and one block."""
    tree, x = make([topk_parents(100, 3, 12), chain_parents(33)], 2, 4, 32, 32, gen)
    check(run(x, tree, torch.float32, config=cfg), truth(x, tree), EXACT)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_precision_modes(precision, gen):
    tree, x = make(SHAPES["topk64"], 2, 4, 32, 32, gen, torch.bfloat16)
    check(run(x, tree, torch.bfloat16, config=SMALL, precision=precision), truth(x, tree), SERVING)


def test_raw_gates_fused_in_kernel(gen, nan_outputs):
    """Qwen3.5's gating applied on chip from a, b, A_log and dt_bias (the form SGLang's kernel takes)."""
    tree, x = make(SHAPES["ragged"], 2, 4, 32, 32, gen, torch.bfloat16)
    a, b, gates = raw_gate_inputs(x, gen)
    q, k, v = (t.bfloat16() for t in (x.q, x.k, x.v))
    out = gdn_tree_verify(q, k, v, a, b, x.state.float(), tree, scale=x.scale, config=SMALL, raw_gates=gates)
    check(out, truth(x, tree), SERVING)
    # A_log and dt_bias as the columns of one table [HV, 2]: the kernel reads them flat (it read the
    # table's rows, relative error 0.24 in o).
    table = torch.stack(gates, dim=1)
    columns = (table[:, 0], table[:, 1])
    assert not columns[0].is_contiguous()
    out = gdn_tree_verify(
        q, k, v, a, b, x.state.float(), tree, scale=x.scale, config=SMALL, raw_gates=columns
    )
    check(out, truth(x, tree), SERVING)


@pytest.mark.parametrize("config", [SMALL, INV[1], INV[2]], ids=["blocked", "inverse1", "inverse2"])
def test_raw_gates_keep_tiny_and_huge_decays(config, gen, nan_outputs):
    """``a + dt_bias`` from -40 to 40, head by head, through every kernel's on-chip gating: a path's
    ``logP`` to float32's relative precision at both ends of softplus (``log(1 + exp(x))`` written out
    gives 0 below x = -17, the whole decay of head 0 lost; above 20 softplus is the identity)."""
    tree, x = make(SHAPES["ragged"], 2, 4, 32, 32, gen, torch.bfloat16)
    n, hv = x.g.shape
    a = torch.linspace(-40, 40, n * hv, device=DEVICE).view(hv, n).T.contiguous()
    gates = (torch.full((hv,), 0.5, device=DEVICE), torch.zeros(hv, device=DEVICE))
    x.g = -torch.tensor(0.5).exp().item() * torch.nn.functional.softplus(a.double())
    q, k, v = (t.bfloat16() for t in (x.q, x.k, x.v))
    out = gdn_tree_verify(q, k, v, a, torch.zeros_like(a), x.state.float(), tree, scale=x.scale,
                          config=config, raw_gates=gates)  # fmt: skip
    x.beta = torch.full_like(x.beta, 0.5)  # sigmoid(0)
    ref = truth(x, tree)
    check(out, ref, SERVING)
    lp_ref = ref[2]
    assert lp_ref[:, 0].abs().max() < 1e-8  # head 0: x <= -20, where written-out softplus gives 0
    assert ((out[2].double() - lp_ref).abs() <= 4e-6 * lp_ref.abs()).all()


def test_depth_one_and_compiled_maximum(gen):
    tree, x = make([star_parents(1) * 1, [-1], [-1]], 2, 2, 16, 16, gen)
    assert tree.max_depth == 1
    check(run(x, tree, torch.float32, config=SMALL), truth(x, tree), EXACT)
    tree, x = make([chain_parents(MAX_DEPTH), topk_parents(20, 3, 4)], 1, 2, 16, 16, gen)
    assert tree.max_depth == MAX_DEPTH
    check(run(x, tree, torch.float32, config=VerifyConfig(64, 16, 16)), truth(x, tree), EXACT)


def test_deeper_than_compiled_maximum_is_refused(gen):
    tree, x = make([chain_parents(MAX_DEPTH + 1)], 1, 1, 16, 16, gen, max_depth=MAX_DEPTH + 1)
    with pytest.raises(ValueError, match=f"depth {MAX_DEPTH + 1} exceeds .* maximum depth {MAX_DEPTH}"):
        run(x, tree, torch.float32)


def test_slot_pool_and_state_untouched(gen, nan_outputs):
    tree, x = make(SHAPES["ragged"], 2, 4, 16, 16, gen, num_slots=6)
    slots = torch.tensor([4, 0, 5, 2], device=DEVICE)
    state = x.state.float()
    before = state.clone()
    q, k, v = (t.float() for t in (x.q, x.k, x.v))
    out = gdn_tree_verify(
        q, k, v, x.g.float(), x.beta.float(), state, tree, scale=x.scale, state_indices=slots, config=SMALL
    )
    check(out, truth(x, tree, slots), EXACT)
    assert torch.equal(state, before)


def test_default_config_and_scale_none(gen):
    tree, x = make(SHAPES["topk63"], 2, 4, 32, 32, gen)
    x.scale = None
    o, *_ = run(x, tree, torch.float32)
    o_ref, _ = gdn_tree.serial_tree_recurrence(x.q, x.k, x.v, x.g, x.beta, x.state, tree)
    assert rel_rms(o, o_ref) <= EXACT


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "state": a["state"].double()}, "state must be float32"),
        (lambda a: {**a, "q": a["q"][..., :8], "k": a["k"][..., :8]}, "dk=8 and dv=16 must be multiples"),
        (lambda a: {**a, "precision": "fp8"}, "precision must be one of"),
        (lambda a: {**a, "config": VerifyConfig(16, 16, 48)}, "does not tile"),
        (lambda a: {**a, "g": a["g"][:, :1]}, r"g must be \[N=3, HV=2\]"),
        (lambda a: {**a, "q": a["q"].half()}, "q and k must share a dtype"),
        (lambda a: {**a, "raw_gates": (a["g"][0], a["g"][0].double())}, "raw_gates must be two float32"),
    ],
)
def test_rejects_bad_arguments(change, match, gen):
    tree, x = make([[-1, 0, 0]], 1, 2, 16, 16, gen)
    args = dict(
        q=x.q.float(), k=x.k.float(), v=x.v.float(), g=x.g.float(), beta=x.beta.float(),
        state=x.state.float(), tree=tree,
    )  # fmt: skip
    with pytest.raises(ValueError, match=match):
        gdn_tree_verify(**change(args))


# ------------------------------------------------------------------------------------------ #
# The explicit-inverse path (gdn_tree_verify_inverse): one tile in registers, or blocked       #
# ------------------------------------------------------------------------------------------ #


@pytest.mark.parametrize("launches", [1, 2])
@pytest.mark.parametrize("shape", ["single", "seven", "star64", "topk100", "ragged"])
def test_inverse_fp32_exact(shape, launches, gen, nan_outputs):
    """Tiles of 16: the 7-node tree in one tile, the others blocked (several block rows, ragged mixes)."""
    tree, x = make(SHAPES[shape], 2, 4, 32, 32, gen)
    check(run(x, tree, torch.float32, config=INV[launches]), truth(x, tree), EXACT)


@pytest.mark.parametrize("launches", [1, 2])
def test_inverse_one_tile_of_64(launches, gen, nan_outputs):
    """A 64-node and a 63-node tree, each in one tile of 64 (the serving shape); the launcher knows that
    no request exceeds the tile, so the blocked variant is not launched."""
    tree, x = make([topk_parents(64, 4, 8), topk_parents(63, 4, 8)], 2, 4, 32, 32, gen)
    cfg = InverseConfig(64, 32, 16, 4, launches)
    assert tree.max_nodes == 64
    check(run(x, tree, torch.float32, config=cfg), truth(x, tree), EXACT)


@pytest.mark.parametrize("launches", [1, 2])
def test_inverse_serving_mode_grouped_heads_slots(launches, gen, nan_outputs):
    """bf16 q/k/v, raw gates on chip, HV = 3H, a slot pool, tiles of 32 (one request blocked)."""
    tree, x = make(SHAPES["ragged"], 1, 3, 32, 32, gen, torch.bfloat16, num_slots=6)
    slots = torch.tensor([4, 0, 5, 2], device=DEVICE)
    a, b, gates = raw_gate_inputs(x, gen)
    q, k, v = (t.bfloat16() for t in (x.q, x.k, x.v))
    state = x.state.float()
    before = state.clone()
    out = gdn_tree_verify(
        q, k, v, a, b, state, tree, scale=x.scale, state_indices=slots, raw_gates=gates,
        config=InverseConfig(32, 16, 16, 2, launches), precision="tf32" if launches == 1 else "bf16",
    )  # fmt: skip
    assert out[0].dtype == torch.bfloat16
    check(out, truth(x, tree, slots), SERVING)
    assert torch.equal(state, before)


@pytest.mark.parametrize("launches", [1, 2])
@pytest.mark.parametrize("depth", [3, 5, 9, 17])
def test_inverse_chains_one_past_a_power_of_two(depth, launches, gen, nan_outputs):
    """Chains of ``2^n + 1`` nodes (9: eight drafts and the pending token) end the inverse with a sum
    instead of a product: in one tile of 32 and in tiles of 16 (blocked, a 40-node tree). One key per
    head, β = 0.9 and slow decay make the deepest power of G large (random keys leave it below the
    tolerance), so a wrong last step fails."""
    trees = [topk_parents(30, 2, depth), chain_parents(depth), topk_parents(40, 3, depth)]
    tree, x = make(trees, 2, 4, 32, 32, gen)
    x.k = x.k[:1].expand_as(x.k).contiguous()
    x.beta.fill_(0.9)
    x.g.fill_(-0.01)
    assert tree.max_depth == depth
    for cfg in (InverseConfig(32, 16, 16, 2, launches), InverseConfig(16, 16, 16, 1, launches)):
        check(run(x, tree, torch.float32, config=cfg), truth(x, tree), EXACT)


def launch_args(cfg, gen):
    """``inverse_launch_args`` of one 12-node tree (H = 1, HV = 2, dk = 16, dv = 32, fp32): the outputs,
    the kernels' arguments and their constants for ``cfg``."""
    tree, x = make([topk_parents(12, 2, 4)], 1, 2, 16, 32, gen)
    inputs = tuple(t.float() for t in (x.q, x.k, x.v, x.g, x.beta, x.state))
    slots = torch.arange(1, device=DEVICE)
    return inverse_launch_args(VerifyCall(*inputs, slots, tree, None, 1.0, False, "ieee"), cfg)


def test_compact_factors_serve_trees_up_to_depth_16(gen):
    """Shallow trees get their factors on compact path tiles (the factor kernel of two launches, every
    program of one launch), deeper ones (the prefill's chains) by the dense block-doubling inverse; both
    kinds run in the tests above (depths 3, 5, 9 and 17, 64). Trees larger than the tile keep the blocked
    kernel."""
    assert [compact_factors(d) for d in (1, 8, 9, 16, 17, 64)] == [True] * 4 + [False] * 2
    for launches, phase in ((2, 1), (1, 3)):
        cfg = InverseConfig(16, 16, 16, 1, launches, 1)
        _, _, consts = launch_args(cfg, gen)
        launch = inverse_kernels.phase_launch
        kernels = {
            (dp, blocked): launch(phase, cfg, {**consts, "DP": dp}, 2, 32, 1, blocked)[0]
            for dp in (16, 32)
            for blocked in (False, True)
        }
        compact = {1: inverse_kernels._path_factors_kernel, 3: inverse_kernels._compact_one_launch_kernel}
        assert kernels.pop((16, False)) is compact[phase]
        assert set(kernels.values()) == {inverse_kernels._gdn_tree_verify_inverse_kernel}


@pytest.mark.parametrize("bt, launches, own_scratch", [(16, 2, False), (64, 2, True), (16, 1, True)])
def test_compact_factor_scratch_is_u_when_its_rows_fit(bt, launches, own_scratch, gen):
    """Q Kᵀ and K Kᵀ side by side (2·bt columns) go through the u output's rows when dv holds them and
    phase 1 runs once per pair (two launches); one launch gives every value tile its own scratch and
    factors, since its tiles form the same factors and write u."""
    (_, u, _), args, consts = launch_args(InverseConfig(bt, 16, 16, 1, launches, 1), gen)
    names = inverse_kernels._path_factors_kernel.arg_names
    scratch, factors = args[names.index("scratch")], args[names.index("factors")]
    assert (scratch is not u) == own_scratch and consts["SW"] == scratch.shape[-1] >= 2 * bt
    tiles = 32 // 16 if launches == 1 else 1  # dv / bv
    assert factors.shape[0] == tiles and (scratch is u or scratch.shape[0] == tiles)


def test_register_cap_goes_to_the_single_tile_value_tile_kernel_only(gen):
    """``maxnreg`` is a launch option of phase 2 for trees of one tile: not of the factor kernel, not of
    the blocked variant (slower capped), and absent when unset."""
    for cap in (None, 128):
        cfg = InverseConfig(16, 16, 16, 1, 2, 1, cap)
        _, _, consts = launch_args(cfg, gen)
        options = {
            (phase, blocked): inverse_kernels.phase_launch(phase, cfg, consts, 2, 32, 1, blocked)[3]
            for phase in (1, 2)
            for blocked in (False, True)
        }
        assert [key for key, opts in options.items() if "maxnreg" in opts] == ([(2, False)] if cap else [])
        assert options[(2, False)].get("maxnreg") == cap


def test_inverse_depth_one_and_compiled_maximum(gen):
    tree, x = make([[-1], [-1, -1, -1]], 2, 2, 16, 16, gen)
    check(run(x, tree, torch.float32, config=INV[2]), truth(x, tree), EXACT)
    tree, x = make([chain_parents(MAX_DEPTH), topk_parents(20, 3, 4)], 1, 2, 16, 16, gen)
    assert tree.max_depth == MAX_DEPTH
    for cfg in (InverseConfig(64, 16, 16, 4, 1), InverseConfig(32, 16, 16, 2, 2)):  # one tile; blocked
        check(run(x, tree, torch.float32, config=cfg), truth(x, tree), EXACT)


def test_default_config_is_a_benchmarked_config():
    """The default is a measured candidate: the inverse path for 17-64 nodes a request (its tile holds
    the average request), the blocked kernel otherwise; never a combination the launcher refuses."""
    for precision in ("tf32", "bf16"):
        for batch in (1, 2, 4, 16, 32):
            for size in (8, 16, 32, 64, 256):
                cfg = default_config(batch * size, batch, 32, 128, 128)
                if 16 < size <= 64:
                    assert cfg in INVERSE_CONFIGS and cfg.bt >= size
                    check_inverse_config(cfg, precision)
                else:
                    assert cfg in CONFIGS


def test_default_precision_is_the_measured_serving_one():
    """fp32 inputs: exact dots. 16-bit inputs: bf16 state products (the precision of the benchmarked
    serving numbers), tf32 where bf16 is refused; the launcher's default pair is never refused."""
    blocked, wide, narrow = CONFIGS[0], InverseConfig(64, 64, 128, 8, 1), InverseConfig(64, 128, 32, 8, 1)
    assert default_precision(torch.float32, torch.float32, wide) == "ieee"
    assert default_precision(torch.bfloat16, torch.bfloat16, blocked) == "bf16"
    assert default_precision(torch.bfloat16, torch.bfloat16, wide) == "bf16"
    assert default_precision(torch.float16, torch.float16, narrow) == "tf32"
    assert default_precision(torch.bfloat16, torch.bfloat16, InverseConfig(64, 128, 32, 8, 2)) == "bf16"
    assert default_precision(torch.bfloat16, torch.bfloat16, InverseConfig(32, 64, 64, 4, 2, 2)) == "tf32"
    for batch in (1, 2, 16):
        cfg = default_config(batch * 64, batch, 32, 128, 128)
        if isinstance(cfg, InverseConfig):
            check_inverse_config(cfg, default_precision(torch.bfloat16, torch.bfloat16, cfg))
    at_b1 = default_config(64, 1, 32, 128, 128)  # one launch, value tiles of 64
    assert at_b1.launches == 1 and default_precision(torch.bfloat16, torch.bfloat16, at_b1) == "bf16"
    bf16 = torch.bfloat16
    assert default_plan(64, 1, 32, 128, 128, bf16, bf16, precision="tf32") == (at_b1, "tf32")


def test_default_plan_runs_fp32_inputs_exactly_with_the_blocked_kernel():
    """fp32 q/k/v (or ``ieee`` asked for): :func:`exact_config` at every shape; 16-bit inputs (or a serving
    precision asked for): the shape rule and its precision; a given config is kept."""
    for batch, size, hv, d in ((1, 64, 32, 128), (32, 64, 4, 64), (8, 8, 48, 128), (16, 256, 32, 128)):
        n = batch * size
        exact = exact_config(d, d)
        assert default_plan(n, batch, hv, d, d, torch.float32, torch.float32) == (exact, "ieee")
        assert default_plan(n, batch, hv, d, d, torch.bfloat16, torch.bfloat16, precision="ieee") == (
            exact, "ieee",
        )  # fmt: skip
        serving = default_config(n, batch, hv, d, d)
        expected = (serving, default_precision(torch.bfloat16, torch.bfloat16, serving))
        assert default_plan(n, batch, hv, d, d, torch.bfloat16, torch.bfloat16) == expected
        assert default_plan(n, batch, hv, d, d, torch.float32, torch.float32, precision="tf32") == (
            serving, "tf32",
        )  # fmt: skip
        given = CONFIGS[0]
        assert default_plan(n, batch, hv, d, d, torch.float32, torch.float32, config=given) == (given, "ieee")
    assert exact_config(128, 128) == VerifyConfig(32, 32, 64, 4, 2, fused=True)
    assert exact_config(64, 16) == VerifyConfig(32, 32, 16, 4, 2, fused=True)


def test_exact_config_is_the_measured_fastest_in_fp32():
    """At every fp32 point of the committed H200 sweep (embedded-model and Qwen3.5-9B heads, trees and
    chains of 64, B = 1 … 32) the exact config is the fastest candidate that passed the float64 check."""
    sweep = json.loads((ROOT / "benchmarks" / "results" / "verify_configs_h200.json").read_text())
    fp32 = [p for p in sweep["points"] if p["dtype"] == "float32"]
    assert len(fp32) >= 8
    for point in fp32:
        _, _, dk, dv = sweep["dims"][point["dims"]]
        key = f"{exact_config(dk, dv)} ieee"
        assert point["best"] == key, (point["dims"], point["shape"], point["batch"], point["best"])


def test_default_config_counts_waves():
    """One launch while its value tiles fit one program a SM (tiles of 64, else whole tiles of 128), two
    beyond; the value-tile kernel of two launches capped at 128 registers (four programs a SM instead of
    three) where that saves a wave. On a GPU of another size the same shape can switch."""
    one, two = InverseConfig(64, 128, 64, 8, 1, 8), InverseConfig(64, 64, 64, 4, 2, 8)
    whole = replace(one, bv=128)
    capped = replace(two, maxnreg=128)
    assert default_config(64, 1, 32, 128, 128) == one  # 32 pairs x 2 tiles: 64 programs
    assert default_config(2 * 64, 2, 32, 128, 128) == one  # 128 <= 132
    assert default_config(64, 1, 48, 128, 128) == one  # 96
    assert default_config(2 * 64, 2, 48, 128, 128) == whole  # 192 tiles of 64; 96 pairs
    assert default_config(2 * 64, 2, 48, 128, 128, num_sms=192) == one
    assert default_config(4 * 64, 4, 32, 128, 128) == whole  # 128 pairs
    assert default_config(4 * 64, 4, 32, 128, 128, num_sms=120) == two  # 256 tiles <= 3 x 120
    assert default_config(4 * 64, 4, 48, 128, 128) == two  # 192 pairs x 2 tiles: 384 <= 3 x 132
    assert default_config(8 * 64, 8, 32, 128, 128) == capped  # 512 tiles: 2 waves of 3 x 132, 1 of 4 x 132
    assert default_config(8 * 64, 8, 48, 128, 128) == two  # 768: two waves either way
    assert default_config(8 * 64, 8, 32, 128, 128, num_sms=192) == two
    assert default_config(16 * 32, 16, 32, 128, 128) == InverseConfig(32, 64, 64, 4, 2, 2, 128)


def test_default_speculation_fills_one_inverse_tile():
    """The default draft budget plus the pending token is one 64-node tile: the explicit-inverse path
    at every batch size (one more draft would send every request to the blocked kernel)."""
    per_request = BoleConfig().max_nodes + 1
    assert per_request == 64
    for batch in (1, 8, 16, 32):
        assert isinstance(default_config(batch * per_request, batch, 32, 128, 128), InverseConfig)
    assert not isinstance(default_config(8 * (per_request + 1), 8, 32, 128, 128), InverseConfig)


def test_default_pair_is_the_measured_best_on_the_h200():
    """What the launcher runs by default for bf16 inputs (config and precision) is, at every point of
    the committed H200 measurement's grid, a timed candidate within 5% of the fastest one; at the depth
    probe's points (which time the grid's winners only) too, where it was timed."""
    result = ROOT / "benchmarks" / "results" / "gdn_verify_h200_focus.json"
    points = json.loads(result.read_text())
    for point in points["grid"] + points["depth"]:
        batch, size, hv = point["batch"], point["tree_size"], point["hv"]
        cfg = default_config(batch * size, batch, hv, 128, 128)
        timed = point["bole_candidates_us"]
        key = f"{cfg} {default_precision(torch.bfloat16, torch.bfloat16, cfg)}"
        if point in points["depth"] and key not in timed:
            continue
        assert key in timed, (point["model"], batch, size, key)
        assert timed[key] <= 1.05 * min(timed.values()), (point["model"], batch, size, key)


def test_a_key_dim_that_is_not_a_power_of_two_takes_the_blocked_kernel(gen):
    """dk = 48: the serving default (a 20-node tree, bf16) and the prefill run the blocked kernel, which
    tiles any multiple of 16; the explicit-inverse path, which loads whole rows of K, is refused by name."""
    tree, x = make([topk_parents(20, 4, 8)], 1, 2, 48, 32, gen, dtype=torch.bfloat16)
    assert isinstance(default_config(20, 1, 2, 48, 32), VerifyConfig)
    check(run(x, tree, torch.bfloat16), truth(x, tree), SERVING)
    with pytest.raises(ValueError, match="dk a power of two"):
        run(x, tree, torch.bfloat16, config=InverseConfig(32, 16, 32, 4, 2, 2))


def test_refuses_the_config_that_miscompiles_on_the_h200(gen):
    tree, x = make([topk_parents(20, 4, 8)], 1, 2, 32, 32, gen)
    bad = InverseConfig(32, 32, 32, 4, launches=1)
    with pytest.raises(ValueError, match="miscompiles on sm_90"):
        run(x, tree, torch.bfloat16, config=bad, precision="bf16")
    with pytest.raises(ValueError, match="miscompiles on sm_90"):
        check_inverse_config(INVERSE_CONFIGS[0], "bf16")
    check_inverse_config(INVERSE_CONFIGS[0], "tf32")


# ------------------------------------------------------------------------------------------ #
# On the H200: real sizes, every benchmarked config                                          #
# ------------------------------------------------------------------------------------------ #


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg",
    [None, CONFIGS[6], CONFIGS[-2], *(INVERSE_CONFIGS[i] for i in (0, 2, 5, 6, 11))],
    ids=str,
)  # every config: the benchmark
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_real_size(cfg, dtype, gen, nan_outputs):
    trees = [topk_parents(64, 4, 8)] * 3 + [topk_parents(256, 4, 16), chain_parents(MAX_DEPTH), [-1]]
    tree, x = make(trees, 16, 32, 128, 128, gen, dtype)
    check(run(x, tree, dtype, config=cfg), truth(x, tree), EXACT if dtype == torch.float32 else SERVING)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 16])
def test_real_size_depth_nine_default_config(batch, gen, nan_outputs):
    """The engine's trees (eight drafts and the pending token: depth 9) at
    Qwen3.5-9B heads, with the launcher's default at each batch (one launch of 64 / 128, two launches)."""
    tree, x = make([topk_parents(64, 4, 9)] * batch, 16, 32, 128, 128, gen, torch.bfloat16)
    check(run(x, tree, torch.bfloat16), truth(x, tree), SERVING)


@pytest.mark.gpu
def test_real_size_27b_heads_and_slots(gen):
    tree, x = make([topk_parents(128, 4, 8)] * 2, 16, 48, 128, 128, gen, torch.bfloat16, num_slots=5)
    slots = torch.tensor([3, 1], device=DEVICE)
    q, k, v = (t.bfloat16() for t in (x.q, x.k, x.v))
    out = gdn_tree_verify(
        q, k, v, x.g.float(), x.beta.float(), x.state.float(), tree, scale=x.scale, state_indices=slots
    )
    check(out, truth(x, tree, slots), SERVING)
    assert math.isfinite(float(out[0].float().abs().max()))
