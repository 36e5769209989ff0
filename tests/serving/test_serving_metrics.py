"""The serving engine's metrics: the snapshot its thread publishes, and the moves that bring Prometheus
samples from one snapshot to the next (the Triton model applies them; tests/server scrapes them)."""

import dataclasses
import time

import pytest

from tests.serving.test_serving_engine import PROMPTS, Collector, make_executor, until
from trtllm_bole.config import SamplingParams
from trtllm_bole.serving import ServingEngine
from trtllm_bole.serving.engine import EngineStats, RequestLatency
from trtllm_bole.serving.metrics import COUNTER, FAMILIES, GAUGE, observations, samples, updates


def test_the_engine_publishes_its_batch_its_cache_and_the_totals_of_the_requests_ended():
    """Totals are the ended requests' own (tokens, drafts, steps), every finish reason counted, a request
    refused at submission too; once all have ended the batch is empty and every KV block free."""
    executor = make_executor(max_batch_size=2)
    blocks = executor.scheduler.blocks
    engine = ServingEngine(executor)
    assert engine.stats() == EngineStats(
        max_batch_size=2, kv_blocks_max=blocks.num_blocks, kv_tokens_per_block=blocks.block_size
    )
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    collectors = [Collector() for _ in range(5)]
    for prompt, got in zip(PROMPTS[:3], collectors, strict=False):
        engine.submit(prompt, params, got)
    engine.submit([], params, collectors[3])  # finished at submission: an empty prompt
    engine.submit([1], SamplingParams(stop=["x"]), collectors[4])  # refused: stop strings, no tokenizer
    finals = [c.final for c in collectors]
    assert until(lambda: engine.stats().finished_length == 3)
    stats = engine.stats()
    engine.close()
    assert stats.serving == 1 and engine.stats().serving == 0
    ended = [f.stats for f in finals[:3]]
    assert [f.finish_reason for f in finals] == ["length"] * 3 + ["error"] * 2
    assert (stats.finished_stop, stats.finished_abort, stats.finished_error) == (0, 0, 2)
    assert stats.prompt_tokens == sum(map(len, PROMPTS[:3])) and stats.generated_tokens == 30
    assert stats.draft_tokens == sum(s.drafted for s in ended) > stats.accepted_draft_tokens
    assert stats.accepted_draft_tokens == sum(s.accepted for s in ended)
    assert stats.verify_steps == sum(s.steps for s in ended) and stats.prefill_forwards == 3
    assert (stats.active, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.iterations >= max(s.steps for s in ended) + 1  # two requests at most a step: some waited
    latencies = engine.take_latencies()  # the four that reached the executor, in the order they ended
    assert [(x.output_tokens, x.finish_reason) for x in latencies] == [(0, "error")] + [(10, "length")] * 3
    assert latencies[0].first_token_s is None and all(0 < x.first_token_s < x.total_s for x in latencies[1:])
    assert engine.take_latencies() == []  # taken once


def test_a_request_ended_by_its_first_token_has_a_time_to_it():
    engine = ServingEngine(make_executor())
    got = Collector()
    engine.submit(PROMPTS[3], SamplingParams(max_tokens=1), got)
    assert got.final.finish_reason == "length" and len(got.ids) == 1  # its first update is its last
    assert until(lambda: engine.stats().finished_length == 1)
    engine.close()
    (latency,) = engine.take_latencies()
    assert 0 < latency.first_token_s <= latency.total_s and latency.output_tokens == 1


def test_a_busy_engine_reports_its_batch_and_the_blocks_it_holds():
    executor = make_executor(max_batch_size=2)
    engine = ServingEngine(executor)
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    collectors = [Collector() for _ in range(3)]
    keys = [engine.submit(p, params, c) for p, c in zip(PROMPTS, collectors, strict=False)]
    assert until(lambda: engine.stats().active == 2 and engine.stats().waiting == 1)
    stats = engine.stats()
    assert stats.kv_blocks_used == sum(len(r.blocks) for r in executor.scheduler.running) > 0
    engine.close()  # aborts all three
    assert engine.stats().finished_abort == len(keys) == 3
    # The prompts prefilled: the third one never was (it counted as if it had been).
    assert engine.stats().prompt_tokens == len(PROMPTS[0]) + len(PROMPTS[1])


def test_a_request_whose_consumer_fails_is_counted_as_the_error_it_is_told():
    """The engine aborts a request whose consumer raises (a vanished client), tells it so in a final
    ``"error"`` update and counts it as that error."""
    engine = ServingEngine(make_executor())
    seen = []

    def gone(update):
        seen.append(update)
        if len(seen) == 2:
            raise ConnectionError("client vanished")

    engine.submit(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True), gone)
    assert until(lambda: engine.stats().finished_error == 1)
    stats = engine.stats()
    engine.close()
    assert stats.finished_abort == 0
    assert seen[-1].finish_reason == "error" and len(seen) == 3  # told so in a final update
    assert stats.generated_tokens == sum(len(u.token_ids) for u in seen) > 0  # what it got before


