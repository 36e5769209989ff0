"""``--focus headline``: a short pass of benchmarks/bench_gdn_verify.py (~2 minutes on the H200).

Compiles only what it times (in parallel), checks every timed variant against float64 first (a failing
one is never timed), then times, in priority order (a run cut short by its budget keeps the first):

1. the headline grid: Qwen3.5-9B then -27B, B = 1, 2, 4, 8, 16, 32, T = 64, depth 8: the blocked kernel
   (the first run's winners), the explicit-inverse path (every config with a tile of 64), SGLang's tree
   kernel and tree-serial (+ its snapshot commit); then the fp32-exact check of the winners;
2. the tree-size sweep T = 8 … 256 at B = 16 (9B): the headline's best configs of both paths plus the
   inverse configs whose tile fits T;
3. a depth probe at B = 1, T = 64 (depth 2, 3, 4, 8): CUDA-graph and eager times of the winners.

Times are CUDA-graph replays (L2 flushed before each, host launch overhead outside the window: an
engine captures its verify step); the headline rows also carry eager times of the winner and SGLang
(``*_eager_us``), the first run's method. Same JSON schema and summary keys as the full run.
"""

from __future__ import annotations

from typing import Any

import _bench_util as U
import _sections as S
import torch

PLAN = {
    "batches": [1, 2, 4, 8, 16, 32], "sizes": [8, 16, 32, 64, 128, 256], "depths": [2, 3, 4, 8],
    "chain_sizes": [], "commit_batches": [], "sweep": [(32, 16, 64)], "rep_ms": 20,
}  # fmt: skip


def old_candidates(b) -> list[tuple]:
    """The blocked kernel's winners of the first H200 run (B = 1, 2, 4-32, and T != 64)."""
    if not b.cuda:
        return [(c, "tf32") for c in b.configs]
    c = b.verify_mod.CONFIGS
    return [(c[4], "bf16"), (c[0], "tf32"), (c[3], "bf16"), (c[3], "tf32"), (c[2], "bf16")]


def new_candidates(b, size: int) -> list[tuple]:
    """Inverse configs whose tile fits a tree of ``size`` nodes, in both serving precisions. Larger trees
    are blocked: the tiles of 32, and the two-launch and 4-warp one-launch tiles of 64, in tf32."""
    if not b.cuda:  # the smoke run's small heads
        return [(b.verify_mod.InverseConfig(16, 16, 16, 1, launches), "tf32") for launches in (1, 2)]
    cfgs = b.verify_mod.INVERSE_CONFIGS
    if size > 64:
        return [(c, "tf32") for c in cfgs if c.bt == 32 or (c.bt == 64 and c.num_warps == 4)]
    bt = 16 if size <= 16 else 32 if size <= 32 else 64
    return [(c, p) for c in cfgs if c.bt == bt for p in ("tf32", "bf16") if _allowed(b, c, p)]


def _allowed(b, cfg, precision: str) -> bool:
    """Not a combination the launcher refuses (it miscompiled in the H200 check)."""
    try:
        b.verify_mod.check_inverse_config(cfg, precision)
    except ValueError:
        return False
    return True


def precompile(b) -> None:
    import _warm

    if not b.cuda or b.args.no_warm:
        b.r["precompile"] = {"skipped": "not on CUDA" if not b.cuda else "--no-warm"}
        return
    tasks = _warm.focus_tasks(b, old_candidates(b), PLAN["sizes"])
    b.r["precompile"] = _warm.warm(tasks, b.args.warm_workers or _warm.default_workers())
    w = b.r["precompile"]
    print(f"  {w['tasks']} variants on {w['workers']} workers in {w['wall_s']} s, {len(w['failed'])} failed")


def _split(row: dict[str, Any]) -> None:
    """Best of each path next to the overall best."""
    times = row.get("bole_candidates_us", {})
    for key, pick in (
        ("new", lambda n: n.startswith("InverseConfig")),
        ("old", lambda n: n.startswith("Verify")),
    ):
        mine = {n: t for n, t in times.items() if pick(n)}
        if mine:
            best = min(mine, key=mine.get)
            row[f"bole_{key}_us"], row[f"bole_{key}_config"] = mine[best], best
            if row.get("sglang_us"):
                row[f"speedup_sglang_{key}"] = row["sglang_us"] / mine[best]


