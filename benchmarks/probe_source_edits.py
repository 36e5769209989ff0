"""The verify's kernels with one textual edit each, timed beside the kept kernels in one process.

    python benchmarks/probe_source_edits.py --out DIR    # H200, about two minutes
    python benchmarks/probe_source_edits.py --depth 9 --batches 1,16 --variants solve_unrolled

Each variant is a list of ``(file, old, new)`` replacements applied to copies of the explicit-inverse
kernel modules (``_inverse_factors.py``, ``gdn_tree_verify_inverse.py``), which are written to a
temporary folder and imported under their own names: the variant runs the launcher's default plan at
each point with its own kernels, the kept package runs the same plan with the committed ones. No kernel
code is copied here, only the edit, so the probe always measures an edit of today's kernels. Every
variant is first checked against the float64 serial recurrence (relative RMS of o and u under 1e-2 on
bf16 inputs; one that fails is not timed). CUDA-graph replays, L2 flushed, inputs rotating, three
interleaved rounds. Writes ``<out>/probe_source_edits_<device>.json``.

Variants that apply to today's kernels (benchmarks/EXPERIMENTS.md, 2026-12-05, has what each measured):

- ``solve_unrolled``: the factor kernel's back substitution unrolled to the padded depth (``DP - 1``
  steps whose loads all go out at once) instead of a loop to the tree's depth (``d - 1`` steps, one round
  trip each). Kept at a9d7ff7 on depth-8 trees, reverted when depth 9 (the engine's, padded to 16) read
  2-4% slower with it (``--depth 9``).

- ``paths_first``: the factor kernel loads K and Q after the paths and the ancestors' gates (whose
  loads wait for the paths), so that the gates' round trip overlaps K's and Q's instead of following
  them.
- ``state_evict_first`` / ``state_cg``: the value-tile kernel's state loads (read once) marked to leave
  the L2 first, or to bypass the L1, so that K, Q and V, read by four tiles each, stay cached.
- ``gathers_after``: the value-tile kernel gathers its dense ``W'`` and ``C'`` tiles after the state
  products instead of before them, so that those two ``[64, 64]`` fp32 tiles (64 registers a thread at
  4 warps) are not live across the products (capped at 128 registers, the kept kernel spills 40 bytes).

Kept from its first run, so no longer a variant here: each path read without its depth first (a9d7ff7).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import _bench_util as U
import torch

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv
from trtllm_bole.kernels.gdn_tree_verify import default_plan
from trtllm_bole.testing import topk_parents

KERNELS = Path(inv.__file__).resolve().parent
FACTORS, VERIFY = "_inverse_factors.py", "gdn_tree_verify_inverse.py"
POINTS = (("qwen3.5-9b", 32, 1), ("qwen3.5-9b", 32, 4), ("qwen3.5-9b", 32, 8), ("qwen3.5-9b", 32, 16),
          ("qwen3.5-9b", 32, 32), ("qwen3.5-27b", 48, 16))  # fmt: skip
ROUNDS = 3
STATE_LOAD = "s_c = tl.load(s_req + ((kc + o_k)[:, None] * DV + o_v[None, :])"  # _state_dots' own


def _state_hint(hint: str) -> list[tuple[str, str, str]]:
    return [(VERIFY, STATE_LOAD + ")\n        ks", STATE_LOAD + f", {hint})\n        ks")]


KQ_LOADS = """    k_t = _operand(_rows(k + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d), UPCAST)
    q_t = _operand(_rows(q + (bos * H + i_h) * DK, o_t, m_t, H * DK, o_d), UPCAST)
"""
AFTER_GATES = "RAW_GATES)  # fmt: skip\n    lp = tl.sum(g_p, axis=0)\n"
PATHS_FIRST = [(FACTORS, KQ_LOADS, ""), (FACTORS, AFTER_GATES, AFTER_GATES + KQ_LOADS)]
GATHERS = """            w = _factor_tile(w_req, o_t, dep_t, d, anc, BT)
            c_t = _factor_tile(c_req, o_t, dep_t, d, anc, BT)
