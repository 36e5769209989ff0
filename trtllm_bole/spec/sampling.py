"""Turning logits into the distribution a request samples from: temperature, top-k, top-p.

The target's logits go through it before acceptance, which tests each draft as a point mass against
the result (BOLE.md §4); the drafter's go through it too, but only to rank and prune draft candidates
(a request's drafts then follow its own temperature, top-k and top-p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_bole import ops


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
    ``top_p >= 1`` disable those filters. A sampled row keeps its logits at or above the floor that
    top-k, then the nucleus of the renormalised top-k, set (:func:`filter_floors`: ties at either
    boundary keep every tied token), and renormalises. ``filtered=False``: the caller knows that no
    sampled row filters (:attr:`~trtllm_bole.spec.drafter.DraftSettings.kind`), so the floor's search
    (on the CPU a sort of every row) is skipped; the result is the same.
    """
    floor = filter_floors(logits, temperature, top_k, top_p) if filtered else None
    return probabilities(logits, temperature, floor)


def filter_floors(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Each row's top-k / top-p floor (:func:`trtllm_bole.ops.filter_floor`); nothing to find on greedy
    rows."""
    greedy = temperature <= 0
    settings = (
        torch.where(greedy, 1.0, temperature),
        torch.where(greedy, 0, top_k),
        torch.where(greedy, 1.0, top_p),
    )
    return ops.filter_floor(logits, *settings)


def probabilities(
    logits: torch.Tensor, temperature: torch.Tensor, floor: torch.Tensor | None
) -> torch.Tensor:
    """The rows' distributions at their temperatures, each keeping its logits at or above its ``floor``
    (``None``: all), one-hot at the argmax where the temperature is 0."""
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    one_hot = torch.zeros_like(scaled).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    if floor is not None:
        scaled = scaled.masked_fill(scaled < floor[:, None], float("-inf"))
    return torch.where(greedy[:, None], one_hot, scaled.softmax(-1))


ROW_ELEMENTS = 1 << 25
"""How many logits :class:`ProcessedLogits` processes at once (128 MB in float32): a whole verify's nodes
at a small vocabulary, ~220 rows at a real model's."""


@dataclass(frozen=True, slots=True)
class ProcessedLogits:
    """:func:`process_logits` of rows of logits ``[N, V]`` with per-row settings ``[N]``, processed on
    demand, at most ``row_elements`` logits at a time: what sampled acceptance reads of a verify's
    distributions (a value per node and a few whole rows) without ``[N, V]`` probabilities, and the
    temporaries of their sort, all held at once."""

    logits: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    filtered: bool = True
    row_elements: int = ROW_ELEMENTS

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]

    def rows(self, index: torch.Tensor | slice, floor: torch.Tensor | None = None) -> torch.Tensor:
        """The distributions of rows ``index`` (``[n]`` or a slice): ``[n, V]``; ``floor``: their
        :func:`filter_floors` where the caller has them."""
        settings = (self.temperature[index], self.top_k[index], self.top_p[index])
        if self.filtered and floor is None:
            floor = filter_floors(self.logits[index], *settings)
        return probabilities(self.logits[index], settings[0], floor)

    def at(self, rows: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``p[rows[i], columns[i]]`` and the total of row ``rows[i]`` (float32 ``[n]`` each), a chunk
        of rows at a time (the floors of all rows at once: they take no ``[N, V]`` temporary on CUDA)."""
        values = torch.zeros(rows.shape, device=rows.device)
        mass = torch.zeros(rows.shape, device=rows.device)
        floors = (
            filter_floors(self.logits, self.temperature, self.top_k, self.top_p) if self.filtered else None
        )
        step = max(1, self.row_elements // self.vocab)
        for start in range(0, self.logits.shape[0], step):
            stop = min(start + step, self.logits.shape[0])
            probs = self.rows(slice(start, stop), None if floors is None else floors[start:stop])
            inside = (rows >= start) & (rows < stop)
            local = (rows - start).clamp(0, stop - start - 1)
            values = torch.where(inside, probs[local, columns], values)
            mass = torch.where(inside, probs.sum(-1)[local], mass)
        return values, mass
