"""A batch of draft trees as one packed forest.

Request ``b`` owns nodes ``cu_seqlens[b] : cu_seqlens[b + 1]`` of every per-node tensor. Inside a
request, ``parents[i]`` is the *local* index of node ``i``'s parent, or ``-1`` when ``i`` is a child
of the committed root (the state after the last committed token). Parents come before children
(``parents[i] < i``), so the packed order is a topological order (BOLE.md §2).

Everything the kernels and references need is derived once here:

- ``depth``: 1 for a child of the root, ``depth(parent) + 1`` otherwise;
- ``paths[i, :depth[i]]``: global indices of the root-to-node path (root child first, ``i`` last).
  A forest deeper than :data:`MAX_TREE_DEPTH` (only a prompt's chain can be: :meth:`TreeBatch.chains`)
  carries ``paths`` with no columns, since its full table would grow with the prompt's length squared,
  and so do the GDN prefill's chunks (``chains(..., paths=False)``): only the prefill takes such
  forests, and its operators need a node's few nearest ancestors (``global_parents``) or the interval
  test below, never a whole path (:attr:`TreeBatch.has_paths`);
- ``dfs_order`` / ``subtree_size``: a depth-first pre-order rank and the size of each subtree, so
  "``j`` is an ancestor of ``i`` or ``i`` itself" is the interval test
  ``dfs_order[j] <= dfs_order[i] < dfs_order[j] + subtree_size[j]`` — three 1-D loads per tile in a
  kernel instead of a gathered ``[T, T]`` mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
import torch.nn.functional as F

from trtllm_bole.transfer import to_device

_ALIGN = 16  # int64 elements: 128 bytes

MAX_TREE_DEPTH = 64
"""Deepest root-to-node path (in nodes) a :class:`TreeBatch` accepts, and the depth the kernels are
compiled for (``trtllm_bole.kernels.MAX_DEPTH``); a tree built deeper is refused by the kernels."""


@dataclass(frozen=True, slots=True)
class TreeBatch:
    parents: torch.Tensor  # int64 [N], local parent index, -1 = child of the committed root
    cu_seqlens: torch.Tensor  # int64 [B + 1]
    depth: torch.Tensor  # int64 [N], >= 1
    request: torch.Tensor  # int64 [N], owning request
    global_parents: torch.Tensor  # int64 [N], packed index of the parent, -1 = root child
    path_table: torch.Tensor  # int64 [N, max_depth] or [N, 0]: what `paths` reads (see has_paths)
    dfs_order: torch.Tensor  # int64 [N], depth-first pre-order rank over the whole forest
    subtree_size: torch.Tensor  # int64 [N], nodes in the subtree rooted at each node (itself included)
    max_depth: int  # host ints: the deepest path and the largest request (kernels size launches by them)
    max_nodes: int

    @classmethod
    def build(
        cls,
        parents: torch.Tensor,
        cu_seqlens: torch.Tensor,
        *,
        max_supported_depth: int = MAX_TREE_DEPTH,
    ) -> TreeBatch:
        """Validate a packed forest and derive its metadata.

        The derivation runs on the host: it is a few small sequential sweeps, each of which would
        synchronise with a GPU. The result reaches the tensors' device in one copy."""
        _check_tensors(parents, cu_seqlens)
        device, num_nodes = parents.device, parents.numel()
        host = torch.cat([parents.long(), cu_seqlens.long()]).cpu().numpy()  # one copy from a GPU
        # NumPy from here: a few dozen operations on at most a few thousand nodes, where each torch
        # call's dispatch would cost more than its work (one build per draft level and step).
        parents, cu_seqlens = host[:num_nodes], host[num_nodes:]
        lengths, request = _validate(parents, cu_seqlens)
        global_parents = np.where(parents >= 0, parents + cu_seqlens[:-1][request], parents)

        depth = np.ones(num_nodes, dtype=np.int64)
        has_parent = global_parents >= 0
        safe_parent = np.maximum(global_parents, 0)
        # Depth fixed point: each sweep settles one more tree level (parents precede children).
        for _ in range(max_supported_depth):
            new_depth = np.where(has_parent, depth[safe_parent] + 1, depth)
            if np.array_equal(new_depth, depth):
                break
            depth = new_depth
        max_depth = int(depth.max())
        if max_depth > max_supported_depth:
            node = int(np.flatnonzero(depth > max_supported_depth)[0])
            b = int(request[node])
            raise ValueError(
                f"request {b}, node {node - int(cu_seqlens[b])}: the tree is deeper than the supported "
                f"maximum depth {max_supported_depth}; draft shallower trees"
            )

        paths = np.full((num_nodes, max_depth), -1, dtype=np.int64)
        nodes = np.arange(num_nodes)
        paths[nodes, depth - 1] = nodes
        for level in range(2, max_depth + 1):
            # Parents are one level up and already complete: copy their path before our own slot.
            at_level = depth == level
            paths[at_level, : level - 1] = paths[safe_parent[at_level], : level - 1]
        subtree_size = np.bincount(paths[paths >= 0], minlength=num_nodes)
        dfs_order = _preorder(paths)
        derived = (parents, cu_seqlens, depth, request, global_parents, paths, dfs_order, subtree_size)
        return cls._from_host(derived, max_depth, int(lengths.max()), device)

    def to(self, device: torch.device | str) -> TreeBatch:
        """The same forest with its tensors on ``device``: one packed copy, split there into views that
        each start on a 128-byte boundary (kernels specialise on 16-byte-aligned pointers)."""
        device = torch.device(device)
        if self.parents.device == device:
            return self
        host = {f.name: getattr(self, f.name) for f in fields(self)}
        host = {name: t for name, t in host.items() if isinstance(t, torch.Tensor)}
        slots = [-(-t.numel() // _ALIGN) * _ALIGN for t in host.values()]
        starts = [sum(slots[:i]) for i in range(len(slots))]
        packed = torch.zeros(sum(slots), dtype=torch.long)
        for t, start in zip(host.values(), starts, strict=True):
            packed[start : start + t.numel()] = t.reshape(-1)
        packed = to_device(packed, device)
        moved = {
            name: packed[start : start + t.numel()].view(t.shape)
            for (name, t), start in zip(host.items(), starts, strict=True)
        }
        return replace(self, **moved)

    @classmethod
    def chains(
        cls,
        lengths: list[int],
        device: torch.device | str = "cpu",
        *,
        max_depth: int | None = None,
        paths: bool = True,
    ) -> TreeBatch:
        """One chain (a tree with a single path) per request: the shape of prefill and chain drafts.
        ``max_depth``: a bound on the lengths to carry instead of the longest (the host ints that pick
        kernels and their tiles; the prefill passes its chunk size, so that a chunk's arithmetic does not
        depend on the longest chunk beside it). ``paths=False``: no paths table (:attr:`has_paths`), for
        callers whose operators never read one (the GDN prefill's chunks).

        Its metadata in closed form (what :meth:`build` derives, without the sweeps): node ``i`` of a
        chain has depth ``i + 1``, its path is the chain's first ``i + 1`` nodes, the packed order is
        already depth-first, and a subtree is the rest of the chain. Made on the host from the lengths
        and moved in one packed copy (:meth:`to`): a prefill step makes a few of these, and built on a
        GPU each took ~20 launches. Chains deeper than :data:`MAX_TREE_DEPTH` carry no ``paths`` columns
        either: a prompt's would grow with its length squared (8 prompts of 4,096 tokens: 1 GiB of int64)."""
        if not lengths or any(n <= 0 for n in lengths):
            raise ValueError(f"chains need one positive length per request, got {list(lengths)}")
        if max_depth is not None and max_depth < max(lengths):
            raise ValueError(f"max_depth {max_depth} is below the longest chain, {max(lengths)}")
        sizes = np.asarray(lengths, dtype=np.int64)
        cu_seqlens = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
        max_depth = max_depth or int(sizes.max())
        request, local = _owners_on_host(cu_seqlens)
        nodes = np.arange(cu_seqlens[-1])
        steps = np.arange(max_depth if paths and max_depth <= MAX_TREE_DEPTH else 0)
        path_table = np.where(steps <= local[:, None], (nodes - local)[:, None] + steps, -1)
        derived = (local - 1, cu_seqlens, local + 1, request, np.where(local > 0, nodes - 1, -1), path_table,
                   nodes, sizes[request] - local)  # fmt: skip
        return cls._from_host(derived, max_depth, max_depth, device)

    @classmethod
    def _from_host(
        cls, derived: tuple[np.ndarray, ...], max_depth: int, max_nodes: int, device: torch.device | str
    ) -> TreeBatch:
        """The forest of host arrays ``derived`` (the tensor fields in order) on ``device``, in one copy."""
        tensors = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in derived)
        return cls(*tensors, max_depth, max_nodes).to(device)

    @classmethod
    def on_device(
        cls,
        parents: torch.Tensor,
        cu_seqlens: torch.Tensor,
        depth: torch.Tensor,
        *,
        max_depth: int,
        max_nodes: int,
    ) -> TreeBatch:
        """The metadata of a forest whose depths the caller already knows, derived where the tensors are:
        no copy to the host and no device sync, so a drafter can grow its forest level by level with the
        GPU running ahead (and a CUDA graph can capture it). No value checks: for forests the caller built
        (:meth:`build` validates a forest from outside).

        ``max_depth`` and ``max_nodes``: the forest's deepest path and largest request, or upper bounds of
        them where the caller knows only those (a forest selected on the device): ``paths`` then has
        ``max_depth`` columns, -1 beyond each node's depth (as ``spec.verify_graphs.pad_depth`` pads
        them), and the result reports the bounds. Every consumer treats both as sizes of padding: the
        kernels read a path up to the node's depth, attention masks padded rows.

        Pre-order ranks sort each request's root-to-node paths lexicographically: a path is a key of
        ``max_depth`` fields of ``max_nodes.bit_length()`` bits, cut into 62-bit words sorted stably from
        the leaf side up, the request's index above the root-side word (one sort for drafting's trees,
        two or three for trees of 64 nodes and depth 9)."""
        bits = max_nodes.bit_length()  # a field holds local index + 1 (0 pads), at most max_nodes
        device, num_nodes = parents.device, parents.numel()
        # Contiguous: the kernels index every field of a TreeBatch flat.
        parents, cu_seqlens, depth = (t.long().contiguous() for t in (parents, cu_seqlens, depth))
        request = _owners(cu_seqlens[1:] - cu_seqlens[:-1], num_nodes)
        start = cu_seqlens[:-1][request]
        global_parents = torch.where(parents >= 0, parents + start, -1)
        # up[:, k]: each node's k-th ancestor (itself at k = 0, -1 above the root); paths reverse it.
        up = [torch.arange(num_nodes, device=device)]
        for _ in range(max_depth - 1):
            up.append(torch.where(up[-1] >= 0, global_parents[up[-1].clamp(min=0)], -1))
        steps = torch.arange(max_depth, device=device)
        above = (depth[:, None] - 1 - steps).clamp(min=0)
        paths = torch.where(steps < depth[:, None], torch.stack(up, 1).gather(1, above), -1)
        on_path = torch.where(paths >= 0, paths, num_nodes).flatten()
        subtree_size = torch.zeros(num_nodes + 1, dtype=torch.long, device=device)
        subtree_size = subtree_size.scatter_add_(0, on_path, torch.ones_like(on_path))[:num_nodes]
        fields = torch.where(paths >= 0, paths - start[:, None] + 1, 0)
        per_word = 62 // bits
        # The request ranks above every field: folded into the root-side word where it fits.
        fold = (cu_seqlens.numel() - 2).bit_length() + bits * min(per_word, max_depth) <= 62
        order = torch.arange(num_nodes, device=device)
        for first in reversed(range(0, max_depth, per_word)):  # the least significant word first
            word = fields[order, first : first + per_word]
            shifts = bits * (word.shape[1] - 1 - torch.arange(word.shape[1], device=device))
            key = (word << shifts).sum(1)
            if first == 0 and fold:
                key = key | (request[order] << (bits * word.shape[1]))
            order = order[torch.argsort(key, stable=True)]
        if not fold:
            order = order[torch.argsort(request[order], stable=True)]
        dfs_order = torch.empty_like(order).scatter_(0, order, torch.arange(num_nodes, device=device))
        return cls(parents, cu_seqlens, depth, request, global_parents, paths, dfs_order, subtree_size,
                   max_depth, max_nodes)  # fmt: skip

    @property
    def num_requests(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_nodes(self) -> int:
        return self.parents.numel()

    @property
    def has_paths(self) -> bool:
        """Whether the forest carries its root-to-node paths: every forest up to :data:`MAX_TREE_DEPTH`
        deep does (every one the verify kernels accept) unless made by ``chains(..., paths=False)``; a
        longer prompt's chain carries an ``[N, 0]`` table instead."""
        return self.path_table.shape[1] == self.max_depth

    @property
    def paths(self) -> torch.Tensor:
        """int64 ``[N, max_depth]``: root-to-node global indices, -1 padded. Refused (``ValueError``) for a
        forest that carries none (:attr:`has_paths`), rather than read as an empty table."""
        if not self.has_paths:
            raise ValueError(
                f"this forest ({self.max_depth} deep, a prompt's or a prefill's chains) carries no paths "
                f"table; its operators take a node's nearest ancestors from global_parents instead"
            )
        return self.path_table

    def tensors(self) -> list[torch.Tensor]:
        """The forest's tensors in field order: ``TreeBatch(*tree.tensors(), max_depth, max_nodes)`` is
        the same forest (how the ``bole::*`` operators, which take tensors and ints, receive one)."""
        return [self.parents, self.cu_seqlens, self.depth, self.request, self.global_parents, self.path_table,
                self.dfs_order, self.subtree_size]  # fmt: skip

    def ancestor_mask(self, request: int | None = None) -> torch.Tensor:
        """``mask[i, j]``: node ``j`` is an ancestor of node ``i`` or ``i`` itself (bool ``[T, T]``).

        Over the whole forest when ``request`` is None (nodes of different requests never relate).
        """
        order, size = self.dfs_order, self.subtree_size
        if request is not None:
            lo, hi = int(self.cu_seqlens[request]), int(self.cu_seqlens[request + 1])
            order, size = order[lo:hi], size[lo:hi]
        return (order[None, :] <= order[:, None]) & (order[:, None] < (order + size)[None, :])

    def path(self, node: int) -> torch.Tensor:
        """Global indices of the root-to-node path of packed node ``node`` (root child first)."""
        return self.paths[node, : int(self.depth[node])]

    def accepted_nodes(self, accepted_leaf: torch.Tensor) -> torch.Tensor:
        """Global index of each request's accepted leaf (``-1`` where nothing was accepted).

        ``accepted_leaf`` holds local indices (int ``[B]``); out-of-range values raise ``ValueError``.
        """
        accepted_leaf = torch.as_tensor(accepted_leaf, device=self.cu_seqlens.device).long()
        if accepted_leaf.shape != (self.num_requests,):
            raise ValueError(
                f"accepted_leaf must have shape [{self.num_requests}] (one entry per request), "
                f"got {tuple(accepted_leaf.shape)}"
            )
        lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        bad = (accepted_leaf < -1) | (accepted_leaf >= lengths)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(
                f"request {b}: accepted_leaf {int(accepted_leaf[b])} is outside [-1, {int(lengths[b])})"
            )
        return torch.where(accepted_leaf >= 0, accepted_leaf + self.cu_seqlens[:-1], accepted_leaf)


def _owners(lengths: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Each packed node's request from the requests' lengths, on their device (no sync: the total is
    given)."""
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=num_nodes
    )


@dataclass(frozen=True, slots=True)
class PrefillChunks:
    """A batch of prompts cut into chunks for the GDN prefill: one chain per chunk, prompt after prompt
    (so the packed rows are the prompts' own), and where each prompt's chunks start."""

    tree: TreeBatch  # one chain per chunk, at most the chunk size deep (its max_depth)
    first: torch.Tensor  # int64 [B + 1]: prompt b has the tree's chains first[b] to first[b + 1] - 1

    @classmethod
    def of(
        cls,
        lengths: Sequence[int],
        chunk_size: int,
        device: torch.device | str,
        *,
        capacity: int | None = None,
    ) -> PrefillChunks:
        """The chunks of prompts ``lengths`` long, made on the host and moved in two copies (no device
        sync). The chains carry no ``paths`` table, which the kernels never read (at 8,192 tokens it would
        be 4 MiB, and milliseconds of host time to make). ``capacity``: as many chains in the tree, the
        ones past the prompts' empty (``cu_seqlens`` repeats the node count, and no prompt's range reaches
        them), so that the tensors' shapes depend on ``capacity`` and the node count alone: a CUDA graph's
        (:func:`chunk_capacity` bounds the count)."""
        if not 1 <= chunk_size <= MAX_TREE_DEPTH:
            raise ValueError(
                f"chunk_size must lie in [1, {MAX_TREE_DEPTH}] (the kernels' depth), got {chunk_size}"
            )
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"prompt lengths must be positive, got {list(lengths)}")
        sizes = [min(chunk_size, n - lo) for n in lengths for lo in range(0, n, chunk_size)]
        counts = [-(-n // chunk_size) for n in lengths]
        if capacity is not None and capacity < len(sizes):
            raise ValueError(f"{len(sizes)} chunks of {list(lengths)} exceed the capacity {capacity}")
        tree = TreeBatch.chains(sizes, max_depth=chunk_size, paths=False)
        if capacity is not None:
            tree = replace(
                tree, cu_seqlens=F.pad(tree.cu_seqlens, (0, capacity - len(sizes)), value=sum(sizes))
            )
        first = torch.tensor([0, *itertools.accumulate(counts)])
        return cls(tree.to(device), to_device(first, device))


def chunk_capacity(num_prompts: int, num_tokens: int, chunk_size: int) -> int:
    """The most chunks that ``num_prompts`` prompts of ``num_tokens`` tokens in all can make: each prompt
    rounds its chunks up once."""
    return (num_tokens + (chunk_size - 1) * num_prompts) // chunk_size


def _owners_on_host(cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each packed node's request and its index within it, from the offsets (host arrays, int64)."""
    lengths = np.diff(cu_seqlens)
    request = np.repeat(np.arange(lengths.size), lengths)
    return request, np.arange(cu_seqlens[-1]) - cu_seqlens[:-1][request]


def _check_tensors(parents: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """The checks that need no values (and so no copy from a GPU)."""
    if not isinstance(parents, torch.Tensor) or not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError("parents and cu_seqlens must be torch tensors")
    if parents.dtype.is_floating_point or cu_seqlens.dtype.is_floating_point:
        raise ValueError(
            f"parents and cu_seqlens must be integer tensors, got {parents.dtype} and {cu_seqlens.dtype}"
        )
    if parents.dim() != 1 or cu_seqlens.dim() != 1:
        raise ValueError(
            f"parents must be 1-D [N] and cu_seqlens 1-D [B + 1], got shapes "
            f"{tuple(parents.shape)} and {tuple(cu_seqlens.shape)}"
        )
    if parents.device != cu_seqlens.device:
        raise ValueError(f"parents is on {parents.device} but cu_seqlens is on {cu_seqlens.device}")


def _validate(parents: np.ndarray, cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The value checks (host arrays, int64); returns each request's length and each node's request."""
    if cu_seqlens.size < 2:
        raise ValueError("empty batch: cu_seqlens needs at least two offsets (one request)")
    if int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu_seqlens[0])}")
    lengths = np.diff(cu_seqlens)
    if (lengths <= 0).any():
        b = int(np.flatnonzero(lengths <= 0)[0])
        raise ValueError(
            f"request {b}: offsets not increasing (cu_seqlens[{b}] = {int(cu_seqlens[b])}, "
            f"cu_seqlens[{b + 1}] = {int(cu_seqlens[b + 1])}); every request needs at least one node"
        )
    if int(cu_seqlens[-1]) != parents.size:
        raise ValueError(f"cu_seqlens ends at {int(cu_seqlens[-1])} but parents holds {parents.size} nodes")
    request, local = _owners_on_host(cu_seqlens)
    bad = (parents < -1) | (parents >= local)
    if bad.any():
        node = int(np.flatnonzero(bad)[0])
        b = int(request[node])
        raise ValueError(
            f"request {b}, node {int(local[node])}: parent {int(parents[node])} breaks the rule "
            f"-1 <= parent < node (parents must come earlier in the same request)"
        )
    return lengths, request


def _preorder(paths: np.ndarray) -> np.ndarray:
    """Depth-first pre-order rank: sort nodes by their root-to-node path, lexicographically.

    An ancestor's path is a prefix of its descendants' (padding ``-1`` sorts first), siblings sort by
    index, and global indices keep requests apart, so every subtree is one contiguous range (paths are
    distinct: each ends at its own node, so the order has no ties).
    """
    order = np.lexsort(paths.T[::-1])  # lexsort's last key is the primary one: the root-side column
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank
