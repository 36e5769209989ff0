"""The sections of benchmarks/bench_gdn_verify.py, in priority order (a run cut short by its time budget
keeps what matters most), and the summary against the issue's targets."""

from __future__ import annotations

import math
from typing import Any

import _bench_util as U
import _peers
import torch

from trtllm_bole.testing import chain_parents, topk_parents

TOP_K = 4


def copy_bandwidth(b) -> None:
    nbytes = 2**30 if b.cuda else 2**20
    b.r["copy_bandwidth"] = U.copy_bandwidth(b.device, nbytes, b.plan["rep_ms"])
    print(f"  copy: {b.r['copy_bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s (read + write)", flush=True)


def peers(b) -> None:
    b.sglang, b.fla = _peers.load_sglang(), _peers.load_fla()
    b.r["peers"] = {
        p.name: {"available": p.available, "version": p.version, "reason": p.reason}
        for p in (b.sglang, b.fla)
    }
    if b.args.smoke:  # SGLang's scatter and do_bench want CUDA; the smoke run checks the calls only
        b.r["peers"]["note"] = "smoke run: peers checked in the interpreter, SGLang's commit not run"
    print(f"  {b.r['peers']}", flush=True)


def _model(b, hv: int) -> str:
    return next(name for name, m in b.models.items() if m["hv"] == hv)


def _trees(size: int, depth: int, batch: int, chain: bool = False) -> list[list[int]]:
    return [chain_parents(size) if chain else topk_parents(size, TOP_K, depth)] * batch


def _time_bole(b, sets: list[U.Inputs], cands: list[tuple], hv: int, depth: int) -> dict[str, Any]:
    """Time every candidate (config, precision) that passes its check; report the fastest."""
    times = {}
    for cand in cands:
        if b.check_bole(cand, hv, depth, sets[0].tree.max_nodes):
            times[cand] = b.measure(U.Rotating(sets, lambda x, c=cand: b.bole(x, c)))
    if not times:
        return {}
    best = min(times, key=times.get)
    return {
        "bole_us": times[best], "bole_config": f"{best[0]} {best[1]}",
        "bole_candidates_us": {f"{c[0]} {c[1]}": t for c, t in times.items()},
        "bole_peak_bytes": U.peak_bytes(lambda: b.bole(sets[0], best)),
    }  # fmt: skip


def sweep(b) -> None:
    """Every verify config at a few shapes (tf32 dots), then the best three with bf16 S-dots."""
    rows = []
    for hv, batch, size in b.plan["sweep"]:
        sets = U.rotations(lambda hv=hv, batch=batch, size=size: b.inputs(_trees(size, 8, batch), hv))
        cands = [(c, "tf32") for c in b.configs]
        res = _time_bole(b, sets, cands, hv, 8)
        top = sorted(res.get("bole_candidates_us", {}).items(), key=lambda kv: kv[1])[:3]
        by_name = {f"{c} tf32": c for c in b.configs}
        extra = _time_bole(b, sets, [(by_name[name], "bf16") for name, _ in top], hv, 8)
        times = {**res.get("bole_candidates_us", {}), **extra.get("bole_candidates_us", {})}
        best = min(times, key=times.get) if times else None
        rows.append(
            {"hv": hv, "batch": batch, "tree_size": size, "depth": 8, "times_us": times, "best": best}
        )
        print(
            f"  sweep HV={hv} B={batch} T={size}: best {best} {times.get(best, float('nan')):.1f} us",
            flush=True,
        )
        # The winner of every sweep point (two at the first, the headline shape) goes on to the grid.
        named = {f"{c} {p}": (c, p) for c in b.configs for p in ("tf32", "bf16")}
        for name in sorted(times, key=times.get)[: 2 if not rows[:-1] else 1]:
            if named[name] not in b.candidates:
                b.candidates.append(named[name])
        b.r["sweep"] = rows
    for batch in sorted({1, max(b.plan["batches"])}):
        hv = b.plan["sweep"][0][0]
        sets = U.rotations(lambda hv=hv, batch=batch: b.inputs(_trees(64 if b.cuda else 20, 8, batch), hv))
        times = {}
        for cfg in b.serial_mod.SERIAL_CONFIGS if b.cuda else [b.serial_mod.SerialConfig(16, 1)]:
            if b.check_serial(cfg, hv):
                times[cfg] = b.measure(U.Rotating(sets, lambda x, c=cfg: b.serial(x, c)))
        if times:
            b.serial_best[batch] = min(times, key=times.get)
        b.r["serial_sweep"].append({"batch": batch, "times_us": {str(c): t for c, t in times.items()}})
    b.r["candidates"] = [f"{c} {p}" for c, p in b.candidates]


def exact_mode(b) -> None:
    hv = b.plan["sweep"][0][0]
    for cfg in dict.fromkeys(c for c, _ in b.candidates):
        b.check_bole_exact(cfg, hv)


def _serial_cfg(b, batch: int):
    keys = sorted(b.serial_best)
    return b.serial_best[min(keys, key=lambda k: abs(math.log2(k) - math.log2(batch)))] if keys else None


def _sglang_part(b, sets: list[U.Inputs], hv: int, size: int, snap_bytes: int) -> dict[str, Any]:
    sg = getattr(b, "sglang", None)
    if not (sg and sg.available):
        return {}
    if snap_bytes > b.mem_cap:
        return {"sglang_skipped": f"intermediate buffer {snap_bytes / 2**30:.1f} GiB over the cap"}
    if not b.check_sglang(sg, hv, size):
        return {"sglang_skipped": "failed its check"}
    prepared = []
    for s in sets:
        si = _peers.sglang_inputs(s.q, s.k, s.v, s.a, s.b, s.a_log, s.dt_bias, s.state, s.tree, s.scale)
        prepared.append((si, si.buffer()))  # preallocated, as SGLang's pool is
    out = {"sglang_us": b.measure(U.Rotating(prepared, lambda p: _peers.sglang_verify(sg, *p)))}
    si = prepared[0][0]
    prepared.clear()
    out["sglang_peak_bytes"] = U.peak_bytes(lambda: _peers.sglang_verify(sg, si, si.buffer()))
    return out


def _serial_part(b, sets: list[U.Inputs], hv: int, batch: int, snap_bytes: int) -> dict[str, Any]:
    from trtllm_bole.kernels.baselines.tree_serial import gdn_snapshot_commit

    cfg = _serial_cfg(b, batch)
    if cfg is None or snap_bytes > b.mem_cap or not b.check_serial(cfg, hv):
        return {}
    leaves = (sets[0].tree.cu_seqlens[1:] - sets[0].tree.cu_seqlens[:-1]) - 1  # the last node

    def total(s: U.Inputs) -> None:
        _, snaps = b.serial(s, cfg)
        gdn_snapshot_commit(s.state, snaps, s.tree, leaves)

    return {
        "serial_us": b.measure(U.Rotating(sets, lambda s: b.serial(s, cfg))),
        "serial_total_us": b.measure(U.Rotating(sets, total)),
        "serial_config": str(cfg),
        "serial_peak_bytes": U.peak_bytes(lambda: b.serial(sets[0], cfg)),
    }


def _fla_part(b, sets: list[U.Inputs], hv: int, batch: int) -> dict[str, Any]:
    fla = getattr(b, "fla", None)
    if not (fla and fla.available and b.check_fla(fla, hv)):
        return {}

    def run(s: U.Inputs):
        return _peers.fla_chain(fla, s.q, s.k, s.v, s.g, s.beta, s.state, batch, s.scale)

    return {"fla_us": b.measure(U.Rotating(sets, run))}


