"""trtllm_bole: exact tree speculative decoding for hybrid-attention LLMs (Qwen3.5)."""

__version__ = "0.1.0"
