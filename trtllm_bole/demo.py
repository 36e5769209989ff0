"""``python -m trtllm_bole demo``: verify a draft forest through the exact core and show it is exact.

Builds a batch of draft trees (top-k style, ragged), runs the closed-form verify and the factored
commit in float64, and compares them node by node with the serial recurrence.
"""

from __future__ import annotations

import torch

from trtllm_bole import ops
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import chain_parents, forest, random_gdn_inputs, topk_parents

TOLERANCE = 1e-10


def run_demo(seed: int = 0) -> bool:
    """Print the comparison; true when both the outputs and the committed states are within
    :data:`TOLERANCE` of the serial recurrence (a NaN anywhere is a mismatch)."""
    gen = torch.Generator().manual_seed(seed)
    trees = [topk_parents(64, 4, 8), topk_parents(17, 2, 6), chain_parents(8)]
    tree = forest(trees)
    h, hv, dk, dv = 2, 4, 32, 32
    x = random_gdn_inputs(tree.num_nodes, tree.num_requests, h, hv, dk, dv, generator=gen)
    print(
        f"forest: {tree.num_requests} requests, {tree.num_nodes} nodes, sizes "
        f"{[len(t) for t in trees]}, max depth {tree.max_depth}; GDN H={h} HV={hv} dk={dk} dv={dv}, float64"
    )
    o_serial, states = gdn_tree.serial_tree_recurrence(
        x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale
    )
    o, factors = ops.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, tree, scale=x.scale)
    err_o = float((o - o_serial).abs().max())
    print(f"closed-form verify vs serial recurrence: max |o - o_serial| = {err_o:.2e}")
    accepted = torch.tensor([int(torch.randint(n, (1,), generator=gen)) for n in map(len, trees)])
    state = x.state.clone()
    ops.gdn_commit(state, factors, accepted)
    err_s = float((state - states[tree.accepted_nodes(accepted)]).abs().max())
    print(f"factored commit of accepted leaves {accepted.tolist()}: max |S - S_serial| = {err_s:.2e}")
    snapshot_bytes = tree.num_nodes * hv * dk * dv * 4
    factor_bytes = tree.num_nodes * (hv * dv * 4 + h * dk * 2 + hv * 4)
    print(
        f"transient state per layer at fp32: snapshots {snapshot_bytes / 1024:.0f} KiB vs factors "
        f"{factor_bytes / 1024:.0f} KiB ({snapshot_bytes / factor_bytes:.0f}x less)"
    )
    exact = err_o <= TOLERANCE and err_s <= TOLERANCE  # max() would drop a NaN after a number
    print(f"EXACT (<= {TOLERANCE:.0e})" if exact else f"MISMATCH: outputs {err_o:.2e}, states {err_s:.2e}")
    return exact
