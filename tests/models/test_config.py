"""Checkpoint configs at their edges: what a config.json leaves out, older field names, end tokens, a
config without an MTP layer; and the model's KV cache reuse."""

import json
import re

import pytest
import torch

from trtllm_bole.models.checkpoint import random_tensors, write_safetensors
from trtllm_bole.models.config import eos_token_ids, load_config
from trtllm_bole.models.loader import load_model, random_model
from trtllm_bole.testing import TINY_CONFIG


def test_allocate_cache_never_keeps_a_cache_smaller_than_asked():
    """Each request is checked against the cache kept at that moment (a larger one since), on every
    dimension: a kept cache with too few blocks would clamp block ids into other requests' blocks."""
    model = random_model(load_config(TINY_CONFIG), seed=1)
    for slots, blocks, block_size in ((4, 20, 4), (8, 20, 4), (4, 21, 4), (9, 8, 4), (2, 30, 4), (2, 2, 8)):
        cache = model.allocate_cache(slots, blocks, block_size)
        assert cache.num_slots >= slots and cache.num_blocks >= blocks and cache.block_size == block_size
        assert model.cache is cache


def test_a_cache_too_large_to_allocate_is_a_clear_error():
    """It was torch's RuntimeError from deep in a model's load ("you tried to allocate 393216000000 bytes"
    for max_batch_size 1,000,000); it says what the cache holds, its size and which settings lower it."""
    model = random_model(load_config(TINY_CONFIG), seed=1)
    words = (
        r"the cache \(10000000000 state slots, 8 KV blocks of 4 tokens\) needs [0-9.]+ GiB, which cpu could"
    )
    with pytest.raises(ValueError, match=words + " not allocate: lower max_batch_size"):
        model.allocate_cache(10**10, 8, 4)
    assert model.cache is None


OPTIONAL = (
    "full_attention_interval", "layer_types", "rope_parameters", "rope_theta", "partial_rotary_factor",
    "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "linear_conv_kernel_dim",
)  # fmt: skip


def test_settings_a_config_leaves_out_take_transformers_defaults():
    """A ``config.json`` without the optional fields reads as transformers reads it (its
    ``Qwen3_5TextConfig`` defaults, written out by ``to_dict``)."""
    transformers = pytest.importorskip("transformers")
    minimal = {k: v for k, v in TINY_CONFIG.items() if k not in OPTIONAL}
    minimal["num_hidden_layers"] = 8
    ours = load_config(minimal)
    kwargs = {k: v for k, v in minimal.items() if k != "model_type"}
    theirs = load_config(transformers.Qwen3_5TextConfig(**kwargs).to_dict())
    for name in ("layer_types", "rope_theta", "rotary_dim", "rms_norm_eps", "tie_word_embeddings",
                 "max_position_embeddings", "linear_conv_kernel_dim"):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name


def test_the_longest_trained_sequence_is_served():
    config = load_config({**TINY_CONFIG, "max_position_embeddings": 64})
    config.check_seq_len(64)
    with pytest.raises(ValueError, match="max_seq_len 65 exceeds"):
        config.check_seq_len(65)


