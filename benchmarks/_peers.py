"""Peer implementations the GDN verify benchmark measures against, loaded from their own wheels.

- SGLang 0.5.10.post1: its tree verify kernel (``fused_sigmoid_gating_delta_rule_update`` with
  ``retrieve_parent_token`` and an intermediate-state buffer, exactly as its ``target_verify`` calls
  it) and its all-layer accepted-state scatter (``fused_mamba_state_scatter_with_mask``). Both files
  import only torch and triton, so they are loaded by file path from the installed package without
  running sglang's heavy package init. SGLang keeps states V-first: ``[slot, HV, V, K]``.
- flash-linear-attention (fla-core): ``fused_recurrent_gated_delta_rule`` on chains (no tree form).

Nothing here is copied from those projects; we only call them. A peer that cannot be loaded is
reported with the reason.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from trtllm_bole.tree import TreeBatch

SGLANG_FILES = {
    "verify": "srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py",
    "scatter": "srt/layers/attention/mamba/mamba_state_scatter_triton.py",
}


@dataclass
class Peer:
    name: str
    module: dict[str, ModuleType] = field(default_factory=dict)
    version: str | None = None
    reason: str | None = None  # why it is unavailable

    @property
    def available(self) -> bool:
        return self.reason is None


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def load_sglang() -> Peer:
    peer = Peer("sglang", version=_dist_version("sglang"))
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        peer.reason = "sglang is not installed (pip install --no-deps sglang==0.5.10.post1)"
        return peer
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        for key, rel in SGLANG_FILES.items():
            peer.module[key] = _load_file(f"_sglang_{key}", root / rel)
    except Exception as exc:  # the reason goes into the results
        peer.reason = f"loading {root / rel} failed: {type(exc).__name__}: {exc}"
    return peer


def load_fla() -> Peer:
    peer = Peer("fla", version=_dist_version("fla-core"))
    try:
        from fla.ops.gated_delta_rule import fused_recurrent

        peer.module["fused_recurrent"] = fused_recurrent
    except Exception as exc:
        peer.reason = f"import fla.ops.gated_delta_rule failed: {type(exc).__name__}: {exc}"
    return peer


@dataclass
class SGLangTreeInputs:
    """SGLang's view of one verify step (one GDN layer): what its ``target_verify`` passes."""

    q: torch.Tensor  # [1, N, H, K]
    k: torch.Tensor
    v: torch.Tensor  # [1, N, HV, V]
    a: torch.Tensor  # [1, N, HV] raw decay input
    b: torch.Tensor  # [1, N, HV] raw beta input
    a_log: torch.Tensor  # [HV]
    dt_bias: torch.Tensor  # [HV]
    state: torch.Tensor  # [S, HV, V, K] fp32 (V-first)
    state_indices: torch.Tensor  # [B]
    cu_seqlens: torch.Tensor  # [B + 1] int32 (query_start_loc)
    parents: torch.Tensor  # [B, T] local parent per draft token (retrieve_parent_token)
    steps: int  # draft tokens per request (cache_steps)
    scale: float

    def buffer(self) -> torch.Tensor:
        """The per-node intermediate-state buffer ``[B, T, HV, V, K]`` fp32 (fresh each step)."""
        b = self.parents.shape[0]
        hv, v, kd = self.state.shape[1:]
        return torch.empty((b, self.steps, hv, v, kd), dtype=torch.float32, device=self.state.device)


def sglang_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    tree: TreeBatch,
    scale: float,
) -> SGLangTreeInputs:
    """From our layout (q, k ``[N, H, K]``, v ``[N, HV, V]``, raw gates a, b ``[N, HV]``, state
    ``[S, HV, K, V]``). SGLang's tree kernel needs equal-size trees with one root child (node 0, the
    pending token): every later node has a parent inside the request. Raises ValueError otherwise."""
    lengths = (tree.cu_seqlens[1:] - tree.cu_seqlens[:-1]).tolist()
    if len(set(lengths)) != 1:
        raise ValueError(f"SGLang's tree verify takes equal-size trees, got sizes {sorted(set(lengths))}")
    steps = lengths[0]
    parents = tree.parents.view(tree.num_requests, steps)
    if bool((parents[:, 1:] < 0).any()):
        raise ValueError("SGLang's tree verify takes one root child per request (node 0)")
    return SGLangTreeInputs(
        q=q[None], k=k[None], v=v[None], a=a[None], b=b[None], a_log=a_log, dt_bias=dt_bias,
        state=state.transpose(-1, -2).contiguous(),
        state_indices=torch.arange(tree.num_requests, device=v.device),
        cu_seqlens=tree.cu_seqlens.to(torch.int32), parents=parents.contiguous(), steps=steps, scale=scale,
    )  # fmt: skip


def sglang_verify(peer: Peer, x: SGLangTreeInputs, buffer: torch.Tensor) -> torch.Tensor:
    """SGLang's target_verify for one GDN layer (its argument values): o ``[1, N, HV, V]``; fills
    ``buffer`` with every node's state. int64 indices keep its slot offsets from overflowing."""
    return peer.module["verify"].fused_sigmoid_gating_delta_rule_update(
        A_log=x.a_log, dt_bias=x.dt_bias, q=x.q, k=x.k, v=x.v, a=x.a, b=x.b,
        initial_state_source=x.state, initial_state_indices=x.state_indices, cu_seqlens=x.cu_seqlens,
        scale=x.scale, use_qk_l2norm_in_kernel=False, softplus_beta=1.0, softplus_threshold=20.0,
        is_kda=False, disable_state_update=True, intermediate_states_buffer=buffer,
        intermediate_state_indices=x.state_indices, cache_steps=x.steps, retrieve_parent_token=x.parents,
    )  # fmt: skip


def sglang_commit(
    peer: Peer, states: torch.Tensor, buffers: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor
) -> None:
    """SGLang's accepted-state copy for all layers: ``states [L, S, HV, V, K]`` from
    ``buffers [L, B, T, HV, V, K]`` at each request's accepted step (-1 = untouched)."""
    peer.module["scatter"].fused_mamba_state_scatter_with_mask(states, buffers, slots, accepted)


def fla_chain(
    peer: Peer,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    batch: int,
    scale: float,
) -> torch.Tensor:
    """fla's fused recurrent GDN over ``batch`` equal chains (packed rows ``[B*T, ...]``): o, no states."""

    def per_request(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, -1, *t.shape[1:])

    o, _ = peer.module["fused_recurrent"].fused_recurrent_gated_delta_rule(
        per_request(q), per_request(k), per_request(v), g=per_request(g), beta=per_request(beta),
        scale=scale, initial_state=state, output_final_state=False, use_qk_l2norm_in_kernel=False,
    )  # fmt: skip
    return o.reshape(v.shape)
