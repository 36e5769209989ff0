"""Gated DeltaNet on draft trees, in plain torch: the truth every kernel is tested against.

Shapes (packed forest of B requests, N nodes): q, k ``[N, H, dk]``; v ``[N, HV, dv]``;
g (log decay, <= 0) and beta ``[N, HV]``; state ``[S, HV, dk, dv]`` with ``S = B`` or a slot pool
addressed by ``state_indices`` ``[B]``. Value head ``h`` reads key head ``h // (HV // H)``.

Everything is computed in the promoted dtype of the inputs and the state (float64 in, float64 out),
so the same code is the float64 oracle and the CPU serving path. Nothing here checks its inputs:
:mod:`trtllm_bole.ops` refuses bad shapes, dtypes and trees by name before it calls these, and the
tests call them on inputs they build (a wrong shape may broadcast rather than fail). ``scale`` scales q
(transformers' Qwen3.5 uses ``dk ** -0.5``; None leaves q as it is).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_bole.tree import TreeBatch

# --------------------------------------------------------------------------------------------- #
# The serial oracle (BOLE.md §1, applied node by node; each node starts from its parent's state) #
# --------------------------------------------------------------------------------------------- #


def serial_tree_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    tree: TreeBatch,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``o [N, HV, dv]`` and every node's post-update state ``[N, HV, dk, dv]``."""
    out_dtype, dtype = v.dtype, _compute_dtype(q, k, v, state)
    q, k = _per_value_head(q, k, v.shape[1], dtype, scale)
    v, g, beta = v.to(dtype), g.to(dtype), beta.to(dtype)
    pre = _pre_states(state, state_indices).to(dtype)
    states = torch.empty((tree.num_nodes, *pre.shape[1:]), dtype=dtype, device=v.device)
    o = torch.empty(v.shape, dtype=dtype, device=v.device)
    for i in range(tree.num_nodes):
        parent = int(tree.global_parents[i])
        prev = pre[int(tree.request[i])] if parent < 0 else states[parent]
        decayed = torch.exp(g[i])[:, None, None] * prev
        u = beta[i][:, None] * (v[i] - torch.einsum("hkv,hk->hv", decayed, k[i]))
        states[i] = decayed + k[i][:, :, None] * u[:, None, :]
        o[i] = torch.einsum("hkv,hk->hv", states[i], q[i])
    return o.to(out_dtype), states


def snapshot_commit(
    state: torch.Tensor,
    snapshots: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
) -> None:
    """Copy the accepted node's snapshot into each request's state (the tree-serial commit)."""
    accepted = tree.accepted_nodes(accepted_leaf)
    slots = _slots(state, tree.num_requests, state_indices)
    keep = accepted >= 0
    state[slots[keep]] = snapshots[accepted[keep]].to(state.dtype)


# ------------------------------------------------------------------------- #
# The closed form (BOLE.md §2, Theorem 1) and the factored commit (BOLE.md §3) #
# ------------------------------------------------------------------------- #


def path_log_decay(g: torch.Tensor, tree: TreeBatch) -> torch.Tensor:
    """``logP_i = sum of g over the root-to-node path of i`` (``[N, HV]``, log space, <= 0)."""
    padded = torch.cat([g, torch.zeros_like(g[:1])])  # index -1 -> the zero row
    return padded[tree.paths].sum(dim=1)


