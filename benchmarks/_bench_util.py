"""Timing, memory, inputs, results file and plot for benchmarks/bench_gdn_verify.py and its siblings.
Importing it puts the repository root on ``sys.path``: ``plugins/`` (check_aot's references) is no
installed package, and the scripts that read it run as ``python benchmarks/<script>.py``."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trtllm_bole.kernels._common import VerifyCall, slot_indices
from trtllm_bole.spec.calibration import device_name
from trtllm_bole.testing import forest
from trtllm_bole.tree import TreeBatch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

H, DK, DV = 16, 128, 128  # Qwen3.5 GDN key heads and head dims
MODELS = {"qwen3.5-9b": {"hv": 32, "gdn_layers": 24}, "qwen3.5-27b": {"hv": 48, "gdn_layers": 48}}
L2_BYTES = 50 * 2**20  # H200 L2; inputs rotate over at least 4x this


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def timer(cuda: bool, rep_ms: int) -> Callable[[Callable[[], Any]], float]:
    """Median time of ``fn`` in µs: triton's do_bench on CUDA (warmed up, L2 flushed between runs,
    CUDA events), wall clock on CPU (smoke runs in the interpreter, meaningless as speed)."""
    if cuda:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=max(2, rep_ms // 4), rep=rep_ms, return_mode="median") * 1e3

    def wall(fn: Callable[[], Any]) -> float:
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) * 1e6

    return wall


def graph_timer(rep_ms: int) -> Callable[[Callable[[], Any]], float]:
    """Median time of ``fn`` in µs, replayed from CUDA graphs (one per input set of a :class:`Rotating`)
    with triton's do_bench: the L2 is flushed before every replay as in :func:`timer`, but the host's
    launch overhead (Python launchers, argument checks) is out of the measured window, as in an engine
    that captures its verify step. Calls are warmed up (compiled, loaded) before capture. do_bench
    flushes by zeroing a 256 MB buffer, which leaves the L2 full of dirty lines that the timed kernels
    write back as they evict them: the conservative reading (H200, the verify at 9B batch 16: 49.3 µs
    against 45.4 after a flush that reads the buffer instead; benchmarks/EXPERIMENTS.md)."""
    from triton.testing import do_bench

    def measure(fn: Callable[[], Any]) -> float:
        calls = [lambda s=s: fn.fn(s) for s in fn.sets] if isinstance(fn, Rotating) else [fn]
        for call in calls:
            call()
        torch.cuda.synchronize()
        graphs = []
        for call in calls:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            graphs.append(graph)
        replay = Rotating(graphs, lambda g: g.replay())
        us = do_bench(replay, warmup=max(2, rep_ms // 4), rep=rep_ms, return_mode="median") * 1e3
        del graphs, replay
        return us

    return measure


def warm_graph_timer(replays: int = 200) -> Callable[[Callable[[], Any]], float]:
    """Mean time of ``fn`` in µs over back-to-back replays of one CUDA graph on one input set, the L2 not
    flushed: inputs that fit stay L2-resident. Against :func:`graph_timer` it sizes how much of a kernel's
    time is waiting on DRAM (a kernel that barely gains is bound by its own latency or issue rate)."""

    def measure(fn: Callable[[], Any]) -> float:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        del graph
        return start.elapsed_time(end) * 1e3 / replays

    return measure


def peak_bytes(fn: Callable[[], Any]) -> int | None:
    """Bytes allocated by one call above what was live before it (kept outputs included)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def copy_bandwidth(device: str, nbytes: int, rep_ms: int) -> dict:
    """Device-to-device copy: bytes read + bytes written per second (the roofline's ceiling). Always timed
    eagerly (:func:`timer`), whatever timer the kernels use: captured in a CUDA graph, torch's copy
    becomes a memcpy node that the copy engine runs, far below what kernels reach (H200: 2.76 against
    4.25 TB/s for the same 1 GB copy), which would overstate every fraction of the ceiling."""
    measure = timer(str(device).startswith("cuda"), rep_ms)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    us = measure(lambda: dst.copy_(src))
    return {"bytes": nbytes, "time_us": us, "bytes_per_s": 2 * nbytes / (us * 1e-6)}


