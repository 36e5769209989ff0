"""The serving engine on a tiny random model: threads in, the same tokens as a plain executor run out;
requests really share steps; cancellation frees slots at once; failures stay with their request."""

import threading
import time

import pytest

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.models.config import load_config
from trtllm_bole.models.loader import random_model
from trtllm_bole.serving import ServingEngine, TextDelta, Update, close_on_drain_file
from trtllm_bole.serving import engine as engine_module
from trtllm_bole.spec.executor import Executor
from trtllm_bole.testing import TINY_MTP_CONFIG, pools_settled

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


def until(condition, timeout: float = 30.0) -> bool:
    """Poll ``condition`` (the engine thread's state, read from the test's) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def settled(engine: ServingEngine) -> bool:
    """Nothing live, every slot and block back in its pool."""
    return until(lambda: not engine._live and pools_settled(engine.executor))


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
    assert all(f.finish_reason == "length" for f in finals) and all(len(c.ids) == 12 for c in collectors)
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
    """A cancelled request's slot is free for the next step: a burst that needs every slot, arriving
    together, runs all in the first step (each request's first update sees the full batch; only that
    each ended with "length" was checked, and an admission of one request a step passed)."""
    long, cancel = Collector(), threading.Event()
    engine.submit(
        PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), long, is_cancelled=cancel.is_set
    )
    assert until(lambda: long.updates)
    cancel.set()
    final = long.final
    assert final.finish_reason == "abort" and final.error is None
    assert len(long.ids) < 100
    assert settled(engine)
    burst, first_batch = [Collector() for _ in range(4)], []

    def record(collector):
        def on_update(update):
            if not collector.updates:  # engine thread: safe to look
                first_batch.append(len(engine.executor.scheduler.running))
            collector(update)

        return on_update

    with engine._cv:  # the engine thread takes the whole burst from its inbox at once
        for p, c in zip(PROMPTS[:4], burst, strict=True):
            engine.submit(p, SamplingParams(max_tokens=8, ignore_eos=True), record(c))
    assert all(c.final.finish_reason == "length" for c in burst)
    assert first_batch == [4] * 4


def test_a_reply_that_fails_ends_its_request_with_a_final_error(engine):
    """A consumer raising on a non-final update (its reply could not be built or sent) loses the
    request, frees its slot, and gets a final update saying why, so that its client is not left
    waiting; the other requests run on."""
    failing, other = Collector(), Collector()

    def fail_first(update):
        if not failing.updates and not update.finished:
            failing.updates.append(update)
            raise OSError("send failed")
        failing(update)

    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine.submit(PROMPTS[0], params, fail_first)
    engine.submit(PROMPTS[1], params, other)
    final = failing.final
    assert final.finish_reason == "error" and "OSError: send failed" in final.error
    assert len(failing.updates) == 2 and other.final.finish_reason == "length"
    assert settled(engine)


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


def test_the_queue_behind_the_free_places_is_asked_only_every_waiting_poll(monkeypatch):
    """An ask is the client's round trip: every step asks the requests in the batch and those its free
    places could take, the rest of the queue only every ``WAITING_POLL_S`` (here: only at the first
    step), so that a long queue does not slow the batch's steps."""
    monkeypatch.setattr(engine_module, "WAITING_POLL_S", 1e9)
    engine = ServingEngine(make_executor(max_batch_size=1))
    got = {name: Collector() for name in "abc"}
    asks = []  # (who was asked, who had ended, whether it had tokens yet)

    def asker(name):
        def is_cancelled() -> bool:
            ended = "".join(n for n, c in got.items() if c.done.is_set())
            asks.append((name, ended, bool(got[name].updates)))
            return False

        return is_cancelled

    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for name, prompt in zip("abc", PROMPTS, strict=False):
        engine.submit(prompt, params, got[name], is_cancelled=asker(name))
    assert [c.final.finish_reason for c in got.values()] == ["length"] * 3
    engine.close()

    def count(name, ended, started=None):
        return sum(x == (name, ended, started if started is not None else x[2]) for x in asks)

    steps = sum(1 for u in got["a"].updates if u.token_ids)
    assert steps >= 4 and count("a", "") >= steps - 1  # asked at every step it ran
    assert count("b", "") <= 1 and count("c", "") <= 1  # behind a full batch: the first step only
    assert count("b", "a", started=False) == 1  # next in line once a's place was free: before its prefill
    assert count("c", "a") <= 1 and count("c", "ab", started=False) == 1


