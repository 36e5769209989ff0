"""Tree verify and commit against the sequential truth: every root-to-node path decoded one token at a
time from the same committed caches (BOLE.md §2-4: GDN, short conv and KV all on the tree)."""

import dataclasses
import warnings

import pytest
import torch

from trtllm_bole.models import mtp as mtp_module
from trtllm_bole.models.cache import StepContext
from trtllm_bole.models.loader import random_model
from trtllm_bole.testing import CUDA_HEADS, chain_parents, forest, random_parents, star_parents, topk_parents

GROWN_ALIKE = mtp_module._grown_alike

ATOL = 1e-4
BLOCK = 4
VARIANTS = {
    "interval2-grouped": {},
    "interval4-tied": {
        "full_attention_interval": 4,
        "linear_num_value_heads": 2,
        "tie_word_embeddings": True,
    },
}


class Setup:
    """A model with three requests prefilled into scattered slots and blocks, over pools whose
    unused rows hold garbage (so a wrong slot, block or mask cannot pass by reading zeros)."""

    def __init__(self, config, *, mtp: bool, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)
        self.model = random_model(config, seed=seed + 1, mtp=mtp)
        self.prompt_lens = [7, 13, 2]
        self.slots = torch.tensor([3, 0, 4])
        max_blocks = 8
        cache = self.model.allocate_cache(num_slots=5, num_blocks=30, block_size=BLOCK)
        for t in (cache.gdn_state, cache.conv_state, cache.k_cache, cache.v_cache):
            t.normal_(generator=self.gen)
        if cache.mtp_k_cache is not None:
            cache.mtp_k_cache.normal_(generator=self.gen)
            cache.mtp_v_cache.normal_(generator=self.gen)
        cache.reset_slots(self.slots)
        self.tables = torch.randperm(30, generator=self.gen)[: 3 * max_blocks].view(3, max_blocks).int()
        prompt = self.tokens(sum(self.prompt_lens))
        ctx = StepContext.chains(self.prompt_lens, self.slots, self.tables, torch.zeros(3, dtype=torch.long))
        prompt_hidden, _ = self.model.prefill(prompt, ctx)
        if mtp:  # align the MTP cache with the prompts: row p = (hidden at p, token at p + 1)
            self.model.mtp.prefill(prompt_hidden, self.tokens(sum(self.prompt_lens)), ctx)

    def tokens(self, n: int) -> torch.Tensor:
        return torch.randint(self.model.config.vocab_size, (n,), generator=self.gen)

    def one(self, b: int, context_len: int) -> StepContext:
        return StepContext.single_tokens(
            self.slots[b : b + 1], self.tables[b : b + 1], torch.tensor([context_len])
        )


def _trees(gen: torch.Generator) -> list[list[int]]:
    return [topk_parents(9, 3, 4), chain_parents(5), random_parents(8, 3, gen)]


def _tensors(cache) -> list[torch.Tensor]:
    return [cache.gdn_state, cache.conv_state, cache.k_cache, cache.v_cache]


