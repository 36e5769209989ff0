"""Engines: a directory that holds everything hardware-specific about serving one model on one GPU
(runtime-layout weights, compiled Bole kernels, the calibrated budget, optionally a TensorRT plan).

``build_scripts/build_engine.py`` is the command line; ``LLM(model=engine_dir)`` loads one.
"""

from trtllm_bole.engine.build import BuildSettings, build_engine
from trtllm_bole.engine.load import Engine, is_engine_dir, load_engine

__all__ = ["BuildSettings", "Engine", "build_engine", "is_engine_dir", "load_engine"]
