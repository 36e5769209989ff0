"""plugins/: the tensorrt.plugin definitions agree with the plain specs, and --tensorrt fails cleanly.

TensorRT's plugin package is exercised for real where it imports (full TensorRT >= 10.9); here no
TensorRT is installed (and the lean runtime, tensorrt-lean-cu13 11.4, carries the same tensorrt.plugin
code but lacks ``TensorFormat``, so the package cannot be imported on top of it either): those tests
skip with the reason. What tensorrt.plugin validates at registration (the annotations of every
decorated function) is checked here from the source instead.
"""

import ast
import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from trtllm_bole.engine.aot import SPECS

ROOT = Path(__file__).resolve().parents[2]
DEFS = ast.parse((ROOT / "plugins" / "bole_plugins.py").read_text())


def decorated(kind):
    """plugin id -> ``([(parameter, its annotation's source or None)], the return annotation's source)`` of
    the function decorated with ``@trtp.<kind>(plugin id)``."""
    out = {}
    for node in DEFS.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "attr", None) == kind:
                    params = [(a.arg, a.annotation and ast.unparse(a.annotation)) for a in node.args.args]
                    out[dec.args[0].value] = params, node.returns and ast.unparse(node.returns)
    return out


DESC = "trtp.TensorDesc"
AOT_RETURN = "tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]"


@pytest.mark.parametrize("plugin", sorted(SPECS))
def test_definitions_match_the_specs(plugin):
    """Names in the specs' order, and the annotations tensorrt.plugin requires (it refuses at import a
    register or aot_impl function whose parameters or return are annotated otherwise)."""
    spec = SPECS[plugin]
    inputs = [(p.name, DESC) for p in spec.inputs]
    attrs = [(name, kind.__name__) for name, kind in spec.attrs]
    outputs = DESC if len(spec.outputs) == 1 else f"tuple[{', '.join([DESC] * len(spec.outputs))}]"
    assert decorated("register")[plugin] == (inputs + attrs, outputs)
    params, _ = decorated("autotune")[plugin]
    assert [name for name, _ in params] == [*(name for name, _ in inputs), "outputs"]
    assert decorated("aot_impl")[plugin] == (
        [*inputs, *attrs, ("outputs", f"tuple[{DESC}]"), ("tactic", "int")],
        AOT_RETURN,
    )


def test_network_calls_each_plugin_as_specified():
    """network.py cannot run here (no TensorRT): every plugin it adds takes the spec's number of inputs and
    exactly its attributes by name, and every plugin but the runtime's commit is used."""
    tree = ast.parse((ROOT / "plugins" / "network.py").read_text())
    calls = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "attr", None) == "_op"
    ]  # fmt: skip
    used = set()
    for call in calls:
        spec = SPECS[f"bole::{call.func.attr}"]
        used.add(spec.plugin_id)
        assert len(call.args) == len(spec.inputs), spec.plugin_id
        assert [kw.arg for kw in call.keywords] == [name for name, _ in spec.attrs], spec.plugin_id
    assert used == set(SPECS) - {"bole::gdn_commit"}  # the commit stays in the runtime


def tensorrt_plugin():
    """The real tensorrt.plugin module (full TensorRT), else a skip with the reason."""
    try:
        return importlib.import_module("tensorrt.plugin")
    except ImportError as e:
        pytest.skip(f"tensorrt.plugin is not importable ({e}); install full TensorRT >= 10.9")
    except AttributeError as e:  # the lean runtime's bindings under the `tensorrt` name
        pytest.skip(f"tensorrt.plugin does not import on this TensorRT runtime ({e})")


def test_plugins_register_with_tensorrt():
    trtp = tensorrt_plugin()
    sys.path.insert(0, str(ROOT))
    importlib.import_module("plugins.bole_plugins")
    for plugin in SPECS:
        namespace, name = plugin.split("::")
        assert hasattr(getattr(trtp.op, namespace), name)


