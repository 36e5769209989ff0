"""Prefills as CUDA graphs: a padding chain changes nothing of the prompts (CPU, eagerly), and a replayed
prefill is the eager one of the same padded shape (GPU)."""

import pytest
import torch

from trtllm_bole.models.cache import NO_BLOCK, PREFILL_CHUNK, PrefillBatch, block_table
from trtllm_bole.models.config import load_config
from trtllm_bole.models.loader import random_model
from trtllm_bole.spec.prefill_graphs import MTPPrefillGraphs, TargetPrefillGraphs, padded_tokens
from trtllm_bole.testing import CUDA_HEADS, TINY_MTP_CONFIG
from trtllm_bole.tree import chunk_capacity

SLOTS, BLOCKS, BLOCK_SIZE, WIDTH = 4, 24, 16, 8  # three requests of up to 128 tokens, slot 3 the scratch
SCRATCH = 3
FIRST = PrefillBatch((5, 70, 1), (2, 0, 1), block_table([[0], [6, 7, 8, 9, 10], [16]]), (0, 0, 0))
# Prompts 0 and 1 go on from their first pieces (prompt 1 past a GDN chunk's end), prompt 2 (slot 1)
# starts over as a new request; 79 tokens against 76: both replay the graph of 128.
SECOND = PrefillBatch((9, 30, 40), (2, 0, 1), block_table([[0], [6, 7, 8, 9, 10, 11, 12], [16, 17, 18]]),
                      (5, 70, 0))  # fmt: skip


def caches(model):
    c = model.cache
    return [
        c.gdn_state[:, :SCRATCH],
        c.conv_state[:, :SCRATCH],
        c.k_cache,
        c.v_cache,
        c.mtp_k_cache,
        c.mtp_v_cache,
    ]


def padded_context(batch: PrefillBatch, device):
    """The context a prefill graph replays ``batch`` on (:meth:`PrefillGraphs._padded_context`)."""
    tokens = padded_tokens(sum(batch.lengths))
    capacity = chunk_capacity(len(batch.lengths) + 1, tokens, PREFILL_CHUNK)
    padded = batch.padded(tokens, SCRATCH, WIDTH)
    return padded.context(device, max_depth=tokens, chunk_capacity=capacity)


def prefill(model, batch: PrefillBatch, ids, next_ids, *, padded: bool):
    """The target's prefill of ``batch`` and the MTP head's over the same rows, eagerly."""
    ctx = padded_context(batch, ids.device) if padded else batch.context(ids.device)
    n = sum(batch.lengths)
    ids, next_ids = (torch.cat([t, t.new_zeros(ctx.tree.num_nodes - n)]) for t in (ids, next_ids))
    hidden, logits = model.prefill(ids, ctx, check=False)
    mtp_hidden, _ = model.mtp.prefill(hidden, next_ids, ctx, check=False)
    return hidden[:n], logits[: len(batch.lengths)], mtp_hidden[:n]


def random_ids(batch: PrefillBatch, vocab: int, gen: torch.Generator, device="cpu"):
    """The prompts' tokens and the tokens after them (the MTP's rows)."""
    return torch.randint(0, vocab, (2, sum(batch.lengths)), generator=gen).to(device).unbind()


def test_the_padded_batch_adds_one_chain_on_the_scratch_slot_with_no_blocks():
    padded = SECOND.padded(128, SCRATCH, WIDTH)
    assert padded.lengths == (9, 30, 40, 49) and padded.slots == (2, 0, 1, SCRATCH) and padded.starts[-1] == 0
    assert padded.tables.shape == (4, WIDTH) and (padded.tables[-1] == NO_BLOCK).all()
    assert torch.equal(padded.tables[:3, :7], SECOND.tables)
    assert [padded_tokens(n) for n in (1, 15, 16, 290, 4095)] == [16, 16, 32, 512, 4096]  # room for one more
    with pytest.raises(ValueError, match="do not pad"):
        SECOND.padded(79, SCRATCH, WIDTH)  # no room left for the padding chain


def test_a_padding_chain_changes_nothing_of_the_prompts():
    """The same two prefills (the second on top of the first's pieces) on two models, one of them with a
    padding chain each time: the prompts' hidden states, logits, MTP rows and every cache but the scratch
    slot's agree. The padded forest declares itself as deep as its tokens and its GDN chunks at capacity
    (a graph's shapes), so this covers those bounds too."""
    config = load_config(TINY_MTP_CONFIG)
    models = [random_model(config, seed=3) for _ in range(2)]
    for model in models:
        model.allocate_cache(SLOTS, BLOCKS, BLOCK_SIZE)
    gen = torch.Generator().manual_seed(0)
    for batch in (FIRST, SECOND):
        ids = random_ids(batch, config.vocab_size, gen)
        plain, padded = (
            prefill(m, batch, *ids, padded=p) for m, p in zip(models, (False, True), strict=True)
        )
        for a, b in zip(plain, padded, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        for a, b in zip(caches(models[0]), caches(models[1]), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert models[1].cache.gdn_state[:, SCRATCH].abs().sum() > 0  # the padding chain ran, on its own slot


@pytest.mark.gpu
def test_a_replayed_prefill_is_the_eager_prefill_of_its_padded_shape():
    """Bit for bit, twice on one graph (the second replay with other lengths, slots and starts: the
    context is copied in, not captured), target and MTP, against eager launches on the same padded
    context; so the capture's warm-up runs wrote nothing of a live request's either."""
    config = load_config({**TINY_MTP_CONFIG, **CUDA_HEADS})
    models = [random_model(config, seed=3, device="cuda") for _ in range(2)]
    for model in models:
        model.allocate_cache(SLOTS, BLOCKS, BLOCK_SIZE)
    target = TargetPrefillGraphs(models[1], table_width=WIDTH, scratch_slot=SCRATCH)
    mtp = MTPPrefillGraphs(models[1].mtp, table_width=WIDTH, scratch_slot=SCRATCH)
    gen = torch.Generator().manual_seed(0)
    for batch in (FIRST, SECOND):
        ids, next_ids = random_ids(batch, config.vocab_size, gen, "cuda")
        eager = prefill(models[0], batch, ids, next_ids, padded=True)
        hidden, logits = target((ids,), batch)
        mtp_hidden, _ = mtp((hidden.clone(), next_ids), batch)
        for a, b in zip(eager, (hidden, logits, mtp_hidden), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(caches(models[0]), caches(models[1]), strict=True):
            assert torch.equal(a, b)
    assert target.captured == [(4, 128)] and target.captures == 1 and mtp.captures == 1
