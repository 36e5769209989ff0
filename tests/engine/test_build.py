"""Engine build and load on CPU: the default engine, idempotence, refusals, atomicity, corruption."""

import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.engine import BuildSettings, build_engine, is_engine_dir, load_engine
from trtllm_bole.engine import build as build_mod
from trtllm_bole.engine import format as fmt
from trtllm_bole.engine.load import check_device_compat
from trtllm_bole.llm import DEFAULT_MODEL
from trtllm_bole.spec.budget import BudgetTable
from trtllm_bole.spec.calibration import CalibrationSettings, TimingSettings

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines") / "tiny"
    start = time.perf_counter()
    path, built = build_engine(DEFAULT_MODEL, out, device="cpu", progress=False)
    elapsed = time.perf_counter() - start
    assert built and path == out
    return out, elapsed


def copy_of(engine, tmp_path):
    return shutil.copytree(engine[0], tmp_path / "copy")


def test_default_engine_builds_in_under_a_minute_and_serves_like_the_checkpoint(engine):
    path, elapsed = engine
    assert elapsed < 60
    assert is_engine_dir(path) and not is_engine_dir(DEFAULT_MODEL)
    config = json.loads((path / "config.json").read_text())
    assert config["environment"]["arch"] == "cpu" and config["kernels"]["compiled"] is False
    assert config["build"] == {
        "dtype": "float32", "max_batch_size": 8, "max_seq_len": 1024, "max_draft_depth": 8,
        "max_draft_nodes": 63,
    }  # fmt: skip
    params = SamplingParams(max_tokens=12)
    from_engine = LLM(path).generate([PROMPT], params, use_tqdm=False)[0]
    from_checkpoint = LLM(DEFAULT_MODEL).generate([PROMPT], params, use_tqdm=False)[0]
    assert from_engine.outputs[0].token_ids == from_checkpoint.outputs[0].token_ids
    assert from_engine.outputs[0].text and from_engine.stats.steps > 0


def test_an_engine_stops_at_the_end_tokens_of_the_checkpoint_s_generation_config(tmp_path):
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "checkpoint")
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 9]}))
    path, built = build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    assert built and LLM(path).executor.eos_token_ids == LLM(checkpoint).executor.eos_token_ids == {5, 9, 0}
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": 6}))
    with pytest.raises(ValueError, match="holds a different engine"):  # the edit is part of its identity
        build_engine(checkpoint, path, device="cpu", progress=False)
    path, built = build_engine(checkpoint, path, device="cpu", progress=False, force=True)
    assert built and LLM(path).executor.eos_token_ids == {6, 0}


def test_rebuild_with_the_same_inputs_is_a_no_op(engine):
    path, _ = engine
    before = (path / "config.json").stat().st_mtime_ns
    again, built = build_engine(DEFAULT_MODEL, path, device="cpu", progress=False)
    assert again == path and not built
    assert (path / "config.json").stat().st_mtime_ns == before


