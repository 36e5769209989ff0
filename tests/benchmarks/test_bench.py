"""The trtllm-bench-style tools run end to end on a tiny checkpoint and check exactness inside."""

import itertools
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck")
    subprocess.run([sys.executable, str(ROOT / "build_scripts" / "make_checkpoint.py"), "--out", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    return out


def test_prepare_dataset_modes(tmp_path):
    for mode, extra in (
        ("token-norm-dist", ["--input-mean", "20", "--input-stdev", "4", "--output-mean", "6",
                             "--vocab-size", "99"]),
        ("token-unif-dist", ["--input-min", "3", "--input-max", "9", "--output-min", "2", "--output-max", "5",
                             "--vocab-size", "99"]),
        ("code", ["--output-tokens", "7"]),
    ):  # fmt: skip
        out = tmp_path / f"{mode}.jsonl"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "prepare_dataset.py"), "--out", str(out), mode,
               "--num-requests", "5", *extra]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["task_id"] for r in rows] == list(range(5))
        assert all(("input_ids" in r) != ("prompt" in r) and r["output_tokens"] >= 1 for r in rows)
        if mode != "code":
            assert all(max(r["input_ids"]) < 99 for r in rows)


def test_throughput_bench_reports_and_checks_exactness(tmp_path, checkpoint):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 7, 9], "output_tokens": 5}) + "\n"
                            for i in range(4)))  # fmt: skip
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "throughput", "--dataset", str(data),
           "--engine", str(checkpoint), "--modes", "ar,bole", "--batch-sizes", "2", "--depth", "3",
           "--max-nodes", "6", "--warmup", "1", "--repeats", "3", "--out", str(tmp_path),
           "--tag", "t"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads((tmp_path / "bench_throughput_cpu_t.json").read_text())  # the device, then the tag
    assert result["all_identical_to_ar"]
    (ar, bole) = result["runs"]
    assert ar["mode"] == "ar" and bole["mode"] == "bole" and bole["output_tokens"] == 20
    trials = bole["output_tokens_per_s_trials"]
    assert len(trials) == 3 and bole["output_tokens_per_s"] == sorted(trials)[1]
    assert bole["ttft_ms"]["p50"] > 0 and "speedup_vs_ar" in bole
    assert result["warmup_tokens"] == 1 and result["repeats"] == 3  # the settings, not only the command


def test_acceptance_eval_checks_every_shape_against_plain_decoding(tmp_path):
    """Also a floor under the MAT curve: 4 drafts of a top-4 tree accept more than 2 tokens a step only
    when the selection reaches past the root's children; ranking those first without a budget (session
    43's fairness floor, FL6) held the embedded model at MAT 2.0 or less there, and no test saw it."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "eval_acceptance.py"), "--prompts", "2",
           "--max-tokens", "16", "--curve", "4", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads((tmp_path / "acceptance_cpu.json").read_text())
    assert result["dtype"] == "float32" and result["prompts"] == 2  # what auto resolved to
    assert all(r["identical_to_ar"] for r in result["rows"]) and len(result["rows"]) == 7
    assert all(r["mean_accepted_tokens"] >= 1.0 for r in result["rows"])
    assert set(result["mat_by_draft_tokens"]) == {"4"} and result["mat_curve_withheld"] == {}
    assert result["mat_by_draft_tokens"]["4"] > 2.0  # 2.73 at 5b83cfa


def test_the_medians_leave_out_rounds_in_which_a_mode_captured_graphs_or_compiled():
    """The modes share the target's CUDA graphs, so the first mode to meet a shape captured it inside a
    timed trial, ``ar``'s and the baselines' (the H200's end-to-end table at 9f9154f: ar 2 captures at
    batch 1, chain 4-10, bole none): those trials slowed the baselines' medians only. A round is left out
    for every mode alike."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import clean_rounds, median_trial

    def trial(speed, captures=0, compiles=0):
        return {"output_tokens_per_s": speed, "graph_captures": captures, "kernel_compiles": {"k": compiles},
                "_outputs": [[1]]}  # fmt: skip

    trials = {"ar": [trial(50.0, captures=2), trial(90.0), trial(80.0), trial(85.0)],
              "bole": [trial(200.0), trial(150.0), trial(190.0, compiles=1), trial(170.0)]}  # fmt: skip
    assert clean_rounds(trials) == [1, 3]
    ar, outputs = median_trial(trials["ar"], [1, 3])
    assert ar["output_tokens_per_s"] == 85.0 and ar["median_of_trials"] == [1, 3] and outputs == [[[1]]] * 4
    assert (
        ar["output_tokens_per_s_trials"] == [50.0, 90.0, 80.0, 85.0] and ar["graph_captures_trials"][0] == 2
    )
    assert median_trial(trials["bole"], [1, 3])[0]["output_tokens_per_s"] == 150.0
    dirty = {"ar": [trial(1.0, captures=1)], "bole": [trial(2.0)]}
    assert clean_rounds(dirty) == [0]  # none clean: every round


