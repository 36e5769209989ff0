import dataclasses

import pytest

from trtllm_bole.models.cache import ModelCache
from trtllm_bole.models.config import Qwen35Config, load_config

# Tiny enough for two CPU cores; dv != dk and HV = 2H so that transposed or mis-grouped heads fail.
TINY = {
    "model_type": "qwen3_5_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 4,
    "full_attention_interval": 2,
}


@pytest.fixture(scope="session")
def tiny_config():
    def make(**overrides) -> Qwen35Config:
        return load_config({**TINY, **overrides})

    return make


@pytest.fixture(scope="session")
def clone_cache():
    def clone(cache: ModelCache) -> ModelCache:
        return ModelCache(
            *(
                None if t is None else t.clone()
                for t in (getattr(cache, f.name) for f in dataclasses.fields(cache))
            )
        )

    return clone


@pytest.fixture(scope="session")
def tiny_settings():
    """The tiny config as a ``config.json``-style dict (a fresh copy each call)."""

    def settings(**overrides) -> dict:
        return {**TINY, **overrides}

    return settings
