import itertools
from types import SimpleNamespace

import pytest

from trtllm_bole.spec.scheduler import (
    BlockManager,
    Request,
    RequestState,
    Scheduler,
    SlotPool,
    SpecStats,
    kv_tokens,
    prefill_rounds,
)


def make(n_blocks=10, block_size=4, slots=2, max_seq_len=32, tree_tokens=4):
    return Scheduler(
        BlockManager(n_blocks, block_size), SlotPool(slots), max_seq_len=max_seq_len, tree_tokens=tree_tokens
    )


def req(i, prompt_len, max_tokens=4):
    return Request(i, list(range(prompt_len)), SimpleNamespace(max_tokens=max_tokens))


def test_admission_reserves_slot_and_blocks_fifo():
    s = make()
    a, b, c = req(0, 8), req(1, 4), req(2, 4)
    for r in (a, b, c):
        s.add(r)
    admitted = s.admit(max_batch=8)
    assert admitted == [a, b]  # two slots only
    assert a.blocks and len(a.blocks) == 4  # ceil((8 + 4 + 4) / 4)
    assert s.slots.num_free == 0 and s.blocks.num_free == 10 - 4 - 3
    s.finish(a, "length")
    assert a.state is RequestState.FINISHED and a.slot == -1 and not a.blocks
    assert s.admit(max_batch=8) == [c]


def test_the_batch_bound_counts_the_running_requests_below_the_free_slots():
    """``max_batch`` below the pool's slots (a pool sized for more than this admission allows): the
    requests already running take places in the batch, not only slots."""
    s = make(n_blocks=40, slots=6)
    for i in range(5):
        s.add(req(i, 4))
    assert len(s.admit(max_batch=2)) == 2 and s.slots.num_free == 4
    assert s.admit(max_batch=3) == [s.running[-1]] and len(s.running) == 3  # one place left, not three
    assert s.admit(max_batch=3) == [] and len(s.waiting) == 2


def test_a_request_needing_exactly_the_free_blocks_is_admitted():
    """With one slot and the blocks a full-length request needs, that request is served, not held."""
    s = make(n_blocks=4, slots=1)
    r = req(0, 4, max_tokens=8)  # 4 + 8 + 4 (tree) = 16 positions = all 4 blocks
    s.add(r)
    assert s.admit(8) == [r] and s.blocks.num_free == 0


def test_fifo_head_waits_for_blocks():
    s = make(n_blocks=5, slots=4)
    big, small = req(0, 12), req(1, 1)
    s.add(req(9, 4))
    s.admit(8)  # takes 3 blocks
    s.add(big)
    s.add(small)
    assert s.admit(8) == []  # big needs 5 blocks, 2 free: small must not overtake
    assert list(s.waiting) == [big, small]


def test_refusals_are_immediate_errors():
    s = make(max_seq_len=16, tree_tokens=4)
    too_long, longest, empty = req(0, 15), req(1, 14), req(2, 0)  # 15 prompt + output tokens at most
    for r in (too_long, longest, empty):
        s.add(r)
    assert too_long.finish_reason == "error" and "so a prompt of at most 14" in too_long.error
    assert empty.error == "empty prompt"
    assert list(s.waiting) == [longest]  # the draft tree's headroom lies past max_seq_len, not inside it


def test_the_context_limit_is_the_same_in_every_mode():
    """Speculation stops where plain decoding does; a request's KV reservation adds its tree past it."""
    ar, tree = make(max_seq_len=16, tree_tokens=1), make(max_seq_len=16, tree_tokens=4)
    assert ar.context_limit == tree.context_limit == 15
    assert (kv_tokens(16, 1), kv_tokens(16, 4)) == (16, 19)  # what the executor's default cache holds
    r = req(0, 10, max_tokens=100)
    assert (ar._reservation(r), tree._reservation(r)) == (4, 5)  # ceil(16 / 4), ceil((15 + 4) / 4)


def test_a_cache_smaller_than_one_context_lowers_the_request_limit():
    """A request's output stops at the request limit as at the context limit (finish "length"): a
    max_tokens past what the KV cache holds was refused, one past the context cut short. A prompt that
    leaves no room for a token is refused."""
    s = make(n_blocks=4, block_size=4, max_seq_len=32, tree_tokens=4)  # 16 positions, 4 of them headroom
    assert (s.context_limit, s.request_limit) == (31, 12)
    fits, more, too_long = req(0, 4, max_tokens=8), req(1, 4, max_tokens=100), req(2, 12, max_tokens=1)
    for r in (fits, more, too_long):
        s.add(r)
    assert list(s.waiting) == [fits, more] and s.reservation(4, 100) == s.reservation(4, 8) == 4
    assert "prompt of 12 tokens exceeds what the KV cache holds" in too_long.error
    assert "4 blocks of 4 hold 12 prompt + output tokens" in too_long.error and "at most 11" in too_long.error
    assert make().request_limit == make().context_limit  # a cache that holds a whole context


def test_abort_while_waiting_and_everything_returns():
    s = make()
    rs = [req(i, 3) for i in range(5)]
    for r in rs:
        s.add(r)
    s.admit(8)
    s.finish(rs[4], "abort")
    for r in rs[:2]:
        s.finish(r, "length")
    s.admit(8)
    for r in rs:
        s.finish(r, "length")
    assert s.slots.num_free == 2 and s.blocks.num_free == 10
    assert not s.running and not s.waiting


def test_pools_reject_bad_sizes_and_overdraw():
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="asked for 3 KV blocks, 2 free"):
        BlockManager(2, 4).allocate(3)
    pool = SlotPool(1)
    pool.allocate()
    with pytest.raises(ValueError, match="no free state slot"):
        pool.allocate()


def test_stats():
    st = SpecStats(steps=4, drafted=20, accepted=8)
    assert st.mean_accepted_tokens == 3.0 and st.acceptance_rate == 0.4
    assert SpecStats().mean_accepted_tokens == 0.0


@pytest.mark.parametrize("max_tokens", [1, 4, 7, 16, 100])
def test_prefill_rounds_cut_prompts_in_order_within_the_bound(max_tokens):
    lengths = [5, 1, 17, 3, 7]
    rounds = prefill_rounds(lengths, max_tokens)
    assert all(0 < sum(stop - start for _, start, stop in r) <= max_tokens for r in rounds)
    assert all(len({i for i, _, _ in r}) == len(r) for r in rounds)  # one piece a prompt a forward
    for i, n in enumerate(lengths):  # each prompt's pieces tile it, in order, forward after forward
        pieces = [(start, stop) for r in rounds for j, start, stop in r if j == i]
        assert pieces[0][0] == 0 and pieces[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    full = [sum(stop - start for _, start, stop in r) for r in rounds[:-1]]
    assert all(t == max_tokens for t in full)  # only the last forward is left part empty


def test_prefill_rounds_of_prompts_within_the_bound_are_one_forward():
    assert prefill_rounds([5, 1, 3], 9) == [[(0, 0, 5), (1, 0, 1), (2, 0, 3)]]
    assert prefill_rounds([5, 1, 3], 4) == [[(0, 0, 4)], [(0, 4, 5), (1, 0, 1), (2, 0, 2)], [(2, 2, 3)]]
