"""The serving engine on a tiny random model: threads in, the same tokens as a plain executor run out;
requests really share steps; cancellation frees slots at once; failures stay with their request."""

import threading
import time

import pytest

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.models.config import load_config
from trtllm_bole.models.loader import random_model
from trtllm_bole.serving import ServingEngine, TextDelta, Update
from trtllm_bole.spec.executor import Executor
from trtllm_bole.testing import TINY_MTP_CONFIG

BOLE = BoleConfig(mode="bole", max_depth=4, max_nodes=10, top_k=3)
PROMPTS = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3], [2, 7, 1, 8], [0, 0, 0], [5, 5]]


def make_executor(max_batch_size: int = 4, **kwargs) -> Executor:
    model = random_model(load_config(TINY_MTP_CONFIG), seed=3)
    return Executor(model, BOLE, max_batch_size=max_batch_size, max_seq_len=128, **kwargs)


class Collector:
    """Records a request's updates; ``done`` is set on the final one."""

    def __init__(self) -> None:
        self.updates: list[Update] = []
        self.done = threading.Event()

    def __call__(self, update: Update) -> None:
        self.updates.append(update)
        if update.finished:
            self.done.set()

    @property
    def ids(self) -> list[int]:
        return [t for u in self.updates for t in u.token_ids]

    @property
    def final(self) -> Update:
        assert self.done.wait(60), "no final update"
        return self.updates[-1]


@pytest.fixture
def engine():
    engine = ServingEngine(make_executor())
    yield engine
    engine.close()
    assert not engine.alive


def reference(prompts, params) -> list[list[int]]:
    executor = make_executor()
    requests = [executor.submit(p, params) for p in prompts]
    while executor.has_unfinished:
        executor.step()
    return [r.output_ids for r in requests]


def test_concurrent_submissions_give_the_executors_tokens(engine):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    collectors = [Collector() for _ in PROMPTS]
    threads = [
        threading.Thread(target=engine.submit, args=(p, params, c))
        for p, c in zip(PROMPTS[: len(collectors)], collectors, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    finals = [c.final for c in collectors]
    assert [c.ids for c in collectors] == reference(PROMPTS, params)
    assert all(f.finish_reason == "length" and f.num_output_tokens == 12 for f in finals)
    assert all(f.stats.steps > 0 and f.stats.drafted > 0 for f in finals)
    assert all(not u.finished for c in collectors for u in c.updates[:-1])


def test_requests_share_steps():
    executor = make_executor(max_batch_size=4)
    engine = ServingEngine(executor)
    batch_sizes = []

    def record(collector):
        def on_update(update):
            batch_sizes.append(len(executor.scheduler.running))  # engine thread: safe to look
            collector(update)

        return on_update

    collectors = [Collector() for _ in range(4)]
    for p, c in zip(PROMPTS[: len(collectors)], collectors, strict=True):
        engine.submit(p, SamplingParams(max_tokens=16, ignore_eos=True), record(c))
    assert all(c.final.finish_reason == "length" for c in collectors)
    engine.close()
    assert max(batch_sizes) == 4


def test_cancel_frees_the_slot_at_once(engine):
    long = Collector()
    key = engine.submit(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), long)
    deadline = time.monotonic() + 30
    while not long.updates and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.cancel(key)
    final = long.final
    assert final.finish_reason == "abort" and final.error is None
    assert len(long.ids) < 100
    assert engine.wait_idle(30)
    scheduler = engine.executor.scheduler
    assert scheduler.slots.num_free == 4 and scheduler.blocks.num_free == scheduler.blocks.num_blocks
    # A burst that needs every slot is admitted in one step.
    burst = [Collector() for _ in range(4)]
    for p, c in zip(PROMPTS[:4], burst, strict=True):
        engine.submit(p, SamplingParams(max_tokens=8, ignore_eos=True), c)
    assert all(c.final.finish_reason == "length" for c in burst)


def test_is_cancelled_is_polled_for_running_and_waiting_requests():
    engine = ServingEngine(make_executor(max_batch_size=1))
    flag = threading.Event()
    running, waiting = Collector(), Collector()
    engine.submit(
        PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), running, is_cancelled=flag.is_set
    )
    engine.submit(
        PROMPTS[1], SamplingParams(max_tokens=100, ignore_eos=True), waiting, is_cancelled=flag.is_set
    )
    deadline = time.monotonic() + 30
    while not running.updates and time.monotonic() < deadline:
        time.sleep(0.01)
    flag.set()
    assert running.final.finish_reason == "abort" and waiting.final.finish_reason == "abort"
    assert waiting.ids == []  # never admitted: its only update is the final one
    engine.close()


def test_refused_requests_get_an_error_and_the_engine_keeps_serving(engine):
    cases = {
        "empty prompt": ([], SamplingParams(max_tokens=4)),
        "outside": ([1, 99], SamplingParams(max_tokens=4)),
        "tokenizer": ([1, 2], SamplingParams(max_tokens=4, stop=["x"])),  # no decode: no stop strings
        "exceeds": (list(range(16)) * 10, SamplingParams(max_tokens=4)),
    }
    for words, (prompt, params) in cases.items():
        collector = Collector()
        engine.submit(prompt, params, collector)
        final = collector.final
        assert final.finish_reason == "error" and words in final.error, final
    good = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True), good)
    assert good.final.finish_reason == "length"


