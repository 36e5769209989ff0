"""The top-k / top-p threshold of rows of logits, by sorting them: the truth of
:func:`trtllm_bole.ops.filter_floor`, which the GPU finds without a sort
(:mod:`trtllm_bole.kernels.filter_floor`); and what a filtered softmax needs of a row to give any of
its probabilities, the truth of :func:`trtllm_bole.ops.softmax_stats`
(:mod:`trtllm_bole.kernels.softmax_stats`)."""

from __future__ import annotations

import torch


def filter_floor(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The smallest logit that top-k and top-p keep in each row of ``logits [N, V] / temperature [N]``
    (in float32; float64 logits in float64): ``[N]``, ``-inf`` where neither filters (``top_k``
    outside ``1 .. V - 1`` and ``top_p >= 1``). A row keeps exactly its scaled logits ``>= floor``.

    Top-k first, then the nucleus of the renormalised top-k (as Hugging Face and vLLM order them): a
    token stays if the top-k mass before it, in descending order, is below ``top_p``, and the likeliest
    token always stays (a row keeps at least one token, whatever ``top_p``). Ties at either
    boundary keep every tied token, so the floor does not depend on how the sort orders equal values.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)  # not the settings': the kernel's and the fake's
    scaled = logits.to(dtype) / temperature[:, None].to(dtype)
    vocab = scaled.shape[-1]
    sorted_logits, _ = scaled.sort(dim=-1, descending=True)
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).long()
    kth = sorted_logits.gather(1, (k - 1)[:, None])
    in_top_k = sorted_logits >= kth
    sorted_probs = sorted_logits.masked_fill(~in_top_k, float("-inf")).softmax(-1)
    # top_p >= 1 keeps everything outright: in float32 the tail's mass before rounds up to 1.
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    likeliest = torch.arange(vocab, device=logits.device) == 0  # always kept (at top_p <= 0 too), as on CUDA
    in_nucleus = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1) | likeliest)
    nucleus_floor = sorted_logits.masked_fill(~in_nucleus, float("inf")).amin(-1, keepdim=True)
    floor = torch.maximum(kth, nucleus_floor).squeeze(-1)
    filters = ((top_k > 0) & (top_k < vocab)) | (top_p < 1)
    return torch.where(filters, floor, float("-inf"))


def softmax_stats(
    logits: torch.Tensor, temperature: torch.Tensor, floor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax (int64 ``[N]``, the first of equal maxima, as ``argmax``) and the normaliser of its
    softmax at ``temperature [N]`` (> 0) over the scaled logits at or above ``floor [N]``:
    ``Σ exp(x / t - max(x / t))`` over ``x / t >= floor`` (float32; float64 logits in float64), so that
    ``p(x) = exp(x / t - max) / normaliser`` for a kept ``x``. The maximum is the argmax's logit divided
    (division by a positive ``t`` keeps the order), and a floor from :func:`filter_floor` always keeps it."""
    dtype = torch.promote_types(logits.dtype, torch.float32)  # not the settings': the kernel's and the fake's
    scaled = logits.to(dtype) / temperature[:, None].to(dtype)
    top = scaled.amax(-1, keepdim=True)
    kept = scaled >= floor[:, None]
    return logits.argmax(-1), torch.where(kept, (scaled - top).exp(), 0.0).sum(-1)
