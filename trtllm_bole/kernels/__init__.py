"""Triton kernels behind :mod:`trtllm_bole.ops` (CUDA tensors; CPU tensors under ``TRITON_INTERPRET=1``).

- :mod:`.gdn_tree_verify`: closed-form tree verification (BOLE.md §2), the public launcher and the
  blocked kernel; :mod:`.gdn_tree_verify_inverse`: the explicit ``(I + G)⁻¹`` path (the launcher's
  default for requests of 17-64 nodes, the blocked kernel's otherwise: measured on the H200), whose
  factors are formed on compact per-node path tiles for trees of depth up to 16;
- :mod:`.gdn_commit`: factored commit of every GDN layer of every request in one launch, and the
  conv-state commit (BOLE.md §3–§4);
- :mod:`.gdn_prefill`: chunked prefill in one launch per layer: each program verifies its prompt's chunks
  in turn (a chunk is a chain) and commits each into its columns of the state;
- :mod:`.tree_conv1d`: tree-aware causal depthwise conv1d + SiLU (BOLE.md §4);
- :mod:`.tree_attention`: full attention of a forest's nodes over the paged KV cache and their
  ancestors, flash-style, in one launch (two where a long context is split across programs);
- :mod:`.kv_commit`: the paged KV cache's commit of the accepted paths, every attention layer in one
  launch; :mod:`.norms`: Qwen3.5's zero-centred RMSNorm in one kernel, and the attention's q/k norm with
  its RoPE in one (the serving forward's glue);
- :mod:`.forest`: a drafted forest's metadata (paths, pre-order, subtree sizes) in one launch;
- :mod:`.filter_floor`: the top-k / top-p threshold of rows of logits by radix select, not by sorting them;
  :mod:`.softmax_stats`: each row's argmax and filtered softmax normaliser in one read (what sampled
  acceptance needs to read any probability without processing whole rows);
- :mod:`.baselines`: today's scheme (serial per-node recurrence with per-node state snapshots), the
  yardstick of the benchmarks;
- :mod:`.compiles`: which kernel variants Triton compiles, for warm-ups that must meet them all.
"""

from trtllm_bole.kernels._common import MAX_DEPTH

__all__ = ["MAX_DEPTH"]