def test_a_full_queue_refuses_requests_until_one_leaves_it():
    """With ``max_queue_size`` 2 and a batch of one: one request runs, two wait, the fourth is refused
    (and counted) while they do; once a waiting one is admitted there is room again."""
    engine = ServingEngine(make_executor(max_batch_size=1), max_queue_size=2)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    collectors = [Collector() for _ in range(4)]
    for prompt, got in zip(PROMPTS, collectors[:3], strict=False):
        engine.submit(prompt, params, got)
    assert until(lambda: engine.stats().active == 1 and engine.stats().waiting == 2)
    with pytest.raises(RuntimeError, match="queue is full: 2 of max_queue_size 2 waiting"):
        engine.submit(PROMPTS[3], params, collectors[3])
    assert collectors[0].final.finish_reason == "length"  # the first ends: the second runs
    assert until(lambda: engine.stats().waiting == 1)
    engine.submit(PROMPTS[3], SamplingParams(max_tokens=2), collectors[3])
    assert [c.final.finish_reason for c in collectors] == ["length"] * 4
    engine.close()
    assert engine.stats().rejected_queue_full == 1 and engine.stats().finished_length == 4
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit(PROMPTS[0], params, Collector())
    assert engine.stats().rejected_shut_down == 1  # counted though the engine thread has stopped
    # A server's own refusals before submit (the Triton model's: bad input, an internal error).
    engine.note_refused("invalid")
    engine.note_refused("invalid")
    engine.note_refused("internal")
    stats = engine.stats()
    assert (stats.rejected_invalid, stats.rejected_internal, stats.rejected_queue_full) == (2, 1, 1)
    with pytest.raises(ValueError, match="'invalid' or 'internal', got 'queue_full'"):
        engine.note_refused("queue_full")  # submit's own: counted there
    with pytest.raises(ValueError, match="max_queue_size must be a positive integer"):
        ServingEngine(make_executor(), max_queue_size=0)


def test_requests_being_handed_to_the_scheduler_count_against_the_queue_bound(monkeypatch):
    """The engine thread takes the whole inbox, then submits each request to the executor: in between a
    request was in neither queue that ``max_queue_size`` counts, and a burst got past the bound (batch 1,
    bound 1: three accepted where two fit). The hand-over is widened here to 0.3 s a request."""
    executor = make_executor(max_batch_size=1)
    submit = executor.submit

    def slow_submit(*args, **kwargs):
        time.sleep(0.3)
        return submit(*args, **kwargs)

    monkeypatch.setattr(executor, "submit", slow_submit)
    engine = ServingEngine(executor, max_queue_size=1)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    accepted = 0
    for prompt in PROMPTS[:4]:
        try:
            engine.submit(prompt, params, Collector())
            accepted += 1
        except RuntimeError as e:
            assert "queue is full: 1 of max_queue_size 1" in str(e)
        time.sleep(0.05)
    engine.close()
    assert accepted == 2