def test_older_configs_rope_scaling_is_read_and_checked():
    """``rope_scaling`` (the field's name before ``rope_parameters``) carries the same settings."""
    scaling = {"rope_type": "default", "partial_rotary_factor": 0.5, "rope_theta": 5e5}
    legacy = load_config({**TINY_CONFIG, "rope_scaling": scaling})
    assert (legacy.rotary_dim, legacy.rope_theta) == (8, 5e5)
    with pytest.raises(ValueError, match="rope_type = 'yarn'"):
        load_config({**TINY_CONFIG, "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_reads_it():
    """transformers takes ``rope_scaling`` over ``rope_parameters`` when a config carries both."""
    transformers = pytest.importorskip("transformers")
    both = {
        **TINY_CONFIG,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
        "rope_scaling": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    }
    kwargs = {k: v for k, v in both.items() if k != "model_type"}
    rope = transformers.Qwen3_5TextConfig(**kwargs).rope_parameters
    assert (rope["rope_theta"], rope["partial_rotary_factor"]) == (5e5, 0.5)
    ours = load_config(both)
    assert (ours.rope_theta, ours.rotary_dim) == (5e5, 8)


@pytest.mark.parametrize(
    ("rope", "field"),
    [
        ({"rope_theta": "1e6"}, "rope_theta = '1e6'"),
        ({"partial_rotary_factor": None}, "partial_rotary_factor = None"),
        ({"rope_parameters": {"rope_theta": "1e6"}}, "rope_parameters.rope_theta = '1e6'"),
        ({"rope_scaling": {"rope_theta": "1e6"}}, "rope_scaling.rope_theta = '1e6'"),
        ({"rope_scaling": {"type": "yarn"}}, "rope_scaling.rope_type = 'yarn'"),
        ({"rope_scaling": "yarn"}, "rope_scaling = 'yarn'"),
    ],
)
def test_a_bad_rope_setting_names_the_field_it_is_in(rope, field):
    with pytest.raises(ValueError, match=rf"^<dict>: {re.escape(field)}"):
        load_config({**TINY_CONFIG, **rope})


def test_an_end_token_only_the_text_config_declares_is_read(tmp_path):
    assert eos_token_ids(tmp_path, {"model_type": "qwen3_5", "text_config": {"eos_token_id": 5}}, None) == [5]
    assert eos_token_ids(tmp_path, {"eos_token_id": 1, "text_config": {"eos_token_id": [5, 1]}}, None) == [
        1,
        5,
    ]


def test_a_config_without_an_mtp_layer_loads_no_mtp_head(tmp_path):
    """``mtp_num_hidden_layers: 0`` says the checkpoint has no MTP module: leftover ``mtp.*`` tensors
    are not loaded as a drafter."""
    settings = {**TINY_CONFIG, "mtp_num_hidden_layers": 0}
    (tmp_path / "config.json").write_text(json.dumps(settings))
    write_safetensors(tmp_path, random_tensors(load_config(settings), seed=0, mtp=True))
    assert load_model(tmp_path, dtype=torch.float32, progress=False).mtp is None


@pytest.mark.parametrize(
    "field, value",
    [("full_attention_interval", 0), ("full_attention_interval", True), ("num_hidden_layers", 0),
     ("num_hidden_layers", "8")],
)  # fmt: skip
def test_a_bad_layer_count_or_interval_is_named(field, value):
    """Without ``layer_types`` the layers' kinds come from the interval: both numbers must be positive
    integers, and the error names the field."""
    raw = {k: v for k, v in TINY_CONFIG.items() if k != "layer_types"}
    with pytest.raises(ValueError, match=f"{field} = {value!r} must be a positive integer"):
        load_config({**raw, field: value})


def test_gdn_head_dims_the_cuda_kernels_cannot_tile_are_refused_before_anything_loads():
    """dk, dv in multiples of 16 on CUDA (the kernels' tensor-core tiles); refused when the model is
    placed there (it failed at the first step, inside the verify kernel's launcher), on any machine."""
    from trtllm_bole.models.model import Qwen35Model

    odd = load_config({**TINY_CONFIG, "linear_key_head_dim": 16, "linear_value_head_dim": 8})
    with pytest.raises(
        ValueError, match=r"linear_value_head_dim = 8: the GDN kernels on CUDA take head dims"
    ):
        Qwen35Model(odd, dtype=torch.float32, device="cuda")
    Qwen35Model(odd, dtype=torch.float32, device="cpu")  # the CPU path takes any
    load_config({**TINY_CONFIG, "linear_key_head_dim": 16, "linear_value_head_dim": 32}).check_cuda_tiles()
    full_attention_only = {
        **TINY_CONFIG,
        "layer_types": ["full_attention"] * TINY_CONFIG["num_hidden_layers"],
    }
    load_config({**full_attention_only, "linear_value_head_dim": 8}).check_cuda_tiles()
