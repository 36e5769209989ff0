"""The Bole kernels an engine compiles: each plugin's kernel at the model's dimensions and dtypes, for
the tiling configs the runtime picks at the engine's batch sizes (the blocked verify's default config and
the explicit inverse's both vary with batch), with the engine's maximum tree depth compiled in. The
explicit-inverse pair (``bole::gdn_tree_factors``, ``bole::gdn_tree_values``) is compiled where its one
tile holds the engine's trees."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from trtllm_bole.engine.aot import (
    SPECS,
    AOTPayload,
    FactorConfig,
    Shapes,
    aot_payload,
    inverse_serves,
    value_tiles,
)
from trtllm_bole.models.config import Qwen35Config

if TYPE_CHECKING:
    from trtllm_bole.engine.build import BuildSettings


def plugin_io(config: Qwen35Config, settings: BuildSettings, batch: int | None = None) -> dict[str, tuple]:
    """``plugin_id -> (shapes, dtypes, attrs)`` for one step of ``batch`` requests (default: the
    engine's maximum) with full draft trees, in the engine's dtype."""
    c = config
    b = batch or settings.max_batch_size
    n = b * (settings.max_draft_nodes + 1)
    s, d, layers = settings.max_batch_size, settings.tree_depth, c.num_gdn_layers
    h, hv, dk, dv = (
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
    )
    cdim, w = c.conv_dim, c.linear_conv_kernel_dim
    act = settings.dtype
    i64 = "int64"
    verify = (
        {"q": (n, h, dk), "k": (n, h, dk), "v": (n, hv, dv), "g": (n, hv), "beta": (n, hv),
         "state": (s, hv, dk, dv), "state_indices": (b,), "cu_seqlens": (b + 1,), "dfs_order": (n,),
         "subtree_size": (n,)},
        {"q": "float32", "k": "float32", "v": act, "g": "float32", "beta": act, "state": "float32",
         "state_indices": i64, "cu_seqlens": i64, "dfs_order": i64, "subtree_size": i64},
        {"scale": dk**-0.5, "max_depth": d},
    )  # fmt: skip
    commit = (
        {"state": (layers, s, hv, dk, dv), "k": (layers, n, h, dk), "u": (layers, n, hv, dv),
         "log_p": (layers, n, hv), "accepted_leaf": (b,), "state_indices": (b,), "cu_seqlens": (b + 1,),
         "depth": (n,), "paths": (n, d)},
        {"state": "float32", "k": act, "u": "float32", "log_p": "float32", "accepted_leaf": i64,
         "state_indices": i64, "cu_seqlens": i64, "depth": i64, "paths": i64},
        {"max_depth": d},
    )  # fmt: skip
    conv = (
        {"x": (n, cdim), "weight": (cdim, w), "conv_state": (s, cdim, w - 1), "state_indices": (b,),
         "request": (n,), "depth": (n,), "global_parents": (n,)},
        {"x": act, "weight": act, "conv_state": act, "state_indices": i64, "request": i64, "depth": i64,
         "global_parents": i64},
        {"silu": 1},
    )  # fmt: skip
    tree = {"cu_seqlens": (b + 1,), "depth": (n,)}
    limits = {"scale": dk**-0.5, "max_nodes": settings.max_draft_nodes + 1}
    factors = (
        {"q": (n, h, dk), "k": (n, h, dk), "g": (n, hv), "beta": (n, hv), **tree, "paths": (n, d)},
        {"q": act, "k": act, "g": "float32", "beta": act, "cu_seqlens": i64, "depth": i64, "paths": i64},
        {**limits, "max_depth": d},
    )  # fmt: skip
    values = (
        {"q": (n, h, dk), "k": (n, h, dk), "v": (n, hv, dv), "state": (s, hv, dk, dv), "state_indices": (b,),
         **tree, "dfs_order": (n,), "subtree_size": (n,), "log_p": (n, hv), "factors": (2, hv, n, d)},
        {"q": act, "k": act, "v": act, "state": "float32", "state_indices": i64, "cu_seqlens": i64,
         "dfs_order": i64, "subtree_size": i64, "depth": i64, "log_p": "float32", "factors": "float32"},
        limits,
    )  # fmt: skip
    return {
        "bole::gdn_tree_verify": verify,
        "bole::gdn_tree_factors": factors,
        "bole::gdn_tree_values": values,
        "bole::gdn_commit": commit,
        "bole::tree_conv1d": conv,
    }


def engine_payloads(config: Qwen35Config, settings: BuildSettings) -> dict[str, Callable[[int], AOTPayload]]:
    """``key -> (arch -> payload)`` for every kernel variant the engine ships."""
    jobs: dict[str, Callable[[int], AOTPayload]] = {}
    for plugin_id, (shapes, dtypes, attrs) in plugin_io(config, settings).items():
        if plugin_id in INVERSE_PAIR and not inverse_serves(
            settings.max_draft_nodes + 1, settings.tree_depth
        ):
            continue
        for t in _runtime_tactics(plugin_id, SPECS[plugin_id].tactics(shapes), config, settings):
            key = f"{plugin_id.split('::')[1]}-t{t}"
            jobs[key] = partial(_payload, plugin_id, shapes, dtypes, attrs, t)
    return jobs


INVERSE_PAIR = ("bole::gdn_tree_factors", "bole::gdn_tree_values")


def _runtime_tactics(
    plugin_id: str, tactics: list, config: Qwen35Config, settings: BuildSettings
) -> list[int]:
    """The tactics of ``plugin_id`` that the runtime's default configs pick at the engine's batch sizes;
    tactic 0 (the runtime's default) for the plugins whose config does not vary with batch, or where
    none of the runtime's choices is among the tactics (the one-launch verify of small batches)."""
    from trtllm_bole.kernels.gdn_tree_verify import InverseConfig, blocked_default_config, default_config

    c, nodes = config, settings.max_draft_nodes + 1
    heads = (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    batches = range(1, settings.max_batch_size + 1)
    if plugin_id == "bole::gdn_tree_verify":
        picked = {blocked_default_config(b, *heads) for b in batches}
    elif plugin_id in INVERSE_PAIR:
        # Trees of 16 nodes or fewer take the blocked kernel at every batch: no pair config is picked.
        configs = (default_config(b * nodes, b, *heads) for b in batches)
        two = [cfg for cfg in configs if isinstance(cfg, InverseConfig) and cfg.launches == 2]
        if plugin_id == "bole::gdn_tree_factors":
            picked = {FactorConfig(cfg.warps1) for cfg in two}
        else:
            keys = {value_tiles(cfg) for cfg in two}
            picked = {t for t in tactics if value_tiles(t) in keys}
    else:
        picked = set()
    return sorted(tactics.index(cfg) for cfg in picked if cfg in tactics) or [0]


def _payload(
    plugin_id: str, shapes: Shapes, dtypes: dict[str, str], attrs: dict, tactic: int, arch: int
) -> AOTPayload:
    return aot_payload(SPECS[plugin_id], shapes, dtypes, attrs, tactic, arch=arch)