def test_refusals_after_the_engine_thread_stopped_are_counted():
    """Once the thread has stopped (closed, or failed) every request is refused and nothing publishes a
    snapshot any more: the refusals still reach the stats (they used to stay at the count the thread last
    published, so ``bole_rejected_requests{reject_reason="shut_down"}`` read 0 while every request failed)."""
    engine = ServingEngine(make_executor())
    engine.close()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="shut down"):
            engine.submit(PROMPTS[0], SamplingParams(max_tokens=2), Collector())
    stats = engine.stats()
    assert (stats.serving, stats.rejected_shut_down, stats.rejected_queue_full) == (0, 3, 0)
    moves = updates(EngineStats(serving=0), stats)
    assert ("bole_rejected_requests", "shut_down", "increment", 3) in moves


def test_while_the_queue_waits_for_kv_blocks_free_places_do_not_hide_it():
    """A batch of four places and KV blocks for one request at a time: the second request waits for
    blocks with three places free, so it is queued, and with ``max_queue_size`` 1 the third is refused
    (counting only the requests beyond the free places, it used to be taken: up to three more waited)."""
    executor = make_executor(max_batch_size=4, num_blocks=6)  # 60 tokens + tree: 5 blocks a request
    engine = ServingEngine(executor, max_queue_size=1)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    collectors = [Collector() for _ in range(3)]
    for prompt, got in zip(PROMPTS, collectors[:2], strict=False):
        engine.submit(prompt, params, got)
    assert until(lambda: engine.stats().active == 1 and engine.stats().waiting == 1)
    with pytest.raises(RuntimeError, match="queue is full: 1 of max_queue_size 1 waiting"):
        engine.submit(PROMPTS[2], params, collectors[2])
    assert [c.final.finish_reason for c in collectors[:2]] == ["length"] * 2
    assert until(lambda: engine.stats().waiting == 0)
    engine.submit(PROMPTS[2], SamplingParams(max_tokens=2), collectors[2])  # room again
    assert collectors[2].final.finish_reason == "length"
    engine.close()


def test_a_burst_into_an_idle_engine_weighs_kv_blocks_too():
    """The same cache and queue bound, the requests arriving together before any step: the first takes
    the blocks, the second waits for them and the third is refused, whether or not the engine thread
    has moved the first two yet (the blocks used to be weighed only after a step: into an idle engine a
    burst filled every free place, 9 of 12 taken with 8 places and one request's blocks)."""
    engine = ServingEngine(make_executor(max_batch_size=4, num_blocks=6), max_queue_size=1)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    collectors = [Collector() for _ in range(3)]
    for prompt, got in zip(PROMPTS, collectors[:2], strict=False):
        engine.submit(prompt, params, got)
    with pytest.raises(RuntimeError, match="queue is full: 1 of max_queue_size 1 waiting"):
        engine.submit(PROMPTS[2], params, collectors[2])
    assert [c.final.finish_reason for c in collectors[:2]] == ["length"] * 2
    engine.close()
    assert engine.stats().rejected_queue_full == 1


