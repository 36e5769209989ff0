"""Compile every kernel variant the benchmark launches, in parallel worker processes, before anything
is timed. Triton's on-disk cache then serves the main process: compiling some fifty variants one after
another would take minutes of the run's ten.

A task is a small tuple; the worker builds tiny inputs at the real dimensions (the compiled variant
depends on dtypes, constexprs and divisibility, not on sizes) and launches the kernel once.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

import _bench_util as U
import _peers
import torch

from trtllm_bole.testing import chain_parents, topk_parents

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the interpreter, for testing the tasks


def run_task(task: tuple) -> tuple[str, float, str | None]:
    t0 = time.monotonic()
    try:
        _run(task)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return str(task), time.monotonic() - t0, None
    except Exception as exc:  # reported, never fatal: the main process compiles lazily instead
        return str(task), time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:500]


def _inputs(trees: list[list[int]], hv: int, dtype: torch.dtype = torch.bfloat16) -> U.Inputs:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    return U.make_inputs(U.tree_of(trees, DEVICE), U.H, hv, U.DK, U.DV, dtype, gen)


def _run(task: tuple) -> None:
    from trtllm_bole.kernels import gdn_commit, gdn_tree_verify, tree_conv1d
    from trtllm_bole.kernels.baselines import tree_serial
    from trtllm_bole.ops import GDNTreeFactors

    kind, *args = task
    if kind == "verify":
        cfg_fields, precision = args
        cfg = gdn_tree_verify.VerifyConfig(*cfg_fields)
        x = _inputs([topk_parents(20, 4, 8)], 32, torch.float32 if precision == "ieee" else torch.bfloat16)
        gdn_tree_verify.gdn_tree_verify(
            x.q, x.k, x.v, x.a, x.b, x.state, x.tree, scale=x.scale, precision=precision, config=cfg,
            raw_gates=(x.a_log, x.dt_bias),
        )  # fmt: skip
    elif kind == "inverse":
        cfg_fields, precision, blocked = args
        cfg = gdn_tree_verify.InverseConfig(*cfg_fields)
        trees = [topk_parents(100, 4, 8), [-1]] if blocked else [topk_parents(16, 4, 8)]
        x = _inputs(trees, 32, torch.float32 if precision == "ieee" else torch.bfloat16)
        gdn_tree_verify.gdn_tree_verify(
            x.q, x.k, x.v, x.a, x.b, x.state, x.tree, scale=x.scale, precision=precision, config=cfg,
            raw_gates=(x.a_log, x.dt_bias),
        )  # fmt: skip
    elif kind == "serial":
        cfg_fields, hv = args
        x = _inputs([topk_parents(20, 4, 8)], hv)
        cfg = tree_serial.SerialConfig(*cfg_fields)
        _, snaps = tree_serial.gdn_tree_verify_serial(
            x.q, x.k, x.v, x.g, x.beta, x.state, x.tree, scale=x.scale, config=cfg
        )
        leaves = torch.zeros(1, dtype=torch.long, device=DEVICE)
        tree_serial.gdn_snapshot_commit(x.state, snaps, x.tree, leaves)
        tree_serial.gdn_snapshot_commit(x.state[None].contiguous(), snaps[None].contiguous(), x.tree, leaves)
    elif kind == "commit":
        cfg = gdn_commit.CommitConfig(*args[0])
        x = _inputs([topk_parents(20, 4, 8)], 32)
        layers = 2
        factors = GDNTreeFactors(
            x.tree, x.k[None].repeat(layers, 1, 1, 1), torch.randn(layers, 20, 32, U.DV, device=DEVICE),
            torch.zeros(layers, 20, 32, device=DEVICE),
        )  # fmt: skip
        state = x.state[None].repeat(layers, 1, 1, 1, 1)
        gdn_commit.gdn_commit(state, factors, torch.tensor([7], device=DEVICE), config=cfg)
    elif kind == "conv":
        hv = args[0]
        channels = 2 * U.H * U.DK + hv * U.DV
        tree = U.tree_of([topk_parents(20, 4, 8)], DEVICE)
        xc = torch.randn(20, channels, device=DEVICE).bfloat16()
        weight = torch.randn(channels, 4, device=DEVICE).bfloat16()
        state = torch.randn(1, channels, 3, device=DEVICE).bfloat16()
        tree_conv1d.tree_conv1d(xc, weight, state, tree, bias=weight[:, 0].contiguous())
        gdn_commit.conv_state_commit(
            state[None].contiguous(), xc[None], tree, torch.tensor([7], device=DEVICE)
        )
    elif kind == "sglang":
        hv, size = args
        peer = _peers.load_sglang()
        x = _inputs([topk_parents(size, 4, min(8, size))], hv)
        si = _peers.sglang_inputs(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state, x.tree, x.scale)
        _peers.sglang_verify(peer, si, si.buffer())
    elif kind == "fla":
        peer = _peers.load_fla()
        x = _inputs([chain_parents(args[0])], 32)
        _peers.fla_chain(peer, x.q, x.k, x.v, x.g, x.beta, x.state, 1, x.scale)
    else:
        raise ValueError(f"unknown warm-up task {kind!r}")


def tasks_for(bench) -> list[tuple]:
    """What the run will launch: every verify config in the three precisions the run uses (serving tf32
    and bf16 with fused gates, fp32-exact), the serial, commit and conv kernels, and the peers' kernels
    at each tree size (SGLang's kernel is specialised on T)."""
    from dataclasses import astuple

    hvs = [m["hv"] for m in bench.models.values()]
    plan = bench.plan
    sizes = sorted({*plan["sizes"], *plan["chain_sizes"], 64})
    tasks: list[tuple] = [("verify", astuple(c), p) for p in ("tf32", "bf16", "ieee") for c in bench.configs]
    tasks += [("serial", astuple(c), hv) for c in bench.serial_mod.SERIAL_CONFIGS for hv in hvs]
    tasks += [("commit", astuple(c)) for c in bench.commit_mod.COMMIT_CONFIGS]
    tasks += [("conv", hvs[0]), ("fla", 32)]
    tasks += [("sglang", hv, t) for hv in hvs for t in sizes]
    return tasks


def focus_tasks(bench, old: list[tuple], sizes: list[int]) -> list[tuple]:
    """What ``--focus headline`` launches: the blocked kernel's candidates, the inverse configs at every
    tile (their blocked variants where trees exceed 64 nodes), tree-serial's config and SGLang's kernel
    at each (HV, T) it is specialised on."""
    from dataclasses import astuple

    import _focus

    hvs = [m["hv"] for m in bench.models.values()]
    tasks: list[tuple] = [("verify", astuple(c), p) for c, p in old]
    seen = set()
    for size in sizes:
        for c, p in _focus.new_candidates(bench, size):
            key = (astuple(c), p, size > 64)
            if key not in seen:
                seen.add(key)
                tasks.append(("inverse", *key))
    for batch in (1, 16):  # the fp32-exact check of the likely winners
        default = bench.verify_mod.default_config(64 * batch, batch, hvs[0], 128, 128)
        tasks.append(("inverse", astuple(default), "ieee", False))
    tasks += [("serial", astuple(bench.serial_mod.SERIAL_CONFIGS[0]), hv) for hv in hvs]
    tasks += [("sglang", hv, 64) for hv in hvs] + [("sglang", hvs[0], t) for t in sizes if t != 64]
    return tasks


def warm(tasks: list[tuple], workers: int) -> dict:
    """Runs the tasks in ``workers`` spawned processes; returns timings and failures for the record."""
    t0 = time.monotonic()
    done, failed = [], []
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(run_task, t) for t in tasks]
        for fut in as_completed(futures):
            name, seconds, error = fut.result()
            entry = {"task": name, "s": round(seconds, 1)}
            if error:
                failed.append({**entry, "error": error})
            else:
                done.append(entry)
    return {"workers": workers, "tasks": len(tasks), "wall_s": round(time.monotonic() - t0, 1),
            "failed": failed, "done": done}  # fmt: skip


def default_workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))