def test_require_tensorrt_names_the_missing_package():
    sys.path.insert(0, str(ROOT))
    from plugins.network import require_tensorrt

    try:
        import tensorrt

        if hasattr(tensorrt, "Builder"):
            pytest.skip("full TensorRT is installed here")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"full TensorRT Python package `tensorrt`.*pip install"):
        require_tensorrt()
    with pytest.raises(RuntimeError, match=r"full TensorRT Python package `tensorrt`.*pip install"):
        importlib.import_module("plugins.bole_plugins")  # was a bare ModuleNotFoundError


def fake_tensorrt(monkeypatch, version, **plugin_api):
    """A ``tensorrt`` module with a Builder and a ``tensorrt.plugin`` holding ``plugin_api``, in place of
    whatever is installed, for as long as the test runs."""
    trt = types.ModuleType("tensorrt")
    trt.__version__, trt.Builder = version, object
    trt.plugin = types.ModuleType("tensorrt.plugin")
    for name, value in plugin_api.items():
        setattr(trt.plugin, name, value)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trt.plugin)
    return trt


def test_require_tensorrt_refuses_a_tensorrt_without_aot_plugins(monkeypatch):
    """TensorRT 10.8's tensorrt.plugin registers JIT plugins only: aot_impl (and add_plugin's aot=)
    came in 10.9, so the build says so instead of an AttributeError deep in bole_plugins' import."""
    sys.path.insert(0, str(ROOT))
    from plugins.network import require_tensorrt

    fake_tensorrt(monkeypatch, "10.8.0.43", register=None, impl=None, autotune=None)
    with pytest.raises(RuntimeError, match=r"10\.8\.0\.43 lacks tensorrt\.plugin\.aot_impl.*>= 10\.9"):
        require_tensorrt()
    trt = fake_tensorrt(monkeypatch, "10.9.0.34", register=None, autotune=None, aot_impl=None)
    assert require_tensorrt() is trt


def test_the_network_registers_the_plugins_it_adds(monkeypatch):
    """build_engine.py --tensorrt imports plugins.network only: the network's trtp.op.bole must not depend
    on someone having imported plugins.bole_plugins first (tensorrt.plugin's op namespaces exist only for
    what @trtp.register defined; a missing one raises AttributeError). A stand-in tensorrt.plugin whose
    register defines op.<namespace>.<name>, as the real one does."""
    sys.path.insert(0, str(ROOT))
    from plugins.network import VerifyNetwork

    op = types.SimpleNamespace()

    def register(plugin_id):
        namespace, name = plugin_id.split("::")

        def define(fn):
            setattr(op.__dict__.setdefault(namespace, types.SimpleNamespace()), name, fn)
            return fn

        return define

    def keep(plugin_id):
        return lambda fn: fn

    trt = fake_tensorrt(
        monkeypatch, "10.9.0.34", op=op, register=register, autotune=keep, aot_impl=keep,
        TensorDesc=object, AutoTuneCombination=object, KernelLaunchParams=object, SymIntExprs=object,
    )  # fmt: skip
    trt.float32, trt.bfloat16, trt.float16, trt.int64 = "f32", "bf16", "f16", "i64"
    monkeypatch.delitem(sys.modules, "plugins.bole_plugins", raising=False)
    try:
        bole = VerifyNetwork._op(None)
        for plugin in SPECS:
            assert hasattr(bole, plugin.split("::")[1])
    finally:  # the stand-in's registration must not outlive the test
        sys.modules.pop("plugins.bole_plugins", None)


