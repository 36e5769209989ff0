"""Command line: ``python -m trtllm_bole <command>`` (``generate``, ``demo``)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from trtllm_bole.cli_help import HelpWithDefaults
from trtllm_bole.spec.scheduler import MAX_PREFILL_TOKENS

if TYPE_CHECKING:
    from trtllm_bole import LLM, SamplingParams

DEFAULT_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def _generate(args: argparse.Namespace) -> int:
    """Bad settings end in one ``error:`` line (exit 2) before any weight is loaded where they can."""
    try:
        try:
            llm, prompt, params = _setup(args)
        except ValueError as e:  # a pydantic ValidationError is one too
            print(f"error: {_one_line(e)}", file=sys.stderr)
            return 2
        return _stream(args, llm, prompt, params)
    except KeyboardInterrupt:  # while loading or streaming
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        sys.stdout = None  # nothing more to flush into the closed pipe at exit
        return 141


# Each settings model's fields as the flags that set them (top_k: --branching in one, --top-k in the other).
FLAGS = {
    "BoleConfig": {"mode": "--mode", "top_k": "--branching", "max_depth": "--depth",
                   "max_nodes": "--max-nodes"},
    "SamplingParams": {"max_tokens": "--max-tokens", "temperature": "--temperature", "top_k": "--top-k",
                       "top_p": "--top-p", "seed": "--seed"},
}  # fmt: skip


def _one_line(e: ValueError) -> str:
    from pydantic import ValidationError

    from trtllm_bole.config import one_line

    return one_line(e, FLAGS.get(e.title, {})) if isinstance(e, ValidationError) else str(e)


def _setup(args: argparse.Namespace) -> tuple[LLM, str | list[int], SamplingParams]:
    from trtllm_bole import LLM, BoleConfig, SamplingParams
    from trtllm_bole.config import unused_drafts
    from trtllm_bole.spec.executor import outside_vocabulary

    drafts = {"top_k": args.branching, "max_depth": args.depth, "max_nodes": args.max_nodes}
    unused, why = unused_drafts(args.mode, [name for name, value in drafts.items() if value is not None])
    if unused:  # given at all, not only off its default (BoleConfig's rule): a flag for nothing is a mistake
        flags = " or ".join(FLAGS["BoleConfig"][name] for name in unused)
        raise ValueError(f"--mode {args.mode} does not use {flags}: {why}")
    bole = BoleConfig(mode=args.mode, **{name: v for name, v in drafts.items() if v is not None})
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed,
    )  # fmt: skip
    fields = SamplingParams.model_fields  # those of sampling alone, given off their defaults:
    off = [name for name in ("top_k", "top_p", "seed") if getattr(params, name) != fields[name].default]
    if params.temperature == 0 and off:  # greedy decoding (--top-k 5 had decoded greedily, silently)
        flags = " or ".join(FLAGS["SamplingParams"][name] for name in off)
        raise ValueError(
            f"--temperature 0 decodes greedily, which uses no {flags}: give a --temperature to sample"
        )
    prompt = args.prompt
    if not prompt and args.prompt_ids is None:  # it was "empty prompt", exit 1, after loading the model
        raise ValueError("--prompt is empty: give it text to continue")
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            raise ValueError(f"--prompt-ids takes comma-separated integers: {args.prompt_ids!r}") from None
        if negative := [t for t in prompt if t < 0]:
            raise ValueError(f"--prompt-ids takes token ids (>= 0), got {negative[:5]}")
    llm = LLM(args.model, speculative_config=bole, device=args.device, dtype=args.dtype,
              max_seq_len=args.max_seq_len, max_prefill_tokens=args.max_prefill_tokens)  # fmt: skip
    ids = llm.encode(prompt)  # a text prompt needs the model's tokenizer: say so before anything streams
    vocab = llm.model.config.vocab_size
    if outside := outside_vocabulary(ids, vocab):  # else the request's error, exit 1 after loading
        raise ValueError(
            f"the prompt's token ids {outside[:5]} are outside the model's vocabulary [0, {vocab})"
        )
    scheduler, positions = llm.executor.scheduler, llm.model.config.max_position_embeddings
    if len(ids) > scheduler.prompt_limit:
        # An engine's own limit (no --max-seq-len given): only a rebuild raises it.
        if llm.engine is not None and args.max_seq_len is None:
            limit, remedy = "the engine's max_seq_len", "rebuild the engine with a larger --max-seq-len"
        else:
            limit, remedy = "--max-seq-len", "raise it"
        raise ValueError(
            f"the prompt holds {len(ids)} tokens, and {limit} {scheduler.max_seq_len} allows prompts of at "
            f"most {scheduler.prompt_limit}: {remedy} (the model has {positions} positions)"
        )
    return llm, prompt, params


def _stream(args: argparse.Namespace, llm: LLM, prompt: str | list[int], params: SamplingParams) -> int:
    if isinstance(prompt, str):
        sys.stdout.write(prompt)
    last = None
    for last in llm.generate_stream(prompt, params):
        delta = last.outputs[0]
        sys.stdout.write(delta.text if llm.tokenizer else f"{delta.token_ids} ")
        sys.stdout.flush()
    if last is None or last.error:
        print(f"\nerror: {last.error if last else 'no output'}", file=sys.stderr)
        return 1
    s = last.stats
    forwards = (
        f"target forwards {s.prefills + s.steps} (prefill {s.prefills} + {s.steps} "
        f"step{'' if s.steps == 1 else 's'})"
    )
    print(
        f"\n\n[{args.mode}] finish: {last.outputs[0].finish_reason}; {forwards}; "
        f"drafted {s.drafted}, accepted by verification {s.accepted} (rate {s.acceptance_rate:.2f}; the last "
        f"step's may run past --max-tokens or a stop); mean accepted tokens per step "
        f"{s.mean_accepted_tokens:.2f}",
        file=sys.stderr,
    )
    return 0


def _seed(text: str) -> int:
    """An argparse type: a torch generator's seed, in [-2**63, 2**64) (past it, a traceback from torch)."""
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{value} is outside a seed's range [-2**63, 2**64)")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_bole", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="stream a continuation (default: the embedded model, on CPU)",
        formatter_class=HelpWithDefaults,
    )  # fmt: skip
    gen.add_argument("--model", default=None, help="checkpoint or engine dir (default: the embedded model)")
    prompt = gen.add_mutually_exclusive_group()  # both given: --prompt had been dropped without a word
    prompt.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to continue")
    prompt.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of --prompt")
    gen.add_argument(
        "--mode", choices=["ar", "chain", "tree-serial", "bole"], default="bole",
        help="plain decoding, a drafted chain, or a drafted tree verified node by node or in closed form",
    )  # fmt: skip
    gen.add_argument("--branching", type=int, default=None, help="draft tree top-k (unset: 4)")
    gen.add_argument(
        "--depth",
        type=int,
        default=None,
        help="draft tree depth (unset: the engine's, else 8; --max-nodes where fewer)",
    )
    gen.add_argument(
        "--max-nodes", type=int, default=None,
        help="draft tokens per step (unset: the engine's, else 63; +1 pending: 64)",
    )  # fmt: skip
    gen.add_argument("--max-tokens", type=int, default=96, help="tokens to generate at most")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0: off")
    gen.add_argument("--top-p", type=float, default=1.0, help="1: off")
    gen.add_argument(
        "--seed", type=int, default=None, help="a sampled request's seed (unset: a fresh draw each run)"
    )
    gen.add_argument(
        "--max-seq-len", type=int, default=None,
        help="the context: prompt + output hold at most this - 1 tokens (unset: the engine's, else 1024)",
    )  # fmt: skip
    gen.add_argument(
        "--max-prefill-tokens", type=int, default=MAX_PREFILL_TOKENS,
        help="prompt tokens a target forward prefills at most (a longer prompt takes several)",
    )  # fmt: skip
    gen.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    gen.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
        help="auto: float32 on CPU, bfloat16 on CUDA",
    )  # fmt: skip

    demo = commands.add_parser("demo", help="verify a demo draft forest through the exact core (CPU)")
    demo.add_argument("--seed", type=_seed, default=0, help="the demo's inputs (default: 0)")

    args = parser.parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    from trtllm_bole.demo import run_demo

    return 0 if run_demo(args.seed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
