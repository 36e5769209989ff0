"""The step-timing harness behind the budget table (on CPU, tiny sizes)."""

import pytest
import torch

from trtllm_bole.llm import DEFAULT_MODEL
from trtllm_bole.models.loader import load_model
from trtllm_bole.spec.calibration import CalibrationSettings, StepTimer, TimingSettings


@pytest.fixture(scope="module")
def timer():
    model = load_model(DEFAULT_MODEL, dtype=torch.float32, progress=False)
    return StepTimer(
        model, max_batch=2, max_kv_len=32, max_tokens=12, settings=TimingSettings(warmup=0, repeats=1)
    )


def test_verify_and_decode_time_the_steps_asked_and_keep_the_median(timer, monkeypatch):
    """Each timed step is the forward asked (its tokens, requests, context and scheme), and a point is the
    median of its repeats (the test only checked that some positive number came back)."""
    from trtllm_bole.spec import calibration

    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # repeats of 3, 1 and 2 seconds
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: next(ticks))
    three = StepTimer(timer.model, max_batch=2, max_kv_len=32, max_tokens=12,
                      settings=TimingSettings(warmup=0, repeats=3))  # fmt: skip
    forwards, verify = [], three.model.verify
    monkeypatch.setattr(three.model, "verify", lambda ids, ctx, gdn_scheme: forwards.append(
        (ids.numel(), ctx.tree.cu_seqlens.tolist(), ctx.context_lens.tolist(), gdn_scheme)
    ) or verify(ids, ctx, gdn_scheme=gdn_scheme))  # fmt: skip
    assert three.verify(2, 16, 12, gdn_scheme="serial") == 2.0
    assert forwards == [(12, [0, 6, 12], [16, 16], "serial")] * 3  # two draft-like trees of 6 nodes
    ticks = iter([0.0, 1.0, 5.0, 9.0, 10.0, 10.5])
    forwards.clear()
    assert three.decode(2, 32) == 1.0
    assert forwards == [(2, [0, 1, 2], [32, 32], "bole")] * 3


def test_a_verify_step_commits_each_request_s_whole_spine(timer, monkeypatch):
    """The commit's path is as deep as the tree (the spine's end), not the node whose index the spine's
    end had before the tree's nodes were sorted by depth (a shallower node: the commit was under-timed)."""
    settings = TimingSettings(warmup=0, repeats=1, top_k=2, depth=4)
    shallow = StepTimer(timer.model, max_batch=2, max_kv_len=8, max_tokens=24, settings=settings)
    committed, real_step = [], shallow._step

    def spy(input_ids, ctx, gdn_scheme, leaf, **kwargs):
        committed.append(ctx.tree.depth[leaf + ctx.tree.cu_seqlens[:-1]].tolist())
        return real_step(input_ids, ctx, gdn_scheme, leaf, **kwargs)

    monkeypatch.setattr(shallow, "_step", spy)
    shallow.verify(2, 8, 24)  # two trees of 12 nodes, depth 4
    assert committed == [[4, 4]]


def test_steps_beyond_the_sizing_are_refused(timer):
    with pytest.raises(ValueError, match="batch"):
        timer.decode(3, 8)
    with pytest.raises(ValueError, match="kv_len"):
        timer.decode(1, 33)
    with pytest.raises(ValueError, match="tokens"):
        timer.verify(2, 8, 1)  # fewer nodes than requests
    with pytest.raises(ValueError, match="tokens"):
        timer.verify(1, 8, 13)


def test_settings_fit_an_engine():
    """Every batch and KV length the engine serves has a measured bucket that covers it (KV lengths
    257-1,023 fell back to the bucket of 256, and an engine of 64 positions was timed at 4,096), and its
    largest step is timed (an engine of 100 tokens was timed up to 96: its budget never reached 100)."""
    fitted = CalibrationSettings().fitted(max_batch=4, max_seq_len=1024, max_tokens=100)
    assert fitted.batch_buckets == (1, 2, 4)
    assert fitted.kv_buckets == (256, 1023)
    assert fitted.capacities == (8, 16, 32, 48, 64, 96, 100)
    assert CalibrationSettings().fitted(max_batch=8, max_seq_len=1024, max_tokens=512).capacities == (
        8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512,
    )  # fmt: skip
    # The default grid reaches a batch of 32 full 64-token trees (it stopped at 512: 16 tokens a request).
    full = CalibrationSettings().fitted(max_batch=32, max_seq_len=4096, max_tokens=32 * 64)
    assert full.capacities[-4:] == (768, 1024, 1536, 2048)
    assert CalibrationSettings().fitted(max_batch=12, max_seq_len=4097, max_tokens=100).batch_buckets == (
        1, 2, 4, 8, 12,
    )  # fmt: skip
    assert CalibrationSettings().fitted(12, 4097, 100).kv_buckets == (256, 1024, 4096)
    assert CalibrationSettings(kv_buckets=(4096,)).fitted(1, 64, 8).kv_buckets == (63,)
    assert CalibrationSettings(capacities=(64,)).fitted(1, 64, 8).capacities == (8,)  # not a 64-node tree