def test_samples_cover_every_stat_under_its_family():
    """Every sample carries the stat its family and label name, against a table written from the metrics'
    meaning (not from FAMILIES), each stat a distinct value: labels swapped within a family (kv ``max``
    and ``tokens_per``, ``verify_steps`` and ``prefill_forwards``, ``stop`` and ``abort``) passed before."""
    families = {f.name: f for f in FAMILIES}
    assert len(families) == len(FAMILIES) and {f.kind for f in FAMILIES} == {GAUGE, COUNTER}
    stats = EngineStats(**{f.name: 100 + i for i, f in enumerate(dataclasses.fields(EngineStats))})
    expected = {
        ("bole_engine_status", "serving"): stats.serving,
        ("bole_request_metrics", "active"): stats.active,
        ("bole_request_metrics", "waiting"): stats.waiting,
        ("bole_request_metrics", "max"): stats.max_batch_size,
        ("bole_kv_cache_block_metrics", "used"): stats.kv_blocks_used,
        ("bole_kv_cache_block_metrics", "free"): stats.kv_blocks_max - stats.kv_blocks_used,
        ("bole_kv_cache_block_metrics", "max"): stats.kv_blocks_max,
        ("bole_kv_cache_block_metrics", "tokens_per"): stats.kv_tokens_per_block,
        ("bole_iteration_metrics", "steps"): stats.iterations,
        ("bole_finished_requests", "length"): stats.finished_length,
        ("bole_finished_requests", "stop"): stats.finished_stop,
        ("bole_finished_requests", "abort"): stats.finished_abort,
        ("bole_finished_requests", "error"): stats.finished_error,
        ("bole_rejected_requests", "queue_full"): stats.rejected_queue_full,
        ("bole_rejected_requests", "shut_down"): stats.rejected_shut_down,
        ("bole_rejected_requests", "invalid"): stats.rejected_invalid,
        ("bole_rejected_requests", "internal"): stats.rejected_internal,
        ("bole_token_metrics", "prompt"): stats.prompt_tokens,
        ("bole_token_metrics", "generated"): stats.generated_tokens,
        ("bole_spec_decode_metrics", "draft_tokens"): stats.draft_tokens,
        ("bole_spec_decode_metrics", "accepted_draft_tokens"): stats.accepted_draft_tokens,
        ("bole_spec_decode_metrics", "verify_steps"): stats.verify_steps,
        ("bole_spec_decode_metrics", "prefill_forwards"): stats.prefill_forwards,
    }
    assert len(set(expected.values())) == len(expected)  # distinct: a swapped label shows
    assert set(expected.values()) >= set(dataclasses.astuple(stats))  # every stat published
    assert samples(stats) == expected


def test_updates_set_gauges_and_grow_counters_by_their_growth():
    first = EngineStats(active=2, max_batch_size=4, kv_blocks_used=3, kv_blocks_max=10, draft_tokens=5)
    moves = updates(None, first)
    assert ("bole_request_metrics", "active", "set", 2) in moves
    assert ("bole_kv_cache_block_metrics", "free", "set", 7) in moves
    assert ("bole_spec_decode_metrics", "draft_tokens", "increment", 5) in moves
    assert not [m for m in moves if m[2] == "increment" and m[3] == 0]  # counters that did not grow
    later = dataclasses.replace(first, active=1, draft_tokens=12, iterations=3)
    moves = updates(first, later)
    assert ("bole_request_metrics", "active", "set", 1) in moves
    assert [m for m in moves if m[2] == "increment"] == [
        ("bole_iteration_metrics", "steps", "increment", 3),
        ("bole_spec_decode_metrics", "draft_tokens", "increment", 7),
    ]
    with pytest.raises(ValueError, match=r"counter bole_spec_decode_metrics\{draft_tokens\} went down"):
        updates(later, dataclasses.replace(later, draft_tokens=11))


def test_observations_time_the_first_token_of_every_request_and_the_rest_of_the_completed_ones():
    done = RequestLatency(first_token_s=0.5, total_s=2.5, output_tokens=3, finish_reason="stop")
    one = RequestLatency(first_token_s=0.25, total_s=0.25, output_tokens=1, finish_reason="length")
    aborted = RequestLatency(first_token_s=0.75, total_s=9.0, output_tokens=30, finish_reason="abort")
    refused = RequestLatency(first_token_s=None, total_s=0.01, output_tokens=0, finish_reason="error")
    assert observations([done, one, aborted, refused]) == [
        ("bole_request_latency_seconds", "first_token", 0.5),
        ("bole_request_latency_seconds", "total", 2.5),
        ("bole_time_per_output_token_seconds", "generated", 1.0),  # 2 s over the 2 tokens after the first
        ("bole_request_latency_seconds", "first_token", 0.25),
        ("bole_request_latency_seconds", "total", 0.25),
        ("bole_request_latency_seconds", "first_token", 0.75),
    ]
