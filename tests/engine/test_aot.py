"""The plugins' plain logic on CPU: descriptors, checks, tactics, grids, and sm_90 PTX from Triton.

Compilation runs in a subprocess: this test process has TRITON_INTERPRET=1 (tests/conftest.py), and
ahead-of-time compilation needs Triton's real compiler (it needs no GPU: the target is explicit).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton

from trtllm_bole.engine.aot import SPECS, value_tiles
from trtllm_bole.engine.build import BuildSettings
from trtllm_bole.engine.kernel_set import engine_payloads, plugin_io
from trtllm_bole.engine.ptx import compile_kernel, entry_params, trim_params
from trtllm_bole.kernels.gdn_commit import default_commit_config
from trtllm_bole.models.config import load_config
from trtllm_bole.models.presets import QWEN35_PRESETS

TRITON_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

NINE_B = load_config(QWEN35_PRESETS["qwen3.5-9b"])
SETTINGS = BuildSettings(dtype="bfloat16").validated("cuda")


class Sym:
    """A symbolic dimension (what TensorRT hands the plugin for dynamic sizes): records arithmetic. Like
    tensorrt.plugin's ShapeExpr it has no reflected operators (``2 * expr`` and ``-expr`` fail there)."""

    def __init__(self, text):
        self.text = text

    def _op(self, op, other):
        return Sym(f"({self.text} {op} {getattr(other, 'text', other)})")

    def __add__(self, o):
        return self._op("+", o)

    def __sub__(self, o):
        return self._op("-", o)

    def __mul__(self, o):
        return self._op("*", o)

    def __floordiv__(self, o):
        return self._op("//", o)