def point(
    b, hv: int, batch: int, size: int, depth: int, chain: bool = False, top: int | None = None
) -> dict[str, Any]:
    """One shape: Bole (the ``top`` best candidates of the sweep), SGLang's tree kernel, tree-serial
    (+ its commit), and fla on chains."""
    sets = U.rotations(lambda: b.inputs(_trees(size, depth, batch, chain), hv))
    tree = sets[0].tree
    row: dict[str, Any] = {
        "model": _model(b, hv), "hv": hv, "batch": batch, "tree_size": size, "depth": tree.max_depth,
        "shape": "chain" if chain else f"top-{TOP_K}",
    }  # fmt: skip
    if not b.candidates:
        b.candidates.append((b.verify_mod.default_config(tree.num_nodes, batch, hv, b.dk, b.dv), "tf32"))
    row.update(_time_bole(b, sets, b.candidates[:top], hv, tree.max_depth))
    row["floor_bytes"] = U.verify_floor_bytes(sets[0])
    copy_bw = b.r.data.get("copy_bandwidth", {}).get("bytes_per_s")
    if row.get("bole_us"):
        row["bole_bytes_per_s"] = row["floor_bytes"] / (row["bole_us"] * 1e-6)
        if copy_bw:
            row["floor_fraction"] = row["bole_bytes_per_s"] / copy_bw
    snap_bytes = tree.num_nodes * hv * b.dk * b.dv * 4
    row["per_node_state_bytes"] = snap_bytes
    row["input_sets"] = {"bole": len(sets)}
    if snap_bytes * len(sets) > b.mem_cap:
        sets = sets[:1]  # the baselines' per-node buffers of every set would not fit: they time one set
    row["input_sets"]["baselines"] = len(sets)
    row.update(_sglang_part(b, sets, hv, size, snap_bytes))
    row.update(_serial_part(b, sets, hv, batch, snap_bytes))
    if chain:
        row.update(_fla_part(b, sets, hv, batch))
    for key, name in (("sglang_us", "speedup_sglang"), ("serial_total_us", "speedup_serial"),
                      ("fla_us", "speedup_fla")):  # fmt: skip
        if row.get(key) and row.get("bole_us"):
            row[name] = row[key] / row["bole_us"]
    print("  " + " ".join(f"{k}={_fmt(v)}" for k, v in row.items() if not isinstance(v, dict)), flush=True)
    return row


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _points(b, key: str, shapes: list[tuple], chain: bool = False, top: int | None = None) -> None:
    done = {(p["hv"], p["batch"], p["tree_size"], p["depth"], p["shape"]) for p in b.r[key]}
    for hv, batch, size, depth in shapes:
        shape = "chain" if chain else f"top-{TOP_K}"
        if (hv, batch, size, size if chain else min(depth, size), shape) in done:
            continue
        if b.budget.left() < 25:
            b.r.skip(f"{key} HV={hv} B={batch} T={size} d={depth}", "time budget spent")
            continue
        try:
            b.r[key].append(point(b, hv, batch, size, depth, chain, top))
        except Exception as exc:
            b.r.error(f"{key} HV={hv} B={batch} T={size} d={depth}", exc)
        if b.cuda:
            torch.cuda.empty_cache()
        b.r.save()


def _hvs(b) -> list[int]:
    return [m["hv"] for m in b.models.values()]


def headline(b) -> None:
    size = 64 if b.cuda else 20
    _points(b, "grid", [(_hvs(b)[0], batch, size, 8) for batch in sorted({1, 16 if b.cuda else 2})])


def _grid(b, hv: int) -> None:
    _points(b, "grid", [(hv, bt, t, 8) for bt in b.plan["batches"] for t in b.plan["sizes"]])


def grid_first(b) -> None:
    _grid(b, _hvs(b)[0])


def grid_rest(b) -> None:
    for hv in _hvs(b)[1:]:
        _grid(b, hv)


def _two_batches(b) -> list[int]:
    return sorted({1, max(bt for bt in b.plan["batches"] if bt <= 16)})


