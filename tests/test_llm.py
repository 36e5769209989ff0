"""The LLM API: warm-up serves and leaves nothing behind, streams join up to generate's text, and
failures leave nothing queued."""

import gc
import itertools
import json
import shutil
import threading
import time
import weakref

import numpy as np
import pytest
import torch

from trtllm_bole import LLM, BoleConfig, SamplingParams
from trtllm_bole.serving import ServingEngine
from trtllm_bole.testing import pools_settled


@pytest.fixture(scope="module")
def llm():
    return LLM(max_batch_size=4, max_seq_len=48)


def test_warm_up_serves_each_batch_size_and_leaves_generation_unchanged(llm, monkeypatch):
    """Its return value echoes the sizes asked for (a warm-up that served nothing passed): each size is
    one generate call of that many prompts, all running at once."""
    params = SamplingParams(max_tokens=12)
    fresh = LLM(max_batch_size=4, max_seq_len=48).generate(["def f(x):"], params, use_tqdm=False)
    real_generate, scheduler = llm.generate, llm.executor.scheduler
    real_admit, served = scheduler.admit, []  # per generate call: its prompts, the most run at once

    def generate(prompts, *args, **kwargs):
        served.append([len(prompts), 0])
        return real_generate(prompts, *args, **kwargs)

    def admit(max_batch):
        admitted = real_admit(max_batch)
        served[-1][1] = max(served[-1][1], len(scheduler.running))
        return admitted

    with monkeypatch.context() as patch:
        patch.setattr(llm, "generate", generate)
        patch.setattr(scheduler, "admit", admit)
        assert llm.warm_up([1, 2, 4], use_tqdm=False) == [1, 2, 4]
    assert served == [[1, 1], [2, 2], [4, 4]]
    assert not llm.executor.has_unfinished
    after = llm.generate(["def f(x):"], params, use_tqdm=False)
    assert after[0].outputs[0].token_ids == fresh[0].outputs[0].token_ids


def test_warm_up_fits_its_requests_to_a_small_kv_cache():
    """A KV cache that holds fewer tokens than the context limit (here 64 for 1,024) is served with a
    smaller limit per request; warm-up once asked for 44-token prompts + 18 tokens and failed."""
    small = LLM(kv_cache_tokens=64, max_seq_len=1024, max_batch_size=4)
    assert small.executor.scheduler.request_limit < 44 + 18
    assert small.warm_up([1, 2], use_tqdm=False) == [1, 2]
    assert not small.executor.has_unfinished


def test_warm_up_defaults_to_batch_one_on_cpu_and_refuses_sizes_beyond_the_engine(llm):
    assert llm.warm_up(use_tqdm=False) == [1]
    with pytest.raises(ValueError, match=r"\[1, 4\] \(max_batch_size\), got \[8\]"):
        llm.warm_up([8], use_tqdm=False)
    with pytest.raises(ValueError, match="got \\[0\\]"):
        llm.warm_up([0], use_tqdm=False)
    with pytest.raises(ValueError, match=r"must be integers in .*got \[2\.5\]"):  # was a TypeError in range()
        llm.warm_up([2.5], use_tqdm=False)
    with pytest.raises(ValueError, match=r"must be integers in .*got \[True\]"):  # was warmed as batch 1
        llm.warm_up([True], use_tqdm=False)
    with pytest.raises(ValueError, match=r"batch sizes are a list of integers, got 2"):  # was a TypeError
        llm.warm_up(2, use_tqdm=False)


def test_stream_texts_join_up_to_generates_text_with_and_without_a_stop_string(llm):
    full = llm.generate(["def f(x):"], SamplingParams(max_tokens=16), use_tqdm=False)[0].outputs[0].text
    stop = full[6:9]
    assert stop and full.index(stop) > 0
    for params in (SamplingParams(max_tokens=16), SamplingParams(max_tokens=16, stop=[stop])):
        whole = llm.generate(["def f(x):"], params, use_tqdm=False)[0].outputs[0]
        streamed = list(llm.generate_stream("def f(x):", params))
        assert "".join(o.outputs[0].text for o in streamed) == whole.text
        assert streamed[-1].finished and not any(o.finished for o in streamed[:-1])
    assert whole.text == full[: full.index(stop)]
    # generation itself stopped there (the text alone would be cut after the fact anyway)
    assert whole.finish_reason == "stop" and len(whole.token_ids) < 16
    # the ids keep the tokens up to the one that completed the stop string (README, Generate)
    ids_text = llm.tokenizer.decode(whole.token_ids)
    assert ids_text.startswith(whole.text) and stop in ids_text
    assert stop not in llm.tokenizer.decode(whole.token_ids[:-1])


