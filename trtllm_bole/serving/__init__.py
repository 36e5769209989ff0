"""Serving: a thread-safe engine around the executor, and the request/response tensors of the Triton
model (``triton_server/``), kept here so that they are tested without a server."""

from trtllm_bole.serving.engine import ServingEngine, TextDelta, Update, close_on_drain_file

__all__ = ["ServingEngine", "TextDelta", "Update", "close_on_drain_file"]