def depth_sweep(b) -> None:
    hv, size = _hvs(b)[0], 64 if b.cuda else 20
    _points(b, "depth", [(hv, bt, size, d) for bt in _two_batches(b) for d in b.plan["depths"]], top=2)


def chains(b) -> None:
    shapes = [(_hvs(b)[0], bt, t, t) for bt in _two_batches(b) for t in b.plan["chain_sizes"]]
    _points(b, "chains", shapes, chain=True, top=2)


def commit(b) -> None:
    """All GDN layers of all requests in one launch (Bole) against the snapshot copies of tree-serial
    and SGLang (its all-layer scatter), plus the conv-state commit."""
    for batch in b.plan["commit_batches"]:
        if b.budget.left() < 30:
            b.r.skip(f"commit B={batch}", "time budget spent")
            continue
        try:
            row = _commit_batch(b, batch)
        except Exception as exc:
            b.r.error(f"commit B={batch}", exc)
            continue
        finally:
            if b.cuda:
                torch.cuda.empty_cache()
        b.r["commit"].append(row)
        print(
            "  " + " ".join(f"{k}={_fmt(v)}" for k, v in row.items() if not isinstance(v, dict)), flush=True
        )
        b.r.save()


def _commit_batch(b, batch: int) -> dict[str, Any]:
    from trtllm_bole.ops import GDNTreeFactors
    from trtllm_bole.reference import gdn_tree

    name = next(iter(b.models))
    hv, layers = b.models[name]["hv"], b.models[name]["gdn_layers"]
    size, depth = (64, 8) if b.cuda else (20, 4)
    x = b.inputs(_trees(size, depth, batch), hv)
    tree, n = x.tree, x.tree.num_nodes
    k = torch.nn.functional.normalize(torch.randn(layers, n, b.h, b.dk, device=b.device), dim=-1).bfloat16()
    u = torch.randn(layers, n, hv, b.dv, device=b.device)
    log_p = gdn_tree.path_log_decay(x.g, tree)[None].expand(layers, -1, -1).contiguous()
    state = torch.randn(layers, batch, hv, b.dk, b.dv, device=b.device) * 0.1
    factors = GDNTreeFactors(tree, k, u, log_p)
    deepest = int(torch.argmax(tree.depth[:size]))  # request 0's first deepest node (local = global index)
    leaf = torch.full((batch,), deepest, dtype=torch.long, device=b.device)
    row: dict[str, Any] = {"model": name, "layers": layers, "batch": batch, "tree_size": size,
                           "path_length": int(tree.depth[deepest]),  # nodes committed per request
                           "state_bytes_moved": 2 * state.numel() * 4}  # fmt: skip
    times = {}
    for cfg in b.commit_mod.COMMIT_CONFIGS if b.cuda else [None]:
        if _check_commit(b, factors, state, leaf, cfg):
            times[str(cfg)] = b.measure(lambda c=cfg: b.commit_mod.gdn_commit(state, factors, leaf, config=c))
    copy_bw = b.r.data.get("copy_bandwidth", {}).get("bytes_per_s")
    if times:
        best = min(times, key=times.get)
        row.update(bole_us=times[best], bole_config=best, bole_candidates_us=times, launches=1)
        row["bole_bytes_per_s"] = row["state_bytes_moved"] / (row["bole_us"] * 1e-6)
        if copy_bw:
            row["copy_fraction"] = row["bole_bytes_per_s"] / copy_bw
    half = leaf.clone()
    half[::2] = -1
    if _check_commit(b, factors, state, leaf, None):  # the default config, a rejecting request among them
        row["bole_half_accepted_us"] = b.measure(lambda: b.commit_mod.gdn_commit(state, factors, half))
    row["snapshot_bytes"] = layers * n * hv * b.dk * b.dv * 4
    if row["snapshot_bytes"] <= 1.3 * b.mem_cap:  # one all-layer snapshot buffer, nothing else large
        row.update(_copy_commits(b, state, tree, leaf, layers, size))
    channels = 2 * b.h * b.dk + hv * b.dv
    xc = torch.randn(layers, n, channels, device=b.device).bfloat16()
    conv_state = torch.randn(layers, batch, channels, 3, device=b.device).bfloat16()
    if _check_conv_commit(b, conv_state, xc, tree, leaf):
        row["conv_commit_us"] = b.measure(lambda: b.commit_mod.conv_state_commit(conv_state, xc, tree, leaf))
    return row


