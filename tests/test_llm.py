"""The LLM API's warm-up: it serves and leaves nothing behind."""

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
