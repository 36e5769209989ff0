"""Chunked prefill in one launch (each program verifies and commits its prompt's chunks in turn) against
the serial float64 recurrence, prompt by prompt."""

import pytest
import torch

from tests.kernels.helpers import DEVICE, rel_rms
from trtllm_bole import ops
from trtllm_bole.kernels import gdn_prefill as kernel
from trtllm_bole.kernels.gdn_tree_verify import VerifyConfig, exact_config
from trtllm_bole.reference import gdn_tree
from trtllm_bole.testing import random_gdn_inputs
from trtllm_bole.tree import PrefillChunks, TreeBatch, chunk_capacity

EXACT, SERVING = 1e-4, 1e-2  # fp32 inputs with IEEE dots; bf16 q/k/v with tensor-core dots


@pytest.mark.parametrize(
    ("lengths", "chunk_size"),
    [([5, 40, 17], 16), ([1, 1], 16), ([33], 32), ([70, 3], 64)],
    ids=["ragged", "single-tokens", "one-full-chunk", "kernel-depth"],
)
def test_prefill_equals_serial_recurrence(lengths, chunk_size, gen, nan_outputs):
    h, hv, dk, dv = 2, 4, 16, 32
    slots = torch.tensor([3, 0, 1][: len(lengths)], device=DEVICE)
    x = random_gdn_inputs(sum(lengths), 4, h, hv, dk, dv, generator=gen, device=DEVICE)
    q, k, v, g, beta = (t.float() for t in (x.q, x.k, x.v, x.g, x.beta))
    pool = x.state.float()
    expected_pool = pool.double().clone()
    o = kernel.gdn_prefill(
        q, k, v, g, beta, pool, lengths, scale=x.scale, state_indices=slots, chunk_size=chunk_size
    )
    chains = TreeBatch.chains(lengths, device=DEVICE)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        q.double(), k.double(), v.double(), g.double(), beta.double(), expected_pool, chains,
        scale=x.scale, state_indices=slots,
    )  # fmt: skip
    expected_pool[slots] = states[chains.cu_seqlens[1:] - 1]
    assert rel_rms(o, o_ref) <= EXACT
    assert rel_rms(pool, expected_pool) <= EXACT
    untouched = [s for s in range(4) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], x.state.float()[untouched])


def serving_precision_check(lengths, h, hv, dk, dv, gen):
    """bf16 q/k/v (the serving layout), fp32 state, against the float64 recurrence on the same rounded
    inputs."""
    x = random_gdn_inputs(sum(lengths), len(lengths), h, hv, dk, dv, generator=gen, device=DEVICE)
    q, k, v = (t.bfloat16() for t in (x.q, x.k, x.v))
    g, beta, state = x.g.float(), x.beta.float(), x.state.float()
    expected_state = state.double().clone()
    o = kernel.gdn_prefill(q, k, v, g, beta, state, lengths, scale=x.scale)
    chains = TreeBatch.chains(lengths, device=DEVICE)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        q.double(), k.double(), v.double(), g.double(), beta.double(), expected_state, chains, scale=x.scale
    )
    assert o.dtype == torch.bfloat16
    assert rel_rms(o, o_ref) <= SERVING
    assert rel_rms(state, states[chains.cu_seqlens[1:] - 1]) <= SERVING


@pytest.mark.parametrize("chunk_size", [5, 33])
def test_several_value_tiles_and_chunks_of_any_size(chunk_size, gen):
    """dv = 128: two value tiles a head, each program committing its own columns of the state; chunk
    sizes that are not powers of two (the commit pads the chunk's rows)."""
    lengths = [70, 9]
    x = random_gdn_inputs(sum(lengths), 2, 1, 2, 32, 128, generator=gen, device=DEVICE)
    q, k, v, g, beta = (t.float() for t in (x.q, x.k, x.v, x.g, x.beta))
    state = x.state.float()
    expected = state.double().clone()
    o = kernel.gdn_prefill(q, k, v, g, beta, state, lengths, scale=x.scale, chunk_size=chunk_size)
    chains = TreeBatch.chains(lengths, device=DEVICE)
    o_ref, states = gdn_tree.serial_tree_recurrence(
        q.double(), k.double(), v.double(), g.double(), beta.double(), expected, chains, scale=x.scale
    )
    assert rel_rms(o, o_ref) <= EXACT
    assert rel_rms(state, states[chains.cu_seqlens[1:] - 1]) <= EXACT


def test_prefill_in_serving_precision(gen):
    serving_precision_check([70, 9], 2, 4, 16, 32, gen)


def test_prefill_in_serving_precision_with_a_key_dim_that_is_not_a_power_of_two(gen):
    """dk = 48 streams in chunks of 16 (tile sides are powers of two)."""
    assert kernel.prefill_config(48, 32, fp32_exact=False).bk == 16
    serving_precision_check([5, 3], 1, 2, 48, 32, gen)


@pytest.mark.gpu
def test_prefill_in_serving_precision_at_qwen35_9b_sizes(gen):
    serving_precision_check([262, 64, 1, 130], 16, 32, 128, 128, gen)


