"""The bonus token's inverse CDF at a real vocabulary: one torch scan of each whole row against
:func:`~trtllm_bole.spec.acceptance.two_level_cdf`, at the rows a batch's bonus tokens draw from.

    python benchmarks/probe_inverse_cdf.py --out DIR     # H200, seconds

Rows of 151,936 float64 weights (uniform), 1, 8 and 32 rows; both sides must pick the same tokens,
else nothing is timed. Times: CUDA-graph replays (``_bench_util.graph_timer``). Writes
``<out>/probe_inverse_cdf_<device>.json``: what :func:`~trtllm_bole.spec.acceptance.inverse_cdf`'s choice
rests on.
"""

from __future__ import annotations

import sys

import _bench_util as U
import torch

from trtllm_bole.spec.acceptance import scanned_cdf, two_level_cdf


def main(argv: list[str] | None = None) -> int:
    start = U.probe_start(__doc__, "probe_inverse_cdf.py", argv)
    if start is None:
        return 2
    args, measure, gen = start
    rows = []
    for count in (1, 8, 32):
        w = torch.rand(count, 151936, device="cuda", dtype=torch.float64, generator=gen)
        u = torch.rand(count, device="cuda", dtype=torch.float64, generator=gen)
        same = torch.equal(scanned_cdf(w, u), two_level_cdf(w, u))
        row = {"rows": count, "vocab": w.shape[1], "same": same}
        if not row["same"]:
            print(f"{count} rows: the two sides picked different tokens: nothing reported", file=sys.stderr)
            return 1
        row["scan_us"] = measure(lambda w=w, u=u: scanned_cdf(w, u))
        row["two_level_us"] = measure(lambda w=w, u=u: two_level_cdf(w, u))
        print(
            f"{count} rows: one scan {row['scan_us']:.1f} us, two levels {row['two_level_us']:.1f} us",
            flush=True,
        )
        rows.append(row)
    path = U.write_result(args.out, U.result_name("probe_inverse_cdf"), {"meta": U.run_meta(), "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
