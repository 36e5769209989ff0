"""GDN tree verification on the H200: Bole's kernels against the schemes engines run today.

    python benchmarks/bench_gdn_verify.py [--quick] [--budget-s 540] [--out benchmarks/results]
    python benchmarks/bench_gdn_verify.py --focus headline --budget-s 150 --out DIR   # ~2 min, see _focus.py
    python benchmarks/bench_gdn_verify.py --plot-only benchmarks/results/gdn_verify_h200.json
    python benchmarks/bench_gdn_verify.py --smoke     # tiny shapes in Triton's interpreter (CPU)

Schemes, all at Qwen3.5 GDN sizes (H=16, dk=dv=128; HV=32 for 9B, 48 for 27B), bf16 q/k/v, fp32 state:
- Bole: closed-form verify (trtllm_bole.kernels.gdn_tree_verify), gating fused on chip (raw a, b): the
  blocked kernel (VerifyConfig) and the explicit-inverse path (InverseConfig), given the largest
  request's node count as an engine would (SGLang's kernel is likewise told T);
- SGLang (0.5.10.post1 wheel): its tree verify kernel with retrieve_parent_token and the per-node
  intermediate-state buffer, gating fused on chip: the same gating work on both sides, L2-norm off on
  both (inputs are unit vectors);
- tree-serial: our serial per-node kernel writing a full state per node, plus the accepted-state copy;
- fla (fla-core wheel): fused_recurrent_gated_delta_rule on chains (it has no tree form).

Every kernel variant is first compiled in parallel worker processes (Triton's disk cache then serves
this process). Every kernel (each config, precision and compiled specialisation) is checked against the
float64 reference on fresh random inputs before it is timed; one that fails is never timed. Times are medians
of triton's do_bench (warm-up, L2 flushed between runs, CUDA events) over rotating input sets, launched
from the host (``--timing eager``, the full run's default) or replayed from CUDA graphs (``--timing
graph``, the focused run's default: the host's launch overhead, tens of µs of Python per call, is out of
the window, as in an engine that captures its verify step). Results
go to <out>/gdn_verify_<device>.json (``_focus.json`` for ``--focus``; rewritten after every section) and
its .png; <device> is ``h200`` on the H200, ``smoke`` in Triton's interpreter (``--smoke``), else the GPU's
name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import _bench_util as U
import _peers
import torch

OUT = Path(__file__).resolve().parent / "results"
FULL = {
    "batches": [1, 2, 4, 8, 16, 32], "sizes": [8, 16, 32, 64, 128, 256],
    "depths": [2, 3, 4, 6, 8, 10, 12, 14, 16], "chain_sizes": [8, 16, 32, 64],
    "commit_batches": [16, 1, 4, 32],  # the first one also checks every config
    "sweep": [(32, 16, 64), (32, 1, 64), (32, 16, 256), (32, 4, 16), (32, 32, 128)], "rep_ms": 40,
}  # fmt: skip
QUICK = {
    "batches": [1, 16], "sizes": [16, 64, 256], "depths": [2, 8, 16], "chain_sizes": [16, 64],
    "commit_batches": [16], "sweep": [(32, 16, 64), (32, 1, 64)], "rep_ms": 20,
}  # fmt: skip
SMOKE = {
    "batches": [1, 2], "sizes": [8, 20], "depths": [2, 4], "chain_sizes": [8], "commit_batches": [2],
    "sweep": [(4, 2, 20)], "rep_ms": 1,
}  # fmt: skip
TOL_EXACT, TOL_SERVING = 1e-4, 1e-2
TIMING_NOTES = {
    "eager": "Times: launches from the host, L2 flushed before each (triton do_bench); below ~100 us the "
    "host's launch overhead can leak into the window.",
    "graph": "Times: CUDA-graph replays (one graph per rotating input set), L2 flushed before each (triton "
    "do_bench), for every scheme alike; *_eager_us fields are host-launched times of the same call.",
}
NOTES = [
    "Bole and SGLang both apply Qwen3.5's gating on chip from raw a, b (same gating work); L2-norm is off "
    "on both (unit-norm inputs). tree-serial and fla take precomputed g, beta.",
    "SGLang's tree kernel takes equal-size trees with one root child (node 0): the top-k trees used here.",
    "fla's fused_recurrent has no tree form and returns no per-node states: chains only, output only.",
    "tree-serial total = its verify + the accepted-snapshot copy for that layer; per-node snapshots and "
    "SGLang's intermediate buffer are fp32 [N, HV, dk, dv] per layer.",
    "Verify configs with bv = dv form G, C and the solve once per (request, head); bv < dv recompute them "
    "per value tile in parallel programs: the sweep times both kinds.",
    "Floor bytes: read S_pre, q, k, v, a, b once; write o, u, logP once. floor_fraction = (floor bytes / "
    "time) / measured copy bandwidth (read + write bytes per second).",
    "Commit: one launch for all GDN layers and requests; bytes = read + write of every committed state.",
]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from trtllm_bole.kernels import gdn_commit, gdn_tree_verify, tree_conv1d
        from trtllm_bole.kernels.baselines import tree_serial

        self.verify_mod, self.commit_mod, self.conv_mod, self.serial_mod = (
            gdn_tree_verify, gdn_commit, tree_conv1d, tree_serial,
        )  # fmt: skip
        self.args = args
        self.cuda = torch.cuda.is_available() and not args.smoke
        self.device = "cuda" if self.cuda else "cpu"
        import _focus

        self.focus = _focus if args.focus else None
        self.plan = SMOKE if args.smoke else _focus.PLAN if args.focus else QUICK if args.quick else FULL
        self.h, self.dk, self.dv = (2, 32, 32) if args.smoke else (U.H, U.DK, U.DV)
        self.models = {"tiny": {"hv": 4, "gdn_layers": 3}} if args.smoke else U.MODELS
        self.timing = args.timing or ("graph" if args.focus else "eager")
        self.measure_eager = U.timer(self.cuda, self.plan["rep_ms"])
        self.measure = (
            U.graph_timer(self.plan["rep_ms"]) if self.cuda and self.timing == "graph" else self.measure_eager
        )
        self.budget = U.Budget(args.budget_s)
        self.gen = torch.Generator(device=self.device).manual_seed(args.seed)
        self.checked: dict[tuple, bool] = {}
        self.mem_cap = int(0.35 * torch.cuda.get_device_properties(0).total_memory) if self.cuda else 2**62
        import triton

        device = torch.cuda.get_device_name(0) if self.cuda else f"CPU interpreter ({platform.machine()})"
        # A focused run is named apart: it has no memory section, and it overwrote the full run's file.
        stem = Path(args.out) / f"gdn_verify_{result_tag(device)}{'_focus' if args.focus else ''}"
        self.png = stem.with_suffix(".png")
        self.r = U.Results(
            stem.with_suffix(".json"),
            {
                "device": device, "torch": torch.__version__, "triton": triton.__version__,
                "python": platform.python_version(), "command": " ".join(["python", *sys.argv]),
                "mode": "smoke" if args.smoke else f"focus {args.focus}" if args.focus else
                "quick" if args.quick else "full",
                "timing": self.timing,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "dims": {"H": self.h, "dk": self.dk, "dv": self.dv, "models": self.models},
                "notes": [*NOTES, TIMING_NOTES[self.timing]],
            },
        )  # fmt: skip
        self.configs = [c for c in gdn_tree_verify.CONFIGS if self.dk % c.bk == 0 and self.dv % c.bv == 0]
        if args.smoke:
            self.configs = [
                gdn_tree_verify.VerifyConfig(16, 16, 16, 1, 1),
                gdn_tree_verify.VerifyConfig(32, 32, 16),
            ]
        self.candidates: list[tuple] = []
        self.serial_best: dict[int, object] = {}
        if args.focus:  # tree-serial's winner at B = 1 and 32 in the first H200 run
            self.serial_best = {
                1: tree_serial.SERIAL_CONFIGS[0] if self.cuda else tree_serial.SerialConfig(16, 1)
            }
        self._check_inputs: dict[tuple, tuple] = {}

    # ----------------------------------------------------------------------------------------- #
    # Runners                                                                                   #
    # ----------------------------------------------------------------------------------------- #

    def bole(self, x: U.Inputs, cand: tuple, raw: bool = True):
        cfg, precision = cand
        gates = (x.a, x.b) if raw else (x.g, x.beta)
        return self.verify_mod.gdn_tree_verify(
            x.q, x.k, x.v, *gates, x.state, x.tree, scale=x.scale, precision=precision, config=cfg,
            raw_gates=(x.a_log, x.dt_bias) if raw else None,
        )  # fmt: skip

    def serial(self, x: U.Inputs, cfg):
        return self.serial_mod.gdn_tree_verify_serial(
            x.q, x.k, x.v, x.g, x.beta, x.state, x.tree, scale=x.scale, config=cfg
        )

    def inputs(self, trees: list[list[int]], hv: int, dtype: torch.dtype = torch.bfloat16) -> U.Inputs:
        return U.make_inputs(U.tree_of(trees, self.device), self.h, hv, self.dk, self.dv, dtype, self.gen)

    # ----------------------------------------------------------------------------------------- #
    # Checks (a failing kernel is never timed)                                                  #
    # ----------------------------------------------------------------------------------------- #

    def _check(self, key: tuple, what: str, run) -> bool:
        if key in self.checked:
            return self.checked[key]
        try:
            errors, tol = run()
            ok = U.passes(errors.values(), tol)
        except Exception as exc:
            self.r.error(f"check {what}", exc)
            errors, tol, ok = {}, None, False
        self.checked[key] = ok
        self.r["checks"].append({"what": what, "ok": ok, "tolerance": tol, **errors})
        print(f"  check {what}: {'ok' if ok else 'FAILED'} {errors}", flush=True)
        return ok

    def check_bole(self, cand: tuple, hv: int, depth: int, max_nodes: int | None = None) -> bool:
        """A request larger than the tile in the timed inputs: the check has one too (blocked code)."""
        cfg, precision = cand
        blocked = max_nodes is not None and max_nodes > cfg.bt
        from trtllm_bole.testing import chain_parents, topk_parents

        # A request of the timed size where it fits the tile (the tile full, as timed), else of 48 nodes.
        size = max_nodes if max_nodes is not None and not blocked else 48

        def run():
            key = (
                "serving",
                hv,
                depth,
                blocked,
                size,
            )  # one input set and truth per shape, for every candidate
            if key not in self._check_inputs:
                big = [topk_parents(100, 4, depth)] if blocked else []
                x = self.inputs([*big, topk_parents(size, 4, depth), chain_parents(depth), [-1]], hv)
                self._check_inputs[key] = (x, U.exact_outputs(x))
            x, (o, _, u, log_p) = self._check_inputs[key]
            o_k, u_k, lp_k = self.bole(x, cand)
            return {
                "o": U.rel_rms(o_k, o),
                "u": U.rel_rms(u_k, u),
                "log_p": U.rel_rms(lp_k, log_p),
            }, TOL_SERVING

        what = f"bole {cfg} {precision} HV={hv} d={depth}{' blocked' if blocked else ''}"
        return self._check(("bole", cfg, precision, hv, depth, blocked, size), what, run)

    def check_bole_exact(self, cfg, hv: int) -> bool:
        from trtllm_bole.testing import chain_parents, topk_parents

        def run():
            x = self.inputs([topk_parents(64, 4, 8), chain_parents(16)], hv, torch.float32)
            o, _, u, log_p = U.exact_outputs(x)
            o_k, u_k, lp_k = self.bole(x, (cfg, "ieee"))
            return {
                "o": U.rel_rms(o_k, o),
                "u": U.rel_rms(u_k, u),
                "log_p": U.rel_rms(lp_k, log_p),
            }, TOL_EXACT

        return self._check(("exact", cfg, hv), f"bole fp32-exact {cfg} HV={hv}", run)

    def check_serial(self, cfg, hv: int) -> bool:
        from trtllm_bole.testing import chain_parents, topk_parents

        def run():  # the verify, then the accepted-state copy timed with it (serial_total_us)
            x = self.inputs([topk_parents(40, 4, 8), chain_parents(9)], hv)
            o, states, _, _ = U.exact_outputs(x)
            o_k, snaps = self.serial(x, cfg)
            leaves = torch.tensor([17, 8], device=x.state.device)
            committed = x.state.clone()
            self.serial_mod.gdn_snapshot_commit(committed, snaps, x.tree, leaves)
            accepted = states[x.tree.accepted_nodes(leaves)]
            return {
                "o": U.rel_rms(o_k, o),
                "snapshots": U.rel_rms(snaps, states),
                "committed": U.rel_rms(committed, accepted),
            }, TOL_SERVING

        return self._check(("serial", cfg, hv), f"tree-serial {cfg} HV={hv}", run)

    def check_sglang(self, peer, hv: int, size: int) -> bool:
        from trtllm_bole.testing import topk_parents

        def run():
            x = self.inputs([topk_parents(size, 4, min(8, size))] * 2, hv)
            o, states, _, _ = U.exact_outputs(x)
            si = _peers.sglang_inputs(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state, x.tree, x.scale)
            buf = si.buffer()
            o_k = _peers.sglang_verify(peer, si, buf)[0]
            snaps = buf.view(x.tree.num_nodes, *buf.shape[2:]).transpose(-1, -2)
            return {"o": U.rel_rms(o_k, o), "states": U.rel_rms(snaps, states)}, TOL_SERVING

        pow2 = 1 << (size - 1).bit_length()
        return self._check(("sglang", hv, pow2), f"sglang tree verify HV={hv} T<={pow2}", run)

    def check_fla(self, peer, hv: int) -> bool:
        from trtllm_bole.testing import chain_parents

        def run():
            x = self.inputs([chain_parents(32)] * 2, hv)
            o, _, _, _ = U.exact_outputs(x)
            o_k = _peers.fla_chain(peer, x.q, x.k, x.v, x.g, x.beta, x.state, 2, x.scale)
            return {"o": U.rel_rms(o_k, o)}, TOL_SERVING

        return self._check(("fla", hv), f"fla fused_recurrent chains HV={hv}", run)

    # ----------------------------------------------------------------------------------------- #
    # Sections                                                                                  #
    # ----------------------------------------------------------------------------------------- #

    def section(self, name: str, fn, reserve_s: float = 20.0) -> None:
        if self.budget.left() < reserve_s:
            self.r.skip(name, f"time budget ({self.args.budget_s} s) spent")
            print(f"-- {name}: skipped (budget)", flush=True)
            return
        print(f"-- {name} (t={self.budget.elapsed():.0f}s)", flush=True)
        try:
            fn()
        except Exception as exc:
            self.r.error(name, exc)
        self.r.save()

    def run(self) -> int:
        from _sections import SECTIONS, summarize

        for name, fn in self.focus.SECTIONS if self.focus else SECTIONS:
            self.section(name, lambda fn=fn: fn(self))

        self.r["summary"] = summarize(self.r.data)
        self.r["meta"]["elapsed_s"] = round(self.budget.elapsed(), 1)
        self.r.save()
        print(U.plot(self.r.data, self.png), flush=True)
        print(json.dumps(self.r.data["summary"], indent=1), flush=True)
        failed = [c["what"] for c in self.r.data["checks"] if not c["ok"]]
        if failed or self.r.data["errors"]:  # nothing of theirs was timed, but the run is not whole
            errors = len(self.r.data["errors"])
            print(f"{len(failed)} checks failed, {errors} errors: exit 1", file=sys.stderr)
            return 1
        return 0


def result_tag(device: str) -> str:
    """Results are named by the device that measured them: ``h200``, ``smoke`` for the interpreter (so
    a smoke run never overwrites a GPU's results), else the GPU's name."""
    return "smoke" if device.startswith("CPU") else U.device_tag(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer points (a few minutes)")
    parser.add_argument(
        "--focus",
        choices=["headline"],
        help="the short pass of _focus.py: headline grid, T sweep, depth probe",
    )
    parser.add_argument(
        "--timing", choices=["eager", "graph"], help="default: graph with --focus, else eager"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU in Triton's interpreter")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting sections after this")
    parser.add_argument("--out", default=str(OUT), help="where the JSON and PNG go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warm", action="store_true", help="compile lazily instead of in parallel first")
    parser.add_argument(
        "--warm-workers", type=int, default=0, help="precompile processes (0: CPUs - 1, <= 16)"
    )
    parser.add_argument("--plot-only", metavar="JSON", help="render the PNG from an existing results file")
    args = parser.parse_args(argv)
    if args.plot_only:
        data = json.loads(Path(args.plot_only).read_text())
        print(U.plot(data, Path(args.plot_only).with_suffix(".png")))
        return 0
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
