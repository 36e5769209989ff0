"""Engine identity and loading: what makes another engine, edits after the build, engines without an
MTP head, the calibration's capacities."""

import json
import shutil
from pathlib import Path

import pytest

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.engine import BuildSettings, build_engine, load_engine
from trtllm_bole.engine import build as build_mod
from trtllm_bole.engine import format as fmt
from trtllm_bole.llm import DEFAULT_MODEL
from trtllm_bole.models.checkpoint import random_tensors, write_safetensors
from trtllm_bole.models.config import load_config
from trtllm_bole.spec.calibration import CalibrationSettings, TimingSettings
from trtllm_bole.testing import TINY_CONFIG

SMALL = BuildSettings(max_batch_size=1, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)


def build_id(*key_parts) -> str:
    """The id a build of these (sources, settings, calibration, TensorRT, environment) gets."""
    return build_mod._hash(build_mod._build_key(*key_parts))


def test_an_engine_is_identified_by_the_gpu_it_was_built_for():
    """A build for another GPU architecture (its kernels compiled for it) is another engine."""
    env = {"trtllm_bole": "1", "source": "s", "torch": "2", "triton": "3", "arch": "sm_90"}
    ids = {build_id({}, SMALL, None, False, {**env, "arch": arch}) for arch in ("sm_90", "sm_100", "cpu")}
    assert len(ids) == 3


