"""The TensorRT plan of an engine (``build_engine.py --tensorrt``): one verify step of the target model.

UNTESTED WITHOUT TENSORRT: full TensorRT (with its Builder) cannot be installed on our machines, so
this file has never run; see plugins/README.md. Everything it calls into — the plugin descriptors,
tactics and AOT payloads — is tested on CPU and launched on the H200 (plugins/check_aot.py).

The network (strongly typed, dynamic N nodes / B requests / M context rows) computes, for a packed
draft forest, what ``Qwen35Model.verify`` computes:

- GDN layers: projections (TensorRT matmuls), ``bole::tree_conv1d`` (+ SiLU), q/k L2 norm and the gates
  (TensorRT elementwise layers), the closed form (state read-only), gated RMS norm, out projection. The
  closed form is the runtime's: ``bole::gdn_tree_factors`` then ``bole::gdn_tree_values`` (the explicit
  inverse, q/k in the model's dtype after their norm, as the runtime hands them on) in a 16-bit engine
  whose trees fit its one tile (``max_draft_nodes + 1 <= 64``, depth <= 16; the tree's ``paths`` are then
  an input), else ``bole::gdn_tree_verify`` (the blocked kernel, fp32 q/k; IEEE dots in an fp32 engine);
- attention layers: q/k RMSNorm, partial RoPE (cos/sin given per node), the output gate, and dense
  attention over ``[context rows | new nodes]`` with an additive mask: the context part is an input
  (the runtime gathers the committed K/V of the batch from its paged cache), the tree part is built in
  the network from the pre-order interval test (``dfs_order``, ``subtree_size``);
- MLPs, norms, residuals, lm_head.

Outputs: logits and hidden states, plus what the commit needs: per GDN layer the factors ``k`` (post-conv,
L2-normalised), ``u`` and ``log_p`` and the conv inputs, per attention layer the new K/V. The commit itself
(``bole::gdn_commit``, in place, all layers in one launch) and the KV compaction stay in the runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_bole.engine.aot import inverse_serves

MISSING = (
    "--tensorrt needs the full TensorRT Python package `tensorrt` (with its Builder, version >= 10.9 for "
    "the tensorrt.plugin AOT API), which is not installed here. The lean runtime (tensorrt-lean) cannot "
    "build plans, and on PyPI `tensorrt` only downloads from NVIDIA's package index: on a machine that "
    "reaches it, `pip install tensorrt-cu13` (or `pip install 'tensorrt-cu12>=10.9'`), then rerun the build."
)


def require_tensorrt() -> Any:
    """The full ``tensorrt`` module, or ``RuntimeError`` naming the missing package and what to do."""
    try:
        import tensorrt as trt
    except ImportError:
        raise RuntimeError(MISSING) from None
    if not hasattr(trt, "Builder"):
        raise RuntimeError(MISSING)
    try:
        import tensorrt.plugin
    except (ImportError, AttributeError):
        raise RuntimeError(f"TensorRT {trt.__version__} lacks tensorrt.plugin. {MISSING}") from None
    if not hasattr(tensorrt.plugin, "aot_impl"):  # AOT plugins came in 10.9 (10.8: JIT plugins only)
        raise RuntimeError(f"TensorRT {trt.__version__} lacks tensorrt.plugin.aot_impl. {MISSING}")
    return trt


def plugin_arch() -> int:
    """``BOLE_PLUGIN_ARCH`` (default 90, ``sm_90`` read alike): the compute capability the plugins' PTX is
    compiled for; ``RuntimeError`` for anything else."""
    value = os.environ.get("BOLE_PLUGIN_ARCH", "90")
    digits = value.strip().removeprefix("sm_")
    if not digits.isdigit():
        raise RuntimeError(f"BOLE_PLUGIN_ARCH={value!r}: set it to a compute capability, e.g. 90 (or sm_90)")
    return int(digits)


def check_plugin_arch(gpu: str) -> None:
    """The plugins' PTX targets the build GPU (``gpu``: ``"sm_90"``, or ``"cpu"``); else ``RuntimeError``
    saying what to change. Needs no TensorRT, so that a build asks for the right device first."""
    if not gpu.startswith("sm_"):
        raise RuntimeError(
            f"--tensorrt builds the plan on the GPU that will run it, not on {gpu}: --device cuda"
        )
    arch = plugin_arch()
    if gpu != f"sm_{arch}":
        raise RuntimeError(
            f"the plugins compile for sm_{arch} (BOLE_PLUGIN_ARCH) but the build GPU is {gpu}: set "
            f"BOLE_PLUGIN_ARCH={gpu.removeprefix('sm_')}"
        )


def build_plan(staging: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Build ``bole.plan`` next to the staged weights; returns the record kept in ``config.json``."""
    trt = require_tensorrt()
    gpu = config["environment"]["arch"]
    check_plugin_arch(gpu)
    from trtllm_bole.engine import format as fmt
    from trtllm_bole.models.config import load_config

    model_config = load_config(config["model"]["hf_config"])
    weights = _read_weights(staging / fmt.WEIGHTS_DIR)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    net = VerifyNetwork(trt, network, model_config, weights, config["build"])
    net.build()
    build_config = builder.create_builder_config()
    build_config.add_optimization_profile(net.profile(builder))
    plan = builder.build_serialized_network(network, build_config)
    if plan is None:
        raise RuntimeError("TensorRT failed to build the verify plan (see its log above)")
    (staging / fmt.PLAN).write_bytes(bytes(plan))
    return {
        "file": fmt.PLAN,
        "tensorrt": trt.__version__,
        "plugin_arch": gpu,
        "inputs": net.input_names,
        "outputs": net.output_names,
    }


