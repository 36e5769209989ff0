"""Qwen3.5 building blocks, written to match transformers' ``modeling_qwen3_5.py`` op for op.

Every token mixer runs two ways over the same weights:

- over a packed forest of new tokens on top of the serving caches (:class:`ForwardState`): GDN
  through :mod:`trtllm_bole.ops` (tree conv, closed-form verify / serial verify / chunked prefill),
  attention over the paged KV cache and the node's ancestors (:func:`trtllm_bole.ops.tree_attention`);
- over whole sequences without a cache (:class:`SequenceState`), differentiable, for training and
  for checking logits against transformers.

Projections are fused where one matmul replaces several (GDN ``in_proj_qkv|z|b|a``, attention
``q|k|v``, MLP ``gate|up``); the loader fills the fused weights slice by slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_bole import ops
from trtllm_bole.models.attention import causal_attention, tree_attention
from trtllm_bole.models.cache import PendingCommit, PrefillPlan, StepContext
from trtllm_bole.models.config import LINEAR_ATTENTION, Qwen35Config
from trtllm_bole.reference import rope

GDN_MODES = ("bole", "serial", "prefill")

# ------------------------------------------------------------------------------------------- #
# Norms and rotary embedding                                                                   #
# ------------------------------------------------------------------------------------------- #


def rope_cos_sin(
    positions: torch.Tensor, config: Qwen35Config, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width cos/sin ``[..., rotary_dim / 2]`` for integer positions (:mod:`trtllm_bole.reference.rope`:
    Qwen3.5's multimodal RoPE is plain 1-D RoPE for text tokens)."""
    return rope.cos_sin(
        positions, rope.inv_freq(config.rope_theta, config.rotary_dim, positions.device), dtype
    )


# ------------------------------------------------------------------------------------------- #
# Per-forward state                                                                            #
# ------------------------------------------------------------------------------------------- #