@dataclass
class Inputs:
    """One GDN layer's verify inputs (serving layout): bf16 q/k/v, raw gates a, b (bf16) with A_log
    and dt_bias (fp32) and the gates they give (fp32 g, beta), fp32 committed state."""

    tree: TreeBatch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    a_log: torch.Tensor
    dt_bias: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor
    scale: float

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.v, self.a, self.b, self.state))

    def call(self, precision: str) -> VerifyCall:
        """The verify launchers' operands: raw gates applied on chip, request b in state row b."""
        slots = slot_indices(None, self.tree.num_requests, self.state.device)
        return VerifyCall(
            self.q,
            self.k,
            self.v,
            self.a,
            self.b,
            self.state,
            slots,
            self.tree,
            (self.a_log, self.dt_bias),
            self.scale,
            False,
            precision,
        )


def make_inputs(
    tree: TreeBatch, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype, gen: torch.Generator
) -> Inputs:
    n, device = tree.num_nodes, tree.parents.device

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    q = F.normalize(randn(n, h, dk), dim=-1).to(dtype)
    k = F.normalize(randn(n, h, dk), dim=-1).to(dtype)
    a, b = randn(n, hv).to(dtype), randn(n, hv).to(dtype)
    a_log = torch.log(torch.rand(hv, generator=gen, device=device) * 15.99 + 0.01)
    dt_bias = randn(hv) * 0.5 - 4.0
    g = -a_log.exp() * F.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    state = randn(tree.num_requests, hv, dk, dv) * 0.1
    v = randn(n, hv, dv).to(dtype)
    return Inputs(tree, q, k, v, a, b, a_log, dt_bias, g, beta, state, dk**-0.5)


def rotations(make: Callable[[], Inputs], budget_bytes: int = 4 * L2_BYTES, most: int = 8) -> list[Inputs]:
    first = make()
    count = max(1, min(most, math.ceil(budget_bytes / max(first.nbytes, 1))))
    return [first] + [make() for _ in range(count - 1)]


class Rotating:
    """Calls ``fn(inputs)`` on the next input set each time (defeats cache reuse between runs)."""

    def __init__(self, sets: list[Any], fn: Callable[[Any], Any]) -> None:
        self.sets, self.fn, self.i = sets, fn, 0

    def __call__(self) -> Any:
        self.i = (self.i + 1) % len(self.sets)
        return self.fn(self.sets[self.i])


def verify_floor_bytes(x: Inputs) -> int:
    """Minimum traffic of a verify: read S_pre, q, k, v and the gates once; write o, u, logP once."""
    n, hv, dv = x.v.shape
    reads = x.state.numel() * 4 + sum(t.numel() * t.element_size() for t in (x.q, x.k, x.v, x.a, x.b))
    writes = n * hv * (dv * x.v.element_size() + dv * 4 + 4)
    return reads + writes


def exact_outputs(x: Inputs) -> tuple[torch.Tensor, ...]:
    """float64 serial walk on exactly the kernel's (rounded) inputs, gates recomputed from the raw a, b:
    ``o``, every node's state, and the closed form's ``u`` and ``logP``."""
    from trtllm_bole.reference import gdn_tree

    g = -x.a_log.double().exp() * F.softplus(x.a.double() + x.dt_bias.double())
    beta = torch.sigmoid(x.b.double())
    args = (x.q.double(), x.k.double(), x.v.double(), g, beta, x.state.double(), x.tree)
    o, states = gdn_tree.serial_tree_recurrence(*args, scale=x.scale)
    _, u, log_p = gdn_tree.closed_form_tree_verify(*args, scale=x.scale)
    return o, states, u, log_p


def run_meta(device: str = "cuda", **extra: Any) -> dict:
    """Where and how a result was measured: the GPU (or ``cpu`` for a ``device`` "cpu" smoke run), the torch,
    triton and Python versions and the command line, then ``extra`` (the run's shapes, configs or peers)."""
    import platform
    import sys

    import triton

    return {
        "device": device_name(torch.device(device)),
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "command": " ".join(["python", *sys.argv]), **extra,
    }  # fmt: skip


DEVICES = ("cuda", "cpu")  # a script's --device: one GPU (the current one) or a CPU smoke run


def cuda_missing(script: str, device: str) -> bool:
    """Whether ``script`` was asked to time on CUDA where there is none (then it says so on stderr)."""
    if device != "cuda" or torch.cuda.is_available():
        return False
    print(f"{script} times on a GPU: it needs CUDA (or --device cpu for its checks alone)", file=sys.stderr)
    return True


