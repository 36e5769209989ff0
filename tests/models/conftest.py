import dataclasses

import pytest

from trtllm_bole.models.cache import ModelCache
from trtllm_bole.models.config import Qwen35Config, load_config
from trtllm_bole.testing import TINY_CONFIG


@pytest.fixture(scope="session")
def tiny_config():
    def make(**overrides) -> Qwen35Config:
        return load_config({**TINY_CONFIG, **overrides})

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
        return {**TINY_CONFIG, **overrides}

    return settings