def test_prefill_config_follows_the_inputs_precision():
    """fp32 inputs run the fp32-exact verify config, 16-bit ones the serving one; neither depends on the
    batch (a prompt's prefill must not depend on the prompts beside it)."""
    assert kernel.prefill_config(128, 128, fp32_exact=True) == exact_config(128, 128)
    serving = kernel.prefill_config(128, 128, fp32_exact=False)
    assert isinstance(serving, VerifyConfig) and serving != exact_config(128, 128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("first", [40, 10], ids=["deep-first", "shallow-first"])
def test_a_prompts_prefill_does_not_depend_on_the_other_prompts(first, dtype, gen):
    """Bit for bit: prompt 0 alone, or in one launch with a long and a short prompt (the chunk size, not
    the longest prompt, bounds the chains' depth)."""
    lengths = [first, 70, 3]
    x = random_gdn_inputs(sum(lengths), 3, 2, 4, 16, 32, generator=gen, device=DEVICE)
    inputs = [t.to(dtype) for t in (x.q, x.k, x.v)] + [x.g.float(), x.beta.float()]
    together, alone = x.state.float(), x.state.float()[:1].clone()
    o_together = kernel.gdn_prefill(*inputs, together, lengths, scale=x.scale)
    o_alone = kernel.gdn_prefill(*(t[:first] for t in inputs), alone, [first], scale=x.scale)
    assert torch.equal(o_together[:first], o_alone)
    assert torch.equal(together[0], alone[0])


def test_chunks_lie_prompt_after_prompt():
    chunks = PrefillChunks.of((5, 40, 17), 16, "cpu")
    assert chunks.first.tolist() == [0, 1, 4, 6]
    assert chunks.tree.cu_seqlens.tolist() == [0, 5, 21, 37, 45, 61, 62]  # the prompts' own rows
    assert chunks.tree.max_depth == 16  # the chunk size, whatever the chunks
    assert chunks.tree.depth.tolist()[21:24] == [1, 2, 3]  # prompt 1's second chunk starts a chain
    with pytest.raises(ValueError, match="chunk_size"):
        PrefillChunks.of((5,), 65, "cpu")
    with pytest.raises(ValueError, match="positive"):
        PrefillChunks.of((5, 0), 16, "cpu")


def test_chunks_at_a_capacity_end_in_empty_chains():
    """A CUDA graph's chunks: as many chains whatever the lengths, the extra ones empty and past every
    prompt's range; the capacity bound is reached and never exceeded."""
    chunks = PrefillChunks.of((5, 40, 17), 16, "cpu", capacity=chunk_capacity(3, 62, 16))
    assert chunk_capacity(3, 62, 16) == 6  # (62 + 3 * 15) // 16: these lengths need all of it
    assert chunks.tree.cu_seqlens.tolist() == [0, 5, 21, 37, 45, 61, 62]
    wide = PrefillChunks.of((32, 30), 16, "cpu", capacity=chunk_capacity(2, 62, 16))
    assert wide.tree.cu_seqlens.tolist() == [0, 16, 32, 48, 62, 62]  # four chunks, one empty
    assert wide.first.tolist() == [0, 2, 4]
    for lengths in [(1, 61), (16, 46), (17, 45), (31, 31), (47, 15)]:  # the capacity holds every split
        assert len(PrefillChunks.of(lengths, 16, "cpu").tree.cu_seqlens) - 1 <= chunk_capacity(2, 62, 16)
    with pytest.raises(ValueError, match="capacity"):
        PrefillChunks.of((5, 40, 17), 16, "cpu", capacity=5)


def test_prefill_checks_its_inputs_as_the_verify_does(gen):
    x = random_gdn_inputs(12, 2, 2, 4, 16, 32, generator=gen, device=DEVICE)
    inputs = [t.float() for t in (x.q, x.k, x.v, x.g, x.beta)]
    with pytest.raises(ValueError, match="cover"):
        kernel.gdn_prefill(*inputs, x.state.float(), [5, 6])
    with pytest.raises(ValueError, match="slots"):  # two prompts, three slots, no state_indices
        kernel.gdn_prefill(*inputs, x.state.float().repeat(2, 1, 1, 1)[:3], [5, 7])
    with pytest.raises(ValueError, match="share a dtype"):
        kernel.gdn_prefill(inputs[0], inputs[1].bfloat16(), *inputs[2:], x.state.float(), [5, 7])


@pytest.mark.gpu
def test_ops_prefill_on_cuda_matches_the_cpu_reference(gen):
    """The dispatch point: CUDA runs the prefill kernel, CPU the torch reference; same results."""
    lengths = [262, 64, 1, 130]
    x = random_gdn_inputs(sum(lengths), 4, 16, 32, 128, 128, generator=gen)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    inputs = [t.float() for t in (x.q, x.k, x.v, x.g, x.beta)]
    cpu_state, gpu_state = x.state.float(), x.state.float().cuda()
    o_cpu = ops.gdn_prefill(*inputs, cpu_state, cu, scale=x.scale)
    o_gpu = ops.gdn_prefill(*(t.cuda() for t in inputs), gpu_state, cu.cuda(), scale=x.scale)
    assert rel_rms(o_gpu.cpu(), o_cpu) <= EXACT
    assert rel_rms(gpu_state.cpu(), cpu_state) <= EXACT
