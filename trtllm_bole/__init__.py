"""trtllm_bole: exact tree speculative decoding for hybrid-attention LLMs (Qwen3.5)."""

from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.llm import LLM, CompletionOutput, RequestOutput

__version__ = "0.1.0"
__all__ = ["LLM", "BoleConfig", "CompletionOutput", "RequestOutput", "SamplingParams"]
