"""Where transient speculative state goes: per-node GDN snapshots vs Bole's factors (the analogue of
the paper's Table I). Formula-based, per request, all GDN layers of the model; runs on any CPU.

    python benchmarks/memory_table.py [--json benchmarks/results/memory_table.json]

Snapshots (tree-serial, SGLang's scheme): T * L * HV * dk * dv fp32 states.
Factors (Bole): T * L * (HV * dv fp32 u + H * dk bf16 k + HV fp32 logP).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from trtllm_bole.models.presets import QWEN35_PRESETS, num_gdn_layers

TREE_SIZES = (64, 100, 200)
MODELS = ("qwen3.5-9b", "qwen3.5-27b", "qwen3.5-122b-a10b")
FP32, BF16 = 4, 2


def transient_bytes(preset: dict, tree_size: int) -> dict[str, int]:
    layers = num_gdn_layers(preset)
    h, hv = preset["linear_num_key_heads"], preset["linear_num_value_heads"]
    dk, dv = preset["linear_key_head_dim"], preset["linear_value_head_dim"]
    snapshots = tree_size * layers * hv * dk * dv * FP32
    factors = tree_size * layers * (hv * dv * FP32 + h * dk * BF16 + hv * FP32)
    return {"snapshots": snapshots, "factors": factors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "memory_table.json")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'model':<20}{'T':>5}{'snapshots':>14}{'factors':>12}{'ratio':>8}")
    for name in MODELS:
        for t in TREE_SIZES:
            b = transient_bytes(QWEN35_PRESETS[name], t)
            ratio = b["snapshots"] / b["factors"]
            rows.append({"model": name, "tree_size": t, **b, "ratio": ratio})
            snap, fact = b["snapshots"] / 2**30, b["factors"] / 2**20
            print(f"{name:<20}{t:>5}{snap:>11.2f} GiB{fact:>8.1f} MiB{ratio:>7.1f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "what": "transient speculative GDN state per request, all GDN layers (formula)",
                "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
                "python": platform.python_version(),
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