def test_an_output_that_finishes_the_prompts_last_character_holds_that_character(llm):
    """A prompt of token ids may end inside a character (an earlier output cut mid-emoji by
    ``max_tokens``). Where the output's first byte finishes it, generate's text, the stream's and the
    serving engine's hold the whole character (they read the output after the prompt's last whole
    character), and a stop string holding it is met; decoded alone, the output began with U+FFFD."""
    prompt = llm.encode("s = '\U0001f600")[:-1]  # the emoji's last byte cut off: three of its bytes left
    assert llm.tokenizer.decode(prompt).endswith("'\ufffd")
    for seed in range(400):  # the embedded model seldom writes a lone last byte: find a draw that does
        params = SamplingParams(max_tokens=3, temperature=3.0, seed=seed)
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        if "\ufffd" not in llm.tokenizer.decode(prompt[-3:] + out.token_ids[:1]):
            break
    else:
        raise AssertionError("no draw of 400 seeds finishes the prompt's character")
    whole = llm.tokenizer.decode(prompt + out.token_ids)
    assert out.text == whole[len("s = '") :] and out.text[0] != "\ufffd"
    assert llm.tokenizer.decode(out.token_ids)[0] == "\ufffd"  # what the output's text was before
    assert "".join(o.outputs[0].text for o in llm.generate_stream(prompt, params)) == out.text
    stopped = llm.generate(
        [prompt], SamplingParams(max_tokens=3, temperature=3.0, seed=seed, stop=[out.text[0]]), use_tqdm=False
    )
    assert (
        stopped[0].outputs[0].finish_reason == "stop" and stopped[0].outputs[0].token_ids == out.token_ids[:1]
    )
    updates, done = [], threading.Event()

    def on_update(update):
        updates.append(update)
        if update.finished:
            done.set()

    engine = ServingEngine.for_llm(LLM(max_batch_size=1, max_seq_len=48))
    try:
        engine.submit(prompt, params, on_update)
        assert done.wait(60)
    finally:
        engine.close()
    assert "".join(u.text for u in updates) == out.text


def test_generate_leaves_nothing_queued_when_a_prompt_or_a_step_fails(llm, monkeypatch):
    with pytest.raises(ValueError, match="integer token ids"):
        llm.generate(["def f(x):", ["not a token id"]], use_tqdm=False)
    assert not llm.executor.has_unfinished  # the first prompt was never submitted
    with monkeypatch.context() as patch:  # settings the executor refuses at submit, on the second prompt
        patch.setattr(llm.executor, "decode_text", None)
        with pytest.raises(ValueError, match="stop strings need a tokenizer"):
            llm.generate(
                ["def f(x):", "class A:"], [SamplingParams(), SamplingParams(stop=["x"])], use_tqdm=False
            )
    assert not llm.executor.has_unfinished  # the first one was submitted, then aborted

    def broken_step():
        raise RuntimeError("device lost")

    monkeypatch.setattr(llm.executor, "step", broken_step)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(["def f(x):", "class A:"], use_tqdm=False)
    assert not llm.executor.has_unfinished


def settled(llm) -> bool:
    return pools_settled(llm.executor)


