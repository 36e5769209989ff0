"""Turning logits into the distribution a request samples from: temperature, top-k, top-p.

The target's logits go through it before acceptance, which tests each draft as a point mass against
the result (BOLE.md §4); the drafter's go through it too, but only to rank and prune draft candidates
(a request's drafts then follow its own temperature, top-k and top-p).
"""

from __future__ import annotations

import torch


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    filtered: bool = True,
) -> torch.Tensor:
    """Probabilities ``[N, V]`` (float32) for rows of logits with per-row settings ``[N]``.

    ``temperature == 0`` rows become one-hot at the argmax (greedy); ``top_k <= 0`` and
    ``top_p >= 1`` disable those filters. Top-k first, then the nucleus of the renormalised top-k (as
    Hugging Face and vLLM order them). Ties at the top-k / top-p boundary keep every tied token, so
    the result does not depend on how the sort orders equal values. ``filtered=False``: the caller knows
    that no sampled row filters (:attr:`~trtllm_bole.spec.drafter.DraftSettings.kind`), so the
    vocabulary sort is skipped; the result is the same.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    one_hot = torch.zeros_like(scaled).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    if not filtered:
        return torch.where(greedy[:, None], one_hot, scaled.softmax(-1))
    sorted_logits, _ = scaled.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).long()
    kth = sorted_logits.gather(1, (k - 1)[:, None])
    in_top_k = sorted_logits >= kth
    sorted_probs = sorted_logits.masked_fill(~in_top_k, float("-inf")).softmax(-1)
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < p.
    # top_p >= 1 keeps everything outright: in float32 the tail's mass before rounds up to 1.
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    in_nucleus = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1))
    nucleus_floor = sorted_logits.masked_fill(~in_nucleus, float("inf")).amin(-1, keepdim=True)
    floor = torch.maximum(kth, nucleus_floor)
    probs = scaled.masked_fill(scaled < floor, float("-inf")).softmax(-1)
    return torch.where(greedy[:, None], one_hot, probs)