def test_a_different_engine_is_replaced_only_with_force(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    other = BuildSettings(max_batch_size=2)
    with pytest.raises(
        ValueError, match=r"different engine \(settings\.max_batch_size: 8 -> 2\); pass --force"
    ):
        build_engine(DEFAULT_MODEL, path, other, device="cpu", progress=False)  # what changed, not all of it
    assert load_engine(path).build["max_batch_size"] == 8
    _, built = build_engine(DEFAULT_MODEL, path, other, device="cpu", force=True, progress=False)
    assert built and load_engine(path).build["max_batch_size"] == 2
    assert not list(tmp_path.glob(".copy.*")), "staging or old copies left behind"


def test_a_non_engine_directory_is_never_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(ValueError, match=r"not a trtllm_bole engine"):
            build_engine(DEFAULT_MODEL, tmp_path, device="cpu", force=force, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_missing_or_invalid_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"not a directory"):
        build_engine(tmp_path / "nope", tmp_path / "e", device="cpu", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"config.json"):
        build_engine(tmp_path / "empty", tmp_path / "e", device="cpu", progress=False)
    broken = shutil.copytree(DEFAULT_MODEL, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 512
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"does not match its config.json"):
        build_engine(broken, tmp_path / "e", device="cpu", progress=False)
    shard = next(broken.glob("model-00003-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(ValueError, match=r"truncated or corrupt"):
        build_engine(broken, tmp_path / "e", device="cpu", progress=False)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (BuildSettings(dtype="float16"), "dtype"),
        (BuildSettings(max_batch_size=0), "max_batch_size"),
        (
            BuildSettings(max_draft_depth=16),
            r"max_draft_depth 16 .* cannot be served: .*less than or equal to 15",
        ),
        (
            BuildSettings(max_draft_depth=8, max_draft_nodes=4),
            r"cannot be served: max_draft_nodes \(4\) must be at least max_draft_depth \(8\)",
        ),
        (
            BuildSettings(max_draft_nodes=600),
            r"max_draft_nodes 600 cannot be served: .*less than or equal to 512",
        ),
        (BuildSettings(max_seq_len=2), "max_seq_len must be at least 3"),
        (
            BuildSettings(max_seq_len=8192),
            r"max_seq_len 8192 exceeds the model's max_position_embeddings 4096",
        ),
    ],
)
def test_bad_build_settings(settings, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", progress=False)


def test_a_failed_plan_is_a_named_build_error_and_leaves_nothing(tmp_path):
    """A plan builder that fails as TensorRT's does (build_serialized_network returns None): one
    BuildStepError naming the step (build_engine.py prints it in one line), no engine, no staging."""
    from trtllm_bole.engine.build import BuildStepError

    def failing(staging, config):
        raise RuntimeError("TensorRT failed to build the verify plan (see its log above)")

    with pytest.raises(BuildStepError, match=r"the TensorRT plan: TensorRT failed to build the verify plan"):
        build_engine(DEFAULT_MODEL, tmp_path / "e", device="cpu", progress=False, plan_builder=failing)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failure", ["disk full", "interrupt"])
def test_an_engine_being_replaced_is_put_back_if_the_new_one_cannot_take_its_place(
    tmp_path, monkeypatch, failure
):
    """The new engine's rename failing (the old one used to stay under a hidden .old-* name), or a Ctrl-C
    right after the old one was moved aside (that left no engine at the output)."""
    output, staging = tmp_path / "engine", tmp_path / ".engine.building-1"
    for folder, text in ((output, "old"), (staging, "new")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    rename = Path.rename

    def failing(self, target):
        if failure == "disk full" and self == staging:
            raise OSError("disk full")
        done = rename(self, target)
        if failure == "interrupt" and self == output:
            raise KeyboardInterrupt
        return done

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError if failure == "disk full" else KeyboardInterrupt):
        build_mod._swap_in(staging, output)
    assert (output / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".engine.building-1", "engine"]


def test_an_interrupted_build_leaves_no_half_written_engine(engine, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C after the weights are written

    monkeypatch.setattr(build_mod, "_compile_kernels", fail)
    with pytest.raises(KeyboardInterrupt):
        build_engine(DEFAULT_MODEL, tmp_path / "fresh", device="cpu", progress=False)
    assert list(tmp_path.iterdir()) == []
    # A failed forced rebuild keeps the previous engine whole.
    path = copy_of(engine, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        build_engine(DEFAULT_MODEL, path, BuildSettings(max_batch_size=2), device="cpu", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]
    assert load_engine(path).build["max_batch_size"] == 8


def test_a_killed_builds_staging_folder_is_named_by_the_next_build(tmp_path, caplog):
    killed = tmp_path / ".e.building-abc123"  # what SIGKILL leaves: no handler ran
    killed.mkdir()
    with caplog.at_level("WARNING"):
        build_engine(DEFAULT_MODEL, tmp_path / "e", device="cpu", progress=False)
    assert f"{killed}" in caplog.text and "remove them" in caplog.text


def test_a_build_of_an_output_another_build_is_writing_is_refused(tmp_path):
    """Two builds of one output: the second is refused while the first holds the lock (each had swapped
    in its own engine, the later one replacing the other's without --force); free once it ends."""
    import fcntl

    with open(tmp_path / ".e.lock", "a+") as other:  # what a running build of tmp_path/e holds
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other.write("pid 4242")
        other.flush()
        with pytest.raises(ValueError, match=r"another build of .*/e is running \(pid 4242\): wait for it"):
            build_engine(DEFAULT_MODEL, tmp_path / "e", device="cpu", progress=False)
        assert not (tmp_path / "e").exists()
    assert build_engine(DEFAULT_MODEL, tmp_path / "e", device="cpu", progress=False)[1]


# -------------------------------------------------------------------------------------------- #
# Loading: every mismatch is a clear ValueError                                                 #
# -------------------------------------------------------------------------------------------- #


def reseal(path, **changes):
    """Rewrite config.json as a build would have (valid hash): a legit engine from elsewhere."""
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            config[section][field] = value
        else:
            config[section] = value
    (path / "config.json").write_text(json.dumps(fmt.seal(config)))


def weight_file(path):
    return next((path / "weights").glob("*.safetensors"))


def test_corrupt_weight_file_is_caught_by_its_hash(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    file = weight_file(path)
    data = bytearray(file.read_bytes())
    data[-100] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"SHA-256 mismatch.*rebuild"):
        LLM(path)
    with pytest.raises(ValueError, match=r"SHA-256 mismatch.*pass --force to rebuild it"):
        build_engine(DEFAULT_MODEL, path, device="cpu", progress=False)  # the same build asked again
    _, built = build_engine(DEFAULT_MODEL, path, device="cpu", force=True, progress=False)
    assert built and load_engine(path)


def test_a_weight_file_the_build_did_not_write_is_refused(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    shutil.copyfile(weight_file(path), path / "weights" / "extra.safetensors")  # a stray or swapped-in file
    with pytest.raises(ValueError, match=r"extra\.safetensors: not written by the build"):
        load_engine(path)


@pytest.mark.parametrize("stray", ["kernels/verify-t0.ptx", "bole.plan", "budget.json"])
def test_kernels_a_plan_or_a_budget_the_build_did_not_write_are_refused(engine, tmp_path, stray):
    """Where the build writes: a plan or kernels planted in an engine built without them loaded as is."""
    path = copy_of(engine, tmp_path)
    (path / stray).parent.mkdir(exist_ok=True)
    (path / stray).write_text("{}")
    with pytest.raises(ValueError, match=rf"{stray.split('/')[-1]}: not written by the build"):
        load_engine(path)
    (path / stray).unlink()
    (path / "notes.txt").write_text("mine")  # elsewhere, a user's file is theirs
    load_engine(path)


def test_tokenizer_files_are_checked_at_build_and_load(tmp_path):
    """A tokenizer every load would refuse is refused by the build, naming the file; an engine built
    without one refuses a tokenizer dropped into it later (the LLM would have used it)."""
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "ckpt")
    (checkpoint / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match=r"ckpt/tokenizer\.json: not a tokenizer"):
        build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    for name in fmt.TOKENIZER_FILES:
        (checkpoint / name).unlink()
    path, _ = build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    assert LLM(path).tokenizer is None
    shutil.copyfile(DEFAULT_MODEL / "tokenizer.json", path / "tokenizer.json")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not written by the build"):
        LLM(path)


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused_at_build_and_load(tmp_path):
    """Another model's tokenizer beside the weights: its prompts would fail one by one, each past the
    vocabulary; the load and the build refuse it once, naming the file and both sizes."""
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "ckpt")
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab_size = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    added = dict(tokenizer["added_tokens"][0], id=vocab_size, content="<|another model's|>")
    tokenizer["added_tokens"].append(added)
    (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer))
    refused = rf"ckpt/tokenizer\.json: its ids reach {vocab_size}, past the model's vocabulary \(vocab_size "
    with pytest.raises(ValueError, match=refused):
        LLM(checkpoint)
    with pytest.raises(ValueError, match=refused):
        build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    assert not (tmp_path / "e").exists()


def test_end_ids_every_load_would_refuse_are_refused_by_the_build(tmp_path):
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "ckpt")
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ValueError, match=r"ckpt \(generation_config\.json\): eos_token_id must be a token"):
        build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    assert not (tmp_path / "e").exists()