@pytest.mark.parametrize("scheme", ["bole", "serial"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_verify_equals_sequential_decode_and_commit_continues_it(scheme, variant, tiny_config, clone_cache):
    s = Setup(tiny_config(**VARIANTS[variant]), mtp=False)
    model, cache = s.model, s.model.cache
    tree = forest(_trees(s.gen))
    ids = s.tokens(tree.num_nodes)
    context = torch.tensor(s.prompt_lens)
    ctx = StepContext(s.slots, s.tables, context, tree)
    before = clone_cache(cache)
    logits, _, pending = model.verify(ids, ctx, gdn_scheme=scheme)
    for kept, now in zip(_tensors(before), _tensors(cache), strict=True):
        assert torch.equal(kept, now), "verify wrote to a cache"

    def decode_one_at_a_time(b: int, tokens: torch.Tensor) -> torch.Tensor:
        model.cache = clone_cache(before)
        for step, token in enumerate(tokens):
            out = model.decode(token[None], s.one(b, s.prompt_lens[b] + step))
        return out[0]

    for node in range(tree.num_nodes):  # the sequential truth, path by path
        expected = decode_one_at_a_time(int(tree.request[node]), ids[tree.path(node)])
        torch.testing.assert_close(logits[node], expected, atol=ATOL, rtol=0)

    # Commit every node of every request once (-1 where a request has fewer nodes: that slot must
    # stay bit-identical), each into its own copy of the pre-verify caches, then decode one more token.
    following = s.tokens(3)
    sizes = (tree.cu_seqlens[1:] - tree.cu_seqlens[:-1]).tolist()
    for choice in range(max(sizes)):
        accepted = torch.tensor([choice if choice < n else -1 for n in sizes])
        model.cache = clone_cache(before)
        fields = ("k_cache", "v_cache", "gdn_state", "conv_state")
        model.commit(dataclasses.replace(pending, **{f: getattr(model.cache, f) for f in fields}), accepted)
        committed = model.cache
        for b in torch.nonzero(accepted < 0).flatten().tolist():
            slot = int(s.slots[b])
            assert torch.equal(committed.gdn_state[:, slot], before.gdn_state[:, slot])
            assert torch.equal(committed.conv_state[:, slot], before.conv_state[:, slot])
        leaves = tree.accepted_nodes(accepted)
        depth = torch.where(accepted >= 0, tree.depth[leaves.clamp(min=0)], 0)
        after = model.decode(following, StepContext.single_tokens(s.slots, s.tables, context + depth))
        for b in range(3):
            path = tree.path(int(leaves[b])) if accepted[b] >= 0 else torch.zeros(0, dtype=torch.long)
            expected = decode_one_at_a_time(b, torch.cat([ids[path], following[b : b + 1]]))
            torch.testing.assert_close(after[b], expected, atol=ATOL, rtol=0)
            slot = int(s.slots[b])
            # The states' inputs come from projections of a whole tree's rows against one row at a time:
            # float32 GEMMs of other shapes, which round differently from one CPU to another (1.2e-5 on
            # an AMD EPYC, under 1e-5 on others); a wrong slot or path moves them by O(1).
            for ours, truth in (
                (committed.gdn_state, model.cache.gdn_state),
                (committed.conv_state, model.cache.conv_state),
            ):
                torch.testing.assert_close(ours[:, slot], truth[:, slot], atol=ATOL, rtol=0)


def test_prefill_writes_its_caches_as_it_runs_and_keeps_nothing_for_a_commit(tiny_config, clone_cache):
    """A prefill's layers commit the conv state and the K/V of their prompts as they run (a batch of long
    prompts' stacked conv inputs and K/V would be its largest tensors): what they leave in the caches is
    what a verify of the same chains committed at the prompts' ends leaves."""
    s = Setup(tiny_config(), mtp=False)
    model = s.model
    verified = clone_cache(model.cache)
    ids, ctx = s.tokens(19), StepContext.chains([12, 7], s.slots[1:], s.tables[1:], torch.tensor([5, 0]))
    fs = model._forward_state(ids, ctx, "prefill")
    model._forward(ids, fs)
    pending = fs.pending()
    assert (pending.new_k, pending.conv_inputs, pending.gdn_factors) == (None, None, None)
    prefilled, model.cache = model.cache, verified
    _, _, pending = model.verify(ids, ctx)
    pending.commit(torch.tensor([11, 6]))
    for name in ("gdn_state", "conv_state", "k_cache", "v_cache"):
        torch.testing.assert_close(getattr(prefilled, name), getattr(verified, name), atol=1e-5, rtol=0)


def test_an_unchecked_prefill_reads_no_value_of_a_tensor(tiny_config):
    """The executor's prefill (``check=False``: it built the slots, block tables and lengths) and its MTP
    prefill read no tensor's value on the host, where on a GPU each read would wait for the device: they
    run under torch's FakeTensorMode, in which reading a value raises. A checked prefill reads them."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    s = Setup(tiny_config(), mtp=True)
    model = s.model
    ids = s.tokens(28)

    def context():  # new slot indices each time: their check's memo (ops.checks.check_slots) never answers
        return StepContext.chains([19, 9], s.slots[1:].clone(), s.tables[1:], torch.tensor([13, 2]))

    hidden, _ = model.prefill(ids, context())
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake_hidden, logits = model.prefill(ids, context(), check=False)
        model.mtp.prefill(hidden, ids, context(), check=False)
        with pytest.raises(DataDependentOutputException):
            model.prefill(ids, context())
        with pytest.raises(DataDependentOutputException):
            model.mtp.prefill(hidden, ids, context())
    assert fake_hidden.shape == hidden.shape and logits.shape == (2, model.config.vocab_size)


def test_prefill_takes_the_host_lengths_of_its_chains(tiny_config):
    """A prefill reads its prompts' bounds from the host lengths that ``StepContext.chains`` keeps; a
    context built otherwise, or whose lengths do not add up to its tree, is refused."""
    from trtllm_bole.tree import TreeBatch

    s = Setup(tiny_config(), mtp=False)
    slots, tables, lens = s.slots[1:], s.tables[1:], torch.tensor([13, 2])
    assert StepContext.chains([5, 3], slots, tables, lens).chain_lengths == (5, 3)
    with pytest.raises(ValueError, match=r"build its context with StepContext\.chains"):
        s.model.prefill(s.tokens(8), StepContext(slots, tables, lens, TreeBatch.chains([5, 3])))
    for lengths in ((5,), (4, 3), (5, 4)):
        with pytest.raises(ValueError, match=r"chain_lengths .* 8 nodes in all"):
            StepContext(slots, tables, lens, TreeBatch.chains([5, 3]), lengths)


def test_prefill_on_top_of_a_context_equals_one_prefill(tiny_config, clone_cache):
    s = Setup(tiny_config(), mtp=False)
    model = s.model
    pieces_cache = clone_cache(model.cache)
    more = s.tokens(12)
    _, whole = model.prefill(more, StepContext.chains([12], s.slots[:1], s.tables[:1], torch.tensor([7])))
    whole_cache = model.cache
    model.cache = pieces_cache
    model.prefill(more[:5], StepContext.chains([5], s.slots[:1], s.tables[:1], torch.tensor([7])))
    _, pieces = model.prefill(
        more[5:], StepContext.chains([7], s.slots[:1], s.tables[:1], torch.tensor([12]))
    )
    torch.testing.assert_close(pieces, whole, atol=ATOL, rtol=0)
    slot = int(s.slots[0])
    torch.testing.assert_close(
        pieces_cache.gdn_state[:, slot], whole_cache.gdn_state[:, slot], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        pieces_cache.conv_state[:, slot], whole_cache.conv_state[:, slot], atol=1e-5, rtol=0
    )


def test_mtp_tree_equals_sequential_rows_and_commit(tiny_config, clone_cache):
    """The MTP head on a forest of rows over its own committed KV, against one row at a time."""
    s = Setup(tiny_config(), mtp=True)
    mtp, cache = s.model.mtp, s.model.cache
    h = s.model.config.hidden_size
    tree = forest([star_parents(4), topk_parents(7, 2, 3), chain_parents(3)])
    hidden = torch.randn(tree.num_nodes, h, generator=s.gen)
    ids = s.tokens(tree.num_nodes)
    context = torch.tensor(s.prompt_lens)
    before = clone_cache(cache)
    mtp_hidden, logits, pending = mtp.verify(hidden, ids, StepContext(s.slots, s.tables, context, tree))

    def one_row_at_a_time(b: int, rows: list[tuple[torch.Tensor, torch.Tensor]]):
        mtp.cache = clone_cache(before)
        for step, (row_hidden, row_id) in enumerate(rows):
            ctx = StepContext.chains([1], s.slots[b : b + 1], s.tables[b : b + 1], context[b : b + 1] + step)
            out_hidden, out_logits = mtp.prefill(row_hidden[None], row_id[None], ctx)
        return out_hidden[0], out_logits[0]

    for node in range(tree.num_nodes):
        path = tree.path(node).tolist()
        expected_hidden, expected_logits = one_row_at_a_time(
            int(tree.request[node]), [(hidden[i], ids[i]) for i in path]
        )
        torch.testing.assert_close(logits[node], expected_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(mtp_hidden[node], expected_hidden, atol=ATOL, rtol=0)

    accepted = torch.tensor([2, 6, -1])
    mtp.cache = cache
    mtp.commit(pending, accepted)
    depth = torch.where(accepted >= 0, tree.depth[tree.accepted_nodes(accepted).clamp(min=0)], 0)
    next_hidden = torch.randn(3, h, generator=s.gen)
    next_ids = s.tokens(3)
    _, after = mtp.prefill(
        next_hidden, next_ids, StepContext.chains([1, 1, 1], s.slots, s.tables, context + depth)
    )
    for b in range(3):
        path = tree.path(int(tree.accepted_nodes(accepted)[b])).tolist() if accepted[b] >= 0 else []
        rows = [(hidden[i], ids[i]) for i in path] + [(next_hidden[b], next_ids[b])]
        torch.testing.assert_close(after[b], one_row_at_a_time(b, rows)[1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("alike", [False, True])
def test_mtp_grows_a_tree_depth_by_depth(tiny_config, clone_cache, monkeypatch, alike):
    """EAGLE-style drafting: one MTP pass per depth over the new nodes only (``past``), equal to one
    pass over the finished forest, and its final pending commits like the one-pass pending. Requests that
    grow alike (as the drafter's do) take the padding placement, the others the gathers."""
    s = Setup(tiny_config(), mtp=True)
    mtp = s.model.mtp
    mixed = [topk_parents(8, 2, 4), chain_parents(3), star_parents(4)]  # nodes in depth order
    trees = [topk_parents(7, 2, 3)] * 3 if alike else mixed
    paddings = []
    monkeypatch.setattr(mtp_module, "_grown_alike", lambda *a: paddings.append(a) or GROWN_ALIKE(*a))
    final = forest(trees)
    hidden = torch.randn(final.num_nodes, s.model.config.hidden_size, generator=s.gen)
    ids = s.tokens(final.num_nodes)
    context = torch.tensor(s.prompt_lens)
    before = clone_cache(s.model.cache)
    whole_hidden, whole_logits, whole_pending = mtp.verify(
        hidden, ids, StepContext(s.slots, s.tables, context, final)
    )

    past, done = None, [0, 0, 0]
    for depth in range(1, final.max_depth + 1):
        counts = [
            int((final.depth[final.cu_seqlens[b] : final.cu_seqlens[b + 1]] <= depth).sum()) for b in range(3)
        ]
        grown = forest([t[:n] for t, n in zip(trees, counts, strict=True)])
        new = torch.cat([final.cu_seqlens[b] + torch.arange(done[b], counts[b]) for b in range(3)])
        ctx = StepContext(s.slots, s.tables, context, grown)
        out_hidden, out_logits, past = mtp.verify(hidden[new], ids[new], ctx, past=past)
        torch.testing.assert_close(out_logits, whole_logits[new], atol=1e-5, rtol=0)
        torch.testing.assert_close(out_hidden, whole_hidden[new], atol=1e-5, rtol=0)
        done = counts
    assert len(paddings) == (final.max_depth - 1 if alike else 0)

    committed = []
    for pending in (whole_pending, past):  # each into its own copy of the pre-verify cache
        target = clone_cache(before)
        dataclasses.replace(pending, k_cache=target.mtp_k_cache, v_cache=target.mtp_v_cache).commit(
            torch.tensor([6, 2, 3])
        )
        committed.append(torch.cat([target.mtp_k_cache, target.mtp_v_cache]))
    torch.testing.assert_close(committed[0], committed[1], atol=1e-5, rtol=0)


def test_mtp_refuses_a_forest_that_does_not_extend_the_past_one(tiny_config):
    s = Setup(tiny_config(), mtp=True)
    mtp, h = s.model.mtp, s.model.config.hidden_size
    context = torch.tensor(s.prompt_lens)

    def verify(tree, past=None, *, slots=s.slots, context=context, check_growth=True):
        new = max(tree.num_nodes - (0 if past is None else past.ctx.tree.num_nodes), 0)
        ctx = StepContext(slots, s.tables, context, tree)
        return mtp.verify(torch.zeros(new, h), s.tokens(new), ctx, past=past, check_growth=check_growth)

    _, _, past = verify(forest([[-1, 0], [-1], [-1]]))
    grown = forest([[-1, 0, 1], [-1, 0], [-1, -1]])
    for bad in (
        dict(tree=forest([[-1, -1, 0], [-1, 0], [-1, -1]])),  # request 0's node 1 changes parent
        dict(tree=forest([[-1], [-1, 0], [-1, -1]])),  # request 0 loses a node
        dict(tree=grown, context=context + 1),  # another step's context
        dict(tree=grown, slots=s.slots.flip(0)),  # other slots
    ):
        with pytest.raises(ValueError, match="must extend its forest"):
            verify(past=past, **bad)
    assert verify(grown, past)[0].shape == (3, h)
    # A caller that grew the forest itself skips the value check (a device sync), not the shape check.
    assert verify(grown, past, context=context + 1, check_growth=False)[0].shape == (3, h)
    with pytest.raises(ValueError, match="must extend its forest"):
        verify(forest([[-1], [-1], [-1]]), past, check_growth=False)  # fewer nodes than the past


def test_mtp_serving_path_equals_its_training_forward(tiny_config):
    """``forward_sequences`` (training) and prefill/verify (serving) of both the target and the MTP
    head agree, with the row convention (hidden at p, token at p + 1, position p)."""
    model = random_model(tiny_config(), seed=5, mtp=True)
    ids = torch.randint(model.config.vocab_size, (1, 21), generator=torch.Generator().manual_seed(6))
    hidden_seq, _ = model.forward_sequences(ids)
    _, mtp_logits_seq = model.mtp.forward_sequences(hidden_seq[:, :-1], ids[:, 1:])
    model.allocate_cache(num_slots=1, num_blocks=8, block_size=BLOCK)
    tables = torch.arange(8, dtype=torch.int32)[None]
    hidden, _ = model.prefill(
        ids[0], StepContext.chains([21], torch.tensor([0]), tables, torch.zeros(1, dtype=torch.long))
    )
    torch.testing.assert_close(hidden, hidden_seq[0], atol=ATOL, rtol=0)
    rows = StepContext.chains([20], torch.tensor([0]), tables, torch.zeros(1, dtype=torch.long))
    _, mtp_logits, _ = model.mtp.verify(hidden[:-1], ids[0, 1:], rows)
    torch.testing.assert_close(mtp_logits, mtp_logits_seq[0], atol=ATOL, rtol=0)
    _, last = model.mtp.prefill(hidden[:-1], ids[0, 1:], rows)
    torch.testing.assert_close(last[0], mtp_logits_seq[0, -1], atol=ATOL, rtol=0)


def test_training_forward_is_differentiable(tiny_config):
    model = random_model(tiny_config(), seed=7, mtp=True).requires_grad_(True)
    ids = torch.randint(model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(8))
    hidden, logits = model.forward_sequences(ids)
    _, mtp_logits = model.mtp.forward_sequences(hidden[:, :-1], ids[:, 1:])
    (logits.logsumexp(-1).mean() + mtp_logits.logsumexp(-1).mean()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), f"no gradient reaches {name}"


def test_bfloat16_serving_runs_and_tracks_float32(tiny_config):
    """Prefill, a tree's verify and commit, the MTP's verify, then a decoding step that reads what the
    commit wrote (nothing read the committed state: a bf16 commit writing noise passed)."""
    config = tiny_config()
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = random_model(config, seed=9, dtype=dtype, mtp=True)
        model.allocate_cache(num_slots=2, num_blocks=16, block_size=BLOCK)
        tables = torch.arange(16, dtype=torch.int32).view(2, 8)
        gen = torch.Generator().manual_seed(10)
        prompt = torch.randint(config.vocab_size, (15,), generator=gen)
        ctx = StepContext.chains([9, 6], torch.tensor([1, 0]), tables, torch.zeros(2, dtype=torch.long))
        hidden, _ = model.prefill(prompt, ctx)
        tree = forest([topk_parents(6, 2, 3), chain_parents(3)])
        ids = torch.randint(config.vocab_size, (tree.num_nodes,), generator=gen)
        logits, hidden, pending = model.verify(
            ids, StepContext(ctx.slots, tables, torch.tensor([9, 6]), tree)
        )
        leaf = torch.tensor([4, 2])
        model.commit(pending, leaf)
        _, mtp_logits, _ = model.mtp.verify(
            hidden, ids, StepContext(ctx.slots, tables, torch.tensor([9, 6]), tree)
        )
        committed = torch.tensor([9, 6]) + tree.depth[leaf + tree.cu_seqlens[:-1]]  # the leaves' paths
        after, _, _ = model.verify(
            torch.tensor([5, 7]), StepContext.single_tokens(ctx.slots, tables, committed)
        )
        assert logits.dtype == mtp_logits.dtype == after.dtype == dtype
        runs[dtype] = (logits.float(), mtp_logits.float(), after.float())
    for ours, truth in zip(runs[torch.bfloat16], runs[torch.float32], strict=True):
        assert (ours - truth).abs().mean() <= 0.05 * truth.std()


def test_bfloat16_verify_hands_the_kernels_their_serving_layout(tiny_config, monkeypatch):
    """In a bf16 model the GDN verify gets bf16 q/k/v (normalised in float32, then rounded): the layout
    the kernel bench measures; fp32 q/k would turn its bf16 tensor-core products into tf32 ones."""
    from trtllm_bole import ops

    seen = []
    verify = ops.gdn_tree_verify

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return verify(q, k, v, *args, **kwargs)

    monkeypatch.setattr(ops, "gdn_tree_verify", spy)
    model = random_model(tiny_config(), seed=9, dtype=torch.bfloat16)
    model.allocate_cache(num_slots=1, num_blocks=8, block_size=BLOCK)
    tables = torch.arange(8, dtype=torch.int32).view(1, 8)
    prompt = torch.randint(model.config.vocab_size, (7,), generator=torch.Generator().manual_seed(3))
    model.prefill(
        prompt, StepContext.chains([7], torch.tensor([0]), tables, torch.zeros(1, dtype=torch.long))
    )
    tree = forest([topk_parents(5, 2, 3)])
    model.verify(
        torch.zeros(5, dtype=torch.long), StepContext(torch.tensor([0]), tables, torch.tensor([7]), tree)
    )
    assert seen and set(seen) == {(torch.bfloat16,) * 3}


def test_draft_derives_its_forests_on_the_device_as_the_host_build_would(tiny_config, monkeypatch):
    """Drafting grows its MTP forest with TreeBatch.on_device (no sync per level); the same draft with
    every level's forest validated and derived by TreeBatch.build gives the same candidates."""
    from trtllm_bole.spec.drafter import DraftSettings, draft
    from trtllm_bole.tree import TreeBatch

    s = Setup(tiny_config(), mtp=True)
    hidden = torch.randn(3, s.model.config.hidden_size, generator=s.gen)
    greedy = DraftSettings.of([0.0] * 3, [0] * 3, [1.0] * 3, "cpu")
    args = (s.model.mtp, s.tokens(3), hidden, s.slots, s.tables, torch.tensor(s.prompt_lens) - 1, greedy)
    fast = draft(*args, top_k=3, depth=4)
    built = []

    def on_host(parents, cu_seqlens, depth, *, max_depth, max_nodes):
        tree = TreeBatch.build(parents, cu_seqlens)
        assert (tree.max_depth, tree.max_nodes) == (max_depth, max_nodes) and torch.equal(tree.depth, depth)
        built.append(tree)
        return tree

    monkeypatch.setattr(TreeBatch, "on_device", on_host)
    slow = draft(*args, top_k=3, depth=4)
    assert len(built) == 4
    assert _differing_fields(fast, slow) == []


def _differing_fields(a, b) -> list[str]:
    """Fields of two candidate pools that differ (tensors bit for bit, host values by ==)."""

    def same(x, y):
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y

    return [f.name for f in dataclasses.fields(a) if not same(getattr(a, f.name), getattr(b, f.name))]


def _cuda_draft_inputs(model, seed: int):
    """Three requests' drafting inputs on the GPU (random MTP cache rows, scattered block tables)."""
    from trtllm_bole.spec.drafter import DraftSettings

    gen = torch.Generator().manual_seed(seed)
    tables = torch.randperm(30, generator=gen)[:24].view(3, 8).int().cuda()
    hidden = torch.randn(3, model.config.hidden_size, generator=gen).cuda()
    pending = torch.randint(model.config.vocab_size, (3,), generator=gen).cuda()
    mtp_lens = torch.randint(1, 30, (3,), generator=gen).cuda()
    greedy = DraftSettings.of([0.0] * 3, [0] * 3, [1.0] * 3, "cuda")
    return (pending, hidden, torch.tensor([0, 1, 2], device="cuda"), tables, mtp_lens, greedy)


def _cuda_model(tiny_config, **overrides):
    model = random_model(tiny_config(**{**CUDA_HEADS, **overrides}), seed=1, device="cuda")
    cache = model.allocate_cache(num_slots=3, num_blocks=30, block_size=BLOCK)
    cache.mtp_k_cache.normal_()
    cache.mtp_v_cache.normal_()
    return model


@pytest.mark.gpu
def test_draft_runs_without_a_device_sync(tiny_config):
    """Every draft level, and the selection of the verify forest, is queued without waiting for the GPU
    (torch's sync debug mode raises on a synchronising call): the host can run ahead, and the drafting
    loop can be captured."""
    from trtllm_bole.spec.drafter import draft, select_tree

    model = _cuda_model(tiny_config)
    inputs = _cuda_draft_inputs(model, 0)
    draft(model.mtp, *inputs, top_k=4, depth=8)  # first use: allocations, cuBLAS handles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pool = draft(model.mtp, *inputs, top_k=4, depth=8)
        tokens, tree, _ = select_tree(pool, 3, per_request=63, total=100)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert pool.tokens.numel() == 3 * (1 + 4 + 7 * 16)
    assert tokens.numel() == tree.num_nodes == 100 and (tree.max_nodes, tree.max_depth) == (64, 9)


@pytest.mark.gpu
def test_an_unchecked_prefill_never_waits_for_the_device(tiny_config):
    """The executor's prefill (``check=False``) and its MTP prefill queue every kernel without a device
    sync (torch's sync debug mode raises on one), whatever the GDN layers; a checked prefill's syncs (its
    value checks) do not grow with them: each layer's chunked GDN takes the forward's host bounds."""
    tables = torch.full((2, 18), -1, dtype=torch.int32)
    tables[0], tables[1, :3] = torch.arange(18), torch.arange(18, 21)  # 70 and 9 positions, blocks of 4

    def syncs(layers: int) -> int:  # the last layer full attention, the others GDN
        model = _cuda_model(
            tiny_config, num_hidden_layers=layers, full_attention_interval=layers, **CUDA_HEADS
        )
        lens = torch.zeros(2, dtype=torch.long, device="cuda")
        ids = torch.randint(model.config.vocab_size, (79,), device="cuda")

        def context():  # new slot indices each time: their check's memo never answers
            return StepContext.chains([70, 9], torch.tensor([2, 0], device="cuda"), tables.cuda(), lens)

        hidden, _ = model.prefill(ids, context())  # first use: compiles, allocations
        ctx, mtp_ctx = context(), context()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model.prefill(ids, ctx, check=False)
            model.mtp.prefill(hidden, ids, mtp_ctx, check=False)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        ctx = context()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.prefill(ids, ctx)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return sum("synchroniz" in str(w.message) for w in caught)

    assert syncs(2) == syncs(8) > 0  # one GDN layer and seven


@pytest.mark.gpu
def test_draft_graphs_replay_the_eager_draft(tiny_config):
    """A replayed graph drafts what draft() drafts, for new inputs (narrower block tables padded), and
    a reallocated cache is captured again instead of read through stale addresses."""
    from trtllm_bole.spec.draft_graphs import DraftGraphs
    from trtllm_bole.spec.drafter import draft

    model = _cuda_model(tiny_config)
    graphs = DraftGraphs.of(model.mtp, top_k=4, depth=8, table_width=10)
    assert DraftGraphs.of(model.mtp, top_k=4, depth=8, table_width=10) is graphs

    def padded(inputs):  # the eager draft over the graph's table width: the same kernels, the same bits
        tables = torch.nn.functional.pad(inputs[3], (0, 10 - inputs[3].shape[1]))
        return draft(model.mtp, *inputs[:3], tables, *inputs[4:], top_k=4, depth=8)

    for seed in (0, 1):
        inputs = _cuda_draft_inputs(model, seed)
        eager, replayed = padded(inputs), graphs(*inputs)
        assert _differing_fields(eager, replayed) == [], seed
    greedy = [(1, "greedy"), (3, "greedy")]
    assert graphs.captured == greedy[1:] and graphs.capture([1, 3]) == [1] and graphs.captured == greedy
    model.allocate_cache(num_slots=3, num_blocks=20, block_size=BLOCK)  # covered: the same cache
    assert graphs.captured == greedy
    model.allocate_cache(num_slots=3, num_blocks=40, block_size=BLOCK).mtp_k_cache.normal_()
    inputs = _cuda_draft_inputs(model, 2)
    assert torch.equal(graphs(*inputs).tokens, padded(inputs).tokens) and graphs.captured == greedy[1:]


@pytest.mark.gpu
def test_sampled_draft_graphs_replay_the_eager_draft_with_each_batch_s_settings(tiny_config):
    """A batch with sampled requests drafts from its own graph, its settings copied in: for two batches
    of other temperatures, top-k and top-p (a greedy request among them), and one of temperatures only
    (no vocabulary sort), the replay drafts what draft() drafts; the greedy graph of the same batch size
    is another."""
    from trtllm_bole.spec.draft_graphs import DraftGraphs
    from trtllm_bole.spec.drafter import DraftSettings, draft

    model = _cuda_model(tiny_config)
    graphs = DraftGraphs.of(model.mtp, top_k=4, depth=8, table_width=10)
    sampled = [DraftSettings.of([0.7, 0.0, 1.3], [5, 0, 0], [1.0, 1.0, 0.8], "cuda"),
               DraftSettings.of([1.0, 0.5, 0.9], [0, 3, 2], [0.6, 1.0, 0.95], "cuda"),
               DraftSettings.of([0.6, 0.0, 1.1], [0, 4, 0], [1.0, 0.5, 1.0], "cuda")]  # fmt: skip
    pools = []
    for seed, settings in enumerate(sampled):
        *inputs, _ = _cuda_draft_inputs(model, seed)
        inputs[3] = torch.nn.functional.pad(inputs[3], (0, 2))  # the graph's width: the same kernels
        eager = draft(model.mtp, *inputs, settings, top_k=4, depth=8)
        replayed = graphs(*inputs, settings)
        assert _differing_fields(eager, replayed) == [], seed
        pools.append(replayed.log_rho.clone())
    greedy = graphs(*_cuda_draft_inputs(model, 1))
    assert graphs.captured == [(3, "filtered"), (3, "greedy"), (3, "sampled")]
    assert not torch.equal(pools[1], greedy.log_rho)  # the settings reached the replayed draft


def test_allocate_cache_keeps_a_cache_that_covers_the_request(tiny_config):
    """Executors that follow one another on a model reuse its cache (and the graphs captured on it),
    zeroed as a new one would be, while it has the slots, blocks and block size they ask for."""
    model = random_model(tiny_config(), seed=1)
    first = model.allocate_cache(num_slots=4, num_blocks=20, block_size=BLOCK)
    first.gdn_state.fill_(1.0)
    first.mtp_k_cache.fill_(1.0)
    assert model.allocate_cache(num_slots=2, num_blocks=10, block_size=BLOCK) is first
    assert model.mtp.cache is first and not first.gdn_state.any() and not first.mtp_k_cache.any()  # zeroed
    for bigger in ((8, 20, BLOCK), (4, 21, BLOCK), (4, 20, 2 * BLOCK)):
        assert model.allocate_cache(*bigger) is not first


def test_draft_graph_registry_does_not_keep_a_model_alive(tiny_config):
    """Graphs are shared per MTP head through a weak registry: dropping the model frees its entry."""
    import gc
    import weakref

    from trtllm_bole.spec.draft_graphs import DraftGraphs

    registered = len(DraftGraphs._registry)
    model = random_model(tiny_config(), seed=1)
    model.allocate_cache(num_slots=2, num_blocks=8, block_size=BLOCK)
    graphs = DraftGraphs.of(model.mtp, top_k=2, depth=3, table_width=4)
    assert len(DraftGraphs._registry) == registered + 1
    assert graphs.mtp is model.mtp and DraftGraphs.of(model.mtp, top_k=2, depth=3, table_width=4) is graphs
    alive = weakref.ref(model.mtp)
    del model
    gc.collect()
    assert alive() is None and len(DraftGraphs._registry) == registered
    with pytest.raises(RuntimeError, match="no longer exists"):
        graphs.capture([1])


def test_placeholder_forest_has_the_shape_asked():
    """Verify graphs are captured on placeholder forests: the sizes, the largest request and the path
    width a graph is keyed by, with valid parents; impossible sizes are refused."""
    from trtllm_bole.spec.verify_graphs import placeholder_forest

    for batch, nodes, largest, depth in ((1, 64, 64, 9), (3, 3, 1, 9), (4, 200, 64, 9), (5, 6, 2, 3)):
        tree = placeholder_forest(batch, nodes, largest, depth)
        sizes = tree.cu_seqlens[1:] - tree.cu_seqlens[:-1]
        assert (tree.num_requests, tree.num_nodes, tree.max_nodes) == (batch, nodes, largest)
        assert int(sizes.max()) == largest and int(sizes.min()) >= 1
        assert tree.max_depth == depth and tree.paths.shape == (nodes, depth)
        assert int(tree.depth.max()) == min(largest, depth)
    with pytest.raises(ValueError, match="cannot hold"):
        placeholder_forest(2, 130, 64, 9)


@pytest.mark.parametrize("scheme", ["bole", "serial"])
def test_padding_a_forests_depth_changes_no_value(scheme, tiny_config, clone_cache):
    """What verify graphs rely on: paths padded to a deeper ``max_depth`` give the same logits, hidden
    states and commit, bit for bit."""
    from trtllm_bole.spec.verify_graphs import pad_depth

    s = Setup(tiny_config(), mtp=False)
    tree = forest(_trees(s.gen))
    ids, context = s.tokens(tree.num_nodes), torch.tensor(s.prompt_lens)
    before = clone_cache(s.model.cache)
    results = []
    for t in (tree, pad_depth(tree, tree.max_depth + 3)):
        s.model.cache = clone_cache(before)
        ctx = StepContext(s.slots, s.tables, context, t)
        logits, hidden, pending = s.model.verify(ids, ctx, gdn_scheme=scheme)
        s.model.commit(pending, torch.tensor([2, 4, 0]))
        results.append([logits, hidden, *_tensors(s.model.cache)])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bole", "serial", "mtp"])
def test_forest_graphs_replay_the_eager_forward(variant, tiny_config):
    """A replayed verify (the target's in either GDN scheme, or the MTP head's) computes what the eager
    one computes over the same padded inputs (block tables ``table_width`` wide, paths ``max_depth``
    wide), for new forests of the captured shape; a reallocated cache is captured again."""
    from trtllm_bole.spec.verify_graphs import MTPGraphs, VerifyGraphs, pad_depth

    model = _cuda_model(tiny_config)
    for t in (model.cache.gdn_state, model.cache.conv_state, model.cache.k_cache, model.cache.v_cache):
        t.normal_()
    kind, owner = (MTPGraphs, model.mtp) if variant == "mtp" else (VerifyGraphs, model)
    graphs = kind.of(owner, max_depth=6, table_width=10)
    assert kind.of(owner, max_depth=6, table_width=10) is graphs

    def eager(inputs, ctx):
        if variant == "mtp":
            return model.mtp.verify(*inputs, ctx)
        return model.verify(*inputs, ctx, gdn_scheme=variant)

    gen = torch.Generator().manual_seed(0)
    slots = torch.tensor([2, 0, 1], device="cuda")
    for seed in range(3):  # three forests of one shape: 3 requests, 23 nodes, at most 9 per request
        tree = forest([topk_parents(9, 3, 4), random_parents(9, 5, gen), chain_parents(5)], device="cuda")
        tables = torch.randperm(30, generator=gen)[:24].view(3, 8).int().cuda()
        inputs = (torch.randint(model.config.vocab_size, (23,), generator=gen).cuda(),)
        if variant == "mtp":
            inputs = (torch.randn(23, model.config.hidden_size, generator=gen).cuda(), *inputs)
        context = torch.randint(1, 30, (3,), generator=gen).cuda()
        ctx = StepContext(slots, tables, context, tree)
        padded = StepContext(slots, torch.nn.functional.pad(tables, (0, 2)), context, pad_depth(tree, 6))
        expected, replayed = eager(inputs, padded), graphs(inputs, ctx, variant)
        *values, pending = expected
        for a, b in zip(values, replayed[:-1], strict=True):
            assert torch.equal(a, b), seed
        for name in ("new_k", "new_v", "conv_inputs"):  # the MTP (attention only) has no conv inputs
            a, b = getattr(pending, name), getattr(replayed[-1], name)
            assert a is b is None if variant == "mtp" and name == "conv_inputs" else torch.equal(a, b)
        if variant == "bole":
            for name in ("k", "u", "log_decay"):
                assert torch.equal(*(getattr(r.gdn_factors, name) for r in (pending, replayed[-1]))), name
        elif variant == "serial":
            for a, b in zip(pending.gdn_snapshots, replayed[-1].gdn_snapshots, strict=True):
                assert torch.equal(a, b)
    assert graphs.captured == [(variant, 3, 23, 9)]
    model.allocate_cache(num_slots=3, num_blocks=40, block_size=BLOCK)
    graphs(inputs, ctx, variant)
    assert graphs.captured == [(variant, 3, 23, 9)] and graphs._cache is model.cache