def _check_conv_commit(b, conv_state: torch.Tensor, xc: torch.Tensor, tree, leaf: torch.Tensor) -> bool:
    """The first three layers' all-layer conv commit against the reference's, layer by layer: a copy, so
    bit-identical."""
    from trtllm_bole.reference import conv_tree

    def run():
        got, want = conv_state[:3].clone(), conv_state[:3].clone()
        b.commit_mod.conv_state_commit(got, xc[:3], tree, leaf)
        for i in range(3):
            conv_tree.conv_state_commit(want[i], xc[i], tree, leaf)
        return {"differs": float(not torch.equal(got, want))}, 0.0

    return b._check(("conv commit",), "conv_state_commit", run)


def _copy_commits(b, state: torch.Tensor, tree, leaf: torch.Tensor, layers: int, size: int) -> dict[str, Any]:
    """The snapshot schemes' commit: copy the accepted node's state, every layer in one launch. One
    all-layer buffer is live at a time (each is as large as the whole tree's per-node states)."""
    out = {"serial_copy_us": _serial_copy(b, state, tree, leaf, layers)}
    sg = getattr(b, "sglang", None)
    if b.cuda and sg and sg.available:
        out["sglang_copy_us"] = _sglang_copy(b, sg, state, leaf, layers, size)
    return out


def _serial_copy(b, state: torch.Tensor, tree, leaf: torch.Tensor, layers: int) -> float:
    snaps = torch.empty(layers, tree.num_nodes, *state.shape[2:], device=b.device)
    return b.measure(lambda: b.serial_mod.gdn_snapshot_commit(state, snaps, tree, leaf))


def _sglang_copy(b, sg, state: torch.Tensor, leaf: torch.Tensor, layers: int, size: int) -> float:
    _, batch, hv, dk, dv = state.shape
    bufs = torch.empty(layers, batch, size, hv, dv, dk, device=b.device)
    vk = torch.empty(layers, batch, hv, dv, dk, device=b.device)
    slots = torch.arange(batch, device=b.device)
    return b.measure(lambda: _peers.sglang_commit(sg, vk, bufs, slots, leaf))


def _check_commit(b, factors, state: torch.Tensor, leaf: torch.Tensor, cfg) -> bool:
    """The first three layers against the float64 factored commit; request 0 rejects (-1) and stays
    bit-identical where another request commits (at batch 1 it commits: with it rejecting, the check
    compared no state and passed a commit that wrote nothing)."""
    from trtllm_bole.ops import GDNTreeFactors
    from trtllm_bole.reference import gdn_tree

    def run():
        sub = GDNTreeFactors(
            factors.tree, *(t[:3].contiguous() for t in (factors.k, factors.u, factors.log_decay))
        )
        accepted = leaf.clone()
        kept = int(len(accepted) > 1)  # requests that keep their state
        accepted[:kept] = -1
        s = state[:3].clone()
        ref = s.double()
        for i in range(3):
            gdn_tree.factored_commit(ref[i], sub.k[i], sub.u[i], sub.log_decay[i], sub.tree, accepted)
        b.commit_mod.gdn_commit(s, sub, accepted, config=cfg)
        untouched = float(not torch.equal(s[:, :kept], state[:3, :kept]))
        return {"state": U.rel_rms(s[:, kept:], ref[:, kept:]), "untouched_changed": untouched}, 1e-5

    return b._check(("commit", str(cfg)), f"gdn_commit {cfg}", run)