def test_an_engine_given_as_the_checkpoint_is_named(engine, tmp_path):
    with pytest.raises(ValueError, match=r"is a trtllm_bole engine, not a checkpoint: pass the Hugging Face"):
        build_engine(engine[0], tmp_path / "e", device="cpu", progress=False)


def test_an_edited_checkpoint_config_rebuilds(engine, tmp_path):
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "ckpt")
    path, _ = build_engine(checkpoint, tmp_path / "e", device="cpu", progress=False)
    config = json.loads((checkpoint / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"different engine.*--force"):
        build_engine(checkpoint, path, device="cpu", progress=False)
    _, built = build_engine(checkpoint, path, device="cpu", force=True, progress=False)
    assert built and load_engine(path).config["model"]["hf_config"]["rms_norm_eps"] == 1e-5


def test_truncated_or_missing_files(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    file = weight_file(path)
    file.write_bytes(file.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"bytes.*truncated"):
        load_engine(path)
    file.unlink()
    with pytest.raises(ValueError, match=r"missing"):
        load_engine(path)
    (path / "config.json").write_text('{"format": "trtllm_bole-eng')  # truncated: it read as a checkpoint's
    with pytest.raises(
        ValueError, match=r"an engine directory \(it has weights/\) whose config\.json is not JSON"
    ):
        LLM(path)
    (path / "config.json").unlink()  # read as a checkpoint, it was named a checkpoint without one
    with pytest.raises(ValueError, match=r"an engine directory \(it has weights/\) without its config\.json"):
        LLM(path)
    with pytest.raises(ValueError, match=r"never overwrites .*: delete it, then rebuild it"):  # not "rebuild"
        LLM(path)  # alone, which the build refused: "a non-empty directory that is not a trtllm_bole engine"
    with pytest.raises(ValueError, match=r"is a non-empty directory that is not a trtllm_bole engine"):
        build_engine(DEFAULT_MODEL, path, device="cpu", force=True, progress=False)


def test_edited_config_is_caught(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["build"]["max_batch_size"] = 64
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"edited after the build"):
        LLM(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"not valid JSON"):
        load_engine(path)


def test_other_schema_or_package_version(engine, tmp_path):
    path = copy_of(engine, tmp_path)
    reseal(path, schema_version=99)
    with pytest.raises(ValueError, match=r"schema version 99.*reads version 1"):
        load_engine(path)
    reseal(path, schema_version=fmt.SCHEMA_VERSION, environment__trtllm_bole="0.0.1")
    with pytest.raises(ValueError, match=r"built by trtllm_bole 0.0.1.*rebuild"):
        LLM(path)


def test_an_engine_of_other_sources_is_refused_and_rebuilt(engine, tmp_path, monkeypatch):
    """The package's version never moved: after a change to how the weights are fused, rebuilding said
    "nothing to do" and the old engine loaded its weights into the wrong rows without an error."""
    path = copy_of(engine, tmp_path)
    assert json.loads((path / "config.json").read_text())["environment"]["source"] == fmt.source_fingerprint()
    monkeypatch.setattr(fmt, "source_fingerprint", lambda: "f" * 64)  # the code after a pull
    with pytest.raises(ValueError, match=r"other trtllm_bole sources .*this is ffffffffffff.*rebuild"):
        LLM(path)
    with pytest.raises(ValueError, match=r"different engine.*--force"):
        build_engine(DEFAULT_MODEL, path, device="cpu", progress=False)


def test_other_gpu_arch_or_triton_version():
    gpu_build = {
        "environment": {"arch": "sm_90"},
        "kernels": {"compiled": True, "arch": "sm_90", "triton": "3.6.0"},
    }
    h200 = {"arch": "sm_90", "triton": "3.6.0", "device_name": "NVIDIA H200"}
    check_device_compat(gpu_build, h200)
    with pytest.raises(ValueError, match=r"compiled for sm_90, but this GPU is sm_80"):
        check_device_compat(gpu_build, {**h200, "arch": "sm_80", "device_name": "A100"})
    with pytest.raises(ValueError, match=r"Triton 3.6.0, but Triton 3.9.0"):
        check_device_compat(gpu_build, {**h200, "triton": "3.9.0"})
    cpu_build = {"environment": {"arch": "cpu"}, "kernels": {"compiled": False}}
    with pytest.raises(ValueError, match=r"without GPU kernels.*on this GPU"):
        check_device_compat(cpu_build, h200)


def test_runtime_requests_beyond_the_build_are_refused(engine, monkeypatch):
    """Before any file is hashed (a minute at 27B); an engine that serves them is hashed once."""
    from trtllm_bole.engine import load as load_mod

    path, _ = engine
    hashed, check = [], load_mod._check_files
    monkeypatch.setattr(load_mod, "_check_files", lambda *a: hashed.append(a[0]) or check(*a))
    with pytest.raises(ValueError, match=r"max_batch_size 16 exceeds the engine's 8"):
        LLM(path, max_batch_size=16)
    with pytest.raises(ValueError, match=r"max_draft_depth 12 exceeds"):
        LLM(path, speculative_config=BoleConfig(max_depth=12))
    with pytest.raises(ValueError, match=r"float32 weights, dtype 'bfloat16' was asked; leave the dtype at"):
        LLM(path, dtype="bfloat16")
    assert hashed == []
    llm = LLM(path, max_batch_size=2, speculative_config=BoleConfig(mode="ar"))
    assert llm.executor.max_batch_size == 2 and llm.model.mtp is None and hashed == [path]


def test_draft_settings_left_unset_take_the_engines(tmp_path):
    settings = BuildSettings(max_batch_size=1, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", progress=False)
    chain = LLM(path, speculative_config=BoleConfig(mode="chain")).speculative_config
    assert (chain.mode, chain.max_depth, chain.draft_tokens) == ("chain", 2, 2)  # max_nodes: a tree's bound
    assert chain.model_fields_set == {"mode", "max_depth"}
    narrow = LLM(path, speculative_config=BoleConfig(top_k=2)).speculative_config
    assert (narrow.mode, narrow.max_depth, narrow.max_nodes, narrow.top_k) == ("bole", 2, 3, 2)
    few = LLM(path, speculative_config=BoleConfig(max_nodes=3)).speculative_config  # was "at least (8)"
    assert (few.max_depth, few.max_nodes) == (2, 3)
    one = LLM(path, speculative_config=BoleConfig(max_nodes=1)).speculative_config  # was "at least (2)"
    assert (one.max_depth, one.max_nodes) == (1, 1)
    with pytest.raises(ValueError, match=r"max_draft_nodes 4 exceeds the engine's 3"):
        LLM(path, speculative_config=BoleConfig(max_depth=2, max_nodes=4))
    cli = subprocess.run(
        [sys.executable, "-m", "trtllm_bole", "generate", "--model", str(path), "--mode", "chain",
         "--prompt-ids", "1,2,3", "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "[chain] finish" in cli.stderr


def test_a_prompt_past_the_engines_context_says_to_rebuild_it(tmp_path):
    """The engine's max_seq_len bounds the prompt, not a --max-seq-len the user did not pass (it said to raise
    that, which the engine then refused)."""
    settings = BuildSettings(max_batch_size=1, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", progress=False)
    command = [sys.executable, "-m", "trtllm_bole", "generate", "--model", str(path)]
    cli = subprocess.run(
        [*command, "--prompt-ids", "5," * 69 + "5"], capture_output=True, text=True, timeout=300
    )
    assert cli.returncode == 2 and "Traceback" not in cli.stderr, cli.stderr  # one error line after the bars
    assert (
        "and the engine's max_seq_len 64 allows prompts of at most 62: rebuild the engine with a larger "
        in cli.stderr
    )


def test_calibrated_engine_ships_its_budget_and_llm_uses_it(tmp_path, monkeypatch):
    calibration = CalibrationSettings(
        capacities=(2, 4), batch_buckets=(1, 2), kv_buckets=(8,), timing=TimingSettings(warmup=0, repeats=1)
    )
    settings = BuildSettings(max_batch_size=1, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", calibration=calibration)
    config = load_engine(path).config
    assert config["budget"]["file"] == "budget.json" and config["budget"]["gpu_seconds"] > 0
    assert config["budget"]["settings"]["batch_buckets"] == [1]  # fitted to max_batch_size
    assert "budget.json" in config["files"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the engine's own table fits its draft depth and device
        llm = LLM(path)
    shipped = BudgetTable.load(load_engine(path).budget_path)
    assert llm.executor.budget is not None and llm.executor.budget.entries == shipped.entries
    with pytest.warns(UserWarning, match=r"trees of depth 3 on cpu, used for depth 2 on cpu"):
        LLM(path, speculative_config=BoleConfig(max_depth=1))
    looked_up, lookup = [], BudgetTable.lookup  # from here: the steps' lookups (an LLM checks its table too)
    monkeypatch.setattr(BudgetTable, "lookup", lambda *a, **kw: looked_up.append(a) or lookup(*a, **kw))
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4 or out.outputs[0].finish_reason == "stop"
    assert looked_up and all(table is llm.executor.budget and batch == 1 for table, batch, _ in looked_up)
    assert torch.get_default_dtype() == torch.float32