def test_a_speedup_needs_every_token_equal_to_plain_decoding():
    """A run parting from ``ar`` at near-ties only had its speed-up reported (two float32 H200 runs)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import add_speedups

    def row(mode, speed, identical=True, near=True):
        return {"mode": mode, "max_batch_size": 2, "output_tokens_per_s": speed, "identical_to_ar": identical,
                "exact_up_to_near_ties": near}  # fmt: skip

    runs = [row("ar", 100.0), row("bole", 250.0), row("chain", 180.0, identical=False),
            row("tree-serial", 190.0, identical=False, near=False)]  # fmt: skip
    add_speedups(runs)
    assert [r["speedup_vs_ar"] for r in runs] == [1.0, 2.5, None, None]
    assert runs[2]["error"] == "greedy output parts from ar (at near-ties only): no speed-up reported"
    assert runs[3]["error"] == "greedy output parts from ar (beyond near-ties): no speed-up reported"


def test_no_speedup_over_an_ar_whose_own_trials_decoded_differently():
    """``ar``'s first trial is the reference; where its other trials decoded other tokens, ``ar`` got no
    speed-up but every mode equal to that first trial was still given one over ``ar``'s median trial."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import add_speedups

    def row(mode, speed, identical):
        return {"mode": mode, "max_batch_size": 4, "output_tokens_per_s": speed, "identical_to_ar": identical,
                "exact_up_to_near_ties": identical}  # fmt: skip

    runs = [row("ar", 100.0, False), row("bole", 250.0, True)]
    add_speedups(runs)
    assert [r["speedup_vs_ar"] for r in runs] == [None, None]
    assert runs[1]["error"] == "ar's own trials decoded differently: no reference, no speed-up reported"