def test_interleaved_streams_and_a_generate_between_them_keep_every_token(llm):
    """Every step advances every running request: a stream must take its tokens from its request, not
    from the events of the steps it ran itself (it lost them, and never finished, before)."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(["def f(x):", "class A:"], params, use_tqdm=False)]
    a, b = llm.generate_stream("def f(x):", params), llm.generate_stream("class A:", params)
    got = {0: [], 1: []}
    for outputs in itertools.zip_longest(a, b):
        for i, out in enumerate(outputs):
            if out is not None:
                got[i].append(out)
    c = llm.generate_stream("def f(x):", params)
    first = next(c)
    llm.generate(["class A:"], params, use_tqdm=False)  # runs c's request to its end meanwhile
    got[2] = [first, *c]
    for i, ref in ((0, alone[0]), (1, alone[1]), (2, alone[0])):
        assert [t for o in got[i] for t in o.outputs[0].token_ids] == ref, i
        assert got[i][-1].finished and not any(o.finished for o in got[i][:-1]), i
    assert settled(llm)


def test_generate_from_several_threads(llm):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(["def f(x):", "import os"], params, use_tqdm=False)]
    results = [None] * 4

    def call(i: int) -> None:
        outputs = llm.generate(["def f(x):", "import os"], params, use_tqdm=False)
        results[i] = [o.outputs[0].token_ids for o in outputs]

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert results == [alone] * 4
    assert settled(llm)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda llm: llm.generate([[1.7, 2.9]], use_tqdm=False), "integer token ids, got \\[1.7, 2.9\\]"),
        (lambda llm: list(llm.generate_stream(["a", "b"])), "one prompt, got 2"),
        (lambda llm: llm.generate(["a"], [None], use_tqdm=False), "must be SamplingParams, got None"),
        (lambda llm: LLM(max_batch_size=0), "max_batch_size must be an integer of at least 1, got 0"),
        (lambda llm: LLM(max_seq_len=2), "max_seq_len must be an integer of at least 3, got 2"),
        (lambda llm: LLM(max_seq_len=4097), "max_seq_len 4097 exceeds the model's max_position_embed"),
        (lambda llm: LLM(device="meta"), "device must be 'cpu', 'cuda' or 'cuda:N', got 'meta'"),
        (lambda llm: SamplingParams(seed=2**64), "seed"),
        (lambda llm: SamplingParams(top_k=2**31), "top_k"),
        (lambda llm: SamplingParams(stop=[""]), "at least 1 character"),
        (lambda llm: SamplingParams(max_tokens=True), "max_tokens\n.*integers, not booleans: got True"),
        (lambda llm: SamplingParams(stop_token_ids=[3, False]), "stop_token_ids\n.*not booleans"),
        (lambda llm: SamplingParams(temperature=True), "temperature\n.*numbers, not booleans: got True"),
        (lambda llm: SamplingParams(top_p=True), "top_p\n.*numbers, not booleans: got True"),
        # In float32 (the sampling kernels' settings) 1e-46 read 0 and kept no token: every draw was the
        # last token id; 1e39 read inf and tied every scaled logit, so top_k kept the whole vocabulary.
        (
            lambda llm: SamplingParams(temperature=0.8, top_p=1e-46),
            "top_p must be at least 1.175e-38, float32's",
        ),
        (lambda llm: SamplingParams(temperature=1e39), "temperature must be at most 3.403e\\+38"),
    ],
)
def test_bad_inputs_are_refused_by_name(llm, call, words):
    with pytest.raises(ValueError, match=words):
        call(llm)


def test_a_max_seq_len_beyond_the_model_is_refused_before_its_weights_load(monkeypatch):
    import trtllm_bole.llm as llm_module

    def loaded(*args, **kwargs):
        raise AssertionError("the weights were loaded before max_seq_len was checked")

    monkeypatch.setattr(llm_module, "load_model", loaded)
    with pytest.raises(ValueError, match="max_seq_len 4097 exceeds the model's max_position_embeddings 4096"):
        LLM(max_seq_len=4097)


@pytest.mark.parametrize("config_layers", [1, 0], ids=["no-mtp-tensors", "config-without-mtp-layers"])
def test_a_speculative_mode_without_an_mtp_module_is_refused_before_the_weights_load(
    config_layers, tmp_path, monkeypatch
):
    """The default mode drafts with the checkpoint's MTP module: a checkpoint without one is refused
    from its config and headers (it was refused after every weight had loaded: minutes at 27B)."""
    import trtllm_bole.llm as llm_module
    from trtllm_bole.models.checkpoint import random_tensors, write_safetensors
    from trtllm_bole.models.config import load_config
    from trtllm_bole.testing import TINY_MTP_CONFIG

    settings = {**TINY_MTP_CONFIG, "mtp_num_hidden_layers": config_layers}
    (tmp_path / "config.json").write_text(json.dumps(settings))
    write_safetensors(tmp_path, random_tensors(load_config(TINY_MTP_CONFIG), seed=0, mtp=config_layers == 0))
    load_model = llm_module.load_model

    def loaded(*args, **kwargs):
        raise AssertionError("the weights were loaded before the MTP module was looked for")

    monkeypatch.setattr(llm_module, "load_model", loaded)
    why = "has no mtp.* tensors" if config_layers else r"config\.json sets mtp_num_hidden_layers = 0"
    with pytest.raises(
        ValueError, match=rf"mode 'bole' drafts with the checkpoint's MTP module, and .*{why}"
    ):
        LLM(tmp_path)
    monkeypatch.setattr(llm_module, "load_model", load_model)
    assert LLM(tmp_path, speculative_config=BoleConfig(mode="ar")).model.mtp is None


def test_a_stream_closed_while_another_steps_ends_with_that_step(llm, monkeypatch):
    """Closing a stream while another caller's step holds the lock queues its abort; the step ends it
    as it releases the lock, before the other stream's reader gets its tokens (it waited for some later
    step, holding its slot and KV blocks while that reader was slow)."""
    closed = llm.generate_stream([5, 6, 7, 8], SamplingParams(max_tokens=40, ignore_eos=True))
    next(closed)
    (request,) = llm.executor.scheduler.running
    step = llm.executor.step

    def step_closing_the_stream():
        monkeypatch.setattr(llm.executor, "step", step)
        closed.close()  # on this thread, inside the step: the lock is held, so the abort is queued
        assert not request.finished
        step()

    monkeypatch.setattr(llm.executor, "step", step_closing_the_stream)
    reader = llm.generate_stream([9, 10, 11], SamplingParams(max_tokens=3, ignore_eos=True))
    next(reader)
    assert request.finished and request.finish_reason == "abort" and not llm._to_abort
    assert [o.finished for o in reader][-1]
    assert pools_settled(llm.executor)


def test_an_empty_stream_prompt_is_one_refused_request(llm):
    (out,) = list(llm.generate_stream([]))
    assert out.finished and out.outputs[0].finish_reason == "error" and "empty prompt" in out.error


def test_ids_no_tokenizer_can_hold_are_one_refused_request_and_the_others_served(llm):
    """-5 and 2**40 raised the tokenizer's OverflowError from generate's outputs, after the batch ran."""
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for bad in (-5, 2**40, 99999):
        refused, served = llm.generate([[1, 2, bad], [1, 2, 3]], params, use_tqdm=False)
        assert refused.outputs[0].finish_reason == "error" and f"token ids [{bad}]" in refused.error
        assert refused.outputs[0].text == "" and refused.prompt_token_ids == [1, 2, bad]
        assert served.error is None and len(served.outputs[0].token_ids) == 3


def test_a_stream_of_a_one_prompt_list_reports_its_prompt_as_generate_does(llm):
    params = SamplingParams(max_tokens=2)
    assert llm.generate(["def f(x):"], params, use_tqdm=False)[0].prompt == "def f(x):"
    assert {o.prompt for o in llm.generate_stream(["def f(x):"], params)} == {"def f(x):"}


def test_prompts_as_arrays_and_tensors_are_token_ids(llm):
    params = SamplingParams(max_tokens=4)
    ref = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids
    for prompt in (np.array([5, 6, 7]), torch.tensor([5, 6, 7])):
        assert llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == ref


def test_a_list_of_a_tensors_items_is_one_prompt_of_token_ids(llm):
    """``list(torch.tensor([5, 6, 7]))`` holds 0-d tensors, which encode reads as ids: each had been taken
    for a prompt, and refused ("got tensor(5)")."""
    params = SamplingParams(max_tokens=4)
    ref = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids
    [out] = llm.generate(list(torch.tensor([5, 6, 7])), params, use_tqdm=False)
    assert (out.prompt_token_ids, out.outputs[0].token_ids) == ([5, 6, 7], ref)
    streamed = [
        t for o in llm.generate_stream(list(torch.tensor([5, 6, 7])), params) for t in o.outputs[0].token_ids
    ]
    assert streamed == ref


def test_an_outputs_prompt_token_ids_are_its_own(llm):
    """Every yield of a stream held the request's own prompt list: extending the first one's (to build the
    next prompt) changed the prompt the later yields reported, and the one the request's stop strings
    were read after while it ran."""
    outputs = llm.generate_stream([5, 6, 7], SamplingParams(max_tokens=5))
    next(outputs).prompt_token_ids.append(99)
    assert [o.prompt_token_ids for o in outputs][-1] == [5, 6, 7]


def test_a_prompt_that_is_no_sequence_is_named(llm):
    # 5 and None were TypeError tracebacks from list() or len(); a dict's keys were served as the prompts,
    # a set's prompts in no order
    for prompt in (5, torch.tensor(5), None, {"prompt": "def f():"}, {"def f():", "import os"}):
        with pytest.raises(ValueError, match="prompts are a string, token ids or a list of them, got"):
            llm.generate(prompt, use_tqdm=False)
        with pytest.raises(ValueError, match="prompts are a string, token ids or a list of them, got"):
            next(llm.generate_stream(prompt))
    with pytest.raises(ValueError, match="sampling_params must be SamplingParams or a list of them, got 5"):
        llm.generate("def f():", 5, use_tqdm=False)  # was a TypeError from list()
    # A dict's keys were taken for the list: "must be SamplingParams, got 'max_tokens'"
    with pytest.raises(ValueError, match=r"got a dict: pass SamplingParams\(\*\*\{'max_tokens': 4\}\)"):
        llm.generate("def f():", {"max_tokens": 4}, use_tqdm=False)


def test_settings_in_place_of_the_prompts_or_the_sampling_params_are_named(llm):
    """A pydantic model iterates as its (field, value) pairs: a BoleConfig for the sampling params was "got 6
    sampling params for 1 prompts", and SamplingParams for the prompts six prompts, the first refused as
    "got ('max_tokens', 64)"."""
    with pytest.raises(ValueError, match=r"sampling_params must be .* got BoleConfig\(mode='bole'"):
        llm.generate("def f():", BoleConfig(), use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompts are a string, .* got a SamplingParams: "):
        llm.generate(SamplingParams(max_tokens=4), use_tqdm=False)


def test_bytes_are_refused_rather_than_read_as_token_ids(llm):
    """Bytes are a sequence of ints: ``b"def f"`` was served as the token ids 100, 101, 102, 32, 102."""
    for call in (llm.generate, lambda p: next(llm.generate_stream(p))):
        for prompt in (b"def f", [b"def f"], bytearray(b"def f")):
            with pytest.raises(ValueError, match=r"got bytes (bytearray\()?b'def f'.*: decode it first"):
                call(prompt)


def test_a_stop_string_holding_a_special_token_is_refused(llm):
    """Decoding skips special tokens, so ``stop=["<|endoftext|>"]`` could never match: it was taken and
    the request ran to max_tokens. Its id is what stops."""
    for call in (llm.generate, lambda p, s: next(llm.generate_stream(p, s))):
        with pytest.raises(ValueError, match=r"stop strings \['x<\|endoftext\|>'\] hold a special token"):
            call("def f", SamplingParams(stop=["x<|endoftext|>"]))
    assert llm.tokenizer.special_texts == {"<|endoftext|>"}


def test_a_prompt_holding_a_lone_surrogate_is_refused_by_name(llm):
    """A ``str`` no encoding holds (``json.loads('"\\ud83d"')``, a ``surrogateescape`` read): the
    tokenizer's TypeError said the str was not a str."""
    for call in (llm.generate, lambda p: next(llm.generate_stream(p))):
        with pytest.raises(ValueError, match=r"lone surrogate '\\ud83d' at character 8"):
            call("def f():\ud83d")


