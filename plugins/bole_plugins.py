"""TensorRT plugin definitions (``tensorrt.plugin``) for the Bole kernels: bole::gdn_tree_verify,
bole::gdn_tree_factors and bole::gdn_tree_values (the explicit-inverse verify in two launches),
bole::gdn_commit and bole::tree_conv1d.

Importing this module registers the five plugins (it needs TensorRT >= 10.9 with ``tensorrt.plugin``).
Each plugin is a thin layer over :mod:`trtllm_bole.engine.aot`, which holds the logic as plain
functions (tested on CPU): ``@trtp.register`` gives TensorRT the output descriptors, ``@trtp.autotune``
the dtype combinations and one tactic per tiling config, and ``@trtp.aot_impl`` the PTX that Triton
compiles from the unchanged ``@triton.jit`` kernels of ``trtllm_bole.kernels``, with the launch grid
and the int32 scalars as symbolic expressions of the input shapes.

Launch convention (TensorRT's): kernel parameters are ``(inputs..., extra scalars..., outputs...)``;
``bole::gdn_commit`` updates the state in place (its output aliases input 0: build with
``trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03``).

No ``from __future__ import annotations`` here: ``tensorrt.plugin`` validates the real annotations.
"""

from typing import Any

from plugins.network import plugin_arch, require_tensorrt
from trtllm_bole.engine.aot import SPECS, PluginSpec, aot_payload

trt = require_tensorrt()  # without it, a RuntimeError naming the package to install (not a bare import error)
trtp = trt.plugin

_NAMES = {trt.float32: "float32", trt.bfloat16: "bfloat16", trt.float16: "float16", trt.int64: "int64"}
_TYPES = {v: k for k, v in _NAMES.items()}
_COMBO = {"float32": "FP32", "bfloat16": "BF16", "float16": "FP16", "int64": "INT64"}
TARGET_ARCH = plugin_arch()
"""Compute capability the AOT PTX is compiled for (TensorRT builds the plan for the GPU it runs on)."""


def _dim(expr: Any) -> Any:
    """A build-time constant as an int (constexprs need ints), a dynamic dimension as is."""
    if not expr.is_fake and expr.is_constant:
        return int(expr.constant_value())
    return expr


def _io(descs: dict[str, trtp.TensorDesc]) -> tuple[dict, dict]:
    shapes = {name: tuple(_dim(e) for e in d.shape_expr) for name, d in descs.items()}
    dtypes = {name: _NAMES.get(d.dtype, str(d.dtype)) for name, d in descs.items()}
    return shapes, dtypes


def _inputs(spec: PluginSpec, args: dict[str, Any]) -> dict[str, trtp.TensorDesc]:
    """The input descriptors among a plugin function's arguments (its ``locals()``), in launch order."""
    return {port.name: args[port.name] for port in spec.inputs}


def _attrs(spec: PluginSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The plugin attributes among a plugin function's arguments (its ``locals()``)."""
    return {name: args[name] for name, _ in spec.attrs}


def _describe(spec: PluginSpec, args: dict[str, Any]) -> tuple[trtp.TensorDesc, ...]:
    descs = _inputs(spec, args)
    shapes = {name: tuple(d.shape_expr) for name, d in descs.items()}
    dtypes = {name: _NAMES[d.dtype] for name, d in descs.items()}
    out = []
    for port, (shape, dtype) in zip(spec.outputs, spec.output_descs(shapes, dtypes), strict=True):
        aliased = dict(spec.aliased)
        if port.name in aliased:
            out.append(descs[aliased[port.name]].aliased())
        else:
            out.append(trtp.from_shape_expr(shape, dtype=_TYPES[dtype]))
    return tuple(out)


def _autotune(spec: PluginSpec, args: dict[str, Any]) -> list[trtp.AutoTuneCombination]:
    ports = (*spec.inputs, *spec.outputs)
    types = ", ".join("|".join(_COMBO[d] for d in p.dtypes) for p in ports)
    shapes, _ = _io(_inputs(spec, args))
    return [trtp.AutoTuneCombination(types, "LINEAR", list(range(1, len(spec.tactics(shapes)) + 1)))]


def _cdiv(a: Any, b: int) -> Any:
    return -(-a // b) if isinstance(a, int) else trtp.cdiv(a, b)


def _aot(spec: PluginSpec, args: dict[str, Any]) -> tuple:
    shapes, dtypes = _io(_inputs(spec, args))
    tactic = max(args["tactic"] - 1, 0)
    payload = aot_payload(spec, shapes, dtypes, _attrs(spec, args), tactic, arch=TARGET_ARCH, cdiv=_cdiv)
    (gx, gy, gz), (bx, by, bz) = payload.launch.grid, payload.launch.block
    launch = trtp.KernelLaunchParams()
    launch.grid_x, launch.grid_y, launch.grid_z = (trtp.SymInt32(g) for g in (gx, gy, gz))
    launch.block_x, launch.block_y, launch.block_z = bx, by, bz
    launch.shared_mem = payload.launch.shared_mem
    extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(v) for v in payload.extra_args])
    return payload.kernel_name, payload.ptx, launch, extra


# ------------------------------------------------------------------------------------------------ #
# bole::gdn_tree_verify                                                                              #
# ------------------------------------------------------------------------------------------------ #

VERIFY = SPECS["bole::gdn_tree_verify"]


@trtp.register("bole::gdn_tree_verify")
def gdn_tree_verify_desc(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    v: trtp.TensorDesc,
    g: trtp.TensorDesc,
    beta: trtp.TensorDesc,
    state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    dfs_order: trtp.TensorDesc,
    subtree_size: trtp.TensorDesc,
    scale: float,
) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    return _describe(VERIFY, locals())