def probe_start(
    doc: str, script: str, argv: list[str] | None, add_args: Callable[[Any], None] | None = None
) -> tuple[Any, Callable, torch.Generator] | None:
    """A GPU probe's start: its command line (``--out``, default ``benchmarks/results``, and what
    ``add_args(parser)`` adds), a graph timer (:func:`graph_timer`, 50 ms) and a CUDA generator seeded 0;
    None where there is no CUDA (said on stderr)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    if add_args is not None:
        add_args(ap)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{script} times on a GPU: it needs CUDA", file=sys.stderr)
        return None
    return args, graph_timer(50), torch.Generator(device="cuda").manual_seed(0)


def device_tag(device: str) -> str:
    """A result file's device part: ``h200``, ``cpu``, else the GPU's name (``nvidia_h100_80gb_hbm3``), so
    that no result is ever named for another device than the one that measured it."""
    return "h200" if "H200" in device else "cpu" if device == "cpu" else device.replace(" ", "_").lower()


def tagged_stem(stem: str, device: str, tag: str | None) -> str:
    """``<stem>_<device tag>``, then ``_<tag>`` where a run has a ``--tag``: the tag names the run, never the
    device (an H100's run tagged ``h200_repeats`` once read as the H200's)."""
    return f"{stem}_{device_tag(device)}" + (f"_{tag}" if tag else "")


def check_tag(parser, tag: str | None) -> None:
    """A ``--tag`` is part of a file name: no folder separator."""
    if tag is not None and "/" in tag:
        parser.error(f"--tag {tag}: a file name suffix, without '/'")


def result_name(stem: str, ext: str = "json") -> str:
    """``<stem>_<device tag>.<ext>`` for this process's GPU: a result named by the device that measured it."""
    return f"{tagged_stem(stem, torch.cuda.get_device_name(), None)}.{ext}"


def write_result(out: str | Path, name: str, data: dict) -> Path:
    """``data`` as indented JSON in ``<out>/<name>`` (the folder made where missing); returns the path."""
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error of ``out`` against ``ref``; NaN where there is nothing to compare (an empty
    comparison was 0, which passes every tolerance)."""
    if ref.numel() == 0:
        return math.nan
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def path_launcher(module: Any, cfg: Any, hv: int, batch: int) -> Callable[[Any], None]:
    """``fn(prepared)``: every kernel of ``cfg``'s explicit-inverse path from ``module`` (the package's
    ``gdn_tree_verify_inverse`` or an edited copy of it) on ``module.inverse_launch_args``' result."""

    def launch(prepared: Any) -> None:
        _, kernel_args, consts = prepared
        for phase in module.phases(cfg):
            kernel, grid, constexprs, options = module.phase_launch(
                phase, cfg, consts, hv, consts["DV"], batch
            )
            kernel[grid](*kernel_args, **constexprs, **options)

    return launch


def checked_and_timed(
    runs: dict[str, tuple[list, Callable[[Any], Any]]],
    exact: tuple[torch.Tensor, ...],
    row: dict,
    measure: Callable[[Callable[[], Any]], float],
    rounds: int,
) -> dict[str, Rotating]:
    """A probe's variants at one point: each run (its prepared input sets, whose first item is the outputs
    ``(o, u, …)``, and its launcher) is checked on its first set against the float64 ``exact`` outputs of
    :func:`exact_outputs` (NaN-filled first; o and u within 1e-2 relative RMS into ``row["rel_rms"]``), and
    those that pass are timed in ``rounds`` interleaved rounds into ``row["verify_us"]``; one that fails is
    said on stdout and not timed. Returns the timed ones (those missing failed)."""
    timed = {}
    for name, (prepared, launch) in runs.items():
        outputs = prepared[0][0]
        for t in outputs:
            t.fill_(float("nan"))
        launch(prepared[0])
        errors = [rel_rms(outputs[0], exact[0]), rel_rms(outputs[1], exact[2])]
        row.setdefault("rel_rms", {})[name] = errors
        if passes(errors, 1e-2):
            timed[name] = Rotating(prepared, launch)
        else:
            where = f"{row.get('model')} B={row.get('batch')} {name}"
            print(f"{where}: failed its check (o {errors[0]:.2e}, u {errors[1]:.2e})")
    for _ in range(rounds):
        for name, fn in timed.items():
            row.setdefault("verify_us", {}).setdefault(name, []).append(measure(fn))
    return timed