def closed_form_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    tree: TreeBatch,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    solver: str = "triangular",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``O = D_P Q S_pre + C U`` with ``(I + G) U = R`` (BOLE.md §2).

    Returns ``o [N, HV, dv]`` (dtype of v), ``u [N, HV, dv]`` and ``log_decay [N, HV]`` (the factors
    the commit needs, in the compute dtype). ``solver`` picks the method for ``(I + G) U = R``:
    ``"triangular"`` (forward substitution, backward stable) or ``"neumann"`` (Lemma 3, ``d`` rounds of
    ``Z <- -G Z``: exact in exact arithmetic, but on a chain ``(G^m)_ij`` sums ``C(i - j - 1, m - 1)``
    paths, not one as BOLE.md §2 says, so on runs of near-identical keys with β near 1 its terms grow
    like ``(1 + β)^d`` and cancel: float32 O off by 1e-1 at 32 nodes, by 1e8 at 64;
    tests/kernels/test_verify_stability.py).
    """
    if solver not in ("neumann", "triangular"):
        raise ValueError(f"solver must be 'neumann' or 'triangular', got {solver!r}")
    out_dtype, dtype = v.dtype, _compute_dtype(q, k, v, state)
    hv = v.shape[1]
    q, k = _per_value_head(q, k, hv, dtype, scale)
    v, beta = v.to(dtype), beta.to(dtype)
    log_p = path_log_decay(g.to(dtype), tree)
    pre = _pre_states(state, state_indices).to(dtype)
    o = torch.empty(v.shape, dtype=dtype, device=v.device)
    u = torch.empty(v.shape, dtype=dtype, device=v.device)
    for b in range(tree.num_requests):
        lo, hi = int(tree.cu_seqlens[b]), int(tree.cu_seqlens[b + 1])
        if hi == lo:  # an empty request (a padded forest's tail) has nothing to verify
            continue
        depth = int(tree.depth[lo:hi].max())
        o_b, u_b = closed_form_core(
            *(x[lo:hi].transpose(0, 1) for x in (q, k, v)),  # [HV, T, .]
            log_p[lo:hi].T,
            beta[lo:hi].T,
            pre[b],
            tree.ancestor_mask(b),
            depth,
            solver,
        )
        o[lo:hi], u[lo:hi] = o_b.transpose(0, 1), u_b.transpose(0, 1)
    return o.to(out_dtype), u, log_p


def closed_form_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_p: torch.Tensor,
    beta: torch.Tensor,
    s_pre: torch.Tensor,
    mask_incl: torch.Tensor,
    depth: int,
    solver: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Theorem 1 for T nodes sharing one pre-tree state, batched over leading dims ``...``.

    q, k ``[..., T, dk]``; v ``[..., T, dv]``; log_p, beta ``[..., T]``; s_pre ``[..., dk, dv]``;
    ``mask_incl [T, T]`` (ancestor or self). Returns ``o`` and ``u`` ``[..., T, dv]``.
    """
    eye = torch.eye(mask_incl.shape[-1], dtype=torch.bool, device=mask_incl.device)
    # P_i / P_j = exp(logP_i - logP_j) <= 1 on ancestors; masked to -inf first so that nothing
    # off the ancestor paths can overflow (BOLE.md §2: never form P_j^-1).
    log_ratio = log_p[..., :, None] - log_p[..., None, :]
    ratio = torch.exp(log_ratio.masked_fill(~mask_incl, float("-inf")))
    g_mat = (beta[..., :, None] * ratio * (k @ k.transpose(-1, -2))).masked_fill(eye, 0.0)
    c_mat = ratio * (q @ k.transpose(-1, -2))
    decay = torch.exp(log_p)[..., None]
    r = beta[..., None] * (v - decay * (k @ s_pre))
    if solver == "neumann":
        u, z = r, r
        for _ in range(depth - 1):  # G^depth = 0: the longest ancestor chain has depth - 1 edges
            z = -g_mat @ z
            u = u + z
    else:
        unit = torch.eye(g_mat.shape[-1], dtype=g_mat.dtype, device=g_mat.device)
        u = torch.linalg.solve_triangular(unit + g_mat, r, upper=False, unitriangular=True)
    return decay * (q @ s_pre) + c_mat @ u, u


