"""Serving: a thread-safe engine around the executor, the request/response tensors and the metrics of
the Triton model (``triton_server/``), kept here so that they are tested without a server."""

from trtllm_bole.serving.engine import EngineStats, ServingEngine, TextDelta, Update, close_on_drain_file

__all__ = ["EngineStats", "ServingEngine", "TextDelta", "Update", "close_on_drain_file"]
