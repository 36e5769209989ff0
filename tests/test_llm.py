"""The LLM API: warm-up serves and leaves nothing behind, streams join up to generate's text, and
failures leave nothing queued."""

import pytest

from trtllm_bole import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(max_batch_size=4, max_seq_len=48)


def test_warm_up_serves_each_batch_size_and_leaves_generation_unchanged(llm):
    params = SamplingParams(max_tokens=12)
    fresh = LLM(max_batch_size=4, max_seq_len=48).generate(["def f(x):"], params, use_tqdm=False)
    assert llm.warm_up([1, 2, 4], use_tqdm=False) == [1, 2, 4]
    assert not llm.executor.has_unfinished
    after = llm.generate(["def f(x):"], params, use_tqdm=False)
    assert after[0].outputs[0].token_ids == fresh[0].outputs[0].token_ids


def test_warm_up_defaults_to_batch_one_on_cpu_and_refuses_sizes_beyond_the_engine(llm):
    assert llm.warm_up(use_tqdm=False) == [1]
    with pytest.raises(ValueError, match=r"\[1, 4\] \(max_batch_size\), got \[8\]"):
        llm.warm_up([8], use_tqdm=False)
    with pytest.raises(ValueError, match="got \\[0\\]"):
        llm.warm_up([0], use_tqdm=False)


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


def test_generate_leaves_nothing_queued_when_a_prompt_or_a_step_fails(llm, monkeypatch):
    with pytest.raises(ValueError, match="invalid literal"):
        llm.generate(["def f(x):", ["not a token id"]], use_tqdm=False)
    assert not llm.executor.has_unfinished  # the first prompt was never submitted

    def broken_step():
        raise RuntimeError("device lost")

    monkeypatch.setattr(llm.executor, "step", broken_step)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(["def f(x):", "class A:"], use_tqdm=False)
    assert not llm.executor.has_unfinished
