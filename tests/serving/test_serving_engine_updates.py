"""Serving engine: the stats each update carries, a cancellation predicate that raises, and a failing
step when the batch's request holds slot 0."""

from tests.serving.test_serving_engine import PROMPTS, Collector, make_executor, settled
from trtllm_bole.config import SamplingParams
from trtllm_bole.serving import ServingEngine


def test_updates_carry_the_requests_own_speculation_totals():
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    executor = make_executor()
    request = executor.submit(PROMPTS[0], params)
    while executor.has_unfinished:
        executor.step()
    engine = ServingEngine(make_executor())
    got = Collector()
    engine.submit(PROMPTS[0], params, got)
    stats = got.final.stats
    engine.close()
    assert stats == request.stats and stats is not request.stats  # a copy of the totals at the end
    assert stats.drafted > stats.accepted  # a random model's drafts: the two totals are told apart


def test_an_is_cancelled_that_raises_cancels_its_request():
    """A vanished client (its predicate raises) counts as cancelled: the slot comes back."""
    engine = ServingEngine(make_executor(max_batch_size=1))
    calls = []

    def gone() -> bool:
        calls.append(1)
        if len(calls) > 1:
            raise ConnectionError("client vanished")
        return False

    doomed = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=100, ignore_eos=True), doomed, is_cancelled=gone)
    final = doomed.final
    assert final.finish_reason == "abort" and len(doomed.ids) < 100
    assert settled(engine)
    engine.close()


def test_a_failing_step_fails_the_request_in_slot_zero(monkeypatch):
    executor = make_executor(max_batch_size=1)  # its one request runs in slot 0
    engine = ServingEngine(executor)
    real_step, calls, slots = executor.step, [], []

    def step_once_broken():
        calls.append(1)
        slots.extend(r.slot for r in executor.scheduler.running)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real_step()

    monkeypatch.setattr(executor, "step", step_once_broken)
    victim = Collector()
    engine.submit(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True), victim)
    assert victim.final.finish_reason == "error" and "device lost" in victim.final.error
    assert slots and set(slots) == {0}
    assert settled(engine)
    engine.close()