def memory(b) -> None:
    """Transient speculative state per request for every GDN layer, measured (max_memory_allocated):
    Bole keeps (u, logP, k) per layer; tree-serial and SGLang keep a state per node."""
    name = list(b.models)[-1]
    hv, layers = b.models[name]["hv"], b.models[name]["gdn_layers"]
    size = 64 if b.cuda else 20
    x = b.inputs(_trees(size, 8, 1), hv)
    cand = b.candidates[0] if b.candidates else (b.verify_mod.default_config(size, 1, hv, b.dk, b.dv), "tf32")
    row: dict[str, Any] = {"model": name, "layers": layers, "batch": 1, "tree_size": size}

    def kept_bytes(kept: list) -> int:
        return sum(t.numel() * t.element_size() for group in kept for t in group)

    def bole_all() -> list:
        return [(*b.bole(x, cand)[1:], x.k.clone()) for _ in range(layers)]

    schemes = {"bole": bole_all} if b.check_bole(cand, hv, x.tree.max_depth) else {}
    cfg = _serial_cfg(b, 1)
    if cfg is not None and b.check_serial(cfg, hv):
        schemes["serial"] = lambda: [b.serial(x, cfg)[1:] for _ in range(layers)]
    sg = getattr(b, "sglang", None)
    if sg and sg.available and b.check_sglang(sg, hv, size):
        si = _peers.sglang_inputs(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.state, x.tree, x.scale)

        def sglang_all() -> list:
            kept = []
            for _ in range(layers):
                buf = si.buffer()
                _peers.sglang_verify(sg, si, buf)
                kept.append((buf,))
            return kept

        schemes["sglang"] = sglang_all
    for scheme, fn in schemes.items():
        kept = fn()
        row[f"{scheme}_kept_bytes"] = kept_bytes(kept)
        del kept
        row[f"{scheme}_peak_bytes"] = U.peak_bytes(fn)
    for scheme in ("serial", "sglang"):
        for kind in ("peak", "kept"):
            ours, theirs = row.get(f"bole_{kind}_bytes"), row.get(f"{scheme}_{kind}_bytes")
            if ours and theirs:
                row[f"{scheme}_over_bole_{kind}"] = theirs / ours
    b.r["memory"] = row
    print("  " + " ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)


def conv(b) -> None:
    from trtllm_bole.reference import conv_tree

    hv = _hvs(b)[0]
    batch, size = (16, 64) if b.cuda else (2, 20)
    channels = 2 * b.h * b.dk + hv * b.dv
    tree = U.tree_of(_trees(size, 8, batch), b.device)
    x = torch.randn(tree.num_nodes, channels, device=b.device).bfloat16()
    weight = torch.randn(channels, 4, device=b.device).bfloat16()
    bias = torch.randn(channels, device=b.device).bfloat16()
    state = torch.randn(batch, channels, 3, device=b.device).bfloat16()
    ref = conv_tree.tree_conv1d(x.double(), weight.double(), state.double(), tree, bias=bias.double())

    def run():
        y = b.conv_mod.tree_conv1d(x, weight, state, tree, bias=bias)
        return {"y": U.rel_rms(y, ref)}, TOL_SERVING_CONV

    row: dict[str, Any] = {"batch": batch, "tree_size": size, "channels": channels}
    if b._check(("conv",), "tree_conv1d", run):
        row["us"] = b.measure(lambda: b.conv_mod.tree_conv1d(x, weight, state, tree, bias=bias))
        floor = 2 * x.numel() * 2 + state.numel() * 2 + weight.numel() * 2
        row["floor_bytes"] = floor
        copy_bw = b.r.data.get("copy_bandwidth", {}).get("bytes_per_s")
        if copy_bw:
            row["floor_fraction"] = floor / (row["us"] * 1e-6) / copy_bw
    b.r["conv"] = row
    print(f"  {row}", flush=True)


TOL_SERVING_CONV = 1e-2


def _target(value: float | None, target: float, **extra: Any) -> dict[str, Any]:
    return {"value": value, "target": target, "met": value is not None and value >= target, **extra}


def summarize(data: dict) -> dict[str, Any]:
    """The issue's 'done when' list, evaluated on this run's numbers."""
    s: dict[str, Any] = {}
    checks = data.get("checks", [])
    for kind, exact, target in (("exact", True, 1e-4), ("serving", False, 1e-2)):
        rows = [c for c in checks if c["what"].startswith("bole ") and ("fp32-exact" in c["what"]) == exact]
        errs = [max(c.get("o", math.inf), c.get("u", math.inf)) for c in rows if c["ok"]]
        s[f"correct_{kind}"] = {
            "checked": len(rows), "passed": sum(c["ok"] for c in rows), "target": target,
            "max_rel_err_of_passing": max(errs) if errs else None,
        }  # fmt: skip
    grid = data.get("grid", [])
    first = next(iter(data.get("meta", {}).get("dims", {}).get("models", {})), None)
    head = {p["batch"]: p for p in grid if p["model"] == first and p["depth"] == 8 and p["tree_size"] == 64}
    for batch, target in ((1, 10), (16, 25)):
        p = head.get(batch, {})
        s[f"speedup_vs_sglang_b{batch}"] = _target(
            p.get("speedup_sglang"), target, bole_us=p.get("bole_us"), sglang_us=p.get("sglang_us")
        )
    big = [p for p in grid if p["batch"] >= 16 and p["tree_size"] == 64 and p.get("floor_fraction")]
    s["floor_fraction_b16plus_T64"] = _target(
        min((p["floor_fraction"] for p in big), default=None), 0.4,
        points={f"{p['model']} B={p['batch']}": p["floor_fraction"] for p in big},
    )  # fmt: skip
    com = next((c for c in data.get("commit", []) if c["batch"] == 16), None)
    if com:
        s["commit_b16_copy_fraction"] = _target(
            com.get("copy_fraction"), 0.7, us=com.get("bole_us"), launches=com.get("launches")
        )
    mem = data.get("memory", {})
    if mem:
        s["memory_serial_over_bole"] = _target(mem.get("serial_over_bole_peak"), 60)
    keys = ("model", "batch", "bole_us", "sglang_us", "serial_total_us", "speedup_sglang", "speedup_serial",
            "floor_fraction", "bole_config")  # fmt: skip
    rows = sorted(
        (p for p in grid if p["tree_size"] == 64 and p["depth"] == 8), key=lambda p: (p["model"], p["batch"])
    )
    s["speedup_table_T64"] = [{k: p.get(k) for k in keys} for p in rows]
    return s


def precompile(b) -> None:
    import _warm

    if not b.cuda or b.args.no_warm:
        b.r["precompile"] = {"skipped": "not on CUDA" if not b.cuda else "--no-warm"}
        return
    b.r["precompile"] = _warm.warm(_warm.tasks_for(b), b.args.warm_workers or _warm.default_workers())
    w = b.r["precompile"]
    print(
        f"  {w['tasks']} variants on {w['workers']} workers in {w['wall_s']} s, {len(w['failed'])} failed",
        flush=True,
    )


SECTIONS = [
    ("precompile", precompile),
    ("copy bandwidth", copy_bandwidth),
    ("peers", peers),
    ("config sweep", sweep),
    ("fp32-exact mode", exact_mode),
    ("headline points", headline),
    ("commit", commit),
    ("memory", memory),
    ("grid, first model", grid_first),
    ("depth sweep", depth_sweep),
    ("chains", chains),
    ("grid, other models", grid_rest),
    ("tree conv", conv),
]