@trtp.autotune("bole::gdn_tree_verify")
def gdn_tree_verify_autotune(
    q, k, v, g, beta, state, state_indices, cu_seqlens, dfs_order, subtree_size, outputs
) -> list[trtp.AutoTuneCombination]:
    return _autotune(VERIFY, locals())


@trtp.aot_impl("bole::gdn_tree_verify")
def gdn_tree_verify_aot_impl(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    v: trtp.TensorDesc,
    g: trtp.TensorDesc,
    beta: trtp.TensorDesc,
    state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    dfs_order: trtp.TensorDesc,
    subtree_size: trtp.TensorDesc,
    scale: float,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
    return _aot(VERIFY, locals())


# ------------------------------------------------------------------------------------------------ #
# bole::gdn_tree_factors, bole::gdn_tree_values: the explicit-inverse verify (trees of <= 64 nodes)  #
# ------------------------------------------------------------------------------------------------ #

FACTORS = SPECS["bole::gdn_tree_factors"]


@trtp.register("bole::gdn_tree_factors")
def gdn_tree_factors_desc(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    g: trtp.TensorDesc,
    beta: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    paths: trtp.TensorDesc,
    scale: float,
    max_nodes: int,
    max_depth: int,
) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    return _describe(FACTORS, locals())


@trtp.autotune("bole::gdn_tree_factors")
def gdn_tree_factors_autotune(
    q, k, g, beta, cu_seqlens, depth, paths, outputs
) -> list[trtp.AutoTuneCombination]:
    return _autotune(FACTORS, locals())


@trtp.aot_impl("bole::gdn_tree_factors")
def gdn_tree_factors_aot_impl(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    g: trtp.TensorDesc,
    beta: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    paths: trtp.TensorDesc,
    scale: float,
    max_nodes: int,
    max_depth: int,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
    return _aot(FACTORS, locals())


VALUES = SPECS["bole::gdn_tree_values"]


@trtp.register("bole::gdn_tree_values")
def gdn_tree_values_desc(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    v: trtp.TensorDesc,
    state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    dfs_order: trtp.TensorDesc,
    subtree_size: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    log_p: trtp.TensorDesc,
    factors: trtp.TensorDesc,
    scale: float,
    max_nodes: int,
) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    return _describe(VALUES, locals())


@trtp.autotune("bole::gdn_tree_values")
def gdn_tree_values_autotune(
    q, k, v, state, state_indices, cu_seqlens, dfs_order, subtree_size, depth, log_p, factors, outputs
) -> list[trtp.AutoTuneCombination]:
    return _autotune(VALUES, locals())


@trtp.aot_impl("bole::gdn_tree_values")
def gdn_tree_values_aot_impl(
    q: trtp.TensorDesc,
    k: trtp.TensorDesc,
    v: trtp.TensorDesc,
    state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    dfs_order: trtp.TensorDesc,
    subtree_size: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    log_p: trtp.TensorDesc,
    factors: trtp.TensorDesc,
    scale: float,
    max_nodes: int,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
    return _aot(VALUES, locals())


# ------------------------------------------------------------------------------------------------ #
# bole::gdn_commit (in place)                                                                       #
# ------------------------------------------------------------------------------------------------ #

COMMIT = SPECS["bole::gdn_commit"]


@trtp.register("bole::gdn_commit")
def gdn_commit_desc(
    state: trtp.TensorDesc,
    k: trtp.TensorDesc,
    u: trtp.TensorDesc,
    log_p: trtp.TensorDesc,
    accepted_leaf: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    paths: trtp.TensorDesc,
    max_depth: int,
) -> trtp.TensorDesc:
    return _describe(COMMIT, locals())[0]


@trtp.autotune("bole::gdn_commit")
def gdn_commit_autotune(
    state, k, u, log_p, accepted_leaf, state_indices, cu_seqlens, depth, paths, outputs
) -> list[trtp.AutoTuneCombination]:
    return _autotune(COMMIT, locals())


@trtp.aot_impl("bole::gdn_commit")
def gdn_commit_aot_impl(
    state: trtp.TensorDesc,
    k: trtp.TensorDesc,
    u: trtp.TensorDesc,
    log_p: trtp.TensorDesc,
    accepted_leaf: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    cu_seqlens: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    paths: trtp.TensorDesc,
    max_depth: int,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
    return _aot(COMMIT, locals())


# ------------------------------------------------------------------------------------------------ #
# bole::tree_conv1d                                                                                 #
# ------------------------------------------------------------------------------------------------ #

CONV = SPECS["bole::tree_conv1d"]


@trtp.register("bole::tree_conv1d")
def tree_conv1d_desc(
    x: trtp.TensorDesc,
    weight: trtp.TensorDesc,
    conv_state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    request: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    global_parents: trtp.TensorDesc,
    silu: int,
) -> trtp.TensorDesc:
    return _describe(CONV, locals())[0]


@trtp.autotune("bole::tree_conv1d")
def tree_conv1d_autotune(
    x, weight, conv_state, state_indices, request, depth, global_parents, outputs
) -> list[trtp.AutoTuneCombination]:
    return _autotune(CONV, locals())


@trtp.aot_impl("bole::tree_conv1d")
def tree_conv1d_aot_impl(
    x: trtp.TensorDesc,
    weight: trtp.TensorDesc,
    conv_state: trtp.TensorDesc,
    state_indices: trtp.TensorDesc,
    request: trtp.TensorDesc,
    depth: trtp.TensorDesc,
    global_parents: trtp.TensorDesc,
    silu: int,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
    return _aot(CONV, locals())