def _eager(b, row: dict[str, Any], hv: int, batch: int, size: int, depth: int) -> None:
    """The first run's timing method (launches timed from the host), for the winner and SGLang."""
    sets = U.rotations(lambda: b.inputs(S._trees(size, depth, batch), hv))
    named = {f"{c} {p}": (c, p) for c, p in b.candidates}
    best = named.get(row.get("bole_config", ""))
    if best is not None:
        row["bole_eager_us"] = b.measure_eager(U.Rotating(sets, lambda x: b.bole(x, best)))
    sg = getattr(b, "sglang", None)
    if row.get("sglang_us") and sg is not None:
        import _peers

        prepared = []
        for s in sets[:2]:
            si = _peers.sglang_inputs(s.q, s.k, s.v, s.a, s.b, s.a_log, s.dt_bias, s.state, s.tree, s.scale)
            prepared.append((si, si.buffer()))
        row["sglang_eager_us"] = b.measure_eager(U.Rotating(prepared, lambda p: _peers.sglang_verify(sg, *p)))


def _point(b, key: str, hv: int, batch: int, size: int, depth: int, cands: list[tuple], eager: bool) -> None:
    if b.budget.left() < 15:
        b.r.skip(f"{key} HV={hv} B={batch} T={size} d={depth}", "time budget spent")
        return
    b.candidates = cands
    try:
        row = S.point(b, hv, batch, size, depth)
        _split(row)
        if eager:
            _eager(b, row, hv, batch, size, depth)
        b.r[key].append(row)
    except Exception as exc:
        b.r.error(f"{key} HV={hv} B={batch} T={size} d={depth}", exc)
    torch.cuda.empty_cache() if b.cuda else None
    b.r.save()


def headline(b) -> None:
    size = 64 if b.cuda else 20
    cands = old_candidates(b) + new_candidates(b, size)
    for hv in S._hvs(b):
        for batch in sorted(b.plan["batches"], key=lambda x: (x not in (1, 16), x)):
            _point(b, "grid", hv, batch, size, 8, cands, eager=True)


def _best(b, batch: int, new: bool) -> tuple | None:
    named = {f"{c} {p}": (c, p) for c, p in old_candidates(b) + new_candidates(b, 64 if b.cuda else 20)}
    rows = [p for p in b.r["grid"] if p["batch"] == batch and p["hv"] == S._hvs(b)[0]]
    name = rows[0].get(f"bole_{'new' if new else 'old'}_config") if rows else None
    return named.get(name)


def size_sweep(b) -> None:
    hv, batch = S._hvs(b)[0], 16 if b.cuda else 2
    winners = [c for c in (_best(b, batch, True), _best(b, batch, False)) if c is not None]
    for size in b.plan["sizes"] if b.cuda else [8, 20]:
        if size == (64 if b.cuda else 20):
            continue  # the headline's point
        cands = list(dict.fromkeys(winners + new_candidates(b, size)))
        _point(b, "grid", hv, batch, size, 8, cands, eager=False)


def depth_probe(b) -> None:
    hv, size = S._hvs(b)[0], 64 if b.cuda else 20
    cands = [c for c in (_best(b, 1, True), _best(b, 1, False)) if c is not None]
    for depth in b.plan["depths"]:
        _point(b, "depth", hv, 1, size, depth, cands or old_candidates(b)[:1], eager=True)


def _exact(b) -> None:
    hv = S._hvs(b)[0]
    for batch in (1, 4, 16) if b.cuda else (1, 2):
        for new in (True, False):
            cand = _best(b, batch, new)
            if cand is not None:
                b.check_bole_exact(cand[0], hv)


SECTIONS = [
    ("precompile (timed variants only)", precompile),
    ("copy bandwidth", S.copy_bandwidth),
    ("peers", S.peers),
    ("headline grid, T=64 depth 8", headline),
    ("fp32-exact mode (the headline winners)", _exact),
    ("tree-size sweep, B=16", size_sweep),
    ("depth probe, B=1", depth_probe),
]