def test_a_calibrated_engine_is_identified_by_its_gpu_too():
    """A budget is its GPU's own: an H100's and an H200's (both sm_90) were one engine, so the second
    build kept the first's budget; an uncalibrated engine is the same on any GPU of the arch."""
    env = {"trtllm_bole": "1", "source": "s", "torch": "2", "triton": "3", "arch": "sm_90"}
    on = [{**env, "device_name": name} for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200")]
    calibrated = {build_id({}, SMALL, CalibrationSettings(), False, e) for e in on}
    assert len(calibrated) == 2 and len({build_id({}, SMALL, None, False, e) for e in on}) == 1


def test_force_rebuilds_even_the_same_engine(tmp_path):
    """``--force`` replaces the engine at the output, the same one too (to recalibrate it)."""
    path, built = build_engine(DEFAULT_MODEL, tmp_path / "e", SMALL, device="cpu", progress=False)
    assert built and not build_engine(DEFAULT_MODEL, path, SMALL, device="cpu", progress=False)[1]
    assert build_engine(DEFAULT_MODEL, path, SMALL, device="cpu", force=True, progress=False)[1]
    assert load_engine(path).build["max_batch_size"] == 1 and not list(tmp_path.glob(".e.*"))


def test_the_current_folder_is_refused_as_an_output_before_anything_is_built(tmp_path, monkeypatch):
    """An output of "." failed after the whole build (and its calibration), as the swap renamed "."."""
    (tmp_path / "inner").mkdir()
    monkeypatch.chdir(tmp_path / "inner")
    for output in (".", "..", tmp_path):
        with pytest.raises(ValueError, match=r"holds the current folder.*--output \./engine"):
            build_engine(DEFAULT_MODEL, output, SMALL, device="cpu", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner"] and not any((tmp_path / "inner").iterdir())


def test_a_mount_point_is_refused_as_an_output_before_anything_is_built(tmp_path, monkeypatch):
    """A volume mounted at --output (a container's /engine) failed after the whole build: the swap renames
    the output folder, which Linux refuses for a mount point (EBUSY)."""
    output = tmp_path / "volume"
    output.mkdir()
    monkeypatch.setattr(Path, "is_mount", lambda self: self == output)
    with pytest.raises(ValueError, match=rf"output {output} is a mount point.*--output {output}/engine"):
        build_engine(DEFAULT_MODEL, output, SMALL, device="cpu", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["volume"] and not any(output.iterdir())


def test_an_edited_tokenizer_rebuilds(tmp_path):
    checkpoint = shutil.copytree(DEFAULT_MODEL, tmp_path / "ckpt")
    path, _ = build_engine(checkpoint, tmp_path / "e", SMALL, device="cpu", progress=False)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["model_max_length"] = 12345
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"different engine.*--force"):
        build_engine(checkpoint, path, SMALL, device="cpu", progress=False)


def test_an_edited_file_list_is_an_edited_config(tmp_path):
    """The file list (sizes, hashes) is part of the sealed config: a weight file swapped together with
    its listed hash is still caught."""
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", SMALL, device="cpu", progress=False)
    config = json.loads((path / fmt.CONFIG).read_text())
    rel = next(r for r in config["files"] if r.endswith(".safetensors"))
    config["files"][rel]["sha256"] = "0" * 64
    (path / fmt.CONFIG).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="edited after the build"):
        load_engine(path)


def test_an_engine_without_an_mtp_head_serves_without_speculation(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(TINY_CONFIG))
    write_safetensors(checkpoint, random_tensors(load_config(TINY_CONFIG), seed=0, mtp=False))
    path, _ = build_engine(checkpoint, tmp_path / "e", SMALL, device="cpu", progress=False)
    engine = load_engine(path)
    assert engine.config["model"]["has_mtp"] is False
    assert engine.load_model(mtp=True, progress=False).mtp is None
    with pytest.raises(ValueError, match="drafts with the checkpoint's MTP module"):
        LLM(path)
    assert LLM(path, speculative_config=BoleConfig(mode="ar", max_depth=8)).model.mtp is None


def test_calibration_covers_every_tree_token_of_a_full_batch(tmp_path, monkeypatch):
    """Capacities up to max_batch_size * (max_draft_nodes + 1): the pending token of each request is
    verified too."""
    seen = []
    real = build_mod.calibrate_model

    def spy(model, settings, **kwargs):
        seen.append((settings, kwargs["per_request"]))
        return real(model, settings, **kwargs)

    monkeypatch.setattr(build_mod, "calibrate_model", spy)
    calibration = CalibrationSettings(
        capacities=(2, 4, 8), batch_buckets=(1,), kv_buckets=(8,), timing=TimingSettings(warmup=0, repeats=1)
    )
    build_engine(DEFAULT_MODEL, tmp_path / "e", SMALL, device="cpu", calibration=calibration, progress=False)
    settings, per_request = seen[0]
    assert settings.capacities == (2, 4) and per_request == 4  # 1 request x (3 drafts + the pending token)
    assert settings.timing.depth == 3  # the engine's trees (2 drafts + the pending token), not the default 9


def test_unserved_batch_buckets_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(build_mod, "load_model", no_load)
    settings = BuildSettings(max_batch_size=4, max_seq_len=64, max_draft_depth=2, max_draft_nodes=3)
    calibration = CalibrationSettings(capacities=(2,), batch_buckets=(1, 4), kv_buckets=(8,))
    with pytest.raises(ValueError, match=r"batch buckets \[4\] exceed every capacity \[2\]"):
        build_engine(DEFAULT_MODEL, tmp_path / "e", settings, device="cpu", calibration=calibration)
    assert list(tmp_path.iterdir()) == []


def test_a_budget_table_serves_at_the_epsilon_it_was_calibrated_for(tmp_path):
    """A table's own epsilon unless one is asked: BoleConfig's default 0.2 once re-derived an engine's
    budgets at 0.2, and until 2026-12-04 still those of any table named by ``budget_table`` (a review:
    a table calibrated at 0.5 served 16 nodes instead of its 24)."""
    calibration = CalibrationSettings(
        epsilon=0.5, capacities=(2, 4), batch_buckets=(1,), kv_buckets=(8,),
        timing=TimingSettings(warmup=0, repeats=1),
    )  # fmt: skip
    path, _ = build_engine(DEFAULT_MODEL, tmp_path / "e", SMALL, device="cpu", calibration=calibration)
    own = LLM(path).executor
    assert own.budget.epsilon == 0.5 and own.bole.epsilon is None  # None: the table's own
    assert own.budget.model == own.model.config.architecture_id  # what it was timed on
    assert LLM(path, speculative_config=BoleConfig(top_k=2)).executor.bole.epsilon is None
    assert LLM(path, speculative_config=BoleConfig(epsilon=0.1)).executor.bole.epsilon == 0.1
    with pytest.warns(UserWarning, match="a budget calibrated for trees of depth 3"):  # the default's is 9
        named = LLM(DEFAULT_MODEL, speculative_config=BoleConfig(budget_table=path / fmt.BUDGET)).executor
    assert named.bole.epsilon is None and named.budget.epsilon == 0.5
    requests = [named.submit([1, 2, 3], SamplingParams(max_tokens=2))]
    assert named._budget(requests) == named.budget.lookup(1, 0) == own._budget(requests)