def passes(errors: Iterable[float], tol: float) -> bool:
    """Every error is a number within ``tol``: a NaN fails (``max`` and ``>`` both let one through)."""
    return all(e <= tol for e in errors)


def tree_of(trees: list[list[int]], device: str) -> TreeBatch:
    return forest(trees, device=device, max_depth=max(64, *(len(t) for t in trees)))


class Results:
    """The JSON results file, rewritten after every section so a run cut short still leaves data."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path, self.data = path, {"meta": meta, "errors": [], "skipped": []}

    def __getitem__(self, key: str) -> Any:
        return self.data.setdefault(key, [])

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def error(self, where: str, exc: BaseException) -> None:
        self.data["errors"].append({"where": where, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        print(f"  ! {where}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)

    def skip(self, where: str, why: str) -> None:
        self.data["skipped"].append({"where": where, "why": why})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        tmp.replace(self.path)


def _line(ax: Any, points: list[tuple], style: str, label: str) -> None:
    points = [(x, y) for x, y in points if y]
    if points:
        ax.plot(*zip(*points, strict=True), style, label=label)


SPEEDUP_LINES = (
    ("speedup_sglang", "vs SGLang tree"),
    ("speedup_sglang_old", "blocked kernel vs SGLang"),
    ("speedup_serial", "vs tree-serial"),
)
TIME_LINES = (
    ("bole_us", "Bole"),
    ("bole_old_us", "Bole blocked kernel"),
    ("sglang_us", "SGLang"),
    ("serial_total_us", "tree-serial"),
)


def plot(data: dict, png: Path) -> str:
    """Four panels: speed-up over SGLang vs batch (T=64), time vs tree size (batch 16), the depth sweep,
    and the fraction of the memory floor reached. Returns a note (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no PNG (run --plot-only <json> where it is installed)"
    grid = [p for p in data.get("grid", []) if p.get("bole_us")]
    size = 64 if any(p["tree_size"] == 64 for p in grid) else max((p["tree_size"] for p in grid), default=0)
    batch = max((p["batch"] for p in grid if p["batch"] <= 16), default=0)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for model, style in zip(dict.fromkeys(p["model"] for p in grid), ("-o", "--s", ":^"), strict=False):
        rows = sorted(
            (p for p in grid if p["model"] == model and p["tree_size"] == size), key=lambda p: p["batch"]
        )
        for key, label in SPEEDUP_LINES:
            _line(axes[0, 0], [(p["batch"], p.get(key)) for p in rows], style, f"{model} {label}")
        _line(axes[1, 1], [(p["batch"], 100 * p.get("floor_fraction", 0)) for p in rows], style, model)
        rows = sorted(
            (p for p in grid if p["model"] == model and p["batch"] == batch), key=lambda p: p["tree_size"]
        )
        for key, label in TIME_LINES:
            _line(axes[0, 1], [(p["tree_size"], p.get(key)) for p in rows], style, f"{model} {label}")
    depth = data.get("depth", [])
    for b in sorted({p["batch"] for p in depth}):
        rows = sorted((p for p in depth if p["batch"] == b), key=lambda p: p["depth"])
        for key, label in (("bole_us", "Bole"), ("sglang_us", "SGLang"), ("serial_total_us", "tree-serial")):
            _line(axes[1, 0], [(p["depth"], p.get(key)) for p in rows], "-o", f"B={b} {label}")
    titles = (
        (f"speed-up of the verify core, T={size} depth 8", "batch", "x", "log"),
        (f"per-layer verify time, batch {batch}", "tree size T", "µs", "log"),
        ("depth sweep (first model)", "tree depth", "µs", "log"),
        (f"Bole: memory floor / time, % of copy bandwidth, T={size}", "batch", "%", "linear"),
    )
    for ax, (title, xlabel, ylabel, yscale) in zip(axes.flat, titles, strict=True):
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, yscale=yscale)
        ax.set_xscale("log", base=2) if xlabel != "tree depth" else None
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    meta = data.get("meta", {})
    versions = f"torch {meta.get('torch')}, triton {meta.get('triton')}"
    timing = "CUDA-graph replays" if meta.get("timing") == "graph" else "host launches"
    fig.suptitle(f"GDN tree verify on {meta.get('device', '?')} ({versions}; {timing}, L2 flushed)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return f"wrote {png}"