@dataclass(slots=True)
class SequenceState:
    """Cache-less forward over ``[B, L]`` sequences: positions ``0 .. L - 1``."""

    cos: torch.Tensor  # [L, rotary_dim / 2]
    sin: torch.Tensor

    @classmethod
    def build(
        cls, length: int, config: Qwen35Config, dtype: torch.dtype, device: torch.device
    ) -> SequenceState:
        return cls(*rope_cos_sin(torch.arange(length, device=device), config, dtype))

    def norm_rope(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """q or k ``[B, L, heads, head_dim]`` normalised and rotated, differentiably (training)."""
        return rope.apply_rope(ops.rms_norm(x, weight, eps), self.cos, self.sin)


@dataclass(slots=True)
class ForwardState:
    """What every layer of one serving forward reads, and what the layers leave for the commit."""

    ctx: StepContext
    cos: torch.Tensor  # [N, rotary_dim / 2], position = context_len + depth - 1
    sin: torch.Tensor
    k_cache: torch.Tensor  # [L_attn, num_blocks, block_size, KVH, d]
    v_cache: torch.Tensor
    gdn_state: torch.Tensor | None = None  # [L_gdn, S, HV, dk, dv]
    conv_state: torch.Tensor | None = None  # [L_gdn, S, C, W - 1]
    gdn_mode: str = "bole"
    # Growing a forest (attention-only stacks, i.e. the MTP head): only the nodes ``rows`` are
    # computed; the other nodes' K/V ``[L_attn, N, KVH, d]`` come from the previous pass.
    rows: torch.Tensor | None = None
    past_k: torch.Tensor | None = None
    past_v: torch.Tensor | None = None
    # A prefill's plan (:meth:`StepContext.prefill_plan`): each prompt's last token, the leaf its layers
    # commit their caches to as they run, and the GDN layers' chunks, made once for every layer.
    plan: PrefillPlan | None = None
    # False: the caller built the slots, block tables and lengths (the executor), so the operators leave
    # their values unchecked and a prefill never waits for the device.
    check: bool = True
    conv_inputs: list[torch.Tensor] = field(default_factory=list)
    gdn_factors: list[ops.GDNTreeFactors] = field(default_factory=list)
    gdn_snapshots: list[torch.Tensor] = field(default_factory=list)
    new_k: list[torch.Tensor] = field(default_factory=list)
    new_v: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        ctx: StepContext,
        config: Qwen35Config,
        dtype: torch.dtype,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *,
        gdn_state: torch.Tensor | None = None,
        conv_state: torch.Tensor | None = None,
        gdn_mode: str = "bole",
        rows: torch.Tensor | None = None,
        past_k: torch.Tensor | None = None,
        past_v: torch.Tensor | None = None,
        check: bool = True,
    ) -> ForwardState:
        if gdn_mode not in GDN_MODES:
            raise ValueError(f"gdn_mode must be one of {GDN_MODES}, got {gdn_mode!r}")
        tree = ctx.tree
        positions = ctx.context_lens.long()[tree.request] + tree.depth - 1
        if rows is not None:
            positions = positions[rows]
        plan = ctx.prefill_plan() if gdn_mode == "prefill" else None
        return cls(ctx, *rope_cos_sin(positions, config, dtype), k_cache, v_cache, gdn_state, conv_state,
                   gdn_mode, rows, past_k, past_v, plan, check)  # fmt: skip

    @property
    def is_prefill(self) -> bool:
        """A prefill's layers write their caches as they run (GDN state, conv state, K/V): its prompts are
        accepted whole, so nothing is kept for a commit (a batch of long prompts' conv inputs and K/V,
        every layer's stacked, would be the largest tensors of its forward)."""
        return self.gdn_mode == "prefill"

    def norm_rope(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """q or k ``[N, heads, head_dim]`` normalised and rotated (one kernel on CUDA)."""
        return ops.rms_norm_rope(x, weight, eps, self.cos, self.sin)

    def pending(self) -> PendingCommit:
        def stacked(xs: list[torch.Tensor]) -> torch.Tensor | None:
            return torch.stack(xs) if xs else None

        return PendingCommit(
            self.ctx,
            self.k_cache,
            self.v_cache,
            stacked(self.new_k),
            stacked(self.new_v),
            self.gdn_state,
            self.conv_state,
            stacked(self.conv_inputs),
            ops.stack_factors(self.gdn_factors) if self.gdn_factors else None,
            tuple(self.gdn_snapshots) if self.gdn_snapshots else None,
        )


# ------------------------------------------------------------------------------------------- #
# Layers                                                                                       #
# ------------------------------------------------------------------------------------------- #


class EmptyInitModule(nn.Module):
    """Parameters are created empty (no random init: weights come from a checkpoint or a seeded
    generator) and frozen for serving; ``requires_grad_(True)`` to train."""

    def __init__(self, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self._factory = {"dtype": dtype, "device": device}

    def _param(self, *shape: int) -> nn.Parameter:
        return nn.Parameter(torch.empty(shape, **self._factory), requires_grad=False)


class _Mixer(EmptyInitModule):
    """A token mixer; ``index`` is its position among the layers of its kind (its row in the caches)."""

    def __init__(self, config: Qwen35Config, index: int, dtype: torch.dtype, device: torch.device | str):
        super().__init__(dtype, device)
        self.index = index
        self.eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor, state: ForwardState | SequenceState) -> torch.Tensor:
        if isinstance(state, ForwardState):
            return self.forward_tree(x, state)
        return self.forward_sequences(x, state)

    def forward_tree(self, x: torch.Tensor, fs: ForwardState) -> torch.Tensor:
        raise NotImplementedError

    def forward_sequences(self, x: torch.Tensor, ss: SequenceState) -> torch.Tensor:
        raise NotImplementedError


class GatedDeltaNet(_Mixer):
    """``layers.N.linear_attn``: in-proj, short conv + SiLU, q/k L2 norm, gates, recurrence, gated norm."""

    def __init__(self, config: Qwen35Config, index: int, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__(config, index, dtype, device)
        c = config
        self.key_heads = c.linear_num_key_heads
        self.value_heads = (c.linear_num_value_heads, c.linear_value_head_dim)
        self.splits = (c.conv_dim, c.value_dim, c.linear_num_value_heads, c.linear_num_value_heads)
        self.key_dim, self.value_dim = c.key_dim, c.value_dim
        self.scale = c.linear_key_head_dim**-0.5
        self.in_proj = self._param(sum(self.splits), c.hidden_size)  # [qkv | z | b | a]
        self.conv_weight = self._param(c.conv_dim, c.linear_conv_kernel_dim)
        self.A_log = self._param(c.linear_num_value_heads)
        self.dt_bias = self._param(c.linear_num_value_heads)
        self.norm = self._param(c.linear_value_head_dim)
        self.out_proj = self._param(c.hidden_size, c.value_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.in_proj).split(self.splits, dim=-1)

    def _recurrence_inputs(
        self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        qk, v = mixed.split((2 * self.key_dim, self.value_dim), dim=-1)
        # q and k normalised in float32, handed on in the activations' dtype: in bf16 that is the verify
        # kernels' serving layout (bf16 q/k/v, fp32 state), the one the kernel bench measures (fp32 q/k
        # turn its bf16 tensor-core products into tf32 ones and double their loads).
        q, k, g, beta = ops.gdn_inputs(qk, a, b, self.A_log, self.dt_bias, self.key_heads)
        return q, k, v.unflatten(-1, self.value_heads), g, beta

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = ops.gated_rms_norm(o, z.unflatten(-1, self.value_heads), self.norm, self.eps)
        return F.linear(y.flatten(-2), self.out_proj)

    def forward_tree(self, x: torch.Tensor, fs: ForwardState) -> torch.Tensor:
        ctx = fs.ctx
        qkv, z, b, a = self._project(x)
        mixed = ops.tree_conv1d(qkv, self.conv_weight, fs.conv_state[self.index], ctx.tree,
                                state_indices=ctx.slots, check=fs.check)  # fmt: skip
        if fs.is_prefill:  # the conv has read the old state: each prompt's last inputs replace it
            ops.conv_state_commit(
                fs.conv_state[self.index], qkv, ctx.tree, fs.plan.ends, state_indices=ctx.slots, check=False
            )
        else:
            fs.conv_inputs.append(qkv)
        q, k, v, g, beta = self._recurrence_inputs(mixed, b, a)
        state = fs.gdn_state[self.index]
        if fs.is_prefill:
            o = ops.gdn_prefill(q, k, v, g, beta, state, fs.plan.chunks, scale=self.scale,
                                state_indices=ctx.slots, check=fs.check)  # fmt: skip
        elif fs.gdn_mode == "serial":
            o, snapshots = ops.gdn_tree_verify_serial(
                q, k, v, g, beta, state, ctx.tree, scale=self.scale, state_indices=ctx.slots
            )
            fs.gdn_snapshots.append(snapshots)
        else:
            o, factors = ops.gdn_tree_verify(
                q, k, v, g, beta, state, ctx.tree, scale=self.scale, state_indices=ctx.slots
            )
            fs.gdn_factors.append(factors)
        return self._output(o, z)

    def forward_sequences(self, x: torch.Tensor, ss: SequenceState) -> torch.Tensor:
        qkv, z, b, a = self._project(x)
        width = self.conv_weight.shape[1]
        mixed = F.conv1d(
            qkv.transpose(1, 2), self.conv_weight[:, None, :], padding=width - 1, groups=qkv.shape[-1]
        )
        mixed = F.silu(mixed[..., : x.shape[1]]).transpose(1, 2)
        q, k, v, g, beta = self._recurrence_inputs(mixed, b, a)
        initial = torch.zeros(
            x.shape[0], v.shape[2], q.shape[-1], v.shape[-1], device=x.device
        )  # [B, HV, dk, dv]
        o, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta, initial, scale=self.scale)
        return self._output(o, z)


class Attention(_Mixer):
    """``layers.N.self_attn``: q (+ output gate), k, v; q/k RMSNorm; partial RoPE; GQA; gated output."""

    def __init__(self, config: Qwen35Config, index: int, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__(config, index, dtype, device)
        c = config
        self.head_dim = c.head_dim
        self.num_heads = c.num_attention_heads
        kv_width = c.num_key_value_heads * c.head_dim
        self.splits = (2 * c.num_attention_heads * c.head_dim, kv_width, kv_width)
        self.qkv_proj = self._param(sum(self.splits), c.hidden_size)  # [q and gate per head | k | v]
        self.q_norm = self._param(c.head_dim)
        self.k_norm = self._param(c.head_dim)
        self.o_proj = self._param(c.hidden_size, c.num_attention_heads * c.head_dim)

    def _project(self, x: torch.Tensor, state: ForwardState | SequenceState) -> tuple[torch.Tensor, ...]:
        q_gate, k, v = F.linear(x, self.qkv_proj).split(self.splits, dim=-1)
        # q_proj interleaves per head: [query (head_dim), gate (head_dim)] (transformers' layout).
        q, gate = q_gate.unflatten(-1, (self.num_heads, 2 * self.head_dim)).chunk(2, dim=-1)
        q = state.norm_rope(q, self.q_norm, self.eps)
        k = state.norm_rope(k.unflatten(-1, (-1, self.head_dim)), self.k_norm, self.eps)
        return q, k, v.unflatten(-1, (-1, self.head_dim)), gate.flatten(-2)

    def _output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return F.linear(o.flatten(-2) * torch.sigmoid(gate), self.o_proj)

    def forward_tree(self, x: torch.Tensor, fs: ForwardState) -> torch.Tensor:
        q, k, v, gate = self._project(x, fs)
        if fs.rows is not None:
            k = fs.past_k[self.index].index_copy(0, fs.rows, k)
            v = fs.past_v[self.index].index_copy(0, fs.rows, v)
        ctx = fs.ctx
        o = tree_attention(q, k, v, fs.k_cache[self.index], fs.v_cache[self.index], ctx.block_tables,
                           ctx.context_lens, ctx.tree, fs.rows)  # fmt: skip
        if fs.is_prefill:  # the prompts' K/V into the layer's cache (their room was checked up front)
            layer = slice(self.index, self.index + 1)
            ops.kv_commit(fs.k_cache[layer], fs.v_cache[layer], k[None], v[None], ctx.tree, fs.plan.ends,
                          ctx.block_tables, ctx.context_lens, check=False)  # fmt: skip
        else:
            fs.new_k.append(k)
            fs.new_v.append(v)
        return self._output(o, gate)

    def forward_sequences(self, x: torch.Tensor, ss: SequenceState) -> torch.Tensor:
        q, k, v, gate = self._project(x, ss)
        return self._output(causal_attention(q, k, v), gate)


class MLP(EmptyInitModule):
    def __init__(self, config: Qwen35Config, *, dtype: torch.dtype, device: torch.device | str):
        super().__init__(dtype, device)
        self.gate_up_proj = self._param(2 * config.intermediate_size, config.hidden_size)
        self.down_proj = self._param(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj)


class DecoderLayer(EmptyInitModule):
    """Pre-norm residual block: token mixer (GDN or attention), then MLP."""

    def __init__(
        self,
        config: Qwen35Config,
        kind: str,
        index: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        super().__init__(dtype, device)
        self.eps = config.rms_norm_eps
        self.kind = kind
        self.input_norm = self._param(config.hidden_size)
        self.post_attention_norm = self._param(config.hidden_size)
        mixer = GatedDeltaNet if kind == LINEAR_ATTENTION else Attention
        self.mixer = mixer(config, index, dtype=dtype, device=device)
        self.mlp = MLP(config, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, state: ForwardState | SequenceState) -> torch.Tensor:
        x = x + self.mixer(ops.rms_norm(x, self.input_norm, self.eps), state)
        return x + self.mlp(ops.rms_norm(x, self.post_attention_norm, self.eps))
