"""Ahead-of-time compilation of the Bole kernels: what a TensorRT AOT plugin launches, without TensorRT.

For each plugin (``bole::gdn_tree_verify``; ``bole::gdn_tree_factors`` and ``bole::gdn_tree_values``,
the explicit-inverse verify's two launches; ``bole::gdn_commit``; ``bole::tree_conv1d``) a
:class:`PluginSpec` says, as plain functions:

- the I/O: input and output names in TensorRT's launch order and the dtypes each accepts;
- the descriptor: output shapes and dtypes from the input shapes, dtypes and attributes;
- the tactics (tiling configs) and, for one tactic, the Triton constexprs, the grid, and the int32
  scalars that go between the input and output pointers (TensorRT's ``extra_args``).

:func:`aot_payload` compiles the adapter of :mod:`trtllm_bole.engine.aot_kernels` for a GPU target and
returns what ``@trtp.aot_impl`` hands to TensorRT: kernel name, PTX, launch parameters, extra args.
Dimensions may be ints or symbolic expressions (``tensorrt.plugin.ShapeExpr``): the same formulas
serve the TensorRT plugins (``plugins/``), the engine build, and the H200 check that launches the PTX
with cuda-python. Compiling needs Triton's compiler (not its interpreter) but no GPU: the target is
explicit (``GPUTarget("cuda", 90, 32)`` on a CPU-only machine gives sm_90 PTX).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtllm_bole.engine.ptx import CompiledKernel, compile_kernel

Dim = Any  # an int, or a symbolic dimension (tensorrt.plugin.ShapeExpr) with + - * //
Shapes = dict[str, tuple[Dim, ...]]

FLOATS = ("float32", "bfloat16", "float16")
TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int64": "i64", "int32": "i32"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _const(shapes: Shapes, port: str, axis: int) -> int:
    """Dimension ``axis`` of ``port``, which the kernel compiles in (head counts, head dims, channels)."""
    d = shapes[port][axis]
    if isinstance(d, int):
        return d
    raise ValueError(
        f"{port}'s dimension {axis} ({d!r}) is compiled into the kernel: give the network a static size there"
    )


# --------------------------------------------------------------------------------------------- #
# Plugin specs                                                                                   #
# --------------------------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class Port:
    name: str
    rank: int
    dtypes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LaunchParams:
    """TensorRT's ``KernelLaunchParams``: grid may be symbolic, block and shared memory are fixed."""

    grid: tuple[Dim, Dim, Dim]
    block: tuple[int, int, int]
    shared_mem: int


@dataclass(frozen=True, slots=True)
class AOTPayload:
    kernel_name: str
    ptx: str
    launch: LaunchParams
    extra_args: tuple[Dim, ...]  # int32 scalars, between the input and the output pointers
    params: tuple[str, ...]  # the launch's parameter names: inputs, extra args, outputs
    num_inputs: int
    kernel: CompiledKernel = field(repr=False)


