import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_command_verifies_exactly():
    out = subprocess.run(
        [sys.executable, "-m", "trtllm_bole", "demo"], capture_output=True, text=True, check=True
    ).stdout
    assert "EXACT (<= 1e-10)" in out


def test_demo_reports_a_nan_commit_as_a_mismatch(monkeypatch, capsys):
    """``max(1e-17, nan)`` is 1e-17: a commit that wrote NaN once printed EXACT and exited 0."""
    from trtllm_bole import __main__, ops

    real_commit = ops.gdn_commit

    def nan_commit(state, *args, **kwargs):
        real_commit(state, *args, **kwargs)
        state.fill_(float("nan"))

    monkeypatch.setattr(ops, "gdn_commit", nan_commit)
    assert __main__.main(["demo"]) == 1
    assert "MISMATCH: outputs" in capsys.readouterr().out


def test_demo_refuses_a_seed_past_the_generators_range():
    """2**64 was torch's "Overflow when unpacking long long" traceback."""
    done = subprocess.run([sys.executable, "-m", "trtllm_bole", "demo", "--seed", str(2**64)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "outside a seed's range" in done.stderr and "Traceback" not in done.stderr


def test_memory_table_writes_json(tmp_path):
    target = tmp_path / "m.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_table.py"), "--json", str(target)],
        check=True,
        capture_output=True,
    )
    rows = json.loads(target.read_text())["rows"]
    nine_b_100 = next(r for r in rows if r["model"] == "qwen3.5-9b" and r["tree_size"] == 100)
    # 100 nodes x 24 GDN layers x 32 heads x 128 x 128 fp32 = 5.03e9 bytes (paper: 4.7 GiB)
    assert nine_b_100["snapshots"] == 100 * 24 * 32 * 128 * 128 * 4
    assert nine_b_100["ratio"] > 60


def test_generate_help_shows_defaults_but_not_unset_ones():
    command = [sys.executable, "-m", "trtllm_bole", "generate", "--help"]
    out = " ".join(subprocess.run(command, capture_output=True, text=True, check=True).stdout.split())
    assert "(default: 96)" in out and "(default: bole)" in out  # --max-tokens, --mode
    assert "(default: None)" not in out and "(unset: 4)" in out  # --branching says what unset means


def test_bad_generate_settings_end_in_one_error_line():
    """A value out of range is the user's to fix: one line naming its flag (not the settings' field: top_k
    is --branching in one and --top-k in the other), exit code 2, before any loading."""
    cases = [  # (flags, what the error line says)
        (["--depth", "20"], "error: --depth: "),
        (["--max-tokens", "0"], "error: --max-tokens: "),
        (["--branching", "0"], "error: --branching: "),
        (["--top-k", "-3"], "error: --top-k: "),
        (["--model", "/nonexistent"], "is not a directory"),
        (["--max-nodes", "0"], "error: --max-nodes: "),  # not a second line for the depth it defaults
        (["--max-nodes", "3", "--depth", "5"], "error: --max-nodes (3) must be at least --depth (5)"),  # both
        # A draft flag its mode does not use (a chain of 8 drafted 8 a step with --max-nodes 2, silently).
        # Given at all, even at its default (--depth 8 in ar drafted nothing, silently).
        (["--mode", "chain", "--max-nodes", "2"], "error: --mode chain does not use --max-nodes: a chain"),
        (["--mode", "chain", "--branching", "4", "--depth", "3"], "does not use --branching: a chain drafts"),
        (["--mode", "ar", "--depth", "8", "--max-nodes", "63"], "use --depth or --max-nodes: it drafts"),
    ]
    for flags, words in cases:
        done = subprocess.run(
            [sys.executable, "-m", "trtllm_bole", "generate", *flags], capture_output=True, text=True
        )
        assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
        assert words in done.stderr and "default factory" not in done.stderr, done.stderr  # pydantic's echo