def test_refused_requests_get_an_error_and_the_engine_keeps_serving(engine):
    cases = {
        "empty prompt": ([], SamplingParams(max_tokens=4)),
        "token ids [99] are not integers in [0,": ([1, 99], SamplingParams(max_tokens=4)),
        "token ids [1.5] are not integers in [0,": ([1, 1.5], SamplingParams(max_tokens=4)),  # crashed a step
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


def test_a_final_reply_that_fails_is_followed_by_a_final_error(engine):
    """A consumer raising on the final update (its reply could not be built) still gets a final update,
    an error saying why, so that its client is not left waiting; the metrics count what it was told."""
    failing = Collector()

    def fail_final(update):
        if update.finished and update.finish_reason == "length":
            raise ValueError("reply not built")
        failing(update)

    engine.submit(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True), fail_final)
    final = failing.final
    assert final.finish_reason == "error" and "ValueError: reply not built" in final.error, final
    assert "aborted" not in final.error  # it had ended
    assert until(lambda: engine.stats().finished_error == 1)
    assert engine.stats().finished_length == 0 and settled(engine)


def test_a_failing_callback_loses_only_its_request(engine):
    def broken(update):
        raise RuntimeError("consumer went away")

    engine.submit(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True), broken)
    good = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=6, ignore_eos=True), good)
    assert good.final.finish_reason == "length" and len(good.ids) == 6
    assert settled(engine)


def test_params_changed_after_submit_do_not_reach_the_queued_request(engine, monkeypatch):
    """A caller reusing one SamplingParams for its next request: the queued request took the changed
    max_tokens (3 asked, 20 served), the executor having copied it only when the request started."""
    real_step, stepping, release = engine.executor.step, threading.Event(), threading.Event()

    def held_step():
        stepping.set()
        assert release.wait(30)
        return real_step()

    monkeypatch.setattr(engine.executor, "step", held_step)
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=2, ignore_eos=True), Collector())
    assert stepping.wait(30)  # the engine thread is inside a step: the next request stays queued
    params, queued = SamplingParams(max_tokens=3, ignore_eos=True), Collector()
    engine.submit(PROMPTS[0], params, queued)
    params.max_tokens = 20
    release.set()
    assert queued.final.finish_reason == "length" and len(queued.ids) == 3


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


def test_an_ending_that_fails_halfway_leaves_the_engine_serving(engine, monkeypatch):
    """A failed step's request whose finish in the scheduler raises too: it gets its final error, and the
    engine forgets it in both lookups (the request id's stayed: its next step event ended the engine
    thread on a KeyError)."""
    scheduler, real_step, calls = engine.executor.scheduler, engine.executor.step, []
    real_finish = scheduler.finish

    def step_once_broken():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real_step()

    def finish_once_broken(request, reason, error=None):
        if reason == "error":  # the failed step's ending
            monkeypatch.setattr(scheduler, "finish", real_finish)
            raise RuntimeError("bookkeeping broke")
        return real_finish(request, reason, error)

    monkeypatch.setattr(engine.executor, "step", step_once_broken)
    monkeypatch.setattr(scheduler, "finish", finish_once_broken)
    victim = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True), victim)
    assert victim.final.finish_reason == "error" and "device lost" in victim.final.error
    after = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=5, ignore_eos=True), after)
    assert after.final.finish_reason == "length" and len(after.ids) == 5
    assert engine.alive and not engine._by_request and not engine._live


