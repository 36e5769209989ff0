"""The tree-serial baseline (per-node recurrence + snapshots) against the serial float64 oracle."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole.kernels.baselines.tree_serial import (
    SERIAL_CONFIGS,
    SerialConfig,
    gdn_snapshot_commit,
    gdn_tree_verify_serial,
)
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import chain_parents, forest, random_gdn_inputs, star_parents, topk_parents

TREES = [topk_parents(40, 4, 8), [-1], chain_parents(9), star_parents(5)]


def make(trees, h, hv, dk, dv, gen, num_slots=None):
    tree = forest(trees, device=DEVICE)
    x = random_gdn_inputs(
        tree.num_nodes, num_slots or tree.num_requests, h, hv, dk, dv, generator=gen, device=DEVICE
    ).cast(torch.float32)
    return tree, x


@pytest.mark.parametrize("heads", [(2, 2), (2, 6)], ids=["H=HV", "3H"])
@pytest.mark.parametrize("cfg", [SerialConfig(16, 1), SerialConfig(32, 2)], ids=str)
def test_outputs_and_snapshots(heads, cfg, gen, nan_outputs):
    tree, x = make(TREES, *heads, 32, 32, gen)
    o, snaps = gdn_tree_verify_serial(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale, config=cfg)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        *(t.double() for t in (x.q, x.k, x.v, x.g, x.beta, x.state)), tree, scale=x.scale
    )
    assert rel_rms(o, o_ref) <= 1e-5 and rel_rms(snaps, states) <= 1e-5


def test_values_laid_out_head_major(gen, nan_outputs):
    """v with its heads outermost in memory gives the same outputs, row-major (as the fake says)."""
    tree, x = make(TREES, 2, 4, 16, 16, gen)
    head_major = x.v.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    o, _ = gdn_tree_verify_serial(x.q, x.k, head_major, x.g, x.beta, x.state, tree, scale=x.scale)
    expected, _ = gdn_tree_verify_serial(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    assert o.is_contiguous() and torch.equal(o, expected)


@pytest.mark.parametrize("heads", [(2, 4), (3, 3)], ids=["HV=4", "HV=3"])
def test_slot_pool_and_commit(heads, gen, nan_outputs):
    """Three value heads of 16 x 16 (768 elements a state, no multiple of the copy block) were refused on
    CUDA, after the step's K/V had been committed; the CPU took them."""
    tree, x = make(TREES, *heads, 16, 16, gen, num_slots=6)
    slots = torch.tensor([4, 0, 5, 2], device=DEVICE)
    before = x.state.clone()
    o, snaps = gdn_tree_verify_serial(
        x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale, state_indices=slots
    )
    assert torch.equal(x.state, before)
    o_ref, _ = gdn_tree.serial_tree_recurrence(
        *(t.double() for t in (x.q, x.k, x.v, x.g, x.beta, x.state)), tree, scale=x.scale,
        state_indices=slots,
    )  # fmt: skip
    assert rel_rms(o, o_ref) <= 1e-5
    accepted = torch.tensor([33, -1, 8, 0], device=DEVICE)
    stacked_state = torch.stack([x.state, x.state.flip(0)])
    stacked_snaps = torch.stack([snaps, snaps * 2])
    expected = stacked_state.clone()
    for i in range(2):
        gdn_tree.snapshot_commit(expected[i], stacked_snaps[i], tree, accepted, state_indices=slots)
    gdn_snapshot_commit(stacked_state, stacked_snaps, tree, accepted, state_indices=slots)
    assert torch.equal(stacked_state, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SERIAL_CONFIGS[:2], ids=str)
def test_real_size(cfg, gen):
    tree, x = make([topk_parents(64, 4, 8)] * 2, 16, 32, 128, 128, gen)
    o, snaps = gdn_tree_verify_serial(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale, config=cfg)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        *(t.double() for t in (x.q, x.k, x.v, x.g, x.beta, x.state)), tree, scale=x.scale
    )
    assert rel_rms(o, o_ref) <= 1e-5 and rel_rms(snaps, states) <= 1e-5