def test_acceptance_eval_of_one_token_takes_no_step():
    """``--max-tokens 1`` passed the check, then divided by zero steps (the prompt's prefill makes it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from eval_acceptance import run

    from trtllm_bole import LLM

    outputs, stats, _ = run(LLM(max_batch_size=2, max_seq_len=64), ["def f(x):", "import os"], 1)
    assert [len(o) for o in outputs] == [1, 1] and stats["steps"] == 0
    assert stats["mean_accepted_tokens"] == 1.0


def test_divergence_names_the_first_differing_token():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import divergence

    assert divergence([[1, 2, 3], [4, 5], [6]], [[1, 2, 9], [4, 5], [6, 7]]) == {
        "requests_differing": 2, "requests": 3, "first_differing_token": 1, "request": 2, "ar_token": 7,
        "token": None,
    }  # fmt: skip
    assert divergence([[1, 2, 3]], [[1, 2, 9]])["ar_token"] == 9


def test_parting_tells_a_near_tie_from_an_error(monkeypatch):
    """A parting is a near-tie only between the target's top two tokens, within NEAR_TIE_LOGITS."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    from trtllm_bole import LLM, SamplingParams

    llm = LLM(max_batch_size=1, max_seq_len=64)
    prompt = llm.encode("def f(x):")
    out = llm.generate([prompt], SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids
    logits = llm.model.forward_sequences(torch.tensor([prompt + out[:1]]))[1][0, -1]
    first, second, third = logits.topk(3).indices.tolist()
    assert out[1] == first
    gap = float(logits[first] - logits[second])
    runner_up = bench.parting(llm, prompt, out, 1, second)
    assert runner_up["logit_gap_ar_minus_mode"] == pytest.approx(gap) and gap > 0
    assert runner_up["near_tie"] == (gap <= bench.NEAR_TIE_LOGITS)
    monkeypatch.setattr(bench, "NEAR_TIE_LOGITS", gap * 1.01)
    assert bench.parting(llm, prompt, out, 1, second)["near_tie"]
    assert not bench.parting(llm, prompt, out, 1, third)["near_tie"]  # not among the top two
    assert not bench.parting(llm, prompt, out, 3, None)["near_tie"]  # a lost token
    result = {}
    bench.check_against_ar(llm, [(prompt, 3)], result, [[[out[0], second, 5]]], [out])
    assert result["partings"] == [{"request": 0} | bench.parting(llm, prompt, out, 1, second)]
    assert result["exact_up_to_near_ties"] and not result["identical_to_ar"]


def test_kernel_bench_focus_pass_checks_before_timing(tmp_path):
    """The focused H200 pass at smoke size (Triton's interpreter): every kernel variant it times first
    passes its float64 check, and the grid, depth probe and summary are written."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gdn_verify.py"), "--smoke", "--focus", "headline",
           "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert not (tmp_path / "gdn_verify_h200_focus.json").exists()  # a smoke run never takes the GPU's name
    assert not (tmp_path / "gdn_verify_smoke.json").exists()  # nor the full run's file
    result = json.loads((tmp_path / "gdn_verify_smoke_focus.json").read_text())
    assert result["errors"] == []
    assert result["checks"] and all(c["ok"] for c in result["checks"] if c["what"].startswith("bole"))
    assert {p["tree_size"] for p in result["grid"]} >= {8, 20} and result["depth"]
    assert all(p["input_sets"]["bole"] >= p["input_sets"]["baselines"] >= 1 for p in result["grid"])
    timed = {name for p in result["grid"] for name in p.get("bole_candidates_us", {})}
    checked = {c["what"].split(" HV=")[0].removeprefix("bole ") for c in result["checks"] if c["ok"]}
    assert timed and timed <= checked


def test_kernel_bench_full_pass_at_smoke_size(tmp_path):
    """Every section of the full H200 pass (commit, memory, chains, conv among them) runs at smoke size
    in Triton's interpreter and exits 0; the commit's times each follow their passing check."""
    script = ROOT / "benchmarks" / "bench_gdn_verify.py"
    cmd = [sys.executable, str(script), "--smoke", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "TRITON_INTERPRET": "1"})
    result = json.loads((tmp_path / "gdn_verify_smoke.json").read_text())
    assert result["errors"] == [] and all(c["ok"] for c in result["checks"])
    checked = {c["what"] for c in result["checks"]}
    assert {"gdn_commit None", "conv_state_commit"} <= checked
    (commit,) = result["commit"]
    assert {"bole_us", "bole_half_accepted_us", "conv_commit_us"} <= set(commit)
    assert result["memory"] and result["chains"] and result["conv"]


def test_kernel_bench_exits_1_when_a_check_fails(tmp_path, monkeypatch):
    """A verify that returns zeros: every Bole check fails, nothing of Bole's is timed or compared, and
    the run exits 1 (it exited 0, so a runner saw success)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_gdn_verify

    import trtllm_bole.kernels.gdn_tree_verify as verify

    def zeros(q, k, v, *args, **kwargs):
        n, hv, dv = v.shape
        return torch.zeros_like(v), torch.zeros(n, hv, dv), torch.zeros(n, hv)

    monkeypatch.setattr(verify, "gdn_tree_verify", zeros)
    assert bench_gdn_verify.main(["--smoke", "--focus", "headline", "--out", str(tmp_path)]) == 1
    result = json.loads((tmp_path / "gdn_verify_smoke_focus.json").read_text())
    assert not any(c["ok"] for c in result["checks"] if c["what"].startswith("bole"))
    assert result["summary"]["speedup_table_T64"] == [] and not any("bole_us" in p for p in result["grid"])


def test_kernel_bench_commit_check_compares_a_committed_state_at_batch_1(tmp_path, monkeypatch):
    """At batch 1 the commit check made its one request reject and compared no state: the relative RMS of
    nothing was 0, so a commit that wrote nothing passed and was timed."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _bench_util
    import _sections
    import bench_gdn_verify

    import trtllm_bole.kernels.gdn_commit as commit

    monkeypatch.setattr(commit, "gdn_commit", lambda state, factors, leaf, config=None: None)
    args = argparse.Namespace(
        quick=False, focus=None, timing=None, smoke=True, budget_s=60.0, out=str(tmp_path), seed=0,
        no_warm=True, warm_workers=0, plot_only=None,
    )  # fmt: skip
    bench = bench_gdn_verify.Bench(args)
    row = _sections._commit_batch(bench, 1)
    check = next(c for c in bench.r["checks"] if c["what"].startswith("gdn_commit"))
    assert not check["ok"] and check["state"] > 0.5
    assert "bole_us" not in row and "bole_half_accepted_us" not in row
    assert math.isnan(_bench_util.rel_rms(torch.empty(0), torch.empty(0)))  # nothing compared never passes


def test_prefill_bench_check_fails_on_nan_states(monkeypatch):
    """A scheme with the right outputs and NaN final states fails the float64 check (max() and > let the
    NaN through: it passed)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_prefill

    from trtllm_bole.reference import gdn_tree
    from trtllm_bole.tree import TreeBatch

    def schemes(lengths, device):
        chains = TreeBatch.chains(lengths, device=device)

        def exact(q, k, v, g, beta, state, scale):
            exact = (t.double() for t in (q, k, v, g, beta, state))
            o, states = gdn_tree.serial_tree_recurrence(*exact, chains, scale=scale)
            state.copy_(states[chains.cu_seqlens[1:] - 1])
            return o.to(v.dtype)

        def nan_states(*args):
            o = exact(*args)
            args[5].fill_(float("nan"))
            return o

        return {"one-launch": exact, "rounds": nan_states}

    monkeypatch.setattr(bench_prefill, "schemes", schemes)
    errors = bench_prefill.check_against_float64(bench_prefill.DIMS["embedded"], torch.float32, "cpu")
    assert errors["one-launch"]["state"] < 1e-6 and math.isnan(errors["rounds"]["state"])
    assert not bench_prefill.within_tolerance(errors, torch.float32)
    assert bench_prefill.within_tolerance({"one-launch": errors["one-launch"]}, torch.float32)


def tiny_dataset(tmp_path: Path) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "input_ids": [5 + i, 7, 9], "output_tokens": 6}) + "\n"
                            for i in range(2)))  # fmt: skip
    return data


