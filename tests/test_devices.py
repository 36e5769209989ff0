"""The product on a GPU that is not the current one. Triton launches its kernels, and torch makes its
streams, events and graph captures, on the calling thread's current CUDA device, not on their tensors':
``device="cuda:1"`` works only where the executor and the calibration make its GPU current, from
whichever thread they are called (a server steps on its own). Needs two GPUs: ``bash benchmarks/h200.sh
second-gpu`` on a two-GPU machine."""

import re
import threading

import pytest
import torch

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.config import check_device
from trtllm_bole.serving.engine import ServingEngine, Update
from trtllm_bole.spec.calibration import CalibrationSettings, TimingSettings, calibrate_model, device_name

TWO_GPUS = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs (an nvidia-h200-x2 machine: bash benchmarks/h200.sh second-gpu)",
)
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\n\ndef main():"]
GREEDY = SamplingParams(max_tokens=40)


def _llm(device: str, mode: str = "bole") -> LLM:
    return LLM(device=device, dtype="float32", speculative_config=BoleConfig(mode=mode), max_batch_size=4,
               max_seq_len=256)  # fmt: skip


def _tokens(llm: LLM) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("count", [1, 2])
def test_a_gpu_past_the_count_torch_sees_is_refused_by_name(count, monkeypatch):
    """The check alone, on any machine (torch's GPU count set): a missing GPU was torch's "invalid device
    ordinal" from deep inside the model's load."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    for device in ("cuda", *(f"cuda:{i}" for i in range(count))):
        check_device(device)
    seen = "1 CUDA GPU (cuda:0;" if count == 1 else "2 CUDA GPUs (cuda:0 to cuda:1;"
    with pytest.raises(ValueError, match=rf"'cuda:{count}' asked for, but torch sees {re.escape(seen)}"):
        check_device(f"cuda:{count}")


@pytest.mark.gpu
def test_a_gpu_past_the_count_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"'cuda:{count}' asked for, but torch sees {count} CUDA GPU"):
        check_device(f"cuda:{count}")
    with pytest.raises(ValueError, match=rf"'cuda:{count}' asked for"):
        LLM(device=f"cuda:{count}")


@pytest.mark.gpu
@TWO_GPUS
def test_the_second_gpu_decodes_as_the_first_and_leaves_it_alone():
    """Greedy Bole on cuda:1 (CUDA graphs captured there) equals plain greedy decoding there and Bole on
    cuda:0 token for token, and puts nothing on cuda:0."""
    torch.cuda.synchronize(0)
    first_before = torch.cuda.memory_allocated(0)
    llm = _llm("cuda:1")
    assert llm.executor.capture_graphs([1, 3]) > 0
    on_second = _tokens(llm)
    torch.cuda.synchronize(1)
    assert torch.cuda.memory_allocated(0) == first_before
    assert all(len(t) == GREEDY.max_tokens for t in on_second)
    assert on_second == _tokens(_llm("cuda:1", mode="ar"))
    assert on_second == _tokens(_llm("cuda:0"))


@pytest.mark.gpu
@TWO_GPUS
def test_a_server_thread_steps_on_the_second_gpu():
    """The serving engine's thread never chose a GPU (its current one is cuda:0): its steps still run on
    the model's, with the same tokens as the caller's own steps."""
    llm = _llm("cuda:1")
    expected = _tokens(llm)
    engine = ServingEngine.for_llm(llm)
    done, got = threading.Event(), {i: [] for i in range(len(PROMPTS))}
    finished: list[Update] = []

    def collect(i: int):
        def on_update(update: Update) -> None:
            got[i] += update.token_ids
            if update.finished:
                finished.append(update)
                if len(finished) == len(PROMPTS):
                    done.set()

        return on_update

    try:
        for i, prompt in enumerate(PROMPTS):
            engine.submit(llm.encode(prompt), GREEDY, collect(i))
        assert done.wait(120), "the engine's requests did not finish"
    finally:
        engine.close()
    assert [u.error for u in finished] == [None] * len(PROMPTS)
    assert [got[i] for i in range(len(PROMPTS))] == expected


@pytest.mark.gpu
@TWO_GPUS
def test_a_calibration_times_the_second_gpu():
    """A calibration on cuda:1 (its timer's graphs and events there) names that GPU and gives a budget for
    each of its buckets."""
    llm = _llm("cuda:1")
    settings = CalibrationSettings(capacities=(8, 16), batch_buckets=(1, 2), kv_buckets=(64,),
                                   timing=TimingSettings(warmup=1, repeats=3, depth=5))  # fmt: skip
    table = calibrate_model(llm.model, settings, max_depth=4, progress=False)
    assert table.device == device_name(torch.device("cuda:1"))
    assert {(e.batch_max, e.kv_max) for e in table.entries} == {(1, 64), (2, 64)}
    assert all(e.budget >= 1 for e in table.entries)
