"""Request and response tensors of the Triton model, and its config parameters, without a server."""

import numpy as np
import pytest

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.serving import Update
from trtllm_bole.serving.protocol import (
    OUTPUT_NAMES,
    RequestError,
    ResponseStream,
    check_prompt_text,
    check_request,
    engine_kwargs,
    llm_kwargs,
    parse_request,
)
from trtllm_bole.spec.scheduler import SpecStats


def text(s: str) -> np.ndarray:
    return np.array([[s.encode()]], dtype=np.object_)


def scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def test_text_prompt_and_sampling_tensors():
    parsed = parse_request(
        {
            "text_input": text("def f():"),
            "max_tokens": scalar(7, np.int32),
            "temperature": scalar(0.5, np.float32),
            "top_k": scalar(3, np.int32),
            "top_p": scalar(0.9, np.float32),
            "random_seed": scalar(11, np.uint64),
            "stream": scalar(True, np.bool_),
            "stop_words": np.array([[b"\n\n", b""]], dtype=np.object_),
        }
    )
    assert parsed.prompt == "def f():" and parsed.stream
    p = parsed.params
    assert (p.max_tokens, p.top_k, p.seed, p.stop) == (7, 3, 11, ["\n\n"])
    assert p.temperature == pytest.approx(0.5) and p.top_p == pytest.approx(0.9)


def test_ids_prompt_trimmed_by_input_lengths_and_parameters_as_fallback():
    parsed = parse_request(
        {"input_ids": np.array([[5, 6, 7, 8]], dtype=np.int32), "input_lengths": scalar(3, np.int32),
         "max_tokens": scalar(4, np.int32)},
        {"max_tokens": 99, "temperature": 1, "stream": True},
    )  # fmt: skip
    assert parsed.prompt == [5, 6, 7]
    assert parsed.params.max_tokens == 4  # the tensor wins over the parameter
    ids = {"input_ids": np.array([[5, 6, 7, 8]], dtype=np.int32)}
    assert parse_request(ids, {"input_lengths": 2}).prompt == [5, 6]  # a scalar: a parameter too
    assert parsed.params.temperature == 1.0 and parsed.stream
    assert parse_request({"text_input": text("x")}).params == SamplingParams()
    triton_own = {"triton_enable_empty_final_response": True}  # Triton's own: accepted, and ignored
    assert parse_request({"text_input": text("x")}, triton_own) == parse_request({"text_input": text("x")})
    assert parse_request({"text_input": text("x")}, triton_own).params == SamplingParams()


def test_token_ids_past_the_context_are_refused_before_they_become_python_ints():
    """40M ids were turned into a list of Python ints (10 s, 2.3 GB in the model's process, every other
    request waiting) before their length was checked; the check now reads the array's size, after
    input_lengths trims it (a padded tensor of a short prompt is served)."""

    class Unconverted(np.ndarray):  # the refusal may not turn the ids into Python ints
        def tolist(self):
            raise AssertionError("converted")

        def __iter__(self):
            raise AssertionError("iterated")

    huge = {"input_ids": np.zeros((1, 5_000_000), dtype=np.int32)}
    with pytest.raises(RequestError, match=r"prompt of 5000000 tokens is too long: .* at most 1024 prompt"):
        parse_request({"input_ids": huge["input_ids"].view(Unconverted)}, context_limit=1024)
    padded = parse_request(huge, {"input_lengths": 3}, context_limit=1024)
    assert padded.prompt == [0, 0, 0] and all(type(t) is int for t in padded.prompt)
    with pytest.raises(RequestError, match="prompt of 1024 tokens is too long"):
        parse_request({"input_ids": np.ones((1, 1024), dtype=np.int64)}, context_limit=1024)


def test_the_smallest_temperature_arrives_as_the_client_wrote_it():
    """An FP32 tensor holds 1e-5 as 9.9999997e-06; read as that double it fell below the minimum."""
    params = parse_request({"text_input": text("x"), "temperature": scalar(1e-5, np.float32)}).params
    assert params.temperature == 1e-5
    assert parse_request({"text_input": text("x"), "top_p": scalar(0.7, np.float32)}).params.top_p == 0.7
    # float32's largest, allowed, is written 3.4028235e+38: as that double it was refused as too large.
    largest = np.finfo(np.float32).max
    params = parse_request({"text_input": text("x"), "temperature": scalar(largest, np.float32)}).params
    assert params.temperature == float(largest)