def test_profile_host_ranks_the_executor_step(tmp_path, checkpoint):
    data = tiny_dataset(tmp_path)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_host.py"), "--dataset", str(data),
           "--engine", str(checkpoint), "--modes", "ar,bole", "--batch-sizes", "2", "--top", "200",
           "--callees", "_prefill_round", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    report = (tmp_path / "profile_host_cpu.txt").read_text()
    assert "===== ar batch 2" in report and "===== bole batch 2" in report
    assert "executor.py" in report and "(step)" in report and "(draft)" in report
    callees = report.split("restriction <'_prefill_round'>")
    assert len(callees) == 3 and all("(_prefill_batch)" in c for c in callees[1:])  # per run, its callees


def test_profile_step_times_every_phase_of_a_step(tmp_path, checkpoint):
    data = tiny_dataset(tmp_path)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--dataset", str(data),
           "--engine", str(checkpoint), "--modes", "ar,tree-serial,bole", "--batch-sizes", "2",
           "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads((tmp_path / "profile_step_cpu.json").read_text())
    assert [r["mode"] for r in result["runs"]] == ["ar", "tree-serial", "bole"]
    assert all(r["identical_to_ar"] is True and "_outputs" not in r for r in result["runs"])
    for r in result["runs"][1:]:
        assert r["steps"] > 0 and r["seconds_synchronised"] > 0
        phases = {"prefill", "draft", "select", "verify", "accept", "commit", "mtp_follow", "outcome"}
        assert set(r["ms_per_step"]) == phases  # on the CPU no graph fuses verify, accept and commit
        assert r["calls"]["verify"] == r["calls"]["accept"] == r["calls"]["commit"] == r["calls"]["draft"]
        assert all(ms > 0 for ms in r["ms_per_step"].values()) and r["outside_phases_s"] >= 0


def test_profile_step_samples_seeded_requests(tmp_path, checkpoint):
    """``--temperature``: sampled requests, seeded by their index, so that the synchronised run draws
    what the free one drew (the profile refuses differing tokens); no comparison with ``ar``'s."""
    data = tiny_dataset(tmp_path)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--dataset", str(data),
           "--engine", str(checkpoint), "--modes", "ar,bole", "--batch-sizes", "2", "--temperature", "0.8",
           "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads((tmp_path / "profile_step_cpu_sampled.json").read_text())
    assert result["temperature"] == 0.8 and [r["mode"] for r in result["runs"]] == ["ar", "bole"]
    assert all(r["identical_to_ar"] is None for r in result["runs"])
    assert result["runs"][1]["calls"]["accept"] == result["runs"][1]["steps"] > 0