class ShapeOnly:
    """Just enough of INetworkDefinition.add_shuffle for shapes, as IShuffleLayer documents it: first
    transpose, then the reshape (0 copies the input dimension of the same index), then the
    second transpose; dims are ints or names of dynamic sizes (no -1 here)."""

    class Tensor:
        def __init__(self, shape):
            self.shape = tuple(shape)

    class Shuffle:
        def __init__(self, t):
            self.input, self.first_transpose, self.reshape_dims, self.second_transpose = t, None, None, None

        def get_output(self, index):
            shape = self.input.shape
            if self.first_transpose is not None:
                shape = tuple(shape[i] for i in self.first_transpose)
            if self.reshape_dims is not None:
                if any(d == 0 and i >= len(shape) for i, d in enumerate(self.reshape_dims)):
                    raise ValueError(f"reshape {self.reshape_dims}: a 0 past the input's rank {len(shape)}")
                shape = tuple(shape[i] if d == 0 else d for i, d in enumerate(self.reshape_dims))
            if self.second_transpose is not None:
                shape = tuple(shape[i] for i in self.second_transpose)
            return ShapeOnly.Tensor(shape)

    def add_shuffle(self, t):
        return self.Shuffle(t)


def test_the_attention_bias_gains_a_leading_axis():
    """The attention's [N, M+N] bias is added to [heads, N, M+N] scores (TensorRT's elementwise layers
    broadcast equal ranks only). It was reshaped with (1, 0, 0), whose 0s copy the input dimensions of the
    same index: [1, M+N, (none)], not [1, N, M+N]."""
    sys.path.insert(0, str(ROOT))
    from plugins.network import VerifyNetwork

    net = VerifyNetwork.__new__(VerifyNetwork)
    net.net = ShapeOnly()
    bias = ShapeOnly.Tensor(("N", "M+N"))
    assert net.unsqueeze0(bias).shape == (1, "N", "M+N")
    assert net.reshape(ShapeOnly.Tensor(("N", 64)), (0, 1, 64)).shape == ("N", 1, 64)  # the RoPE tables
    with pytest.raises(ValueError, match="past the input's rank"):
        net.reshape(bias, (1, 0, 0))
    source = (ROOT / "plugins" / "network.py").read_text()
    assert "self.unsqueeze0(bias.get_output(0))" in source


def test_the_plugins_arch_is_checked_against_the_build_device(monkeypatch):
    """Without TensorRT, so that a build is told the device to use before the package to install; a CPU
    build had been told to set BOLE_PLUGIN_ARCH=cpu, which then failed as an int() deep in the import."""
    sys.path.insert(0, str(ROOT))
    from plugins.network import check_plugin_arch

    monkeypatch.delenv("BOLE_PLUGIN_ARCH", raising=False)
    check_plugin_arch("sm_90")
    with pytest.raises(RuntimeError, match=r"not on cpu: --device cuda"):
        check_plugin_arch("cpu")
    with pytest.raises(RuntimeError, match=r"compile for sm_90 .* set BOLE_PLUGIN_ARCH=100"):
        check_plugin_arch("sm_100")
    monkeypatch.setenv("BOLE_PLUGIN_ARCH", "sm_100")
    check_plugin_arch("sm_100")
    for value in ("cpu", "9.0", ""):
        monkeypatch.setenv("BOLE_PLUGIN_ARCH", value)
        with pytest.raises(RuntimeError, match=r"BOLE_PLUGIN_ARCH=.*: set it to a compute capability"):
            check_plugin_arch("sm_90")


def test_build_engine_tensorrt_flag_fails_at_once_without_tensorrt(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "build_scripts" / "build_engine.py"),
            "--tensorrt",
            "--output",
            str(tmp_path / "e"),
        ],
        capture_output=True,
        text=True,
    )
    if run.returncode == 0:
        assert json.loads(run.stdout.splitlines()[-1])["tensorrt_plan"]  # full TensorRT present
        return
    assert run.returncode == 2 and not (tmp_path / "e").exists()
    if torch.cuda.is_available():
        assert "`tensorrt`" in run.stderr and "tensorrt-lean" in run.stderr
    else:  # the device first: a plan is built on the GPU that runs it
        assert "not on cpu: --device cuda" in run.stderr
