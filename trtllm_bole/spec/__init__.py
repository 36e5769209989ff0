"""Speculative decoding: drafting, acceptance, budget, scheduling and the executor."""