def test_a_failing_callback_loses_only_its_request(engine):
    def broken(update):
        raise RuntimeError("consumer went away")

    engine.submit(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True), broken)
    good = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=6, ignore_eos=True), good)
    assert good.final.finish_reason == "length" and len(good.ids) == 6
    assert engine.wait_idle(30)
    assert engine.executor.scheduler.slots.num_free == 4


def test_a_failing_step_fails_its_batch_not_the_engine(engine, monkeypatch):
    real_step = engine.executor.step
    calls = []

    def step_once_broken():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real_step()

    monkeypatch.setattr(engine.executor, "step", step_once_broken)
    victim = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True), victim)
    assert victim.final.finish_reason == "error" and "device lost" in victim.final.error
    after = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=5, ignore_eos=True), after)
    assert after.final.finish_reason == "length"
    assert engine.executor.scheduler.slots.num_free == 4


def test_a_request_finished_in_a_failing_step_still_gets_its_tokens(engine, monkeypatch):
    """B's prefill ends it (one token) in the step whose speculation for A then raises: B's final
    update must still come, with its token, and A's with an error; nothing stays live."""
    executor, armed = engine.executor, threading.Event()
    real_prefill, real_speculate = executor._prefill, executor._speculate

    def prefill(requests):
        events = real_prefill(requests)
        if any(r.prompt_ids == PROMPTS[1] for r in requests):
            armed.set()
        return events

    def speculate(requests):
        if armed.is_set():
            armed.clear()
            raise RuntimeError("device lost")
        return real_speculate(requests)

    monkeypatch.setattr(executor, "_prefill", prefill)
    monkeypatch.setattr(executor, "_speculate", speculate)
    running = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), running)
    deadline = time.monotonic() + 30
    while not running.updates and time.monotonic() < deadline:
        time.sleep(0.01)
    short = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=1, ignore_eos=True), short)
    assert short.final.finish_reason == "length" and len(short.ids) == 1
    assert running.final.finish_reason == "error" and "device lost" in running.final.error
    assert len(running.ids) == running.final.num_output_tokens
    assert engine.wait_idle(30) and not engine._live
    assert executor.scheduler.slots.num_free == 4


def test_close_aborts_in_flight_requests():
    engine = ServingEngine(make_executor())
    collectors = [Collector() for _ in range(3)]
    for p, c in zip(PROMPTS[: len(collectors)], collectors, strict=True):
        engine.submit(p, SamplingParams(max_tokens=100, ignore_eos=True), c)
    engine.close()
    assert not engine.alive
    for c in collectors:
        assert c.final.finish_reason == "abort" and "shut down" in c.final.error
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(PROMPTS[0], SamplingParams(), Collector())


def test_text_delta_holds_back_what_may_still_change():
    vocab = {1: "ab", 2: "\ufffd", 3: "c", 4: "EN", 5: "D!"}

    def decode(ids):
        text = "".join(vocab[t] for t in ids)
        return text.replace("\ufffdc", "é")  # a character split over two tokens

    delta = TextDelta(decode, stop=["END"])
    assert delta([1], False) == "ab"
    assert delta([1, 2], False) == ""  # half a character
    assert delta([1, 2, 3], False) == "é"
    assert delta([1, 2, 3, 4], False) == ""  # could be the start of "END"
    assert delta([1, 2, 3, 4, 5], True) == ""  # cut at the stop string, as LLM.generate cuts
    plain = TextDelta(decode)
    assert plain([1, 4], False) == "abEN" and plain([1, 4, 5], True) == "D!"
    assert TextDelta(None)([1], True) == ""


def test_text_delta_reassembles_the_real_tokenizers_text():
    from trtllm_bole.llm import DEFAULT_MODEL
    from trtllm_bole.text import Tokenizer

    tokenizer = Tokenizer.find(DEFAULT_MODEL)
    text = 'def grüße(名前):\n    return f"¡hola {名前}! ✓"  # naïve\n'
    ids = tokenizer.encode(text)
    delta = TextDelta(tokenizer.decode, stop=["# na"])
    pieces = [delta(ids[:n], n == len(ids)) for n in range(1, len(ids) + 1)]
    assert "".join(pieces) == text[: text.index("# na")]
    assert all("\ufffd" not in p for p in pieces)


def test_an_engine_thread_that_dies_fails_every_request_and_refuses_new_ones(monkeypatch):
    engine = ServingEngine(make_executor(max_batch_size=1))
    running, queued = Collector(), Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), running)
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=100, ignore_eos=True), queued)
    deadline = time.monotonic() + 30
    while not running.updates and time.monotonic() < deadline:
        time.sleep(0.01)

    def broken():
        raise RuntimeError("bug outside a step")

    monkeypatch.setattr(engine, "_poll_cancellations", broken)
    for c in (running, queued):
        assert c.final.finish_reason == "error" and "bug outside a step" in c.final.error
    engine._thread.join(10)
    assert not engine.alive and not engine._live
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(PROMPTS[2], SamplingParams(), Collector())