def _read_weights(directory: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118
                out[name] = f.get_tensor(name).float().numpy()
    return out


class VerifyNetwork:
    """Builds the verify network layer by layer (names follow ``Qwen35Model.named_parameters``)."""

    def __init__(
        self, trt: Any, network: Any, config: Any, weights: dict[str, np.ndarray], build: dict
    ) -> None:
        self.trt, self.net, self.c, self.w, self.build_settings = trt, network, config, weights, build
        self.dtype = trt.bfloat16 if build["dtype"] == "bfloat16" else trt.float32
        self.input_names: list[str] = []
        self.output_names: list[str] = []

    # -- small helpers ------------------------------------------------------------------------ #

    def input(self, name: str, dtype: Any, shape: tuple[int, ...]) -> Any:
        self.input_names.append(name)
        return self.net.add_input(name, dtype, shape)

    def output(self, tensor: Any, name: str) -> None:
        tensor.name = name
        self.net.mark_output(tensor)
        self.output_names.append(name)

    def const(self, array: np.ndarray, dtype: Any = None) -> Any:
        array = np.ascontiguousarray(array, dtype=np.float32)
        t = self.net.add_constant(array.shape, self.trt.Weights(array)).get_output(0)
        return self.cast(t, dtype or self.dtype)

    def cast(self, t: Any, dtype: Any) -> Any:
        return t if t.dtype == dtype else self.net.add_cast(t, dtype).get_output(0)

    def ew(self, a: Any, b: Any, op: str) -> Any:
        return self.net.add_elementwise(a, b, getattr(self.trt.ElementWiseOperation, op)).get_output(0)

    def unary(self, a: Any, op: str) -> Any:
        return self.net.add_unary(a, getattr(self.trt.UnaryOperation, op)).get_output(0)

    def act(self, a: Any, op: str) -> Any:
        return self.net.add_activation(a, getattr(self.trt.ActivationType, op)).get_output(0)

    def reshape(self, t: Any, dims: tuple[int, ...], perm: tuple[int, ...] | None = None) -> Any:
        layer = self.net.add_shuffle(t)
        layer.reshape_dims = dims  # 0 copies the input dimension (dynamic N), -1 is inferred
        if perm is not None:
            layer.second_transpose = perm
        return layer.get_output(0)

    def unsqueeze0(self, t: Any) -> Any:
        """``[a, b]`` -> ``[1, a, b]``, a and b dynamic. A reshape's 0 copies the input dimension of the same
        index, so ``(1, 0, 0)`` would give ``[1, b, ?]``: reshape to ``[a, b, 1]``, then move the 1 first."""
        return self.reshape(t, (0, 0, 1), (2, 0, 1))

    def transpose(self, t: Any, perm: tuple[int, ...]) -> Any:
        layer = self.net.add_shuffle(t)
        layer.first_transpose = perm
        return layer.get_output(0)

    def take(self, t: Any, axis: int, start: int, size: int) -> Any:
        """A static range along ``axis`` (a gather, so dynamic leading dimensions need no shape math)."""
        idx = self.net.add_constant((size,), self.trt.Weights(np.arange(start, start + size, dtype=np.int32)))
        return self.net.add_gather(t, idx.get_output(0), axis).get_output(0)

    def linear(self, x: Any, name: str, rows: tuple[int, int] | None = None) -> Any:
        weight = self.w[name] if rows is None else self.w[name][rows[0] : rows[1]]
        op = self.trt.MatrixOperation
        return self.net.add_matrix_multiply(x, op.NONE, self.const(weight), op.TRANSPOSE).get_output(0)

    def mean_last(self, x: Any, rank: int) -> Any:
        return self.net.add_reduce(x, self.trt.ReduceOperation.AVG, 1 << (rank - 1), True).get_output(0)

    def rms(self, x: Any, rank: int, eps: float) -> Any:
        """``x / sqrt(mean(x^2) + eps)`` in float32."""
        x = self.cast(x, self.trt.float32)
        ms = self.ew(
            self.mean_last(self.ew(x, x, "PROD"), rank), self.const(np.full((1,) * rank, eps), x.dtype), "SUM"
        )
        return self.ew(x, self.unary(self.unary(ms, "SQRT"), "RECIP"), "PROD")

    def rms_norm(self, x: Any, name: str, rank: int = 2) -> Any:
        """Zero-centred RMSNorm ``x / rms(x) * (1 + w)`` (Qwen3_5RMSNorm)."""
        scale = (1.0 + self.w[name]).reshape((1,) * (rank - 1) + (-1,))
        return self.cast(
            self.ew(self.rms(x, rank, self.c.rms_norm_eps), self.const(scale, self.trt.float32), "PROD"),
            self.dtype,
        )

    # -- the model ----------------------------------------------------------------------------- #

    def build(self) -> None:
        trt, c, b = self.trt, self.c, self.build_settings
        i64 = trt.int64
        self.ids = self.input("input_ids", trt.int32, (-1,))
        forest = ("state_indices", "cu_seqlens", "dfs_order", "subtree_size", "request", "depth")
        forest += ("global_parents",)  # the tree conv's walk up the path
        self.tree = {n: self.input(n, i64, (-1,)) for n in forest}
        # The runtime's choice: the explicit inverse serves 16-bit activations; fp32 ones take the exact mode,
        # the blocked kernel's IEEE dots (kernels.gdn_tree_verify.exact_config).
        self.inverse = self.dtype != trt.float32 and inverse_serves(
            b["max_draft_nodes"] + 1, b["max_draft_depth"] + 1
        )
        if self.inverse:  # each node's ancestors by depth, for the explicit inverse's compact factors
            self.tree["paths"] = self.input("paths", i64, (-1, -1))
        self.gdn_state = self.input(
            "gdn_state",
            trt.float32,
            (
                c.num_gdn_layers,
                b["max_batch_size"],
                c.linear_num_value_heads,
                c.linear_key_head_dim,
                c.linear_value_head_dim,
            ),
        )
        self.conv_state = self.input(
            "conv_state",
            self.dtype,
            (c.num_gdn_layers, b["max_batch_size"], c.conv_dim, c.linear_conv_kernel_dim - 1),
        )
        self.cos = self.input("rope_cos", self.dtype, (-1, c.rotary_dim))
        self.sin = self.input("rope_sin", self.dtype, (-1, c.rotary_dim))
        self.ctx_k = self.input(
            "context_k", self.dtype, (c.num_attn_layers, -1, c.num_key_value_heads, c.head_dim)
        )
        self.ctx_v = self.input(
            "context_v", self.dtype, (c.num_attn_layers, -1, c.num_key_value_heads, c.head_dim)
        )
        self.ctx_bias = self.input("context_bias", trt.float32, (-1, -1))  # [N, M]: 0 = visible, -inf = not
        self.tree_bias = self._tree_bias()
        x = self.net.add_gather(self.const(self.w["embed_tokens"]), self.ids, 0).get_output(0)
        for i, kind in enumerate(c.layer_types):
            h = self.rms_norm(x, f"layers.{i}.input_norm")
            mixer = self._gdn(h, i) if kind == "linear_attention" else self._attention(h, i)
            x = self.ew(x, mixer, "SUM")
            x = self.ew(x, self._mlp(self.rms_norm(x, f"layers.{i}.post_attention_norm"), i), "SUM")
        hidden = self.rms_norm(x, "norm")
        self.output(hidden, "hidden")
        self.output(self.linear(hidden, "lm_head" if "lm_head" in self.w else "embed_tokens"), "logits")

    def _tree_bias(self) -> Any:
        """``[N, N]``: 0 where column j is an ancestor-or-self of row i (pre-order interval), else -inf."""
        order = self.cast(self.tree["dfs_order"], self.trt.int32)
        end = self.ew(order, self.cast(self.tree["subtree_size"], self.trt.int32), "SUM")
        row, col, col_end = (
            self.reshape(order, (-1, 1)),
            self.reshape(order, (1, -1)),
            self.reshape(end, (1, -1)),
        )
        inside = self.ew(self.unary(self.ew(row, col, "LESS"), "NOT"), self.ew(row, col_end, "LESS"), "AND")
        zero, neg = (self.const(np.full((1, 1), v), self.trt.float32) for v in (0.0, -np.inf))
        return self.net.add_select(inside, zero, neg).get_output(0)

    def _gdn(self, h: Any, i: int) -> Any:
        trt, c = self.trt, self.c
        p, li = f"layers.{i}.mixer.", c.gdn_layer_ids.index(i)
        widths = (c.conv_dim, c.value_dim, c.linear_num_value_heads, c.linear_num_value_heads)
        starts = np.cumsum((0, *widths))
        qkv, z, b, a = (self.linear(h, p + "in_proj", (int(starts[j]), int(starts[j + 1]))) for j in range(4))
        conv_state = self.reshape(
            self.take(self.conv_state, 0, li, 1), (-1, c.conv_dim, c.linear_conv_kernel_dim - 1)
        )
        t = self.tree
        conv = self.net.add_plugin(
            self._op().tree_conv1d(
                qkv,
                self.const(self.w[p + "conv_weight"]),
                conv_state,
                t["state_indices"],
                t["request"],
                t["depth"],
                t["global_parents"],
                silu=1,
            ),
            aot=True,
        ).get_output(0)
        hk, dk, hv, dv = (
            c.linear_num_key_heads,
            c.linear_key_head_dim,
            c.linear_num_value_heads,
            c.linear_value_head_dim,
        )
        q = self._l2norm(self.reshape(self.take(conv, 1, 0, c.key_dim), (0, hk, dk)))
        k = self._l2norm(self.reshape(self.take(conv, 1, c.key_dim, c.key_dim), (0, hk, dk)))
        v = self.reshape(self.take(conv, 1, 2 * c.key_dim, c.value_dim), (0, hv, dv))
        f32 = trt.float32
        gate = self.act(
            self.ew(self.cast(a, f32), self.const(self.w[p + "dt_bias"][None], f32), "SUM"), "SOFTPLUS"
        )
        g = self.ew(gate, self.const(-np.exp(self.w[p + "A_log"])[None], f32), "PROD")
        beta = self.act(b, "SIGMOID")
        state = self.reshape(self.take(self.gdn_state, 0, li, 1), (-1, hv, dk, dv))
        o, k, u, log_p = (self._explicit_inverse if self.inverse else self._blocked)(q, k, v, g, beta, state)
        self.output(k, f"gdn{li}.k")
        self.output(u, f"gdn{li}.u")
        self.output(log_p, f"gdn{li}.log_p")
        self.output(qkv, f"gdn{li}.conv_input")
        normed = self.cast(self.rms(o, 3, c.rms_norm_eps), self.dtype)
        zz = self.cast(self.reshape(z, (0, hv, dv)), f32)
        silu = self.cast(self.ew(zz, self.act(zz, "SIGMOID"), "PROD"), self.dtype)
        y = self.ew(self.ew(self.const(self.w[p + "norm"][None, None]), normed, "PROD"), silu, "PROD")
        return self.linear(self.reshape(y, (0, -1)), p + "out_proj")

    def _blocked(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> tuple[Any, ...]:
        """``bole::gdn_tree_verify`` (fp32 q/k): o, the commit's k, u and log_p."""
        t = self.tree
        verify = self.net.add_plugin(
            self._op().gdn_tree_verify(
                q, k, v, g, beta, state, t["state_indices"], t["cu_seqlens"], t["dfs_order"],
                t["subtree_size"], scale=self.c.linear_key_head_dim**-0.5,
            ),
            aot=True,
        )  # fmt: skip
        return verify.get_output(0), k, verify.get_output(1), verify.get_output(2)

    def _explicit_inverse(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> tuple[Any, ...]:
        """``bole::gdn_tree_factors`` then ``bole::gdn_tree_values`` on q/k in the model's dtype: o, the
        commit's k (the same, as the runtime's commit reads it), u and log_p."""
        t, b = self.tree, self.build_settings
        q, k = self.cast(q, self.dtype), self.cast(k, self.dtype)
        scale, nodes = self.c.linear_key_head_dim**-0.5, b["max_draft_nodes"] + 1
        factors = self.net.add_plugin(
            self._op().gdn_tree_factors(
                q, k, g, beta, t["cu_seqlens"], t["depth"], t["paths"],
                scale=scale, max_nodes=nodes, max_depth=b["max_draft_depth"] + 1,
            ),
            aot=True,
        )  # fmt: skip
        log_p = factors.get_output(1)
        values = self.net.add_plugin(
            self._op().gdn_tree_values(
                q, k, v, state, t["state_indices"], t["cu_seqlens"], t["dfs_order"], t["subtree_size"],
                t["depth"], log_p, factors.get_output(0), scale=scale, max_nodes=nodes,
            ),
            aot=True,
        )  # fmt: skip
        return values.get_output(0), k, values.get_output(1), log_p

    def _l2norm(self, x: Any) -> Any:
        x = self.cast(x, self.trt.float32)
        ss = self.net.add_reduce(
            self.ew(x, x, "PROD"), self.trt.ReduceOperation.SUM, 1 << 2, True
        ).get_output(0)
        ss = self.ew(ss, self.const(np.full((1, 1, 1), 1e-6), self.trt.float32), "SUM")
        return self.ew(x, self.unary(self.unary(ss, "SQRT"), "RECIP"), "PROD")

    def _rope(self, x: Any) -> Any:
        c = self.c
        rot, half = c.rotary_dim, c.rotary_dim // 2
        x_rot, x_pass = self.take(x, 2, 0, rot), self.take(x, 2, rot, c.head_dim - rot)
        minus = self.const(np.full((1, 1, 1), -1.0))
        rotated = self.net.add_concatenation(
            [self.ew(self.take(x_rot, 2, half, half), minus, "PROD"), self.take(x_rot, 2, 0, half)]
        )
        rotated.axis = 2
        cos, sin = (self.reshape(t, (0, 1, rot)) for t in (self.cos, self.sin))
        out = self.ew(self.ew(x_rot, cos, "PROD"), self.ew(rotated.get_output(0), sin, "PROD"), "SUM")
        cat = self.net.add_concatenation([out, x_pass])
        cat.axis = 2
        return cat.get_output(0)

    def _attention(self, h: Any, i: int) -> Any:
        c, p, li = self.c, f"layers.{i}.mixer.", self.c.attn_layer_ids.index(i)
        nh, kvh, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_gate = self.w[p + "qkv_proj"][: 2 * nh * d].reshape(nh, 2, d, -1)
        self.w[p + "q"], self.w[p + "gate"] = (
            q_gate[:, 0].reshape(nh * d, -1),
            q_gate[:, 1].reshape(nh * d, -1),
        )
        q = self.reshape(self.linear(h, p + "q"), (0, nh, d))
        gate = self.linear(h, p + "gate")
        k = self.reshape(self.linear(h, p + "qkv_proj", (2 * nh * d, 2 * nh * d + kvh * d)), (0, kvh, d))
        v = self.reshape(
            self.linear(h, p + "qkv_proj", (2 * nh * d + kvh * d, 2 * nh * d + 2 * kvh * d)), (0, kvh, d)
        )
        q = self._rope(self.rms_norm(q, p + "q_norm", 3))
        k = self._rope(self.rms_norm(k, p + "k_norm", 3))
        self.output(k, f"attn{li}.new_k")
        self.output(v, f"attn{li}.new_v")
        keys, values = [], []
        for ctx, new, out in ((self.ctx_k, k, keys), (self.ctx_v, v, values)):
            rows = self.net.add_concatenation([self.reshape(self.take(ctx, 0, li, 1), (-1, kvh, d)), new])
            rows.axis = 0
            per_head = self.reshape(rows.get_output(0), (0, kvh, 1, d))
            rep = self.net.add_concatenation(
                [per_head] * (nh // kvh)
            )  # GQA: each KV head serves nh/kvh heads
            rep.axis = 2
            out.append(self.transpose(self.reshape(rep.get_output(0), (0, nh, d)), (1, 0, 2)))  # [nh, M+N, d]
        op = self.trt.MatrixOperation
        qh = self.transpose(q, (1, 0, 2))  # [nh, N, d]
        scores = self.net.add_matrix_multiply(qh, op.NONE, keys[0], op.TRANSPOSE).get_output(0)
        scores = self.ew(
            self.cast(scores, self.trt.float32),
            self.const(np.full((1, 1, 1), d**-0.5), self.trt.float32),
            "PROD",
        )
        bias = self.net.add_concatenation([self.ctx_bias, self.tree_bias])
        bias.axis = 1
        scores = self.ew(scores, self.unsqueeze0(bias.get_output(0)), "SUM")  # [N, M+N] -> [1, N, M+N]
        softmax = self.net.add_softmax(scores)
        softmax.axes = 1 << 2
        probs = self.cast(softmax.get_output(0), self.dtype)
        o = self.net.add_matrix_multiply(probs, op.NONE, values[0], op.NONE).get_output(0)  # [nh, N, d]
        o = self.reshape(self.transpose(o, (1, 0, 2)), (0, -1))
        return self.linear(self.ew(o, self.act(gate, "SIGMOID"), "PROD"), p + "o_proj")

    def _mlp(self, h: Any, i: int) -> Any:
        p, inter = f"layers.{i}.mlp.", self.c.intermediate_size
        gate, up = (
            self.linear(h, p + "gate_up_proj", (0, inter)),
            self.linear(h, p + "gate_up_proj", (inter, 2 * inter)),
        )
        return self.linear(
            self.ew(self.ew(gate, self.act(gate, "SIGMOID"), "PROD"), up, "PROD"), p + "down_proj"
        )

    def _op(self) -> Any:
        """``tensorrt.plugin.op.bole``: the namespace exists once ``plugins/bole_plugins.py`` has registered
        the plugins (importing ``tensorrt.plugin`` alone defines none)."""
        import tensorrt.plugin as trtp

        import plugins.bole_plugins  # noqa: F401

        return trtp.op.bole

    def profile(self, builder: Any) -> Any:
        """Dynamic sizes: N tree nodes, B requests, M context rows, within the engine's build limits."""
        b, c = self.build_settings, self.c
        batch, nodes = b["max_batch_size"], b["max_batch_size"] * (b["max_draft_nodes"] + 1)
        ctx = batch * b["max_seq_len"]
        profile = builder.create_optimization_profile()

        def kv(rows: int) -> tuple[int, ...]:
            return (c.num_attn_layers, rows, c.num_key_value_heads, c.head_dim)

        shapes = {
            "input_ids": [(1,), (nodes // 2,), (nodes,)],
            "state_indices": [(1,), (batch,), (batch,)],
            "cu_seqlens": [(2,), (batch + 1,), (batch + 1,)],
            "rope_cos": [(1, c.rotary_dim), (nodes // 2, c.rotary_dim), (nodes, c.rotary_dim)],
            "context_k": [kv(1), kv(ctx // 2), kv(ctx)],
            "context_bias": [(1, 1), (nodes // 2, ctx // 2), (nodes, ctx)],
        }  # fmt: skip
        for name in ("dfs_order", "subtree_size", "request", "depth", "global_parents"):
            shapes[name] = shapes["input_ids"]
        if self.inverse:
            levels = b["max_draft_depth"] + 1
            shapes["paths"] = [(1, 1), (nodes // 2, levels), (nodes, levels)]
        shapes["rope_sin"], shapes["context_v"] = shapes["rope_cos"], shapes["context_k"]
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        return profile
