"""Turning logits into the distribution a request samples from: temperature, top-k, top-p.

The target's logits go through it before acceptance, which tests each draft as a point mass against
the result (BOLE.md §4), read where the test reads them (:class:`ProcessedLogits`: a probability a node
from each row's floor, argmax and softmax normaliser, and a few whole rows); the drafter's floors come
from here too, to rank draft candidates as their request samples (a request's drafts then follow its own
temperature, top-k and top-p; :meth:`~trtllm_bole.spec.drafter.DraftSettings.top_log_probs`).
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


@dataclass(frozen=True, slots=True)
class ProcessedLogits:
    """:func:`process_logits` of rows of logits ``[N, V]``, read where sampled acceptance reads it: one
    probability a node (:meth:`at`) and a few whole rows (:meth:`rows`), without the ``[N, V]``
    probabilities (nor, with top-k / top-p, a sort's temporaries) of every row. ``floor``: the rows'
    :func:`filter_floors`, found once (:meth:`of`), or None where no row filters."""

    logits: torch.Tensor
    temperature: torch.Tensor
    floor: torch.Tensor | None

    @classmethod
    def of(
        cls,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        *,
        filtered: bool = True,
    ) -> ProcessedLogits:
        """Rows with per-row settings ``[N]``, as :func:`process_logits` takes them."""
        floor = filter_floors(logits, temperature, top_k, top_p) if filtered else None
        return cls(logits, temperature, floor)

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]

    def rows(self, index: torch.Tensor | slice) -> torch.Tensor:
        """The distributions of rows ``index`` (``[n]`` or a slice): ``[n, V]``."""
        floor = None if self.floor is None else self.floor[index]
        return probabilities(self.logits[index], self.temperature[index], floor)

    def at(self, rows: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``p[rows[i], columns[i]]`` and the total of row ``rows[i]`` (float64 ``[n]`` each): the kept
        tokens' :func:`log_probs_at` exponentiated, the one-hot of the argmax on greedy rows. A total is
        1, what the normaliser makes it (the sum of a row of :meth:`rows` is 1 to float32 rounding)."""
        log_p, argmax = log_probs_at(self.logits, self.temperature, self.floor, rows, columns)
        p = torch.where((self.temperature <= 0)[rows], (columns == argmax).double(), log_p.exp())
        return p, torch.ones_like(p)


def log_probs_at(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    floor: torch.Tensor | None,
    rows: torch.Tensor,
    columns: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability of token ``columns`` in row ``rows`` (index tensors that broadcast) of ``logits
    [N, V]`` under each row's softmax at its ``temperature [N]`` (``<= 0`` read as 1: the plain softmax)
    over its logits at or above ``floor [N]`` (:func:`filter_floors`'; None keeps all): ``x / t - max -
    log(normaliser)`` (float64, after the division in float32 as :func:`probabilities` rounds it), ``-inf``
    for a token the floor drops; and the argmax of each of those rows. From each row's argmax and
    normaliser (:func:`~trtllm_bole.ops.softmax_stats`: on CUDA one read of the rows), with no ``[N, V]``
    temporary. Dividing by a positive temperature keeps the logits' order, so the maximum is the
    argmax's logit divided."""
    t = torch.where(temperature <= 0, 1.0, temperature)
    floor = torch.full_like(t, float("-inf")) if floor is None else floor
    argmax, normaliser = ops.softmax_stats(logits, t, floor)
    t, floor, argmax, normaliser = (x[rows] for x in (t, floor, argmax, normaliser))
    x = logits[rows, columns].float() / t
    top = logits[rows, argmax].float() / t
    log_p = x.double() - top.double() - normaliser.double().log()
    return torch.where(x >= floor, log_p, float("-inf")), argmax


def request_generator(seed: int, device: torch.device) -> torch.Generator:
    """A seeded request's generator on ``device``, the seed read modulo 2**64. CUDA's generator (Philox)
    reads all 64 bits; the CPU's (Mersenne Twister) only the low 32, so that seeds 2**32 apart (a base plus
    ``i * 2**32``) sampled alike there: on the CPU a seed of 2**32 or more is mixed down to 32 bits first
    (splitmix64's finaliser, its high half), a smaller one is used as it is."""
    seed %= 2**64
    if device.type == "cpu" and seed >= 2**32:
        mask = 2**64 - 1
        seed = ((seed ^ (seed >> 30)) * 0xBF58476D1CE4E5B9) & mask
        seed = ((seed ^ (seed >> 27)) * 0x94D049BB133111EB) & mask
        seed = (seed ^ (seed >> 31)) >> 32
    return torch.Generator(device=device).manual_seed(seed)
