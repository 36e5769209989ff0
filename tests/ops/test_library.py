"""The ``bole::*`` operators: schemas that say what they mutate, fakes that agree with the real outputs
(``torch.library.opcheck``), and a step of verify + commit that ``torch.compile`` captures whole, each
operator one node, with the eager result. On CPU the operators run the reference; on the H200 the same
tests run the kernels (tests/conftest.py's device)."""

import pytest
import torch

from trtllm_bole import ops
from trtllm_bole.ops import library
from trtllm_bole.ops.library import tree_args
from trtllm_bole.reference import rope
from trtllm_bole.testing import forest, random_gdn_inputs, topk_parents
from trtllm_bole.tree import PrefillChunks, chunk_capacity

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def case(gen):
    tree = forest([topk_parents(7, 2, 3), [-1, 0]], device=DEVICE)
    x = random_gdn_inputs(tree.num_nodes, 2, 2, 4, 16, 16, generator=gen, device=DEVICE)
    return tree, x.cast(torch.bfloat16)  # the serving mode: o in bf16, the state and factors in float32


def _leaves(tree):
    return torch.tensor([4, 1], device=tree.parents.device)


def _samples(tree, x):
    """One call of every operator, as ``(operator, args, kwargs)``."""
    n, c, w = tree.num_nodes, 6, 4
    t = tree_args(tree)
    _, u, log_p = library.gdn_tree_verify(x.q, x.k, x.v, x.g, x.beta, x.state, *t, scale=x.scale)
    slots = torch.tensor([2, 0], device=DEVICE)
    pool = torch.randn((3, *x.state.shape[1:]), device=DEVICE)
    conv = torch.randn(3, c, w - 1, device=DEVICE)
    caches = [torch.randn(2, 4, 4, 1, 8, device=DEVICE) for _ in range(2)]
    new_kv = [torch.randn(2, n, 1, 8, device=DEVICE) for _ in range(2)]
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lengths = torch.tensor([2, 3], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5, n], device=DEVICE)
    chunks = PrefillChunks.of([5, n - 5], 4, DEVICE, capacity=chunk_capacity(2, n, 4) + 1)  # one chunk empty
    queries = torch.randn(n, 2, 8, device=DEVICE)
    freqs = rope.inv_freq(10000.0, 8, torch.device(DEVICE))
    attention = (*(kv[0] for kv in new_kv), *(c[0] for c in caches))  # k, v, k_cache, v_cache of layer 0
    hv = x.v.shape[1]
    qk = torch.randn(n, 3 + 2 * x.q[0].numel(), device=DEVICE)[:, 3:]  # a split of the conv's output
    gates = torch.randn(n, 2 * hv, device=DEVICE)  # a and b: splits of the projection
    return [
        (library.rms_norm, (x.v, torch.randn(x.v.shape[-1], device=DEVICE), 1e-6), {}),
        (
            library.gdn_inputs,
            (
                qk,
                gates[:, hv:],
                gates[:, :hv],
                torch.randn(hv, device=DEVICE),
                torch.randn(hv, device=DEVICE),
                x.q.shape[1],
            ),
            {},
        ),
        (
            library.gated_rms_norm,
            (x.v, torch.randn(x.v.shape, device=DEVICE), torch.randn(x.v.shape[-1], device=DEVICE), 1e-6),
            {},
        ),
        (
            library.rms_norm_rope,
            (
                x.q,
                torch.randn(x.q.shape[-1], device=DEVICE),
                1e-6,
                *rope.cos_sin(cu[:1].repeat(n), freqs, x.q.dtype),
            ),
            {},
        ),
        (
            library.filter_floor,
            (
                torch.randn(3, 40, device=DEVICE),
                torch.tensor([1.0, 0.7, 1.3], device=DEVICE),
                torch.tensor([0, 5, 3], device=DEVICE),
                torch.tensor([0.9, 1.0, 0.5], device=DEVICE),
            ),
            {},
        ),
        (
            library.softmax_stats,
            (
                torch.randn(3, 40, device=DEVICE),
                torch.tensor([1.0, 0.7, 1.3], device=DEVICE),
                torch.tensor([float("-inf"), 0.5, 1.0], device=DEVICE),
            ),
            {},
        ),
        (
            library.forest_metadata,
            (tree.parents, tree.cu_seqlens, tree.depth, tree.max_depth, tree.max_nodes),
            {},
        ),
        (library.gdn_tree_verify, (x.q, x.k, x.v, x.g, x.beta, x.state, *t), {"scale": x.scale}),
        (library.gdn_tree_verify_serial, (x.q, x.k, x.v, x.g, x.beta, pool, *t), {"state_indices": slots}),
        (library.gdn_commit, (pool, x.k, u, log_p, *t, _leaves(tree)), {"state_indices": slots}),
        (
            library.gdn_snapshot_commit,
            (pool, torch.randn(n, *pool.shape[1:], device=DEVICE), *t, _leaves(tree)),
            {"state_indices": slots},
        ),
        (
            library.gdn_prefill,
            (x.q, x.k, x.v, x.g, x.beta, pool, *tree_args(chunks.tree), chunks.first),
            {"state_indices": slots},
        ),
        (
            library.tree_conv1d,
            (torch.randn(n, c, device=DEVICE), torch.randn(c, w, device=DEVICE), conv, *t),
            {"state_indices": slots},
        ),
        (
            library.conv_state_commit,
            (conv, torch.randn(n, c, device=DEVICE), *t, _leaves(tree)),
            {"state_indices": slots},
        ),
        (library.kv_commit, (*caches, *new_kv, *t, _leaves(tree), tables, lengths), {}),
        (library.tree_attention, (queries, *attention, tables, lengths, *t, 0.3), {}),
    ]