def commit_core(s_pre: torch.Tensor, k: torch.Tensor, u: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """``P_a S_pre + (D_a K_a)^T U_a`` for a path whose last node is ``a`` (BOLE.md §3), batched.

    s_pre ``[..., dk, dv]``; k ``[..., L, dk]``; u ``[..., L, dv]``; log_p ``[..., L]``.
    """
    leaf = log_p[..., -1:]
    weighted_k = torch.exp(leaf - log_p)[..., None] * k
    return torch.exp(leaf)[..., None] * s_pre + weighted_k.transpose(-1, -2) @ u


def factored_commit(
    state: torch.Tensor,
    k: torch.Tensor,
    u: torch.Tensor,
    log_decay: torch.Tensor,
    tree: TreeBatch,
    accepted_leaf: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
) -> None:
    """``S_new = P_a S_pre + (D_a K_a)^T U_a`` along each accepted path, in place (BOLE.md §3).

    Requests with ``accepted_leaf == -1`` keep their state bit for bit.
    """
    accepted = tree.accepted_nodes(accepted_leaf)
    slots = _slots(state, tree.num_requests, state_indices)
    hv = state.shape[1]
    dtype = torch.promote_types(state.dtype, u.dtype)
    for b in torch.nonzero(accepted >= 0).flatten().tolist():
        path = tree.path(int(accepted[b]))
        new = commit_core(
            state[slots[b]].to(dtype),
            _expand_heads(k[path].to(dtype), hv).transpose(0, 1),  # [HV, L, dk]
            u[path].to(dtype).transpose(0, 1),
            log_decay[path].to(dtype).T,
        )
        state[slots[b]] = new.to(state.dtype)


# ------------------------------------------------------------------ #
# Prefill: chunks of a prompt are chains, verified and committed whole #
# ------------------------------------------------------------------ #


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    *,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole sequences, functionally (differentiable, so training uses it too).

    q, k ``[B, L, H, dk]``; v ``[B, L, HV, dv]``; g, beta ``[B, L, HV]``; initial_state
    ``[B, HV, dk, dv]``. Each chunk is a chain: the closed form with a triangular solve, then the
    commit of its last node. Returns ``o [B, L, HV, dv]`` and the final state.
    """
    out_dtype, dtype = v.dtype, _compute_dtype(q, k, v, initial_state)
    batch, length, hv = v.shape[:3]
    pad = -length % chunk_size
    q, k = _per_value_head(q, k, hv, dtype, scale)

    def chunked(x: torch.Tensor) -> torch.Tensor:
        # [B, L, HV, ...] -> [B, HV, n_chunks, C, ...]; padding has beta = 0 and g = 0, so it
        # neither writes to nor decays the state.
        x = F.pad(x.to(dtype), (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.reshape(batch, -1, chunk_size, *x.shape[2:])
        return x.movedim(3, 1)

    q, k, v, g, beta = (chunked(x) for x in (q, k, v, g, beta))
    log_p = g.cumsum(-1)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    state = initial_state.to(dtype)
    outputs = []
    for c in range(q.shape[2]):
        o_c, u_c = closed_form_core(
            q[:, :, c], k[:, :, c], v[:, :, c], log_p[:, :, c], beta[:, :, c], state, causal, chunk_size,
            "triangular",
        )  # fmt: skip
        outputs.append(o_c)
        state = commit_core(state, k[:, :, c], u_c, log_p[:, :, c])
    o = torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :length].transpose(1, 2)
    return o.to(out_dtype), state


def chunked_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Packed prompts (``[N, ...]`` rows, ``cu_seqlens``) through the recurrence; ``state`` in place."""
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    slots = _slots(state, cu_seqlens.numel() - 1, state_indices)
    for b in range(cu_seqlens.numel() - 1):
        piece = slice(int(cu_seqlens[b]), int(cu_seqlens[b + 1]))
        o_b, final = chunk_gated_delta_rule(
            *(x[piece][None] for x in (q, k, v, g, beta)),
            state[slots[b]][None],
            scale=scale,
            chunk_size=chunk_size,
        )
        o[piece] = o_b[0]
        state[slots[b]] = final[0].to(state.dtype)
    return o


# --------- #
# Utilities #
# --------- #


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """``[..., H, d] -> [..., HV, d]``: value head h reads key head h // (HV // H)."""
    return x.repeat_interleave(hv // x.shape[-2], dim=-2)


def _per_value_head(
    q: torch.Tensor, k: torch.Tensor, hv: int, dtype: torch.dtype, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    q = _expand_heads(q.to(dtype), hv)
    if scale is not None:
        q = q * scale
    return q, _expand_heads(k.to(dtype), hv)


def _slots(state: torch.Tensor, num_requests: int, state_indices: torch.Tensor | None) -> torch.Tensor:
    if state_indices is None:
        return torch.arange(num_requests, device=state.device)
    return state_indices.to(device=state.device, dtype=torch.long)


def _pre_states(state: torch.Tensor, state_indices: torch.Tensor | None) -> torch.Tensor:
    return state if state_indices is None else state[state_indices.long()]
