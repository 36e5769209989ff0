"""Qwen3.5 hybrid models: configs, checkpoint loading, and the tree forward."""