def test_every_operator_is_sampled(case):
    defined = {
        name
        for name in dir(torch.ops.bole)
        if isinstance(getattr(torch.ops.bole, name), torch._ops.OpOverloadPacket)
    }
    samples = _samples(*case)
    assert {op.name().split("::")[1] for op, _, _ in samples} == defined
    assert len(samples) == SAMPLED  # a sample past test_opcheck's range would never be checked


SAMPLED = 16  # test_opcheck's cases, one a sample: test_every_operator_is_sampled keeps it current


@pytest.mark.parametrize("index", range(SAMPLED))
def test_opcheck(case, index):
    """Schema (mutated arguments declared, nothing else written), fake against real outputs, and the
    operator under AOT dispatch (what torch.compile runs)."""
    op, args, kwargs = _samples(*case)[index]
    torch.library.opcheck(op, args, kwargs)


def test_a_compiled_step_is_the_eager_step(case):
    """verify + conv + commit on a slot pool, as the executor calls them, captured whole (``fullgraph``;
    the slot indices' values are checked by eager calls only): each ``bole::`` operator one node of
    the graph, the same outputs and committed states as eager."""
    tree, x = case
    weight, conv = torch.randn(6, 4, device=DEVICE), torch.randn(3, 6, 3, device=DEVICE)
    mixed = torch.randn(tree.num_nodes, 6, device=DEVICE)
    slots = torch.tensor([2, 0], device=DEVICE)
    x.state = torch.randn(3, *x.state.shape[1:], device=DEVICE)

    def step(state, conv_state):
        o, factors = ops.gdn_tree_verify(
            x.q, x.k, x.v, x.g, x.beta, state, tree, scale=x.scale, state_indices=slots
        )
        y = ops.tree_conv1d(mixed, weight, conv_state, tree, state_indices=slots)
        ops.gdn_commit(state, factors, _leaves(tree), state_indices=slots)
        ops.conv_state_commit(conv_state, mixed, tree, _leaves(tree), state_indices=slots)
        return o, y

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    eager_state, eager_conv = x.state.clone(), conv.clone()
    compiled_state, compiled_conv = x.state.clone(), conv.clone()
    expected = step(eager_state, eager_conv)
    got = torch.compile(step, backend=backend, fullgraph=True)(compiled_state, compiled_conv)
    for a, b in zip((*got, compiled_state, compiled_conv), (*expected, eager_state, eager_conv), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    called = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    bole = [str(t) for t in called if str(t).startswith("bole.")]
    assert bole == ["bole.gdn_tree_verify.default", "bole.tree_conv1d.default", "bole.gdn_commit.default",
                    "bole.conv_state_commit.default"]  # fmt: skip


def test_meta_tensors_give_shapes_without_compute(case):
    tree, x = case
    meta = [t.to("meta") for t in (x.q, x.k, x.v, x.g, x.beta, x.state)]
    meta_tree = [t.to("meta") for t in tree.tensors()]
    o, u, log_p = library.gdn_tree_verify(*meta, meta_tree, tree.max_depth, tree.max_nodes)
    assert (o.shape, u.shape, log_p.shape) == (x.v.shape, x.v.shape, x.v.shape[:2])
    assert (o.dtype, u.dtype, log_p.dtype) == (torch.bfloat16, torch.float32, torch.float32)


def test_outputs_are_row_major_whatever_the_inputs_layout(case):
    """The fakes promise row-major outputs; the kernels write them so, and so does the CPU side."""
    tree, _ = case
    transposed = torch.randn(16, tree.num_nodes, device=DEVICE).t()
    torch.library.opcheck(library.rms_norm, (transposed, torch.randn(16, device=DEVICE), 1e-6))
    conv = (torch.randn(6, tree.num_nodes, device=DEVICE).t(), torch.randn(6, 4, device=DEVICE))
    torch.library.opcheck(library.tree_conv1d, (*conv, torch.randn(2, 6, 3, device=DEVICE), *tree_args(tree)))


def test_gdn_inputs_gates_are_float32_whatever_the_parameters_dtype():
    """A float64 dt_bias once promoted the CPU side's g to float64, where the fake and the kernel say
    float32."""
    n, hv = 3, 2
    qk, a, b = (
        torch.randn(n, 8, device=DEVICE),
        torch.randn(n, hv, device=DEVICE),
        torch.randn(n, hv, device=DEVICE),
    )
    params = (torch.randn(hv, dtype=torch.float64, device=DEVICE) for _ in range(2))  # A_log, dt_bias
    args = (qk, a, b, *params, 1)
    torch.library.opcheck(library.gdn_inputs, args)
    assert ops.gdn_inputs(*args)[2].dtype == torch.float32


@pytest.mark.parametrize(
    "logits_dtype, settings_dtype",
    [(torch.float64, torch.float64), (torch.float32, torch.float64)],
    ids=["float64", "float64-settings"],
)
def test_sampling_fakes_give_the_dtype_of_the_logits(logits_dtype, settings_dtype, gen):
    """Float64 logits (the references' truth) floor in float64, and float64 settings do not promote float32
    logits: the CPU side once gave float64 floors and normalisers where the fakes (and the kernels) said
    float32, so a compiled graph's dtypes were not the eager ones."""
    logits = torch.randn(4, 40, generator=gen, dtype=logits_dtype).to(DEVICE)
    temperature = torch.tensor([1.0, 0.5, 2.0, 0.7], dtype=settings_dtype, device=DEVICE)
    top_k = torch.tensor([3, 0, 10, 1], device=DEVICE)
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.3], dtype=settings_dtype, device=DEVICE)
    torch.library.opcheck(library.filter_floor, (logits, temperature, top_k, top_p))
    floor = ops.filter_floor(logits, temperature, top_k, top_p)
    assert floor.dtype == torch.promote_types(logits_dtype, torch.float32)
    torch.library.opcheck(library.softmax_stats, (logits, temperature, floor))