def test_booleans_are_refused_as_token_ids(llm):
    """``True`` is an int to ``operator.index``: ``[True, 5]`` was served as the ids 1, 5 (and a numpy
    bool array's ``tolist`` gives such a list), where the executor and SamplingParams refuse booleans."""
    for call in (llm.generate, lambda p: next(llm.generate_stream(p))):
        for prompt in ([True, 5], [[3, False]], np.array([True, False])):
            with pytest.raises(ValueError, match="a sequence of integer token ids, got"):
                call(prompt)
    assert llm.encode([np.int64(3), torch.tensor(5)]) == [3, 5]  # other integer types are ids


def test_sampling_params_changed_in_place_are_validated_when_submitted(llm):
    """Assignments are validated, a list changed in place is not: an empty stop string stopped every
    request after its first token, a ``True`` in ``stop_token_ids`` was read as id 1."""
    for change, refused in (
        (lambda sp: sp.stop.append(""), "stop.0"),
        (lambda sp: sp.stop_token_ids.append(True), "stop_token_ids"),
    ):
        params = SamplingParams(max_tokens=4)
        change(params)
        with pytest.raises(ValueError, match=refused):
            llm.generate(["def f():"], params, use_tqdm=False)
    assert settled(llm)
    fresh = llm.generate(["def f():"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(fresh[0].outputs[0].token_ids) == 4


def test_every_end_token_of_the_checkpoint_is_read(tmp_path):
    """A list of ids (each stops: tests/spec/test_executor.py), or a clear error for anything else."""
    from trtllm_bole.llm import DEFAULT_MODEL

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(DEFAULT_MODEL, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["eos_token_id"] = [7, 11]
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert LLM(checkpoint).executor.eos_token_ids == {7, 11}
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [13, 7]}))
    assert LLM(checkpoint).executor.eos_token_ids == {13, 7, 11}  # a chat model's end of turn too
    config["eos_token_id"] = "</s>"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json\): eos_token_id must be a token id"):
        LLM(checkpoint)


