"""Build a trtllm_bole engine: everything hardware-specific about serving one model on one GPU.

    python build_scripts/build_engine.py          # the embedded tiny model -> engines/<name>-<arch>
    python build_scripts/build_engine.py --checkpoint CKPT --output ENGINE --calibrate
    python -m trtllm_bole generate --model ENGINE # or LLM(model=ENGINE)

The engine directory holds the weights converted to the runtime layout and dtype, the Bole kernels
compiled for the present GPU (PTX + cubin; none when built on CPU), ``config.json`` (model, build and
Bole settings, versions, device, SHA-256 of every file; versioned schema), the calibrated
verification budget with ``--calibrate`` (BOLE.md §5) and a TensorRT plan with ``--tensorrt``.
Rebuilding with the same inputs is a no-op; the engine at ``--output`` is replaced (or rebuilt) only
with ``--force``; an interrupted build leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation (parser() loads torch anyway: BuildSettings' module imports it)
    from trtllm_bole.spec.calibration import CalibrationSettings

ROOT = Path(__file__).resolve().parents[1]


def default_output(checkpoint: Path, arch: str) -> Path:
    """``engines/<checkpoint name>-<arch>`` in the repository (``--checkpoint .`` has a name too)."""
    return ROOT / "engines" / f"{checkpoint.resolve().name}-{arch}"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    from trtllm_bole.cli_help import HelpWithDefaults
    from trtllm_bole.engine.build import BuildSettings
    from trtllm_bole.spec.budget import (
        DEFAULT_BATCH_BUCKETS,
        DEFAULT_CAPACITIES,
        DEFAULT_EPSILON,
        DEFAULT_KV_BUCKETS,
    )

    default = BuildSettings()

    p = argparse.ArgumentParser(prog="build_engine.py", description=__doc__, formatter_class=HelpWithDefaults)
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="Hugging Face Qwen3.5 checkpoint directory (config.json + safetensors); "
        "default: the embedded trtllm_bole/assets/qwen35-code-tiny",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="engine directory to write (default: engines/<checkpoint name>-<arch>)",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default=default.dtype,
        help="weight and activation dtype; auto: bfloat16 on a GPU, float32 on CPU",
    )
    p.add_argument(
        "--device",
        default=None,
        help="where kernels are compiled and calibration runs: cuda[:N] or cpu (default: cuda if present)",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=default.max_batch_size,
        help="requests served at once (GDN state slots)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=default.max_seq_len,
        help="the context: prompt + output hold at most this - 1 tokens",
    )
    p.add_argument(
        "--max-draft-depth",
        type=int,
        default=default.max_draft_depth,
        help="draft tokens on a tree's longest path (compiled into the kernels)",
    )
    p.add_argument(
        "--max-draft-nodes",
        type=int,
        default=default.max_draft_nodes,
        help="draft tokens per request and step (63 + the pending token: one 64-node verify tile)",
    )
    cal = p.add_argument_group("budget calibration (BOLE.md §5)")
    cal.add_argument(
        "--calibrate",
        action="store_true",
        help="measure verify vs decode latency on this device and ship the budget table",
    )
    cal.add_argument(
        "--epsilon",
        type=float,
        default=DEFAULT_EPSILON,
        help="a verify may cost up to (1 + epsilon) x a decode step (the engine serves at it unless "
        "BoleConfig(epsilon=...) says otherwise)",
    )
    cal.add_argument(
        "--calibration-batches",
        type=_ints,
        default=DEFAULT_BATCH_BUCKETS,
        metavar="B,B,...",
        help="batch-size buckets (those past --max-batch-size become --max-batch-size)",
    )
    cal.add_argument(
        "--calibration-kv-lens",
        type=_ints,
        default=DEFAULT_KV_BUCKETS,
        metavar="KV,KV,...",
        help="committed KV-length buckets (those past --max-seq-len - 1 become --max-seq-len - 1)",
    )
    cal.add_argument(
        "--calibration-capacities",
        type=_ints,
        default=DEFAULT_CAPACITIES,
        metavar="N,N,...",
        help="tree-token capacities to time (total across the batch; capped at --max-batch-size x "
        "(--max-draft-nodes + 1))",
    )
    cal.add_argument(
        "--calibration-repeats", type=int, default=5, help="timed repeats per point (median kept)"
    )
    cal.add_argument("--calibration-warmup", type=int, default=2, help="untimed runs before each point")
    p.add_argument(
        "--tensorrt",
        action="store_true",
        help="also build a TensorRT plan (bole.plan) with the bole:: plugins; needs the full "
        "`tensorrt` package (see plugins/README.md)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the engine already at --output: a different one, or the same one rebuilt "
        "(to recalibrate it, say)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p  # fmt: skip


CALIBRATION_FLAGS = (
    "epsilon", "calibration_batches", "calibration_kv_lens", "calibration_capacities", "calibration_repeats",
    "calibration_warmup",
)  # fmt: skip


def _calibration(cli: argparse.ArgumentParser, args: argparse.Namespace) -> CalibrationSettings:
    """The calibration settings of the flags; a bad value is a usage error."""
    from trtllm_bole.spec.calibration import CalibrationSettings, TimingSettings

    try:
        return CalibrationSettings(
            epsilon=args.epsilon,
            capacities=args.calibration_capacities,
            batch_buckets=args.calibration_batches,
            kv_buckets=args.calibration_kv_lens,
            # The timed trees' depth is the engine's: build_engine sets it from the checked settings.
            timing=TimingSettings(warmup=args.calibration_warmup, repeats=args.calibration_repeats),
        )
    except ValueError as e:
        cli.error(str(e))


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the build, which removes its staging folder


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    ignored = [
        f"--{name.replace('_', '-')}"
        for name in CALIBRATION_FLAGS
        if getattr(args, name) != cli.get_default(name)
    ]
    if ignored and not args.calibrate:
        cli.error(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} only with --calibrate")
    signal.signal(signal.SIGTERM, _stop)  # timeout, docker stop, a cancelled CI job: clean up as Ctrl-C
    import torch

    from trtllm_bole.config import check_device
    from trtllm_bole.engine import BuildSettings, build_engine
    from trtllm_bole.engine.build import BuildStepError
    from trtllm_bole.engine.format import environment
    from trtllm_bole.llm import DEFAULT_MODEL

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:  # a flag's value out of range is a usage error, as a malformed one is (exit 2)
        check_device(device)
        settings = BuildSettings(
            args.dtype, args.max_batch_size, args.max_seq_len, args.max_draft_depth, args.max_draft_nodes
        ).validated(device)
    except ValueError as e:
        cli.error(str(e))
    checkpoint = args.checkpoint or DEFAULT_MODEL
    output = args.output or default_output(checkpoint, environment(device)["arch"])
    plan_builder = None
    if args.tensorrt:
        sys.path.insert(0, str(ROOT))
        from plugins.network import build_plan, check_plugin_arch, require_tensorrt

        try:
            check_plugin_arch(environment(device)["arch"])  # before the build writes or times anything
            require_tensorrt()
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        plan_builder = build_plan
    calibration = None
    if args.calibrate:
        calibration = _calibration(cli, args)
    start = time.perf_counter()
    try:
        path, built = build_engine(
            checkpoint, output, settings, device=device, calibration=calibration,
            plan_builder=plan_builder, force=args.force, progress=not args.quiet,
        )  # fmt: skip
    except (ValueError, OSError, BuildStepError) as e:  # bad inputs, an unwritable output, a failed step
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # The swap is one rename: the output holds the engine it held, or, interrupted at the very end,
        # this build's whole (a Ctrl-C while the replaced one was deleted came after the swap).
        print("interrupted: no engine was half-written", file=sys.stderr)
        return 130
    config = json.loads((path / "config.json").read_text())
    summary = {
        "engine": str(path),
        "built": built,
        "seconds": round(time.perf_counter() - start, 2),
        "arch": config["environment"]["arch"],
        "dtype": config["build"]["dtype"],
        "kernels_compiled": config["kernels"]["compiled"],
        "budget": config["budget"]
        and {"file": config["budget"]["file"], "gpu_seconds": config["budget"]["gpu_seconds"]},
        "tensorrt_plan": bool(config.get("tensorrt")),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