def sym_cdiv(a, b):
    return a._op("cdiv", b) if isinstance(a, Sym) else -(-a // b)


def dynamic(shapes, **names):
    """Replace the leading dimension of the named inputs by symbols."""
    return {k: (Sym(names[k]), *v[1:]) if k in names else v for k, v in shapes.items()}


def test_descriptors_give_output_shapes_and_dtypes():
    io = plugin_io(NINE_B, SETTINGS, batch=4)
    shapes, dtypes, _ = io["bole::gdn_tree_verify"]
    assert SPECS["bole::gdn_tree_verify"].output_descs(shapes, dtypes) == [
        ((256, 32, 128), "bfloat16"),  # 4 requests x (63 drafts + the pending token)
        ((256, 32, 128), "float32"),
        ((256, 32), "float32"),
    ]
    shapes, dtypes, _ = io["bole::gdn_commit"]
    descs = SPECS["bole::gdn_commit"].output_descs(shapes, dtypes)
    assert descs == [((24, 8, 32, 128, 128), "float32")]
    assert dict(SPECS["bole::gdn_commit"].aliased) == {"state_out": "state"}
    shapes, dtypes, _ = io["bole::tree_conv1d"]
    assert SPECS["bole::tree_conv1d"].output_descs(shapes, dtypes) == [((256, 8192), "bfloat16")]


def test_a_dynamic_compiled_in_dimension_is_named_by_port_and_axis():
    shapes, dtypes, _ = plugin_io(NINE_B, SETTINGS)["bole::gdn_tree_verify"]
    verify = SPECS["bole::gdn_tree_verify"]
    shapes = {**shapes, "v": (*shapes["v"][:2], Sym("DV"))}
    with pytest.raises(
        ValueError, match=r"v's dimension 2 .* is compiled into the kernel: give the network a static"
    ):
        verify.check(shapes, dtypes)


def test_dynamic_sizes_stay_symbolic_in_grid_and_extra_args():
    io = plugin_io(NINE_B, SETTINGS)
    verify = SPECS["bole::gdn_tree_verify"]
    shapes = dynamic(io["bole::gdn_tree_verify"][0], cu_seqlens="B1", q="N", v="N")
    cfg = verify.tactics(shapes)[0]
    gx, gy, gz = verify.grid(shapes, cfg, sym_cdiv)
    assert (gx, gy, gz.text) == (128 // cfg.bv, 32, "(B1 - 1)")
    commit = SPECS["bole::gdn_commit"]
    shapes = dynamic(io["bole::gdn_commit"][0], accepted_leaf="B", depth="N", paths="N")
    grid = commit.grid(shapes, commit.tactics(shapes)[0], sym_cdiv)
    assert grid[2].text == "(B * 24)"
    assert [getattr(a, "text", a) for a in commit.extra_values(shapes)] == ["B", 8, "N", 9]
    shapes = io["bole::gdn_commit"][0]  # a static batch, a dynamic layer count
    shapes = {**shapes, "state": (Sym("L"), *shapes["state"][1:])}
    assert commit.grid(shapes, commit.tactics(shapes)[0], sym_cdiv)[2].text == "(L * 8)"
    conv = SPECS["bole::tree_conv1d"]
    shapes = dynamic(io["bole::tree_conv1d"][0], x="N", global_parents="N")
    assert conv.grid(shapes, conv.tactics(shapes)[0], sym_cdiv)[1].text == "(N cdiv 16)"
    assert [getattr(a, "text", a) for a in conv.extra_values(shapes)] == ["N"]


def test_launch_order_is_inputs_then_extra_args_then_outputs():
    commit = SPECS["bole::gdn_commit"]
    assert commit.params[:9] == tuple(p.name for p in commit.inputs)
    assert commit.params[9:] == ("num_requests", "num_slots", "num_nodes", "max_depth", "state_out")
    for spec in SPECS.values():  # the adapters declare exactly this order
        fn = spec.adapter()
        names = fn.fn.__code__.co_varnames if hasattr(fn, "fn") else fn.arg_names
        assert tuple(names[: len(spec.params)]) == spec.params


@pytest.mark.parametrize(
    ("plugin", "edit", "message"),
    [
        ("bole::gdn_tree_verify", {"q": (4, 16, 128, 1)}, "rank 3"),
        ("bole::gdn_tree_verify", {"k": (256, 16, 64)}, r"k.shape\[2\] = 64 must equal q.shape\[2\] = 128"),
        ("bole::gdn_tree_verify", {"state": (8, 32, 128, 64)}, r"state.shape\[3\]"),
        ("bole::gdn_commit", {"paths": (7, 9)}, r"paths.shape\[0\] = 7"),
        ("bole::tree_conv1d", {"conv_state": (8, 8192, 4)}, "conv_state width 4 must be weight width 4 - 1"),
    ],
)
def test_checks_name_the_bad_port(plugin, edit, message):
    shapes, dtypes, _ = plugin_io(NINE_B, SETTINGS, batch=4)[plugin]
    with pytest.raises(ValueError, match=message):
        SPECS[plugin].check({**shapes, **edit}, dtypes)


def test_checks_dtypes():
    shapes, dtypes, _ = plugin_io(NINE_B, SETTINGS)["bole::gdn_tree_verify"]
    with pytest.raises(ValueError, match="state_indices must be one of"):
        SPECS["bole::gdn_tree_verify"].check(shapes, {**dtypes, "state_indices": "int32"})
    with pytest.raises(ValueError, match="v, beta must share a dtype"):
        SPECS["bole::gdn_tree_verify"].check(shapes, {**dtypes, "beta": "float32"})


def test_tactics_only_tile_the_head_dims():
    shapes, _, _ = plugin_io(NINE_B, SETTINGS)["bole::gdn_tree_verify"]
    tactics = SPECS["bole::gdn_tree_verify"].tactics(shapes)
    assert tactics and all(128 % c.bk == 0 and 128 % c.bv == 0 for c in tactics)
    commit_shapes, _, _ = plugin_io(NINE_B, SETTINGS)["bole::gdn_commit"]
    first = SPECS["bole::gdn_commit"].tactics(commit_shapes)[0]
    depth = commit_shapes["paths"][1]  # the engine's tree depth
    assert first == default_commit_config(128, 128, depth)  # the runtime's default first
    assert (first.bk, first.bv, first.outer) == ((16, 64, False) if depth > 4 else (64, 64, True))


def test_explicit_inverse_tactics_and_limits():
    shapes, dtypes, attrs = plugin_io(NINE_B, SETTINGS, batch=16)["bole::gdn_tree_values"]
    values = SPECS["bole::gdn_tree_values"]
    tactics = values.tactics(shapes)
    first = tactics[0]
    assert (first.bk, first.bv, first.num_warps, first.maxnreg) == (64, 64, 4, 128)  # the runtime's default
    assert values.launch_options(first) == {"num_warps": 4, "num_stages": 1, "maxnreg": 128}
    keys = [value_tiles(t) for t in tactics]
    assert len(set(keys)) == len(keys) and all(t.launches == 2 and t.bt == 64 for t in tactics)
    assert values.constexprs(shapes, dtypes, attrs, first)["S_BF16"]  # bf16 serving: bf16 state products
    exact = {**dtypes, "q": "float32", "k": "float32", "v": "float32"}
    assert values.constexprs(shapes, exact, attrs, first)["PREC"] == "ieee"
    for bad in ({"max_nodes": 65}, {"max_nodes": 0}):
        with pytest.raises(
            ValueError, match=r"at most 64 nodes and depth 16 per request \(max_nodes=-?\d+\);"
        ):
            values.constexprs(shapes, dtypes, {**attrs, **bad}, first)  # it takes no max_depth to name
    shapes, dtypes, attrs = plugin_io(NINE_B, SETTINGS, batch=16)["bole::gdn_tree_factors"]
    factors = SPECS["bole::gdn_tree_factors"]
    with pytest.raises(ValueError, match="at most 64 nodes and depth 16"):
        factors.constexprs(shapes, dtypes, {**attrs, "max_depth": 17}, factors.tactics(shapes)[0])
    assert factors.output_descs(shapes, dtypes) == [
        ((2, 32, 16 * 64, 9), "float32"),  # W', C' per value head, node and path position
        ((16 * 64, 32), "float32"),
        ((16 * 64, 32, 128), "float32"),  # Q Kᵀ and K Kᵀ rows on the way
    ]


def test_engines_compile_the_pair_only_for_trees_it_serves():
    keys = engine_payloads(NINE_B, BuildSettings(dtype="bfloat16", max_batch_size=16).validated("cuda"))
    assert {"gdn_tree_factors-t0", "gdn_tree_values-t0"} <= set(keys)  # batch 16: the runtime's default
    wide = BuildSettings(dtype="bfloat16", max_batch_size=16, max_draft_nodes=64).validated("cuda")
    assert not any(
        k.startswith(("gdn_tree_factors", "gdn_tree_values")) for k in engine_payloads(NINE_B, wide)
    )
    assert any(k.startswith("gdn_tree_verify") for k in engine_payloads(NINE_B, wide))


@pytest.mark.parametrize("nodes", [7, 15])
def test_engines_of_small_trees_list_their_kernels(nodes):
    """Trees of 16 nodes or fewer: the runtime's config is the blocked kernel's at every batch, which has no
    launch count (a GPU build of ``--max-draft-nodes 15`` stopped on an AttributeError before compiling)."""
    for dtype in ("bfloat16", "float32"):
        settings = BuildSettings(dtype=dtype, max_batch_size=16, max_draft_depth=4, max_draft_nodes=nodes)
        keys = engine_payloads(NINE_B, settings.validated("cuda"))
        assert any(k.startswith("gdn_tree_verify") for k in keys)
        assert {"gdn_tree_factors-t0", "gdn_tree_values-t0"} <= set(keys)  # the pair's tactic 0


PTX = """.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1,
\t.param .u64 .ptr .global .align 1 k_param_2,
\t.param .u64 .ptr .global .align 1 k_param_3
)
{
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b32 \t%r1, [k_param_1];
}
"""


def test_trim_params_drops_unused_trailing_scratch_pointers():
    trimmed = trim_params(PTX, "k", 2)
    assert entry_params(trimmed, "k") == ["k_param_0", "k_param_1"]
    assert "k_param_1\n)" in trimmed
    assert trim_params(PTX, "k", 4) == PTX
    with pytest.raises(ValueError, match="k_param_1 is used"):
        trim_params(PTX, "k", 1)
    with pytest.raises(ValueError, match="fewer than"):
        trim_params(PTX, "k", 5)


@pytest.mark.interpreter
def test_compile_refuses_the_interpreter():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        compile_kernel(SPECS["bole::tree_conv1d"].adapter(), {}, {}, arch=90, num_warps=4, num_stages=1)


COMPILE = textwrap.dedent(
    """
    import json, sys
    from trtllm_bole.engine.aot import SPECS, aot_payload
    from trtllm_bole.engine.build import BuildSettings
    from trtllm_bole.engine.kernel_set import engine_payloads, plugin_io
    from trtllm_bole.models.config import load_config
    from trtllm_bole.models.presets import QWEN35_PRESETS

    settings = BuildSettings(dtype="bfloat16").validated("cuda")
    io = plugin_io(load_config(QWEN35_PRESETS["qwen3.5-9b"]), settings, batch=4)
    out = {}
    for plugin in sys.argv[2:]:
        shapes, dtypes, attrs = io[plugin]
        p = aot_payload(SPECS[plugin], shapes, dtypes, attrs, 0, arch=90)
        path = f"{sys.argv[1]}/{p.kernel_name}.ptx"
        open(path, "w").write(p.ptx)
        out[plugin] = {"name": p.kernel_name, "ptx": path, "grid": list(p.launch.grid),
                       "block": list(p.launch.block), "shared": p.launch.shared_mem,
                       "extra": list(p.extra_args), "params": list(p.params),
                       "cubin_params": p.kernel.cubin_num_params, "cubin": p.kernel.cubin.hex()}
    print(json.dumps(out))
    """
)


def compile_in_subprocess(tmp_path, *plugins):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE, str(tmp_path), *plugins], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_ptx(info, tmp_path):
    with open(info["ptx"]) as f:
        ptx = f.read()
    assert ".target sm_90a" in ptx and re.search(r"^\.version 8\.0$", ptx, re.MULTILINE)
    assert re.search(rf"\.visible \.entry {info['name']}\(", ptx)
    assert len(entry_params(ptx, info["name"])) == len(info["params"])  # exactly TensorRT's launch
    assert re.search(r"ld\.global[.\w]*\.v[24]\.", ptx)  # vector loads: pointers compiled as 16-byte aligned
    assert info["block"][0] % 32 == 0
    ptxas = shutil.which("ptxas") or str(TRITON_BIN / "ptxas")  # Triton ships one
    run = subprocess.run([ptxas, "-arch=sm_90a", info["ptx"], "-o", str(tmp_path / "k.cubin")])
    assert run.returncode == 0  # the PTX assembles for the H200
    # The cubin (Triton's, untrimmed) declares what the build records: the launch's parameters, then
    # Triton's scratch pointers, which a launch of the cubin passes as nulls.
    (tmp_path / "triton.cubin").write_bytes(bytes.fromhex(info["cubin"]))
    elf = subprocess.run([str(TRITON_BIN / "cuobjdump"), "-elf", str(tmp_path / "triton.cubin")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    ordinals = {int(o, 16) for o in re.findall(r"Ordinal\s*:\s*0x([0-9a-f]+)", elf)}
    assert ordinals == set(range(info["cubin_params"])) and info["cubin_params"] > len(info["params"])


def test_aot_ptx_for_sm90_commit_and_conv(tmp_path):
    out = compile_in_subprocess(tmp_path, "bole::gdn_commit", "bole::tree_conv1d")
    commit, conv = out["bole::gdn_commit"], out["bole::tree_conv1d"]
    assert commit["name"] == "gdn_commit_aot" and commit["grid"] == [2, 32, 4 * 24]  # the dot form (depth 9)
    assert commit["extra"] == [4, 8, 256, 9]
    assert conv["name"] == "tree_conv1d_aot" and conv["extra"] == [256]  # 4 requests x 64 nodes
    assert conv["grid"] == [64, 256 // 16, 1]
    for info in out.values():
        check_ptx(info, tmp_path)


@pytest.mark.slow
def test_aot_ptx_for_sm90_verify(tmp_path):
    info = compile_in_subprocess(tmp_path, "bole::gdn_tree_verify")["bole::gdn_tree_verify"]
    assert info["name"] == "gdn_tree_verify_aot" and info["extra"] == []
    assert info["grid"] == [128 // 16, 32, 4]  # tactic 0: value tiles of 16, per head, per request
    check_ptx(info, tmp_path)


@pytest.mark.slow
def test_aot_ptx_for_sm90_explicit_inverse(tmp_path):
    out = compile_in_subprocess(tmp_path, "bole::gdn_tree_factors", "bole::gdn_tree_values")
    factors, values = out["bole::gdn_tree_factors"], out["bole::gdn_tree_values"]
    assert factors["name"] == "gdn_tree_factors_aot" and factors["grid"] == [32, 4, 1]  # per head, request
    assert values["name"] == "gdn_tree_values_aot" and values["grid"] == [128 // 64, 32, 4]  # + value tiles
    assert factors["extra"] == values["extra"] == [256, 9]  # nodes, path length
    assert factors["block"] == [8 * 32, 1, 1] and values["block"] == [4 * 32, 1, 1]
    with open(values["ptx"]) as f:
        assert re.search(r"^\.maxnreg 128$", f.read(), re.MULTILINE)  # tactic 0: the runtime's register cap
    for info in out.values():
        check_ptx(info, tmp_path)