class PluginSpec:
    """One TensorRT plugin around one Bole kernel (subclasses below)."""

    plugin_id: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]  # rank 0: the rank follows the inputs (see output_descs)
    extra_args: tuple[str, ...]
    attrs: tuple[tuple[str, type], ...]  # TensorRT plugin attributes (name, type)
    aliased: tuple[tuple[str, str], ...] = ()  # (output, the input it is written in place of)

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        raise NotImplementedError

    def tactics(self, shapes: Shapes) -> list[Any]:
        raise NotImplementedError

    def adapter(self) -> Any:
        raise NotImplementedError

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        raise NotImplementedError

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        raise NotImplementedError

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        raise NotImplementedError

    def launch_options(self, cfg: Any) -> dict[str, Any]:
        """The compile options of a tactic: warps, stages and, where the tactic caps them, registers."""
        options = {"num_warps": cfg.num_warps, "num_stages": getattr(cfg, "num_stages", 1)}
        maxnreg = getattr(cfg, "maxnreg", None)
        return options if maxnreg is None else {**options, "maxnreg": maxnreg}

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        """Ranks, dtypes and the dimensions the ports share; ``ValueError`` naming the port."""
        for port in self.inputs:
            if port.name not in shapes or port.name not in dtypes:
                raise ValueError(f"{self.plugin_id}: input {port.name} is missing")
            if len(shapes[port.name]) != port.rank:
                raise ValueError(
                    f"{self.plugin_id}: {port.name} must have rank {port.rank}, got shape {shapes[port.name]}"
                )
            if dtypes[port.name] not in port.dtypes:
                raise ValueError(
                    f"{self.plugin_id}: {port.name} must be one of {port.dtypes}, got {dtypes[port.name]}"
                )

    @property
    def params(self) -> tuple[str, ...]:
        return (*(p.name for p in self.inputs), *self.extra_args, *(p.name for p in self.outputs))

    def signature(self, dtypes: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
        placeholder = {p.name: (None,) * p.rank for p in self.inputs}
        descs = self.output_descs(placeholder, dtypes)
        out_dtypes = {p.name: d for p, (_, d) in zip(self.outputs, descs, strict=True)}
        sig = {p.name: "*" + TRITON_TYPES[dtypes[p.name]] for p in self.inputs}
        sig.update(dict.fromkeys(self.extra_args, "i32"))
        sig.update({name: "*" + TRITON_TYPES[d] for name, d in out_dtypes.items()})
        sig.update(dict.fromkeys(constexprs, "constexpr"))
        return sig


def _head_dims(plugin_id: str, h: int, dk: int, hv: int, dv: int) -> None:
    from trtllm_bole.kernels._common import tiles_head_dims

    if hv % h or not tiles_head_dims(dk, dv):
        raise ValueError(f"{plugin_id}: HV={hv} must be a multiple of H={h}, dk={dk} and dv={dv} of 16")


def _value_grid(shapes: Shapes, cfg: Any) -> tuple[Dim, Dim, Dim]:
    """One program a (value tile, value head, request)."""
    return (_const(shapes, "v", 2) // cfg.bv, _const(shapes, "v", 1), shapes["cu_seqlens"][0] - 1)


def _exact(dtypes: dict[str, str], names: Sequence[str]) -> bool:
    """The fp32-exact mode (IEEE dots) when every float operand is fp32, else the serving precisions."""
    return all(dtypes[n] == "float32" for n in names)


def _same_dtype(spec: str, dtypes: dict[str, str], names: Sequence[str]) -> None:
    if len({dtypes[n] for n in names}) > 1:
        raise ValueError(f"{spec}: {', '.join(names)} must share a dtype, got {[dtypes[n] for n in names]}")


def _same(spec: str, shapes: Shapes, pairs: Sequence[tuple[str, int, str, int]]) -> None:
    for a, i, b, j in pairs:
        da, db = shapes[a][i], shapes[b][j]
        if isinstance(da, int) and isinstance(db, int) and da != db:
            raise ValueError(f"{spec}: {a}.shape[{i}] = {da} must equal {b}.shape[{j}] = {db}")


class GDNTreeVerifySpec(PluginSpec):
    plugin_id = "bole::gdn_tree_verify"
    inputs = (
        Port("q", 3, ("float32",)),
        Port("k", 3, ("float32",)),
        Port("v", 3, FLOATS),
        Port("g", 2, ("float32",)),
        Port("beta", 2, FLOATS),
        Port("state", 4, ("float32",)),
        Port("state_indices", 1, ("int64",)),
        Port("cu_seqlens", 1, ("int64",)),
        Port("dfs_order", 1, ("int64",)),
        Port("subtree_size", 1, ("int64",)),
    )
    outputs = (Port("o", 0, FLOATS), Port("u", 0, ("float32",)), Port("log_p", 0, ("float32",)))
    extra_args = ()
    attrs = (("scale", float),)

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        return [(shapes["v"], dtypes["v"]), (shapes["v"], "float32"), (shapes["g"], "float32")]

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        super().check(shapes, dtypes)
        _same(self.plugin_id, shapes, [
            ("k", 0, "q", 0), ("k", 1, "q", 1), ("k", 2, "q", 2), ("v", 0, "q", 0), ("g", 0, "q", 0),
            ("g", 1, "v", 1), ("beta", 0, "q", 0), ("beta", 1, "v", 1), ("state", 1, "v", 1),
            ("state", 2, "q", 2), ("state", 3, "v", 2), ("dfs_order", 0, "q", 0),
            ("subtree_size", 0, "q", 0),
        ])  # fmt: skip
        _same_dtype(self.plugin_id, dtypes, ("v", "beta"))
        _head_dims(self.plugin_id, *(_const(shapes, *d) for d in (("q", 1), ("q", 2), ("v", 1), ("v", 2))))

    def tactics(self, shapes: Shapes) -> list[Any]:
        from trtllm_bole.kernels.gdn_tree_verify import CONFIGS

        dk, dv = _const(shapes, "q", 2), _const(shapes, "v", 2)
        return [c for c in CONFIGS if dk % c.bk == 0 and dv % c.bv == 0]

    def adapter(self) -> Any:
        from trtllm_bole.engine.aot_kernels import gdn_tree_verify_aot

        return gdn_tree_verify_aot

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        exact = _exact(dtypes, ("v", "beta"))
        return {
            "SCALE": float(attrs["scale"]),
            "H": _const(shapes, "q", 1),
            "HV": _const(shapes, "v", 1),
            "DK": _const(shapes, "q", 2),
            "DV": _const(shapes, "v", 2),
            "BT": cfg.bt,
            "BK": cfg.bk,
            "BV": cfg.bv,
            "LB": cfg.lb,
            "FUSED": cfg.fused,
            "PREC": "ieee" if exact else "tf32",
        }

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        return _value_grid(shapes, cfg)

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        return ()


INVERSE_TILE = 64
"""Nodes per request the explicit-inverse plugins serve, in one tile (63 drafts and the pending token: an
engine's default tree); requests of more nodes, or deeper than the compact factors serve, take
``bole::gdn_tree_verify``. The kernel skips a larger request, so the attributes bound the trees at build."""


def inverse_serves(max_nodes: int, max_depth: int) -> bool:
    """Whether the explicit-inverse plugins serve trees of up to ``max_nodes`` nodes and ``max_depth`` levels
    per request (the pending token included): one tile of :data:`INVERSE_TILE`, compact factors."""
    from trtllm_bole.kernels.gdn_tree_verify_inverse import compact_factors

    return 1 <= max_nodes <= INVERSE_TILE and max_depth >= 1 and compact_factors(max_depth)


def _inverse_limits(plugin_id: str, attrs: dict) -> None:
    from trtllm_bole.kernels.gdn_tree_verify_inverse import COMPACT_MAX_DEPTH

    nodes, depth = int(attrs["max_nodes"]), attrs.get("max_depth")  # the value tiles take no depth
    if not inverse_serves(nodes, 1 if depth is None else int(depth)):
        asked = f"max_nodes={nodes}" + ("" if depth is None else f", max_depth={depth}")
        raise ValueError(
            f"{plugin_id} serves trees of at most {INVERSE_TILE} nodes and depth {COMPACT_MAX_DEPTH} per "
            f"request ({asked}); build larger ones with bole::gdn_tree_verify"
        )


def value_tiles(cfg: Any) -> tuple[int, int, int, int | None]:
    """What the value-tile kernel of an explicit-inverse config compiles with: ``(bk, bv, warps, register
    cap)`` (the factor kernel's warps and the launch count are not its own)."""
    return cfg.bk, cfg.bv, cfg.num_warps, cfg.maxnreg


def _inverse_configs(dk: int, dv: int) -> list[Any]:
    """The value-tile settings ``(bk, bv, warps, register cap)`` of the explicit inverse's two-launch configs
    in tiles of :data:`INVERSE_TILE` that tile dk and dv, each once, the runtime's default at large batches
    first (:func:`~trtllm_bole.kernels.gdn_tree_verify.default_config`: value tiles of 64 at 4 warps under
    128 registers)."""
    from trtllm_bole.kernels.gdn_tree_verify_inverse import INVERSE_CONFIGS

    seen, out = set(), []
    for c in INVERSE_CONFIGS:
        key = value_tiles(c)
        if c.launches == 2 and c.bt == INVERSE_TILE and dk % c.bk == 0 and dv % c.bv == 0 and key not in seen:
            seen.add(key)
            out.append(c)
    return sorted(out, key=lambda c: value_tiles(c)[1:] != (64, 4, 128))


@dataclass(frozen=True, slots=True)
class FactorConfig:
    num_warps: int = 8


class GDNTreeFactorsSpec(PluginSpec):
    """Phase 1 of the explicit-inverse verify (:mod:`trtllm_bole.kernels.gdn_tree_verify_inverse`): the
    compact factors ``W'``, ``C'`` and ``logP`` once per (request, value head), for
    ``bole::gdn_tree_values``. ``scratch`` holds each head's ``Q Kᵀ`` and ``K Kᵀ`` rows on the way."""

    plugin_id = "bole::gdn_tree_factors"
    inputs = (
        Port("q", 3, FLOATS),
        Port("k", 3, FLOATS),
        Port("g", 2, ("float32",)),
        Port("beta", 2, FLOATS),
        Port("cu_seqlens", 1, ("int64",)),
        Port("depth", 1, ("int64",)),
        Port("paths", 2, ("int64",)),
    )
    outputs = (
        Port("factors", 0, ("float32",)),
        Port("log_p", 0, ("float32",)),
        Port("scratch", 0, ("float32",)),
    )
    extra_args = ("num_nodes", "max_depth")
    attrs = (("scale", float), ("max_nodes", int), ("max_depth", int))

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        n, hv, d = shapes["q"][0], shapes["g"][1], shapes["paths"][1]
        return [((2, hv, n, d), "float32"), ((n, hv), "float32"), ((n, hv, 2 * INVERSE_TILE), "float32")]

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        super().check(shapes, dtypes)
        _same(self.plugin_id, shapes, [
            ("k", 0, "q", 0), ("k", 1, "q", 1), ("k", 2, "q", 2), ("g", 0, "q", 0), ("beta", 0, "q", 0),
            ("beta", 1, "g", 1), ("depth", 0, "q", 0), ("paths", 0, "q", 0),
        ])  # fmt: skip
        _same_dtype(self.plugin_id, dtypes, ("q", "k"))
        _inverse_dims(self.plugin_id, _const(shapes, "q", 1), _const(shapes, "q", 2), _const(shapes, "g", 1))

    def tactics(self, shapes: Shapes) -> list[Any]:
        return [FactorConfig(8), FactorConfig(4)]

    def adapter(self) -> Any:
        from trtllm_bole.engine.aot_kernels import gdn_tree_factors_aot

        return gdn_tree_factors_aot

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        from trtllm_bole.kernels._common import pow2_at_least

        _inverse_limits(self.plugin_id, attrs)
        return {
            "SCALE": float(attrs["scale"]),
            "H": _const(shapes, "q", 1),
            "HV": _const(shapes, "g", 1),
            "DK": _const(shapes, "q", 2),
            "BT": INVERSE_TILE,
            "DP": pow2_at_least(int(attrs["max_depth"])),
            "SW": 2 * INVERSE_TILE,
            "PREC": "ieee" if _exact(dtypes, ("q", "k")) else "tf32",
        }

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        return (_const(shapes, "g", 1), shapes["cu_seqlens"][0] - 1, 1)

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        return (shapes["q"][0], shapes["paths"][1])


class GDNTreeValuesSpec(PluginSpec):
    """Phase 2 of the explicit-inverse verify: one program per (request, value head, value tile) forms
    ``K S`` and ``Q S`` from the state (read, never written), then ``U = W' (V - D K S)`` and
    ``O = scale D Q S + C' U`` from the factors of ``bole::gdn_tree_factors``."""

    plugin_id = "bole::gdn_tree_values"
    inputs = (
        Port("q", 3, FLOATS),
        Port("k", 3, FLOATS),
        Port("v", 3, FLOATS),
        Port("state", 4, ("float32",)),
        Port("state_indices", 1, ("int64",)),
        Port("cu_seqlens", 1, ("int64",)),
        Port("dfs_order", 1, ("int64",)),
        Port("subtree_size", 1, ("int64",)),
        Port("depth", 1, ("int64",)),
        Port("log_p", 2, ("float32",)),
        Port("factors", 4, ("float32",)),
    )
    outputs = (Port("o", 0, FLOATS), Port("u", 0, ("float32",)))
    extra_args = ("num_nodes", "max_depth")
    attrs = (("scale", float), ("max_nodes", int))

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        return [(shapes["v"], dtypes["v"]), (shapes["v"], "float32")]

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        super().check(shapes, dtypes)
        _same(self.plugin_id, shapes, [
            ("k", 0, "q", 0), ("k", 1, "q", 1), ("k", 2, "q", 2), ("v", 0, "q", 0), ("state", 1, "v", 1),
            ("state", 2, "q", 2), ("state", 3, "v", 2), ("dfs_order", 0, "q", 0), ("subtree_size", 0, "q", 0),
            ("depth", 0, "q", 0), ("log_p", 0, "q", 0), ("log_p", 1, "v", 1), ("factors", 1, "v", 1),
            ("factors", 2, "q", 0),
        ])  # fmt: skip
        _same_dtype(self.plugin_id, dtypes, ("q", "k"))
        if _const(shapes, "factors", 0) != 2:
            raise ValueError(
                f"{self.plugin_id}: factors must be [2, HV, N, depth] (W', C'), got {shapes['factors']}"
            )
        h, dk, hv, dv = (_const(shapes, *d) for d in (("q", 1), ("q", 2), ("v", 1), ("v", 2)))
        _inverse_dims(self.plugin_id, h, dk, hv)
        if dv % 16:
            raise ValueError(f"{self.plugin_id}: dv={dv} must be a multiple of 16")

    def tactics(self, shapes: Shapes) -> list[Any]:
        return _inverse_configs(_const(shapes, "q", 2), _const(shapes, "v", 2))

    def adapter(self) -> Any:
        from trtllm_bole.engine.aot_kernels import gdn_tree_values_aot

        return gdn_tree_values_aot

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        _inverse_limits(self.plugin_id, attrs)
        exact = _exact(dtypes, ("q", "k", "v"))
        return {
            "SCALE": float(attrs["scale"]),
            "H": _const(shapes, "q", 1),
            "HV": _const(shapes, "v", 1),
            "DK": _const(shapes, "q", 2),
            "DV": _const(shapes, "v", 2),
            "BT": INVERSE_TILE,
            "BK": cfg.bk,
            "BV": cfg.bv,
            "PREC": "ieee" if exact else "tf32",
            "S_BF16": not exact,  # the serving precision: bf16 state products (default_precision)
        }

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        return _value_grid(shapes, cfg)

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        return (shapes["q"][0], shapes["factors"][3])


def _inverse_dims(plugin_id: str, h: int, dk: int, hv: int) -> None:
    if hv % h or dk < 16 or dk & (dk - 1):
        raise ValueError(
            f"{plugin_id}: HV={hv} must be a multiple of H={h} and dk={dk} a power of two >= 16 (the "
            "explicit inverse loads whole rows of K)"
        )


class GDNCommitSpec(PluginSpec):
    plugin_id = "bole::gdn_commit"
    inputs = (
        Port("state", 5, ("float32",)),
        Port("k", 4, FLOATS),
        Port("u", 4, ("float32",)),
        Port("log_p", 3, ("float32",)),
        Port("accepted_leaf", 1, ("int64",)),
        Port("state_indices", 1, ("int64",)),
        Port("cu_seqlens", 1, ("int64",)),
        Port("depth", 1, ("int64",)),
        Port("paths", 2, ("int64",)),
    )
    outputs = (Port("state_out", 0, ("float32",)),)
    extra_args = ("num_requests", "num_slots", "num_nodes", "max_depth")
    attrs = (("max_depth", int),)
    aliased = (("state_out", "state"),)

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        return [(shapes["state"], dtypes["state"])]

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        super().check(shapes, dtypes)
        _same(self.plugin_id, shapes, [
            ("k", 0, "state", 0), ("u", 0, "state", 0), ("log_p", 0, "state", 0), ("u", 1, "k", 1),
            ("log_p", 1, "k", 1), ("u", 2, "state", 2), ("log_p", 2, "state", 2), ("k", 3, "state", 3),
            ("u", 3, "state", 4), ("state_indices", 0, "accepted_leaf", 0), ("depth", 0, "k", 1),
            ("paths", 0, "k", 1),
        ])  # fmt: skip
        _head_dims(
            self.plugin_id,
            *(_const(shapes, *d) for d in (("k", 2), ("state", 3), ("state", 2), ("state", 4))),
        )

    def tactics(self, shapes: Shapes) -> list[Any]:
        from trtllm_bole.kernels.gdn_commit import COMMIT_CONFIGS, default_commit_config

        dk, dv = _const(shapes, "state", 3), _const(shapes, "state", 4)
        default = default_commit_config(dk, dv, _const(shapes, "paths", 1))
        rest = [c for c in COMMIT_CONFIGS if dk % c.bk == 0 and dv % c.bv == 0 and c != default]
        return [default, *rest]

    def adapter(self) -> Any:
        from trtllm_bole.engine.aot_kernels import gdn_commit_aot

        return gdn_commit_aot

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        from trtllm_bole.kernels._common import pow2_at_least

        return {
            "H": _const(shapes, "k", 2),
            "HV": _const(shapes, "state", 2),
            "DK": _const(shapes, "state", 3),
            "DV": _const(shapes, "state", 4),
            "DP": pow2_at_least(int(attrs["max_depth"]), 16),
            "BK": cfg.bk,
            "BV": cfg.bv,
            "OUTER": cfg.outer,
        }

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        layers, requests = shapes["state"][0], shapes["accepted_leaf"][0]
        # A symbolic factor first: tensorrt.plugin's ShapeExpr has no reflected operators (int * expr fails).
        lanes = layers * requests if isinstance(requests, int) else requests * layers
        return (_const(shapes, "state", 4) // cfg.bv, _const(shapes, "state", 2), lanes)

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        return (shapes["accepted_leaf"][0], shapes["state"][1], shapes["depth"][0], shapes["paths"][1])


@dataclass(frozen=True, slots=True)
class ConvConfig:
    bn: int = 16
    num_warps: int = 4


class TreeConv1dSpec(PluginSpec):
    plugin_id = "bole::tree_conv1d"
    inputs = (
        Port("x", 2, FLOATS),
        Port("weight", 2, FLOATS),
        Port("conv_state", 3, FLOATS),
        Port("state_indices", 1, ("int64",)),
        Port("request", 1, ("int64",)),
        Port("depth", 1, ("int64",)),
        Port("global_parents", 1, ("int64",)),
    )
    outputs = (Port("y", 0, FLOATS),)
    extra_args = ("num_nodes",)
    attrs = (("silu", int),)

    def output_descs(self, shapes: Shapes, dtypes: dict[str, str]) -> list[tuple[tuple, str]]:
        return [(shapes["x"], dtypes["x"])]

    def check(self, shapes: Shapes, dtypes: dict[str, str]) -> None:
        super().check(shapes, dtypes)
        _same(self.plugin_id, shapes, [
            ("weight", 0, "x", 1), ("conv_state", 1, "x", 1), ("request", 0, "x", 0), ("depth", 0, "x", 0),
            ("global_parents", 0, "x", 0),
        ])  # fmt: skip
        _same_dtype(self.plugin_id, dtypes, ("x", "weight", "conv_state"))
        w, ws = _const(shapes, "weight", 1), _const(shapes, "conv_state", 2)
        if ws != w - 1 or w < 2:
            raise ValueError(f"{self.plugin_id}: conv_state width {ws} must be weight width {w} - 1 (W >= 2)")

    def tactics(self, shapes: Shapes) -> list[Any]:
        return [ConvConfig()]

    def adapter(self) -> Any:
        from trtllm_bole.engine.aot_kernels import tree_conv1d_aot

        return tree_conv1d_aot

    def _bc(self, shapes: Shapes) -> int:
        import triton

        return min(128, triton.next_power_of_2(_const(shapes, "x", 1)))

    def constexprs(self, shapes: Shapes, dtypes: dict[str, str], attrs: dict, cfg: Any) -> dict[str, Any]:
        return {
            "C": _const(shapes, "x", 1),
            "W": _const(shapes, "weight", 1),
            "BN": cfg.bn,
            "BC": self._bc(shapes),
            "SILU": bool(attrs.get("silu", 1)),
        }

    def grid(self, shapes: Shapes, cfg: Any, cdiv: Callable) -> tuple[Dim, Dim, Dim]:
        c = _const(shapes, "x", 1)
        return (_cdiv(c, self._bc(shapes)), cdiv(shapes["x"][0], cfg.bn), 1)

    def extra_values(self, shapes: Shapes) -> tuple[Dim, ...]:
        return (shapes["x"][0],)


SPECS: dict[str, PluginSpec] = {
    s.plugin_id: s
    for s in (
        GDNTreeVerifySpec(),
        GDNTreeFactorsSpec(),
        GDNTreeValuesSpec(),
        GDNCommitSpec(),
        TreeConv1dSpec(),
    )
}


def aot_payload(
    spec: PluginSpec,
    shapes: Shapes,
    dtypes: dict[str, str],
    attrs: dict[str, Any],
    tactic: int = 0,
    *,
    arch: int = 90,
    cdiv: Callable[[Dim, int], Dim] = _cdiv,
) -> AOTPayload:
    """Compile ``spec``'s kernel for ``sm_<arch>`` and the given I/O; ``tactic`` indexes
    ``spec.tactics(shapes)``. Dimensions used as constexprs (head counts, head dims, channels) must be
    ints; the others may be symbolic, with ``cdiv`` acting on them."""
    spec.check(shapes, dtypes)
    configs = spec.tactics(shapes)
    if not 0 <= tactic < len(configs):
        raise ValueError(f"{spec.plugin_id}: tactic {tactic} outside [0, {len(configs)})")
    cfg = configs[tactic]
    constexprs = spec.constexprs(shapes, dtypes, attrs, cfg)
    kernel = compile_kernel(
        spec.adapter(), spec.signature(dtypes, constexprs), constexprs,
        **spec.launch_options(cfg), arch=arch,
    )  # fmt: skip
    if kernel.num_params != len(spec.params):
        raise ValueError(f"{kernel.name}: {kernel.num_params} parameters, expected {len(spec.params)}")
    launch = LaunchParams(spec.grid(shapes, cfg, cdiv), (kernel.num_warps * 32, 1, 1), kernel.shared)
    extra = spec.extra_values(shapes)
    return AOTPayload(kernel.name, kernel.ptx, launch, extra, spec.params, len(spec.inputs), kernel)