def test_sampling_flags_under_greedy_decoding_are_refused(capsys):
    """--top-k, --top-p and --seed shape sampling only: without a --temperature they decoded greedily,
    silently (a flag for nothing, as a draft flag its mode does not use)."""
    import trtllm_bole.__main__ as cli

    cases = [
        (
            ["--top-k", "5"],
            "error: --temperature 0 decodes greedily, which uses no --top-k: give a --temperature",
        ),
        (["--seed", "1", "--top-p", "0.9", "--mode", "ar"], "which uses no --top-p or --seed: give"),
    ]
    for flags, words in cases:
        assert cli.main(["generate", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and err.count("\n") == 1, err
    assert (
        cli.main(["generate", "--top-p", "1", "--max-tokens", "1", "--mode", "ar"]) == 0
    )  # at its default: off


def test_an_empty_prompt_is_refused_in_one_line_before_loading(capsys):
    """It was the request's error: the model loaded, a blank line, "error: empty prompt", exit 1."""
    import trtllm_bole.__main__ as cli

    assert cli.main(["generate", "--prompt", ""]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: --prompt is empty: give it text to continue\n")


def test_cuda_without_a_gpu_is_refused_by_name():
    import pytest
    import torch

    from trtllm_bole import LLM

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="sees no CUDA GPU; use device='cpu'"):
        LLM(device="cuda")


def test_generate_refuses_what_it_cannot_serve_in_one_line(tmp_path):
    """A text prompt for a checkpoint without a tokenizer, a bad device, malformed ids or ones outside the
    vocabulary: before streaming (ids past the vocabulary were the request's error, exit 1 after a blank
    line)."""
    import shutil

    from trtllm_bole.llm import DEFAULT_MODEL

    checkpoint = shutil.copytree(
        DEFAULT_MODEL, tmp_path / "ckpt", ignore=shutil.ignore_patterns("tokenizer*")
    )
    cases = [
        (["--model", str(checkpoint)], "has no tokenizer.json"),
        (["--device", "tpu"], "device must be 'cpu', 'cuda' or 'cuda:N'"),
        (["--prompt-ids", "1,,2"], "--prompt-ids takes comma-separated integers"),
        (["--prompt-ids=-1"], "--prompt-ids takes token ids (>= 0), got [-1]"),  # was exit 1, after loading
        (
            ["--prompt-ids", "1,8192"],
            "the prompt's token ids [8192] are outside the model's vocabulary [0, 8192)",
        ),
        (["--prompt", "a", "--prompt-ids", "1"], "--prompt-ids: not allowed with argument --prompt"),
    ]
    for args, words in cases:
        done = subprocess.run(
            [sys.executable, "-m", "trtllm_bole", "generate", *args], capture_output=True, text=True
        )
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stdout == ""


def test_generate_counts_a_prompt_prefilled_in_pieces_as_its_forwards():
    """Its summary line counts the target forwards: a 10-token prompt under a bound of 4 takes three
    prefills, then plain decoding one step per token after the first."""
    prompt = ",".join(str(t) for t in range(1, 11))
    done = subprocess.run(
        [sys.executable, "-m", "trtllm_bole", "generate", "--prompt-ids", prompt, "--mode", "ar",
         "--max-tokens", "3", "--max-prefill-tokens", "4"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "target forwards 5 (prefill 3 + 2 steps)" in done.stderr, done.stderr


def test_generate_serves_a_prompt_beyond_the_default_context_with_max_seq_len():
    """The default context (1,024) refuses a 1,100-token prompt before anything streams, naming the flag
    that raises it, up to the model's 4,096 positions (the command had none, so no such prompt could be
    served; then the refusal came after the prompt was printed, in the API's words)."""
    command = [sys.executable, "-m", "trtllm_bole", "generate", "--prompt-ids", ",".join(["1"] * 1100),
               "--mode", "ar", "--max-tokens", "2"]  # fmt: skip
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout[-300:]
    assert refused.stderr.splitlines()[-1] == (
        "error: the prompt holds 1100 tokens, and --max-seq-len 1024 allows prompts of at most 1022: "
        "raise it (the model has 4096 positions)"
    )
    served = subprocess.run([*command, "--max-seq-len", "1200"], capture_output=True, text=True)
    assert served.returncode == 0 and "finish: length" in served.stderr, served.stderr
    beyond = subprocess.run([*command, "--max-seq-len", "4097"], capture_output=True, text=True).stderr
    assert beyond.startswith("error: max_seq_len 4097 exceeds") and beyond.count("\n") == 1, beyond


def test_generate_into_a_closed_pipe_stops_quietly():
    done = subprocess.run(
        f"{sys.executable} -m trtllm_bole generate --max-tokens 64 | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert len(done.stdout) == 10 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_ctrl_c_while_the_model_loads_is_a_quiet_exit(monkeypatch, capsys):
    """Ctrl-C while an engine is hashed or a model loads was a KeyboardInterrupt traceback (only streaming
    caught it)."""
    import trtllm_bole.__main__ as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_setup", interrupted)
    assert cli.main(["generate"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