def test_a_request_finished_in_a_failing_step_still_gets_its_tokens(engine, monkeypatch):
    """B's prefill ends it (one token) in the step whose speculation for A then fails, at the wait for
    its outcome (where a device error surfaces): B's final update must still come, with its token, and
    A's with an error; nothing stays live."""
    executor, armed, seen = engine.executor, threading.Event(), {}
    real_prefill, real_book = executor._prefill, executor._book

    def prefill(requests):
        seen.update((tuple(r.prompt_ids), r) for r in requests)
        events = real_prefill(requests)
        if any(r.prompt_ids == PROMPTS[1] for r in requests):
            armed.set()
        return events

    def book(launched):
        if armed.is_set():
            armed.clear()
            raise RuntimeError("device lost")
        return real_book(launched)

    monkeypatch.setattr(executor, "_prefill", prefill)
    monkeypatch.setattr(executor, "_book", book)
    running = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), running)
    deadline = time.monotonic() + 30
    while not running.updates and time.monotonic() < deadline:
        time.sleep(0.01)
    short = Collector()
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=1, ignore_eos=True), short)
    assert short.final.finish_reason == "length" and len(short.ids) == 1
    assert running.final.finish_reason == "error" and "device lost" in running.final.error
    assert running.ids == seen[tuple(PROMPTS[0])].output_ids  # every committed token was handed out
    assert settled(engine)


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


def slowed(engine: ServingEngine, seconds: float) -> ServingEngine:
    """Each step takes at least ``seconds`` more: requests of many steps outlast a short grace."""
    real_step = engine.executor.step

    def step():
        time.sleep(seconds)
        return real_step()

    engine.executor.step = step
    return engine


def test_close_with_a_grace_lets_short_requests_finish_and_aborts_the_rest():
    engine = slowed(ServingEngine(make_executor()), 0.05)
    short, long = Collector(), Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True), short)  # a few steps
    engine.submit(PROMPTS[1], SamplingParams(max_tokens=100, ignore_eos=True), long)  # dozens of steps
    assert until(lambda: engine._live)
    start = time.monotonic()
    engine.close(grace=1.0)
    assert not engine.alive and time.monotonic() - start < 10
    assert short.final.finish_reason == "length" and len(short.ids) == 6  # grace 0 cuts it (checked)
    assert long.final.finish_reason == "abort" and "shut down" in long.final.error and len(long.ids) < 100
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(PROMPTS[0], SamplingParams(), Collector())


@pytest.mark.parametrize(("content", "finished"), [("30\n", "length"), ("soon", "abort")])
def test_the_drain_file_closes_the_engine_with_its_grace(tmp_path, content, finished):
    """The Triton launcher's stop: a grace lets a request finish, a file without one closes at once."""
    engine = slowed(ServingEngine(make_executor()), 0.02)
    drain = tmp_path / "drain"
    watcher = close_on_drain_file(engine, drain, poll=0.01)
    request = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True), request)
    assert until(lambda: request.updates)
    (tmp_path / "partial").write_text(content)
    (tmp_path / "partial").replace(drain)  # whole, as the launcher writes it
    watcher.join(60)
    assert not watcher.is_alive() and not engine.alive
    assert request.final.finish_reason == finished
    assert (len(request.ids) == 40) == (finished == "length")


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
    assert engine.stats().serving == 0 and engine.stats().finished_error == 2  # what the metrics show
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(PROMPTS[2], SamplingParams(), Collector())


def test_a_drain_file_left_by_an_earlier_server_is_removed_not_obeyed(tmp_path):
    engine = ServingEngine(make_executor())
    drain = tmp_path / "drain"
    drain.write_text("0\n")
    watcher = close_on_drain_file(engine, drain, poll=0.01)
    request = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True), request)
    assert request.final.finish_reason == "length" and engine.alive and watcher.is_alive()
    assert not drain.exists()
    engine.close()
    watcher.join(10)
    assert not watcher.is_alive()
