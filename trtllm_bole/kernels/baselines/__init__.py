"""Baselines the benchmarks measure Bole against (BOLE.md §1): the per-node serial tree recurrence with
per-node state snapshots. Peers from other projects (SGLang, flash-linear-attention) are loaded by the
benchmark from their own wheels, never copied here."""