def test_copy_ceiling_is_never_graph_timed(monkeypatch):
    """A copy captured in a CUDA graph runs on the copy engine (H200: 2.76 against 4.25 TB/s): the
    roofline's ceiling is timed eagerly whatever timer the kernels use."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _sections

    def graph_timed(fn):
        raise AssertionError("the copy ceiling went through the kernels' (graph) timer")

    def eager(fn):
        fn()
        return 2.0

    monkeypatch.setattr(_sections.U, "timer", lambda cuda, rep_ms: eager)
    monkeypatch.setattr(_sections.U, "graph_timer", lambda rep_ms: graph_timed)
    b = SimpleNamespace(cuda=False, device="cpu", measure=graph_timed, plan={"rep_ms": 1}, r={})
    _sections.copy_bandwidth(b)
    assert b.r["copy_bandwidth"]["time_us"] == 2.0
    assert b.r["copy_bandwidth"]["bytes_per_s"] == 2 * 2**20 / 2e-6


@pytest.fixture(scope="module")
def embedded():
    from trtllm_bole import LLM

    return LLM(max_batch_size=1, max_seq_len=64)


def test_a_bad_dataset_line_is_named_before_any_run(tmp_path, embedded):
    """Every request is checked as it loads: the line and what is wrong, never a traceback from inside a
    timed run or a request silently served short."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    context = embedded.model.config.max_position_embeddings - 1
    ok = json.dumps({"input_ids": [5, 7], "output_tokens": 3})
    text = "x = 1\u2028y = 2\u2029\u0085"  # line separators JSON strings hold unescaped: not line ends
    separated = json.dumps({"prompt": text, "output_tokens": 2}, ensure_ascii=False)
    for lines, message in (
        ([], "holds no requests"),
        ([ok, "{bad json"], "line 2: not JSON"),
        ([separated, "{bad json"], "line 2: not JSON"),
        ([ok, "[1, 2]"], "line 2: expected an object"),
        ([json.dumps({"input_ids": [5]})], "line 1: output_tokens must be an integer of 1 or more, got None"),
        ([json.dumps({"input_ids": [5], "output_tokens": 0})], "got 0"),
        ([json.dumps({"input_ids": [5], "output_tokens": 2.7})], "got 2.7"),
        ([json.dumps({"input_ids": [], "output_tokens": 2})], "line 1: empty prompt"),
        ([json.dumps({"prompt": "", "output_tokens": 2})], "line 1: empty prompt"),
        (
            [json.dumps({"input_ids": "5 7", "output_tokens": 2})],
            "line 1: input_ids must be a list of token ids, got '5 7'",
        ),
        ([json.dumps({"input_ids": [5, 10**9], "output_tokens": 2})], "outside the vocabulary"),
        ([json.dumps({"input_ids": [5] * context, "output_tokens": 1})], "exceed the model's context"),
    ):
        data = tmp_path / "d.jsonl"
        data.write_text("".join(line + "\n" for line in lines))
        with pytest.raises(ValueError, match=message):
            bench.load_dataset(data, embedded)
    data.write_text(ok + "\n\n" + json.dumps({"prompt": "def f(x):", "output_tokens": 2}) + "\n")
    (a, b) = bench.load_dataset(data, embedded)
    assert a == ([5, 7], 3) and b[0] == embedded.encode("def f(x):") and b[1] == 2
    data.write_bytes(f"{separated}\r\n{ok}\r\n".encode())
    assert bench.load_dataset(data, embedded) == [(embedded.encode(text), 2), ([5, 7], 3)]