class OwnedLock:
    """A lock that tells which thread holds it."""

    def __init__(self, lock) -> None:
        self.lock, self.owner = lock, None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self.lock.acquire(blocking, timeout):
            return False
        self.owner = threading.get_ident()
        return True

    def release(self) -> None:
        self.owner = None
        self.lock.release()

    def locked(self) -> bool:
        return self.lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def test_a_stream_read_while_another_thread_generates_finishes_once_with_every_token(llm, monkeypatch):
    """A yield is one view of its request: ``finished`` only on the last, with every token before it
    (another thread's step between reading the tokens and building the output once broke this). A busy
    thread alone never stepped into that gap (this passed with the bug put back), so as each stream's
    first output is built, another thread steps its request to the end: in the gap if the stream does
    not hold the lock then, else once it lets go."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = llm.generate(["def f(x):"], params, use_tqdm=False)[0].outputs[0].token_ids
    stop = threading.Event()
    monkeypatch.setattr(llm, "_lock", OwnedLock(llm._lock))
    real_output, steppers, stepped = llm._output, [], set()

    def step_to_the_end(request) -> None:
        while not request.finished:
            llm._step()

    def output_while_another_steps(request, prompt, delta=None):
        if delta is not None and not request.finished and request.request_id not in stepped:
            stepped.add(request.request_id)
            steppers.append(threading.Thread(target=step_to_the_end, args=(request,), daemon=True))
            steppers[-1].start()
            if llm._lock.owner != threading.get_ident():  # nothing keeps the step out of the gap
                steppers[-1].join(60)
        return real_output(request, prompt, delta)

    monkeypatch.setattr(llm, "_output", output_while_another_steps)

    def busy() -> None:
        while not stop.is_set():
            llm.generate(["class A:"], SamplingParams(max_tokens=3), use_tqdm=False)

    other = threading.Thread(target=busy, daemon=True)
    other.start()
    try:  # five streams stepped in their gap; on a loaded machine the busy thread may finish one first
        for _ in range(20):
            outs = list(llm.generate_stream("def f(x):", params))
            assert [t for o in outs for t in o.outputs[0].token_ids] == alone
            assert outs[-1].finished and not any(o.finished for o in outs[:-1])
            if len(stepped) == 5:
                break
    finally:
        stop.set()
        for thread in [other, *steppers]:
            thread.join(60)
    assert len(stepped) == 5
    assert settled(llm)


def test_a_stream_closed_by_the_garbage_collector_mid_step_does_not_deadlock(llm, monkeypatch):
    """Its ``finally`` runs on whatever thread collects, possibly one holding the step lock."""
    stream = llm.generate_stream("def f(x):", SamplingParams(max_tokens=40, ignore_eos=True))
    next(stream)
    cycle = {"stream": stream}
    cycle["self"] = cycle  # only the cyclic collector frees it
    del stream, cycle
    real_step = llm.executor.step

    def collecting_step():
        gc.collect()
        return real_step()

    monkeypatch.setattr(llm.executor, "step", collecting_step)
    done = []
    caller = threading.Thread(
        target=lambda: done.append(llm.generate(["x = 1"], use_tqdm=False)), daemon=True
    )
    caller.start()
    caller.join(60)
    assert done, "generate() deadlocked on the collected stream's abort"
    assert settled(llm)


def test_a_failed_step_ends_every_running_request(llm, monkeypatch):
    """The step may have left any of them half-updated: none runs on, whoever submitted it."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    a, b = llm.generate_stream("def f(x):", params), llm.generate_stream("class A:", params)
    next(a), next(b)
    real_step = llm.executor.step

    def broken():
        raise RuntimeError("device lost")

    monkeypatch.setattr(llm.executor, "step", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        next(a)
    monkeypatch.setattr(llm.executor, "step", real_step)
    last = list(b)[-1]
    assert last.finished and last.outputs[0].finish_reason == "error" and "device lost" in last.error
    assert settled(llm)


def test_shutdown_frees_the_model_and_refuses_later_calls():
    """``with LLM(...) as llm:`` and :meth:`LLM.shutdown` drop the model, its caches and graphs (nothing
    else keeps them: their memory goes back); a later call is refused by name, not an AttributeError
    from None; a second shutdown does nothing."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with LLM(max_batch_size=2, max_seq_len=48) as llm:
        assert len(llm.generate(["def f(x):"], params, use_tqdm=False)[0].outputs[0].token_ids) == 4
        model, executor = weakref.ref(llm.model), weakref.ref(llm.executor)
    gc.collect()
    assert model() is None and executor() is None
    for call in (
        lambda: llm.generate(["def f(x):"], params, use_tqdm=False),
        lambda: next(llm.generate_stream("def f(x):", params)),
        lambda: llm.warm_up(),
    ):
        with pytest.raises(RuntimeError, match="this LLM was shut down: make a new LLM"):
            call()
    llm.shutdown()


class _EagerGraph:
    def replay(self) -> None:
        pass


def test_shutdown_drops_the_graphs_and_caches_whoever_holds_the_model(monkeypatch):
    """Shutdown releases the CUDA graphs (their outputs hold the graph pool's memory) and the model's
    caches itself, not by leaving them to the last reference: with the model still held elsewhere they go.
    On the CPU the step graphs are "captured" by running once (a real capture needs CUDA)."""
    from trtllm_bole.spec.graphs import CacheGraphs
    from trtllm_bole.spec.verify_graphs import StepGraphs

    monkeypatch.setattr(CacheGraphs, "_capture", lambda self, run: (_EagerGraph(), run()))
    llm = LLM(max_batch_size=2, max_seq_len=48)
    model, executor = llm.model, llm.executor
    executor.step_graphs = StepGraphs.of(
        model, max_depth=llm.speculative_config.max_depth + 1, table_width=4, coins=2
    )
    assert executor.capture_graphs([1, 2]) == 2
    graphs = executor.step_graphs
    outputs = [weakref.ref(t) for key in graphs.captured for t in graphs._graphs[key].outputs]
    cache = weakref.ref(model.cache.gdn_state)
    llm.shutdown()
    gc.collect()
    assert not graphs.captured and model.cache is None and model.mtp.cache is None and cache() is None
    assert outputs and all(ref() is None for ref in outputs)


def test_shutdown_ends_the_requests_of_running_calls_as_aborted():
    """A stream being read and a generate() on another thread, both mid-request when the LLM shuts
    down: each ends, its requests aborted with the tokens they had, and nothing waits forever."""
    llm = LLM(max_batch_size=4, max_seq_len=1024)
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    stream = llm.generate_stream("def f(x):", params)
    first = next(stream)
    results = []
    thread = threading.Thread(
        target=lambda: results.extend(llm.generate(["import os", [5, 6]], params, use_tqdm=False)),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 60
    while len(llm.executor.scheduler.running) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread's requests admitted
    llm.shutdown()
    thread.join(60)
    assert not thread.is_alive(), "generate() did not return after shutdown"
    rest = list(stream)
    assert first.finished is False and rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert [o.outputs[0].finish_reason for o in results] == ["abort", "abort"]
    assert all(len(o.outputs[0].token_ids) < 1000 for o in results)


def test_shutdown_closes_a_serving_engine_made_from_the_llm_first():
    """The engine's requests ended with final updates, its thread stopped: shutdown had aborted them under
    the LLM's lock alone, while the engine's thread stepped the same executor, and their clients waited
    on an engine that never learned of it. A new engine of a shut-down LLM is refused by name."""
    llm = LLM(max_batch_size=2, max_seq_len=1024)
    engine = ServingEngine.for_llm(llm)
    updates, started, done = [], threading.Event(), threading.Event()

    def on_update(update):
        updates.append(update)
        started.set()
        if update.finished:
            done.set()

    engine.submit([5, 6, 7], SamplingParams(max_tokens=1000, ignore_eos=True), on_update)
    assert started.wait(60)
    llm.shutdown()
    assert done.is_set() and not engine.alive
    assert updates[-1].finish_reason == "abort" and sum(len(u.token_ids) for u in updates) < 1000
    with pytest.raises(RuntimeError, match="this LLM was shut down"):
        ServingEngine.for_llm(llm)


def test_a_served_llm_refuses_to_step_by_itself():
    """The serving engine's thread steps the executor without the LLM's lock: a generate of the LLM's own
    beside it had stepped the same executor at once (wrong tokens on both sides, an IndexError, a GDN slot
    of -1). Once served, the LLM refuses to generate, stream, warm up or serve again, in one line, and
    the served request reads as plain decoding does; an LLM whose own stream still runs is not served."""
    prompt, params = [5, 6, 7], SamplingParams(max_tokens=24)
    plain = LLM(max_batch_size=2, max_seq_len=128, speculative_config=BoleConfig(mode="ar"))
    expected = plain.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(max_batch_size=2, max_seq_len=128)
    stream = llm.generate_stream(prompt, params)
    next(stream)
    with pytest.raises(RuntimeError, match=r"still runs 1 request\(s\) of its own"):
        ServingEngine.for_llm(llm)
    stream.close()
    engine = ServingEngine.for_llm(llm)
    got, done = [], threading.Event()
    try:
        engine.submit(prompt, params, lambda u: (got.extend(u.token_ids), u.finished and done.set()))
        for refused in (
            lambda: llm.generate([prompt], params, use_tqdm=False),
            lambda: next(llm.generate_stream(prompt, params)),
            lambda: llm.warm_up(use_tqdm=False),
            lambda: ServingEngine.for_llm(llm),
        ):
            with pytest.raises(RuntimeError, match=r"this LLM is served .* submit requests to the server"):
                refused()
        assert done.wait(60)
    finally:
        llm.shutdown()
    assert got == expected


def _live_allocation_sites(top: int = 8) -> str:
    """Where the CUDA tensors still allocated were made (torch's memory history, our frames), largest
    first: what a failure of the test below needs to say."""
    sites: dict[str, int] = {}
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                ours = [f for f in block.get("frames", []) if "trtllm_bole" in f["filename"]][:3]
                site = " < ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in ours)
                sites[site or "?"] = sites.get(site or "?", 0) + block["size"]
    largest = sorted(sites.items(), key=lambda kv: -kv[1])[:top]
    return "; ".join(f"{size / 2**20:.1f} MB at {site}" for site, size in largest)


def _cublas_workspaces_dropped() -> int:
    """Drops torch's cuBLAS workspaces (one for each stream a GEMM ran on, kept for the life of the process,
    which torch's own leak check leaves out the same way) and returns the bytes they held."""
    allocated = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    return allocated - torch.cuda.memory_allocated()


@pytest.mark.gpu
def test_shutdown_gives_the_gpu_memory_back():
    """What "frees the model, its caches and graphs" means on a GPU: after a warm-up (every CUDA graph
    captured) and a generate, shutdown leaves torch's allocated memory where it was before the LLM, but for
    cuBLAS workspaces: at most two (the eager forwards' stream and the one all captures run on).
    Its first run (an H100, benchmarks/results/h100_d78cf4c) failed: 638 of 681 MB still allocated, which
    its second run (h100_420c3ae) named: 19 workspaces of 32 MiB, one for each new stream a capture had
    run on. A failure names the model's fate and where the live allocations were made."""
    _cublas_workspaces_dropped()
    eye = torch.eye(64, device="cuda")
    eye @ eye  # a GEMM on a stream without a workspace
    workspace = _cublas_workspaces_dropped()  # what one takes
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        gc.collect()
        before = torch.cuda.memory_allocated()
        with LLM(device="cuda", max_batch_size=4, max_seq_len=256) as llm:
            llm.warm_up(use_tqdm=False)
            llm.generate(["def f(x):"], SamplingParams(max_tokens=16), use_tqdm=False)
            held = torch.cuda.memory_allocated() - before
            model = weakref.ref(llm.model)
        gc.collect()
        sites = _live_allocation_sites()
        workspaces = _cublas_workspaces_dropped()
        left = torch.cuda.memory_allocated() - before
        fate = "the model alive" if model() is not None else "the model gone"
        why = f"{held} bytes held, {left} left, {workspaces} in workspaces of {workspace}, {fate}: {sites}"
        assert held > 2**24 and left <= max(2**22, held // 100), why
        assert workspace > 0 and workspaces <= 2 * workspace, why
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
