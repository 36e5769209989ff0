"""Command line: ``python -m trtllm_bole <command>``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_bole", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="verify a demo draft forest through the exact core (CPU)")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from trtllm_bole.demo import run_demo

        return 0 if run_demo(args.seed) <= 1e-10 else 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