def test_a_request_at_the_context_limit_is_served_whole(monkeypatch, embedded):
    """The executor's max_seq_len stays within the model's positions: a dataset that fits them is served,
    not refused for the benchmark's own headroom past its longest request."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    monkeypatch.setattr(embedded.model.config, "max_position_embeddings", 48)
    dataset = [([5, 7, 9] * 10, 17)]  # 47 tokens: the context of max_seq_len 48
    assert bench.max_seq_len_for(dataset, embedded) == 48
    result = bench.run(embedded, "ar", {}, dataset, 1, sequential=True)
    assert result["output_tokens"] == 17


def test_bench_refuses_a_bad_dataset_or_command_line_with_a_message(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"input_ids": [5, 7], "output_tokens": 0}) + "\n")
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "throughput", "--dataset", str(data),
             "--out", str(tmp_path)]  # fmt: skip
    for extra, message in (
        ([], "line 1: output_tokens must be an integer of 1 or more, got 0"),
        (["--modes", "ar,medusa"], "--modes ar,medusa: each of ar, chain, tree-serial, bole"),
        (["--batch-sizes", "1,0"], "--batch-sizes 1,0: comma-separated integers of 1 or more"),
        (["--repeats", "0"], "--repeats 0 (1 or more)"),
        (["--engine", str(tmp_path / "no")], f"model {tmp_path / 'no'} is not a directory"),  # a traceback
    ):
        done = subprocess.run([*bench, *extra], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    for tool in ("profile_step.py", "profile_host.py"):  # the same dataset check, the same way out
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / tool), "--dataset", str(data), "--out", str(tmp_path)],
            capture_output=True,
            text=True,
        )
        assert (
            done.returncode == 2 and "line 1: output_tokens" in done.stderr and "Traceback" not in done.stderr
        )
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob("*.txt"))


def no_model(*args, **kwargs):
    raise AssertionError("the model loaded")


def test_bench_refuses_a_bad_command_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """A tree the executors refuse (a pydantic traceback after the model's load and warm-up), a draft
    setting no listed mode uses (each executor takes only its mode's: it went unseen), a batch size
    listed twice (its second speed-up taken against the first's ar run), or results that cannot be written
    (lost after every timed run): each flag named, before the model loads."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    monkeypatch.setattr(bench, "LLM", no_model)
    data, file = tiny_dataset(tmp_path), tmp_path / "file"
    file.write_text("")
    for extra, message in (
        (["--depth", "16"], "--depth: Input should be less than or equal to 15 (got 16)"),
        (["--branching", "0"], "--branching: Input should be greater than or equal to 1 (got 0)"),
        (["--depth", "8", "--max-nodes", "4"], "--depth 8, --max-nodes 4: --max-nodes (4) must be at least"),
        (["--modes", "ar", "--depth", "0"], "--depth: used by none of --modes ar"),  # was let through
        (
            ["--modes", "ar,chain", "--branching", "2", "--max-nodes", "4"],
            "--branching, --max-nodes: used by",
        ),
        (["--batch-sizes", "8,8"], "--batch-sizes 8,8: comma-separated integers of 1 or more, each at most"),
        (["--batch-sizes", "1,01"], "each at most once"),
        (["--modes", "ar,bole,ar"], "--modes ar,bole,ar: each of ar, chain, tree-serial, bole at most once"),
        (["--tag", "a/b"], "--tag a/b: a file name suffix, without '/'"),
        (["--out", str(file)], f"--out {file}: not a directory that can be created"),
        (["--out", str(file / "results")], f"--out {file / 'results'}: not a directory that can be created"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(["throughput", "--dataset", str(data), "--out", str(tmp_path / "out"), *extra])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    out = tmp_path / "new" / "results"
    chain = ["--modes", "chain,bole", "--max-nodes", "4"]  # bole's: its depth follows (4), the chain's stays
    with pytest.raises(AssertionError, match="the model loaded"):
        bench.main(["latency", "--dataset", str(data), *chain, "--out", str(out)])
    assert out.is_dir()


def test_profiling_tools_refuse_bad_runs_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """As bench.py refuses them: a bad one was a traceback once the model had loaded, or a run repeated."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench
    import profile_host
    import profile_step

    monkeypatch.setattr(bench, "LLM", no_model)
    data, file = tiny_dataset(tmp_path), tmp_path / "file"
    file.write_text("")
    for tool in (profile_step, profile_host):
        for extra, message in (
            (["--modes", "ar,medusa"], "--modes ar,medusa: each of ar, chain, tree-serial, bole at most"),
            (["--modes", "bole,bole"], "--modes bole,bole: each of"),
            (["--batch-sizes", "1,x"], "--batch-sizes 1,x: comma-separated integers of 1 or more"),
            (["--batch-sizes", "2,2"], "--batch-sizes 2,2: comma-separated integers of 1 or more, each at"),
            (["--out", str(file)], f"--out {file}: not a directory that can be created"),
        ):
            with pytest.raises(SystemExit) as exit_info:
                tool.main(["--dataset", str(data), "--out", str(tmp_path), *extra])
            assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_prepare_dataset_refuses_requests_of_no_tokens(tmp_path):
    out = tmp_path / "d.jsonl"
    for mode, extra, message in (
        ("code", ["--num-requests", "2", "--output-tokens", "0"], "0 is not an integer of 1 or more"),
        ("code", ["--num-requests", "0"], "0 is not an integer of 1 or more"),
        ("token-unif-dist", ["--num-requests", "2", "--input-min", "5", "--input-max", "3", "--output-min",
                             "1", "--output-max", "2", "--vocab-size", "9"], "must not exceed"),
        ("token-norm-dist", ["--num-requests", "2", "--input-mean", "5", "--output-mean", "3",
                             "--vocab-size", "0"], "0 is not an integer of 1 or more"),
        # these three were tracebacks, or a dataset of lengths no distribution gives
        ("token-norm-dist", ["--num-requests", "2", "--input-mean", "nan", "--output-mean", "3",
                             "--vocab-size", "9"], "nan is not a finite number"),
        ("token-norm-dist", ["--num-requests", "2", "--input-mean", "5", "--input-stdev", "-1",
                             "--output-mean", "3", "--vocab-size", "9"], "-1 is negative"),
        ("code", ["--num-requests", "2"], f"--out {tmp_path} is a directory"),
        # accepted and of no effect: every length clamped to 1; the same prompts whatever the seed
        ("token-norm-dist", ["--num-requests", "2", "--input-mean", "-5", "--output-mean", "3",
                             "--vocab-size", "9"], "-5 is below 1: a mean length is 1 or more"),
        ("--seed", ["3", "code", "--num-requests", "2"], "--seed has no use there"),
    ):  # fmt: skip
        target = tmp_path if "directory" in message else out
        cmd = [sys.executable, str(ROOT / "benchmarks" / "prepare_dataset.py"), "--out", str(target), mode,
               *extra]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_result_files_take_their_gpu_name(monkeypatch):
    """A result of another GPU is never written under the H200's or the CPU's name, and no script names
    the file it writes for a GPU (an H100 run once wrote verify_ratio_repeats_h200.json)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bench_util import device_tag, result_name

    assert device_tag("NVIDIA H200") == "h200" and device_tag("cpu") == "cpu"
    assert device_tag("NVIDIA A100-SXM4-80GB") == "nvidia_a100-sxm4-80gb"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert result_name("probe") == "probe_nvidia_h100_80gb_hbm3.json"
    assert result_name("probe", "png") == "probe_nvidia_h100_80gb_hbm3.png"
    named = re.compile(r"""["'][\w{}$/]*_h200\w*\.(?:json|png|txt)["']""")  # a quoted file name
    for script in (ROOT / "benchmarks").glob("*.py"):
        assert not named.findall(script.read_text()), (script.name, named.findall(script.read_text()))
    runs = (ROOT / "benchmarks" / "h200.sh").read_text().splitlines()
    assert not [line for line in runs if "_h200" in line and not line.lstrip().startswith("#")]


def test_every_step_of_the_device_runs_says_its_exit_code():
    """``h200.sh`` exits 1 when any step of its target failed (benchmarks/README.md): each ``python`` step
    is followed by a ``note`` (two summaries of Nsight reports had none, so their failures exited 0)."""
    text = (ROOT / "benchmarks" / "h200.sh").read_text().replace("\\\n", " ")
    steps = text[text.index("\ncase ") :].splitlines()
    unnoted = [
        step.strip()
        for step, after in itertools.pairwise(steps)
        if re.search(r"(^|[\s(])python3? ", step) and not step.lstrip().startswith("#")
        and "note " not in step and not after.lstrip().startswith("note ")
    ]  # fmt: skip
    assert not unnoted, unnoted


def test_acceptance_eval_prints_no_statistic_it_withholds(tmp_path, monkeypatch, capsys):
    """A shape whose output differs from ar's shows no MAT, acceptance or tokens per forward, on screen
    as in the JSON."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import eval_acceptance

    def fake_llm(model, *, speculative_config, **kwargs):
        return SimpleNamespace(mode=speculative_config.mode, model=SimpleNamespace(dtype=torch.float32))

    stats = {"mean_accepted_tokens": 3.25, "acceptance_rate": 0.875, "tokens_per_target_forward": 2.5}
    outputs = {"ar": [[1, 2]], "chain": [[1, 3]], "bole": [[1, 2]]}
    monkeypatch.setattr(eval_acceptance, "LLM", fake_llm)
    monkeypatch.setattr(eval_acceptance, "run", lambda llm, prompts, n: (outputs[llm.mode], stats, 0.1))
    assert eval_acceptance.main(["--prompts", "1", "--curve", "", "--out", str(tmp_path)]) == 1
    lines = {line.split()[0] + " " + line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["chain d4"].split()[2:] == ["-", "-", "-", "False"]
    assert lines["tree d4"].split()[3:] == ["3.25", "0.88", "2.50", "True"]
    result = json.loads((tmp_path / "acceptance_cpu.json").read_text())
    assert "acceptance_rate" not in result["rows"][1] and result["dtype"] == "float32"


def test_acceptance_eval_refuses_counts_it_cannot_run(capsys):
    """--prompts 0 divided by zero at the end of a run; more than the held-out prompts ran fewer."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import eval_acceptance

    for args in (["--prompts", "0"], ["--prompts", "65"], ["--max-tokens", "0"], ["--batch", "0"]):
        with pytest.raises(SystemExit) as exit_:
            eval_acceptance.main(args)
        assert exit_.value.code == 2 and "(1 to the 64 held out)" in capsys.readouterr().err


def test_an_engine_is_benchmarked_within_its_build(tmp_path, capsys):
    """As LLM(engine) refuses: a batch, a request length or a tree past the build names the flag to rebuild
    with; within it the executors' max_seq_len stays inside the build's."""
    from trtllm_bole import LLM
    from trtllm_bole.engine.build import BuildSettings, build_engine
    from trtllm_bole.llm import DEFAULT_MODEL

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    settings = BuildSettings(max_batch_size=2, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", progress=False)
    llm = LLM(path, max_batch_size=1)
    small = {"max_depth": 2, "top_k": 2, "max_nodes": 3}
    dataset = [([5, 7, 9] * 10, 16)]  # 46 tokens: within 64, not with the bench's 32 tokens of room
    bench.check_engine(llm, "auto", [1, 2], ["ar", "bole"], small, dataset)
    assert bench.max_seq_len_for(dataset, llm) == 64
    # Unset tree sizes are the engine's (bench's own defaults, depth 8, failed on this engine), else 8 / 63.
    assert bench.speculation(llm, {}) == {"max_depth": 2, "top_k": 4, "max_nodes": 3}
    assert bench.speculation(llm, {"max_nodes": 1}) == {"max_depth": 1, "top_k": 4, "max_nodes": 1}
    checkpoint = types.SimpleNamespace(engine=None)
    assert bench.speculation(checkpoint, {}) == {"max_depth": 8, "top_k": 4, "max_nodes": 63}
    assert bench.speculation(checkpoint, {"max_nodes": 4}) == {"max_depth": 4, "top_k": 4, "max_nodes": 4}
    deeper = ["--modes", "bole", "--batch-sizes", "2", "--depth", "4"]  # than the engine's 3 nodes hold
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["throughput", "--dataset", str(tiny_dataset(tmp_path)), "--engine", str(path), *deeper,
                    "--out", str(tmp_path / "out")])  # fmt: skip
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--max-nodes (3) must be at least --depth (4)" in error, error
    # A chain's max_nodes is no tree's (it was checked as bole's: "max_nodes (1) must be at least ...").
    bench.check_engine(llm, "auto", [1], ["ar", "chain"], {**small, "max_nodes": 1}, dataset)
    for batches, modes, bole_args, data, words in (
        (
            [4],
            ["ar"],
            small,
            dataset,
            "max_batch_size 4 exceeds the engine's 2; ask for less or rebuild with",
        ),
        ([1], ["bole"], {**small, "max_depth": 3}, dataset, "max_draft_depth 3 exceeds the engine's 2"),
        ([1], ["chain"], {**small, "max_depth": 3}, dataset, "max_draft_depth 3 exceeds the engine's 2"),
        ([1], ["ar"], small, [([5] * 60, 8)], "max_seq_len 69 exceeds the engine's 64"),
    ):
        with pytest.raises(ValueError, match=words):
            bench.check_engine(llm, "auto", batches, modes, bole_args, data)