def test_repeated_buckets_are_refused():
    """A table with two entries of one bucket is refused at every load: refused before it is built."""
    for name in ("capacities", "batch_buckets", "kv_buckets"):
        with pytest.raises(ValueError, match=f"calibration {name} must not repeat a value, got \\(8, 8\\)"):
            CalibrationSettings(**{name: (8, 8)})


@pytest.mark.gpu
def test_gpu_steps_replay_the_executors_graphs():
    """On a GPU the timed forward is the one the executor runs: a graph per forest shape (paths padded to
    the timer's tree depth, one-node forests for plain decoding), captured by the warm-up; with
    ``cuda_graphs=False`` nothing is captured."""
    from trtllm_bole.spec.verify_graphs import VerifyGraphs

    model = load_model(DEFAULT_MODEL, dtype=torch.float32, device="cuda", progress=False)
    settings = TimingSettings(warmup=1, repeats=2)
    eager = StepTimer(model, max_batch=2, max_kv_len=32, max_tokens=12, settings=settings, cuda_graphs=False)
    assert eager.verify(2, 16, 12) > 0 and eager.decode(2, 32) > 0
    trees = VerifyGraphs.of(model, max_depth=9, table_width=eager.blocks_per_request)
    decodes = VerifyGraphs.of(model, max_depth=1, table_width=eager.blocks_per_request)
    assert trees.captured == [] and decodes.captured == []
    timer = StepTimer(model, max_batch=2, max_kv_len=32, max_tokens=12, settings=settings)
    assert timer.verify(2, 16, 12) > 0 and timer.verify(1, 0, 3, gdn_scheme="serial") > 0
    assert timer.decode(2, 32) > 0
    assert trees.captured == [("bole", 2, 12, 6), ("serial", 1, 3, 3)]
    assert decodes.captured == [("bole", 2, 2, 1)]


def test_device_name_names_the_gpu_asked_for(monkeypatch):
    """bench.py named the current GPU (GPU 0) for a run on cuda:1; both it and the budget use this."""
    from trtllm_bole.spec.calibration import device_name

    monkeypatch.setattr(
        torch.cuda, "get_device_name", lambda device=None: f"GPU {torch.device(device).index}"
    )
    assert device_name(torch.device("cuda:1")) == "GPU 1" and device_name(torch.device("cpu")) == "cpu"


def test_a_timed_gpu_step_is_queued_behind_a_gpu_wait(monkeypatch):
    """On a GPU the start event is recorded behind a GPU-side wait, so the step is already queued when the
    GPU meets it and the events bracket the GPU's work alone: from an idle GPU they also bracketed the
    host's enqueueing, and the embedded model's budgets followed its jitter (H100: the decoding step read
    0.56-0.81 ms that way over five rounds, 0.470-0.473 behind the wait; probe_calibration_timing.py).
    The order is checked on CPU with stand-ins for the stream's calls; the GPU runs it in calibration."""
    from types import SimpleNamespace

    from trtllm_bole.spec import calibration

    calls, made = [], []

    class Event:
        def __init__(self, enable_timing):
            self.name = f"event {len(made)}"
            made.append(self)

        def record(self):
            calls.append(f"record {self.name}")

        def synchronize(self):
            calls.append("synchronize")

        def elapsed_time(self, end):
            return 2.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(f"sleep {cycles}"))
    timer = StepTimer.__new__(StepTimer)
    timer.model = SimpleNamespace(device=torch.device("cuda"))
    timer.settings = TimingSettings(warmup=1, repeats=2)
    assert timer._time(lambda: calls.append("step")) == 2.0e-3
    wait = f"sleep {calibration.HOST_HIDING_CYCLES}"
    one = [wait, "record event 0", "step", "record event 1", "synchronize"]
    assert calls == [
        "step",
        *one,
        *[c.replace("event 0", "event 2").replace("event 1", "event 3") for c in one],
    ]
