"""Published Qwen3.5 text dimensions (``text_config`` fields of the released checkpoints).

Used for random-weight timing runs at real size and for the memory tables; tiny test models are
written by ``build_scripts/make_checkpoint.py``. GDN: dk = dv = 128, conv kernel 4, one full-attention
layer every four.
"""

from __future__ import annotations

_COMMON = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "head_dim": 256,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "linear_num_key_heads": 16,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}

QWEN35_PRESETS: dict[str, dict] = {
    "qwen3.5-9b": {
        **_COMMON,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "intermediate_size": 12288,
        "linear_num_value_heads": 32,
    },
    "qwen3.5-27b": {
        **_COMMON,
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "intermediate_size": 17408,
        "linear_num_value_heads": 48,
    },
    # MoE models: only their GDN dimensions are used here (memory tables); they are not served.
    "qwen3.5-35b-a3b": {
        **_COMMON,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "linear_num_value_heads": 32,
    },
    "qwen3.5-122b-a10b": {
        **_COMMON,
        "hidden_size": 3072,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "linear_num_value_heads": 64,
    },
}


def num_gdn_layers(preset: dict) -> int:
    interval = preset["full_attention_interval"]
    return sum(1 for i in range(preset["num_hidden_layers"]) if (i + 1) % interval)


# Tiny random models for tests, CPU demos and the embedded default (build_scripts/make_checkpoint.py
# sets vocab_size from the tokenizer it trains). Both layer mixes and both head layouts are covered:
# "tiny" groups two GDN value heads per key head and alternates GDN / attention with untied
# embeddings; "tiny-interval4" is 3 GDN : 1 attention like the real models, with tied embeddings.
_TINY_COMMON = {
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}

TINY_PRESETS: dict[str, dict] = {
    "tiny": {
        **_TINY_COMMON,
        "full_attention_interval": 2,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "tie_word_embeddings": False,
    },
    "tiny-interval4": {
        **_TINY_COMMON,
        "full_attention_interval": 4,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "tie_word_embeddings": True,
    },
}
