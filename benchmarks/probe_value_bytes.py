"""What the value-tile kernel waits for: its inputs' traffic, its stores, or its own on-chip chain.

    python benchmarks/probe_value_bytes.py --out DIR    # H200, about 30 s
    python benchmarks/probe_value_bytes.py --plot-only results/probe_value_bytes_h200.json   # any machine
    ncu ... python benchmarks/probe_value_bytes.py --launch all   # one variant at 9B batch 16, for a profiler

The verify's value-tile kernel (the launcher's default at batch 8-32: two launches, tiles of 64, four
warps, 128 registers) is timed alone, on factors formed once by the factor kernel, beside variants of
itself whose source is edited in one place each:

- ``kq``, ``state``, ``v``: every program reads that input (K and Q; the state tile; V) at one address,
  so after the first program it comes from the L1 or the L2 and its traffic is gone;
- ``stores``: U and O are stored under a mask that is false at run time (computed, not written);
- ``factors``: the dense W' and C' tiles are a constant on the ancestor pattern instead of gathered
  from the compact factors (no gather, no transpose);
- their unions, down to ``all+factors``: no memory traffic and no gathers, only the state's
  conversion, the four tensor-core products and the elementwise work between them.

The edited variants compute wrong outputs by design (a time only); the unedited copy is checked against
the float64 serial recurrence first (relative RMS of o under 1e-2) and nothing is timed if it fails.
CUDA-graph replays with the L2 flushed (``_bench_util.graph_timer``), inputs rotating, two rounds.
Qwen3.5-9B GDN heads at batch 8, 16 and 32, 27B at 16; top-4 trees of 64 nodes, depth 8, bf16 q/k/v,
fp32 state. Writes ``<out>/probe_value_bytes_<device>.json`` and a PNG of each variant's time as a share of
the kept kernel's. Diagnostic only: no speed-up is reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.testing import topk_parents

CONFIG = inv.InverseConfig(64, 64, 64, 4, 2, 8, 128)
POINTS = (("qwen3.5-9b", 32, 8), ("qwen3.5-9b", 32, 16), ("qwen3.5-9b", 32, 32), ("qwen3.5-27b", 48, 16))
KERNEL = "def _gdn_tree_verify_inverse_kernel("
DEAD = "mask=m[:, None] & (hv < 0))"  # false at run time: the compiler keeps what it would store
EDITS = {
    "kq": (
        ("q_req = q + (bos * H + i_h) * DK", "q_req = q + i_h * 0"),
        ("k_req = k + (bos * H + i_h) * DK", "k_req = k + i_h * 0"),
    ),
    "state": (("s_req = state + (slot * hv + i_hv) * (DK * DV)", "s_req = state + slot * 0"),),
    "v": (("v_req = v + (bos * hv + i_hv) * DV", "v_req = v + bos * 0"),),
    "stores": (
        ("tl.store(u_req + out, u_t, mask=m[:, None])", f"tl.store(u_req + out, u_t, {DEAD}"),
        (
            "tl.store(o_req + out, o_out.to(o_req.dtype.element_ty), mask=m[:, None])",
            f"tl.store(o_req + out, o_out.to(o_req.dtype.element_ty), {DEAD}",
        ),
    ),
    "factors": (
        ("w = _factor_tile(w_req, o_t, dep_t, d, anc, BT)", "w = tl.where(anc, 0.5, 0.0)"),
        ("c_t = _factor_tile(c_req, o_t, dep_t, d, anc, BT)", "c_t = tl.where(anc, 0.25, 0.0)"),
    ),
}
VARIANTS = {
    "base": (),
    **{name: (name,) for name in EDITS},
    "kq+state": ("kq", "state"),
    "kq+state+v": ("kq", "state", "v"),
    "all": ("kq", "state", "v", "stores"),
    "all+factors": ("kq", "state", "v", "stores", "factors"),
}


def edited_source(edits: tuple[str, ...]) -> str:
    """The kernels' module with ``edits`` applied: inside the value-tile kernel where the line is there
    (the one-launch kernel repeats some of them), else in the helper that holds it; each exactly once."""
    source = Path(inv.__file__).read_text()
    start = source.index(KERNEL)
    end = source.index("@triton.jit", start)
    parts = [source[:start], source[start:end], source[end:]]
    for old, new in (pair for name in edits for pair in EDITS[name]):
        where = 1 if old in parts[1] else 0
        if parts[where].count(old) != 1:
            raise RuntimeError(f"the edit {old!r} no longer matches the kernel's source once")
        parts[where] = parts[where].replace(old, new)
    return "".join(parts)


def load_variant(name: str, edits: tuple[str, ...], folder: Path):
    path = folder / f"value_variant_{name.replace('+', '_')}.py"
    path.write_text(edited_source(edits))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # triton reads the kernel's source back through its module
    spec.loader.exec_module(module)
    return module


def plot(data: dict, png: Path) -> None:
    """Each variant's best time as a share of the kept kernel's, one bar per point (no PNG without
    matplotlib: redraw with ``--plot-only`` where it is installed)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib missing: no PNG (run --plot-only <json> where it is installed)")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in data["rows"] if row["value_us"]]
    names = list(VARIANTS)[::-1]
    fig, ax = plt.subplots(figsize=(9, 6))
    height = 0.8 / len(rows)
    for i, row in enumerate(rows):
        kept = min(row["value_us"]["base"])
        shares = [100 * min(row["value_us"][n]) / kept for n in names]
        label = f"{row['model']} batch {row['batch']} (kept {kept:.1f} µs)"
        ax.barh([y + i * height for y in range(len(names))], shares, height, label=label)
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(names))], names)
    ax.axvline(100, color="grey", lw=0.8)
    ax.set_xlim(0, 140)
    ax.set_xlabel("% of the kept value-tile kernel's time (CUDA graphs, L2 flushed)")
    ax.set_title("What the value-tile kernel waits for: inputs read at one address, stores dropped")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rep-ms", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--launch", choices=VARIANTS, help="only launch this variant (9B, batch 16) three times")
    ap.add_argument("--plot-only", type=Path, metavar="JSON", help="redraw the PNG of a committed result")
    args = ap.parse_args(argv)
    if args.plot_only:
        plot(json.loads(args.plot_only.read_text()), args.plot_only.with_suffix(".png"))
        return 0
    if not torch.cuda.is_available():
        print("probe_value_bytes.py times GPU kernels: it needs CUDA", file=sys.stderr)
        return 2

    measure = U.graph_timer(args.rep_ms)
    gen = torch.Generator(device="cuda").manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="probe_value_bytes_"))
    modules = {name: load_variant(name, edits, folder) for name, edits in VARIANTS.items()}
    rows = []
    for model, hv, batch in POINTS[1:2] if args.launch else POINTS:
        trees = [topk_parents(64, 4, 8)] * batch
        sets = U.rotations(
            lambda trees=trees, hv=hv: U.make_inputs(
                U.tree_of(trees, "cuda"), U.H, hv, U.DK, U.DV, torch.bfloat16, gen
            )
        )
        prepared = []  # (outputs, kernel arguments, constants) of each input set, its factors formed
        for x in sets:
            outputs, kernel_args, consts = inv.inverse_launch_args(x.call("bf16"), CONFIG)
            kernel, grid, constexprs, options = inv.phase_launch(1, CONFIG, consts, hv, U.DV, batch)
            kernel[grid](*kernel_args, **constexprs, **options)
            prepared.append((outputs, kernel_args, consts))

        def value_tiles(p, module, hv=hv, batch=batch):
            _, kernel_args, consts = p
            kernel, grid, constexprs, options = module.phase_launch(2, CONFIG, consts, hv, U.DV, batch)
            kernel[grid](*kernel_args, **constexprs, **options)

        if args.launch:
            for _ in range(3):
                value_tiles(prepared[0], modules[args.launch])
            torch.cuda.synchronize()
            return 0
        value_tiles(prepared[0], modules["base"])
        error = U.rel_rms(prepared[0][0][0], U.exact_outputs(sets[0])[0])
        row = {"model": model, "hv": hv, "batch": batch, "base_rel_rms_o": error, "value_us": {}}
        rows.append(row)
        if not U.passes([error], 1e-2):
            print(f"{model} B={batch}: the kept kernel's copy failed its check ({error:.2e}), not timed")
            continue
        for _ in range(args.rounds):
            for name, module in modules.items():
                us = measure(U.Rotating(prepared, lambda p, m=module: value_tiles(p, m)))
                row["value_us"].setdefault(name, []).append(us)
        print(f"{model} B={batch}: " + ", ".join(f"{n} {min(t):.1f}" for n, t in row["value_us"].items()))
    meta = U.run_meta(config=str(CONFIG), tree={"size": 64, "top_k": 4, "depth": 8}, variants=VARIANTS)
    data = {"meta": meta, "rows": rows}
    path = U.write_result(args.out, U.result_name("probe_value_bytes"), data)
    plot(data, path.with_suffix(".png"))
    print(f"wrote {path} and its PNG")
    return 1 if any(not U.passes([row["base_rel_rms_o"]], 1e-2) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
