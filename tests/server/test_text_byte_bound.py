"""The served model refuses a text prompt that cannot fit by its bytes, before tokenizing it (the bound
the model computes from the tokenizer's longest token)."""

import pytest
from triton_harness import error_of, needs_server, start_server, stop_server

pytestmark = [needs_server, pytest.mark.slow]

MAX_SEQ_LEN = 64
CONTEXT_LIMIT = MAX_SEQ_LEN - 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("triton"),
        ["--mode", "ar", "--max-batch-size", "1", "--max-seq-len", str(MAX_SEQ_LEN)],
    )
    yield server
    stop_server(server)


def test_a_text_prompt_beyond_the_byte_bound_is_refused_by_its_size(server):
    from client import build_inputs

    from trtllm_bole.llm import DEFAULT_MODEL
    from trtllm_bole.text import Tokenizer

    bound = CONTEXT_LIMIT * Tokenizer.find(DEFAULT_MODEL).max_token_bytes
    message = error_of(server.grpc_url, build_inputs("x" * (bound + 1), max_tokens=1))
    assert f"prompt text of {bound + 1} bytes is too long" in message
    assert server.ready()
