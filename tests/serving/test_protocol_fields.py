"""Triton request fields at their edges."""

import numpy as np
import pytest

from trtllm_bole.config import SamplingParams
from trtllm_bole.serving.protocol import RequestError, check_request, llm_kwargs, parse_request


def test_end_id_zero_is_a_token_not_none():
    """Token 0 is a real end id (the embedded model's own ``eos_token_id``); only -1 means none."""
    params = parse_request(
        {"text_input": np.array([[b"x"]], np.object_), "end_id": np.array([[0]], np.int32)}
    ).params
    assert params.stop_token_ids == [0] and params.ignore_eos
    assert parse_request(
        {"text_input": np.array([[b"x"]], np.object_)}, {"end_id": 0}
    ).params.stop_token_ids == [0]


def test_input_lengths_may_cover_every_id_given():
    """TensorRT-LLM clients send ``input_lengths`` equal to the ids' length."""
    ids = np.array([[5, 6, 7]], np.int32)
    assert parse_request({"input_ids": ids, "input_lengths": np.array([[3]], np.int32)}).prompt == [5, 6, 7]
    assert parse_request({"input_ids": ids, "input_lengths": np.array([[0]], np.int32)}).prompt == []


def test_the_id_equal_to_the_vocabulary_size_is_outside_it():
    ok = SamplingParams(max_tokens=2)
    check_request([0, 7], ok, context_limit=12, vocab_size=8, has_tokenizer=False)
    with pytest.raises(RequestError, match=r"input_ids \[8\] are outside the vocabulary \[0, 8\)"):
        check_request([1, 8], ok, context_limit=12, vocab_size=8, has_tokenizer=False)


def test_a_prompt_that_fills_the_context_is_refused_as_too_long():
    with pytest.raises(RequestError, match="prompt of 12 tokens is too long"):
        check_request(
            [1] * 12, SamplingParams(max_tokens=1), context_limit=12, vocab_size=8, has_tokenizer=False
        )


def test_draft_top_k_sets_the_draft_branching():
    kwargs = llm_kwargs({"draft_top_k": "2", "max_nodes": "9"})
    assert (kwargs["speculative_config"].top_k, kwargs["speculative_config"].max_nodes) == (2, 9)
