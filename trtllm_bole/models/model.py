"""The Qwen3.5 hybrid model (dense), with three serving entry points over one set of weights.

- :meth:`Qwen35Model.prefill`: prompts (one chain per request), written straight into the caches;
- :meth:`Qwen35Model.verify`: a packed forest of draft tokens; caches untouched, a pending commit
  returned; :meth:`Qwen35Model.commit` then keeps each request's accepted path;
- :meth:`Qwen35Model.decode`: one token per request (a one-node verify plus its commit);

and :meth:`Qwen35Model.forward_sequences`, cache-less and differentiable, for training and for the
comparison with transformers. Layer code is shared by all of them (:mod:`trtllm_bole.models.layers`).

The ``hidden`` the entry points return is the final-normed state that the lm_head (and the MTP
head, see :mod:`trtllm_bole.models.mtp`) consumes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_bole import ops
from trtllm_bole.models.cache import ModelCache, PendingCommit, StepContext
from trtllm_bole.models.config import LINEAR_ATTENTION, Qwen35Config
from trtllm_bole.models.layers import DecoderLayer, EmptyInitModule, ForwardState, SequenceState
from trtllm_bole.models.mtp import MTPHead

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


class Qwen35Model(EmptyInitModule):
    """Weights (fused projections, see :mod:`~trtllm_bole.models.checkpoint` for the name map), the
    optional MTP head, and the serving cache once :meth:`allocate_cache` has run. Build it with
    :func:`~trtllm_bole.models.loader.load_model` (a checkpoint) or
    :func:`~trtllm_bole.models.loader.random_model` (seeded weights)."""

    def __init__(
        self,
        config: Qwen35Config,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        mtp: bool = False,
    ):
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
        if torch.device(device).type == "cuda":
            config.check_cuda_tiles()
        super().__init__(dtype, device)
        self.config = config
        c = config
        self.embed_tokens = self._param(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(
                c,
                kind,
                (c.gdn_layer_ids if kind == LINEAR_ATTENTION else c.attn_layer_ids).index(i),
                dtype=dtype,
                device=device,
            )
            for i, kind in enumerate(c.layer_types)
        )
        self.norm = self._param(c.hidden_size)
        self.lm_head = None if c.tie_word_embeddings else self._param(c.vocab_size, c.hidden_size)
        self.mtp = (
            MTPHead(c, self.embed_tokens, self.lm_head_weight, dtype=dtype, device=device) if mtp else None
        )
        self.cache: ModelCache | None = None
        self.cache_allocations = 0  # each allocate_cache gives the cache to a new user (it is zeroed)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def lm_head_weight(self) -> nn.Parameter:
        return self.embed_tokens if self.lm_head is None else self.lm_head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head_weight)

    def allocate_cache(self, num_slots: int, num_blocks: int, block_size: int = 16) -> ModelCache:
        """Allocate (and keep) zeroed slot pools and paged KV; the MTP head shares the same object. A kept
        cache with at least these slots and blocks (and this block size) is zeroed and serves again: its
        addresses stay, and with them the CUDA graphs captured on it
        (:mod:`trtllm_bole.spec.draft_graphs`)."""
        c = self.cache
        if c is None or c.block_size != block_size or c.num_slots < num_slots or c.num_blocks < num_blocks:
            self.cache = ModelCache.allocate(
                self.config, num_slots, num_blocks, block_size,
                dtype=self.dtype, device=self.device, mtp=self.mtp is not None,
            )  # fmt: skip
        else:
            c.zero_()
        if self.mtp is not None:
            self.mtp.cache = self.cache
        self.cache_allocations += 1
        return self.cache

    def release_cache(self) -> None:
        """Drop the cache (the MTP head's too): its memory goes once no graph or executor holds it."""
        self.cache = None
        if self.mtp is not None:
            self.mtp.cache = None

    # -------------------------------------------------------------------------------------- #
    # Serving                                                                                 #
    # -------------------------------------------------------------------------------------- #

    def _forward_state(
        self, input_ids: torch.Tensor, ctx: StepContext, gdn_mode: str, check: bool = True
    ) -> ForwardState:
        cache = self.cache
        if cache is None:
            raise ValueError("no cache: call allocate_cache(num_slots, num_blocks, block_size) first")
        if input_ids.shape != (ctx.tree.num_nodes,):
            raise ValueError(
                f"input_ids must be [N={ctx.tree.num_nodes}] (one token per tree node), got "
                f"{tuple(input_ids.shape)}"
            )
        return ForwardState.build(
            ctx, self.config, self.dtype, cache.k_cache, cache.v_cache,
            gdn_state=cache.gdn_state, conv_state=cache.conv_state, gdn_mode=gdn_mode, check=check,
        )  # fmt: skip

    def _forward(self, input_ids: torch.Tensor, fs: ForwardState) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, fs)
        return ops.rms_norm(x, self.norm, self.config.rms_norm_eps)

    @torch.no_grad()
    def prefill(
        self, input_ids: torch.Tensor, ctx: StepContext, *, check: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts ``input_ids [N]`` (``ctx``: one chain per request, from :meth:`StepContext.chains`, on
        top of ``context_lens`` committed tokens, 0 for a fresh request), written into the caches.

        Returns ``(hidden [N, h], logits [B, V])``, the logits at each prompt's last token. GDN runs
        chunked (:func:`trtllm_bole.ops.gdn_prefill`), equal to the recurrence. ``check=False``: the
        caller built the slots, block tables and lengths (the executor), so their values go unchecked and
        nothing waits for the device.
        """
        fs = self._forward_state(input_ids, ctx, "prefill", check)
        if check:  # before any layer writes a cache (the GDN layers check the slots too: after any
            # attention layer before the first of them wrote its K/V)
            cache = self.cache
            ops.check_slots(cache.num_slots, ctx.tree.num_requests, ctx.slots, cache.gdn_state.device)
            if self.config.attn_layer_ids:
                ops.check_kv_room(fs.k_cache, ctx.tree, fs.plan.ends, ctx.block_tables, ctx.context_lens)
        hidden = self._forward(input_ids, fs)  # its layers wrote every cache: no commit
        return hidden, self.logits(hidden[ctx.tree.cu_seqlens[1:] - 1])

    @torch.no_grad()
    def verify(
        self, input_ids: torch.Tensor, ctx: StepContext, *, gdn_scheme: str = "bole"
    ) -> tuple[torch.Tensor, torch.Tensor, PendingCommit]:
        """A packed forest of draft tokens; no cache is written.

        Node ``i`` sees the committed context plus its ancestors (RoPE position
        ``context_len + depth(i) - 1``); GDN layers run Bole's closed form (``"bole"``, factors kept)
        or the node-by-node baseline (``"serial"``, a state snapshot per node). Returns
        ``(logits [N, V], hidden [N, h], pending)``; hand ``pending`` to :meth:`commit`.
        """
        if gdn_scheme not in ("bole", "serial"):
            raise ValueError(f"gdn_scheme must be 'bole' or 'serial', got {gdn_scheme!r}")
        fs = self._forward_state(input_ids, ctx, gdn_scheme)
        hidden = self._forward(input_ids, fs)
        return self.logits(hidden), hidden, fs.pending()

    @torch.no_grad()
    def commit(self, pending: PendingCommit, accepted_leaf: torch.Tensor, *, check: bool = True) -> None:
        """Keep each request's path to ``accepted_leaf[b]`` (local node index, -1 = nothing).

        GDN state (Bole's factors: all layers in one call; the serial baseline's snapshots, one tensor a
        layer: a call a layer), conv state (one call) and the accepted K/V at positions
        ``context_len .. context_len + depth - 1``. ``ctx`` is not changed: the executor advances
        ``context_lens`` by the accepted depth. ``check=False``: see :meth:`PendingCommit.commit`.
        """
        pending.commit(accepted_leaf, check=check)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """One new token per request (:meth:`StepContext.single_tokens`); returns logits ``[B, V]``."""
        tree = ctx.tree
        if tree.num_nodes != tree.num_requests:
            raise ValueError(
                f"decode takes one token per request, got {tree.num_nodes} nodes for {tree.num_requests} "
                f"requests; use verify for trees"
            )
        logits, _, pending = self.verify(input_ids, ctx)
        pending.commit(torch.zeros(tree.num_requests, dtype=torch.long, device=input_ids.device))
        return logits

    # -------------------------------------------------------------------------------------- #
    # Training / reference                                                                    #
    # -------------------------------------------------------------------------------------- #

    def forward_sequences(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids [B, L]`` from position 0, no cache; returns ``(hidden [B, L, h], logits [B, L, V])``.

        Differentiable (GDN through the chunked closed form); parameters are created with
        ``requires_grad=False`` for serving, so call ``requires_grad_(True)`` to train.
        """
        state = SequenceState.build(input_ids.shape[1], self.config, self.dtype, input_ids.device)
        x = F.embedding(input_ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, state)
        hidden = ops.rms_norm(x, self.norm, self.config.rms_norm_eps)
        return hidden, self.logits(hidden)