"""
C_AFTER = "            if PHASE == 3:  # C' formed after the state products"
GATHERS_AFTER = [
    (VERIFY, GATHERS, ""),
    (
        VERIFY,
        C_AFTER,
        "            if PHASE == 2:\n" + GATHERS.replace("            ", "                ") + C_AFTER,
    ),
]
ROLLED = "for i in range(0, d - 1):\n        col = d - 2 - i"
SOLVE_UNROLLED = [(FACTORS, ROLLED, "for i in tl.static_range(0, DP - 1):\n        col = DP - 2 - i")]
VARIANTS = {
    "solve_unrolled": SOLVE_UNROLLED,
    "paths_first": PATHS_FIRST,
    "state_evict_first": _state_hint('eviction_policy="evict_first"'),
    "state_cg": _state_hint('cache_modifier=".cg"'),
    "gathers_after": GATHERS_AFTER,
}


def edited_module(name: str, edits: list[tuple[str, str, str]], folder: Path):
    """The explicit-inverse module with ``edits`` applied to copies of its two files, imported as
    ``<name>_verify`` (its factor helpers from ``<name>_factors``). An edit that matches nothing, or more
    than once, is refused: the probe would time the kept kernel under another name."""
    sources = {f: (KERNELS / f).read_text() for f in (FACTORS, VERIFY)}
    # The copy of the verify module imports the edited factor helpers, checked like every edit: were the
    # import not found, the variant would run the package's helpers and time the kept kernel.
    relink = (VERIFY, "from trtllm_bole.kernels._inverse_factors import", f"from {name}_factors import")
    for file, old, new in [*edits, relink]:
        if sources[file].count(old) != 1:
            raise ValueError(f"{name}: {old!r} occurs {sources[file].count(old)} times in {file}, not once")
        sources[file] = sources[file].replace(old, new)
    modules = {}
    for file, suffix in ((FACTORS, "factors"), (VERIFY, "verify")):
        path = folder / f"{name}_{suffix}.py"  # triton reads a kernel's source from its file
        path.write_text(sources[file])
        spec = importlib.util.spec_from_file_location(f"{name}_{suffix}", path)
        modules[suffix] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = modules[suffix]
        spec.loader.exec_module(modules[suffix])
    return modules["verify"]


def _choices(allowed: list, convert=str):
    """An argparse type: a comma-separated list of ``allowed`` values, or its error."""

    def parse(text: str) -> list:
        try:
            values = [convert(v) for v in text.split(",")]
        except ValueError:
            values = [text]
        if not set(values) <= set(allowed):
            raise argparse.ArgumentTypeError(f"expected some of {allowed}, comma-separated; got {text!r}")
        return values

    return parse


def _options(parser: argparse.ArgumentParser) -> None:
    batches = sorted({p[2] for p in POINTS})
    parser.add_argument("--depth", type=int, choices=range(1, 17), default=8, metavar="1-16",
                        help="the top-4 trees' depth (64 nodes each)")  # fmt: skip
    parser.add_argument("--batches", type=_choices(batches, int), default=batches,
                        help="the points of these batch sizes only (comma-separated)")  # fmt: skip
    parser.add_argument("--variants", type=_choices(list(VARIANTS)), default=list(VARIANTS),
                        help="these variants only (comma-separated)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_source_edits.py", argv, _options)
    if start is None:
        return 2
    args, measure, gen = start
    folder = Path(tempfile.mkdtemp(prefix="bole_edits_"))
    sys.path.insert(0, str(folder))
    chosen, depth = args.variants, args.depth
    modules = {"kept": inv} | {name: edited_module(name, VARIANTS[name], folder) for name in chosen}
    rows, failed = [], False
    for model, hv, batch in [p for p in POINTS if p[2] in args.batches]:
        trees = [topk_parents(64, 4, depth)] * batch
        sets = U.rotations(
            lambda trees=trees, hv=hv: U.make_inputs(
                U.tree_of(trees, "cuda"), U.H, hv, U.DK, U.DV, torch.bfloat16, gen
            )
        )
        cfg, precision = default_plan(64 * batch, batch, hv, U.DK, U.DV, torch.bfloat16, torch.bfloat16)
        exact = U.exact_outputs(sets[0])
        row = {"model": model, "hv": hv, "batch": batch, "config": f"{cfg} {precision}"}
        rows.append(row)
        runs = {
            name: (
                [module.inverse_launch_args(x.call(precision), cfg) for x in sets],
                U.path_launcher(module, cfg, hv, batch),
            )
            for name, module in modules.items()
        }
        failed |= len(U.checked_and_timed(runs, exact, row, measure, ROUNDS)) < len(runs)
        print(f"{model} B={batch}: " + ", ".join(f"{n} {min(t):.1f}" for n, t in row["verify_us"].items()))
    variants = {name: VARIANTS[name] for name in chosen}
    meta = U.run_meta(tree={"size": 64, "top_k": 4, "depth": depth}, variants=variants, rounds=ROUNDS)
    path = U.write_result(args.out, U.result_name("probe_source_edits"), {"meta": meta, "rows": rows})
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