def test_end_id_replaces_the_models_end_token():
    assert parse_request({"text_input": text("x"), "end_id": scalar(7, np.int32)}).params.stop_token_ids == [
        7
    ]
    none = parse_request({"text_input": text("x"), "end_id": scalar(-1, np.int32)}).params
    assert none.ignore_eos and none.stop_token_ids == []


@pytest.mark.parametrize(
    ("tensors", "parameters", "words"),
    [
        ({}, {}, "got neither"),
        ({"text_input": text("x"), "input_ids": np.array([[1]], np.int32)}, {}, "got both"),
        ({"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_)}, {}, "one prompt per request"),
        ({"text_input": np.array([[b"\xff"]], dtype=np.object_)}, {}, "UTF-8"),
        ({"input_ids": np.array([[1.5]], np.float32)}, {}, "integers"),
        ({"input_ids": np.array([[1, 2]], np.int32), "input_lengths": scalar(3, np.int32)}, {}, "outside"),
        ({"text_input": text("x"), "max_tokens": scalar(0, np.int32)}, {}, "max_tokens"),
        ({"text_input": text("x"), "max_tokens": np.array([[1, 2]], np.int32)}, {}, "one value"),
        ({"text_input": text("x"), "temperature": scalar(-1, np.float32)}, {}, "temperature"),
        ({"text_input": text("x"), "top_p": scalar(0, np.float32)}, {}, "top_p"),
        ({"text_input": text("x")}, {"max_tokens": "5"}, "must be int"),
        ({"text_input": text("x")}, {"stream": 1}, "must be bool"),
        ({"text_input": text("x")}, {"temperature": "hot"}, "must be float"),
        ({"text_input": text("x"), "temperature": scalar(np.inf, np.float32)}, {}, "temperature.*finite"),
        (
            {"text_input": text("x"), "stop_words": np.array([[b"x" * 1025]], np.object_)},
            {},
            r"stop_words\.0: .*1024 char",
        ),
        (
            {"text_input": text("x"), "stop_words": np.array([[b"%d" % i for i in range(17)]], np.object_)},
            {},
            "stop",
        ),
        (
            {"text_input": text("x"), "temperature": scalar(1e-40, np.float32)},
            {},
            r"0 \(greedy\) or at least 1e-05 \(got [0-9.e-]+\)$",  # the value once
        ),
        (
            {"text_input": text("x")},
            {"max_new_tokens": 8},
            r"unknown request parameters \['max_new_tokens'\]",
        ),
        (  # a misspelt prompt field (HTTP JSON's extra keys arrive as parameters): the inputs are named
            {},
            {"prompt": "def f():"},
            r"unknown request parameters \['prompt'\]: this model reads the prompt from text_input or input_",
        ),
        ({"text_input": text("x"), "input_lengths": scalar(1, np.int32)}, {}, "does not apply to text_input"),
        ({"text_input": text("x")}, {"input_lengths": 1}, "does not apply to text_input"),
        (
            {"text_input": text("x"), "end_id": scalar(-2, np.int32)},
            {},
            r"end_id -2 is neither a token id nor -1",
        ),
        ({"text_input": text("x")}, {"end_id": -7}, "end_id -7"),  # it used to mean "no end token"
    ],
)
def test_bad_requests_are_refused_with_the_reason(tensors, parameters, words):
    with pytest.raises(RequestError, match=words):
        parse_request(tensors, parameters)


def test_limits_are_checked_against_the_engine():
    ok = SamplingParams(max_tokens=10)
    check_request([1, 2], ok, context_limit=12, vocab_size=8, has_tokenizer=False)
    cases = [
        ([], ok, "empty prompt"),
        (list(range(8)) * 2, ok, "too long"),
        ([1, 9], ok, "outside the vocabulary"),
        (
            [1],
            SamplingParams(max_tokens=2, stop_token_ids=[8]),
            r"end_id 8 is outside the vocabulary \[0, 8\)",
        ),
        ([1, 2, 3], ok, "max_tokens 10 is out of range"),
        ([1], SamplingParams(max_tokens=2, stop=["x"]), "tokenizer"),
    ]
    for prompt, params, words in cases:
        with pytest.raises(RequestError, match=words):
            check_request(prompt, params, context_limit=12, vocab_size=8, has_tokenizer=False)
    # A stop word holding a special token: refused as an invalid argument here (the executor's refusal,
    # on the engine thread, reached the client as an internal error).
    special = SamplingParams(max_tokens=2, stop=["ok", "x<|endoftext|>"])
    with pytest.raises(RequestError, match=r"stop_words \['x<\|endoftext\|>'\] hold a special token"):
        check_request([1], special, context_limit=12, vocab_size=8, has_tokenizer=True,
                      special_texts={"<|endoftext|>"})  # fmt: skip
    check_request([1], special, context_limit=12, vocab_size=8, has_tokenizer=True, special_texts={"<|im|>"})


def update(ids, text_delta, finished=False, reason=None, error=None) -> Update:
    return Update(0, ids, text_delta, finished, reason, error, SpecStats(2, 8, 3))


def test_streaming_sends_every_delta_and_flags_the_last():
    replies = ResponseStream(stream=True)
    first = replies(update([4, 5], "ab"))
    assert not first.final and first.tensors["output_ids"].tolist() == [[4, 5]]
    assert first.tensors["text_output"].tolist() == [[b"ab"]]
    assert first.tensors["finish_reason"].tolist() == [[b""]]
    assert replies(update([], "")) is None
    last = replies(update([6], "c", True, "length"))
    assert last.final and last.tensors["finish_reason"].tolist() == [[b"length"]]
    assert last.tensors["total_draft_tokens"].item() == 8
    assert last.tensors["total_accepted_draft_tokens"].item() == 3
    assert last.tensors["acceptance_rate"].item() == pytest.approx(3 / 8)
    assert last.tensors["mean_accepted_tokens"].item() == pytest.approx(2.5)
    assert last.tensors["output_ids"].dtype == np.int32


def test_non_streaming_sends_one_reply_with_everything():
    replies = ResponseStream(stream=False)
    assert replies(update([4, 5], "ab")) is None
    last = replies(update([6], "c", True, "stop"))
    assert tuple(last.tensors) == OUTPUT_NAMES
    assert last.final and last.tensors["output_ids"].tolist() == [[4, 5, 6]]
    assert last.tensors["text_output"].tolist() == [[b"abc"]]
    empty = ResponseStream(stream=False)(update([], "", True, "stop"))
    assert empty.tensors["output_ids"].shape == (1, 0)


def test_aborts_and_failures_become_errors():
    cancelled = ResponseStream(True)(update([], "", True, "abort"))
    assert (cancelled.final, cancelled.code) == (True, "cancelled")
    shutdown = ResponseStream(True)(update([], "", True, "abort", "the serving engine shut down"))
    assert shutdown.code == "unavailable" and "shut down" in shutdown.error
    failed = ResponseStream(False)(update([], "", True, "error", "engine step failed"))
    assert failed.code == "internal" and failed.tensors is None
    # Triton hands clients no status code of the model's errors: the message opens with it.
    assert cancelled.message == "[CANCELLED] request cancelled"
    assert shutdown.message == "[UNAVAILABLE] the serving engine shut down"
    assert failed.message == "[INTERNAL] engine step failed"


def test_model_parameters_become_llm_arguments():
    unset = {k: "${" + k + "}" for k in ("engine_dir", "speculative_mode", "max_batch_size", "device")}
    assert llm_kwargs(unset, "KIND_CPU", "0") == {"model": None, "device": "cpu"}
    kwargs = llm_kwargs(
        {"engine_dir": "/e", "speculative_mode": "chain", "max_depth": "3", "max_batch_size": "16",
         "max_seq_len": "512", "device": "cuda", "dtype": "bfloat16", "kv_cache_tokens": "",
         "max_prefill_tokens": "2048"},
        "KIND_GPU", "2",
    )  # fmt: skip
    assert kwargs == {
        "model": "/e",
        "device": "cuda:2",
        "dtype": "bfloat16",
        "max_batch_size": 16,
        "max_seq_len": 512,
        "max_prefill_tokens": 2048,
        "speculative_config": BoleConfig(mode="chain", max_depth=3),
    }
    assert llm_kwargs({}, "KIND_GPU", "1")["device"] == "cuda:1"
    with pytest.raises(ValueError, match="max_batch_size must be positive"):
        llm_kwargs({"max_batch_size": "0"})
    with pytest.raises(ValueError, match="must be an integer"):
        llm_kwargs({"max_seq_len": "lots"})
    # A draft parameter its mode does not use, even at the value a tree would default to, is refused.
    with pytest.raises(ValueError, match="speculative_mode ar does not use max_depth or max_nodes: it"):
        llm_kwargs({"speculative_mode": "ar", "max_depth": "8", "max_nodes": "5"})
    with pytest.raises(ValueError, match="speculative_mode chain does not use draft_top_k: a chain drafts"):
        llm_kwargs({"speculative_mode": "chain", "draft_top_k": "4"})
    # A bad value is one line naming the parameter (pydantic's text spanned lines and named the field).
    for given, message in (
        ({"max_depth": "40"}, r"^max_depth: Input should be less than or equal to 15 \(got 40\)$"),
        ({"draft_top_k": "17"}, r"^draft_top_k: Input should be less than or equal to 16 \(got 17\)$"),
        ({"speculative_mode": "beam"}, r"^speculative_mode: Input should be 'ar', .* \(got 'beam'\)$"),
        ({"max_depth": "8", "max_nodes": "4"}, r"^max_nodes \(4\) must be at least max_depth \(8\) so that"),
    ):
        with pytest.raises(ValueError, match=message):
            llm_kwargs(given)
    with pytest.raises(ValueError, match=r"^--max-depth: Input should be less than or equal to 15"):
        llm_kwargs({"max_depth": "40"}, names={"max_depth": "--max-depth"})


def test_the_queue_bound_is_the_engines_parameter():
    assert engine_kwargs({"max_queue_size": "${max_queue_size}", "max_batch_size": "8"}) == {}
    assert engine_kwargs({"max_queue_size": " 32 "}) == {"max_queue_size": 32}
    assert "max_queue_size" not in llm_kwargs({"max_queue_size": "32"})
    with pytest.raises(ValueError, match="max_queue_size must be positive"):
        engine_kwargs({"max_queue_size": "0"})


def test_a_text_prompt_that_cannot_fit_is_refused_before_tokenizing():
    check_prompt_text("é" * 20, context_limit=10, max_token_bytes=4)  # 40 bytes: may be 10 tokens
    with pytest.raises(RequestError, match="prompt text of 42 bytes is too long"):
        check_prompt_text("é" * 21, context_limit=10, max_token_bytes=4)


def test_max_token_bytes_bounds_the_real_tokenizers_token_count():
    """The bound behind that refusal: no text takes fewer than bytes / max_token_bytes tokens, and the
    bound is the longest vocabulary entry's bytes, no looser (any too-large bound passed before)."""
    import random

    from trtllm_bole.llm import DEFAULT_MODEL
    from trtllm_bole.text import Tokenizer

    tokenizer = Tokenizer.find(DEFAULT_MODEL)
    vocab = tokenizer._tok.get_vocab(with_added_tokens=True)
    longest = max(vocab, key=lambda entry: len(entry.encode()))
    assert tokenizer.max_token_bytes == len(longest.encode())
    rng = random.Random(0)
    texts = [tokenizer.decode([vocab[longest]]) * 50, " " * 5000, "\n" * 3000, "x" * 4000]
    texts += ["".join(rng.choice("ab \n\t{}éあ") for _ in range(2000)) for _ in range(5)]
    for text in texts:
        assert len(tokenizer.encode(text)) * tokenizer.max_token_bytes >= len(text.encode())
