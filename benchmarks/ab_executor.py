"""A/B of one executor change in one process: the change against the code it replaced.

    python benchmarks/ab_executor.py outcome-queue    # H200: ~30 s -> results/ab_outcome_queue_<device>.json
    python benchmarks/ab_executor.py forest-kernel --trials 8 --batches 8,16,32 --out DIR
    python benchmarks/ab_executor.py dispatcher --trials 6
    python benchmarks/ab_executor.py tree-attention
    python benchmarks/ab_executor.py step-graphs
    python benchmarks/ab_executor.py gdn-inputs --trials 6 --batches 8,32
    python benchmarks/ab_executor.py prefill-overlap --trials 6 --batches 8,16 --requests 48
    python benchmarks/ab_executor.py host-chains --trials 6 --batches 8,16 --requests 48
    python benchmarks/ab_executor.py grown-alike --trials 6 --batches 1,8,32
    python benchmarks/ab_executor.py draft-forest --trials 6 --batches 1,8,32
    python benchmarks/ab_executor.py prefill-graphs --trials 6 --batches 1,8,16 --requests 48
    python benchmarks/ab_executor.py sampled-draft-graphs --temperature 0.8 --trials 4 --batches 8
    python benchmarks/ab_executor.py sampled-acceptance --temperature 0.8 --trials 4 --batches 1,8,32
    python benchmarks/ab_executor.py unfiltered-sampling --temperature 0.8 --trials 4 --batches 1,8,32

``new`` is the executor as it is; ``old`` reproduces the code before the change by a patch:

- ``outcome-queue``: a step waits for its outcome before queueing the MTP follow-up (the order before
  2026-11-30; now the follow-up is queued first and the GPU runs it while the host books the step),
  reproduced by waiting inside :meth:`QueuedOutcome.of`;
- ``forest-kernel``: drafting and tree selection derive their forests with :meth:`TreeBatch.on_device`'s
  ~65 torch kernels instead of :mod:`trtllm_bole.kernels.forest`'s one launch, reproduced by setting
  the kernel's node limit to 0 (``ops.forest`` then falls back);
- ``dispatcher``: the ``bole::*`` operators (2026-12-01) against calling what they run directly (as
  ``trtllm_bole.ops`` did before them), reproduced by replacing each operator of ``ops.library`` with
  its implementation for the device (``library.IMPLEMENTATIONS``);
- ``tree-attention``: full attention (the target's verify, drafting, the MTP's follow-up, prefill) in
  one Triton launch against the torch path (a dense mask and the block table's whole window gathered for
  every forward, then SDPA), reproduced by running ``bole::tree_attention``'s CPU implementation, plain
  torch, on the GPU's tensors;
- ``step-graphs``: the tree selection, and a greedy batch's verify with its acceptance and commit,
  replayed from CUDA graphs (2026-12-02) against the selection, acceptance and commit launched kernel by
  kernel from Python around a replayed verify, reproduced by no selection graphs and step graphs that
  replay only the verify;
- ``gdn-inputs``: every GDN layer's q/k L2 norms with its decay and beta, and its gated output norm, one
  Triton launch each (2026-12-02) against the torch reference's small kernels, reproduced by running
  ``bole::gdn_inputs`` and ``bole::gated_rms_norm``'s CPU implementations, plain torch, on the GPU's
  tensors (as ``tree-attention`` does);
- ``prefill-overlap``: a step queues the running requests' draft, verify and commit before it launches
  the admitted prompts' prefill, and reads its outcome after (2026-12-02), against the prefill first,
  reproduced by the step of before;
- ``host-chains``: a prefill step's chains (the prompts', the MTP head's and the GDN prefill's chunks)
  made on the host and moved in one packed copy each, with no paths table (2026-12-02), against their
  derivation on the device, ~20 torch kernels each, paths included, reproduced by that derivation;
- ``grown-alike``: each draft level places the MTP's earlier K/V by padding every request's rows
  (2026-12-02, the requests of a draft grow alike) against the general placement's gathers and sort,
  reproduced by making the test that picks the padding fail;
- ``draft-forest``: drafting carries its MTP forest's local parents and depths from level to level,
  grown by concatenation, and takes each beam node's parent row from its column in the children's grid
  (2026-12-02), against deriving both from the pool at every level (a map from pool indices to local
  ones, gathers of the pool's parents and depths), reproduced by the draft of before;
- ``prefill-graphs``: the target's and the MTP head's prefills replayed from CUDA graphs of padded shapes
  (2026-12-03, :mod:`trtllm_bole.spec.prefill_graphs`) against launched from Python, reproduced by
  making the executor's two prefill graph sets None;
- ``sampled-draft-graphs``: a batch with sampled requests replays its draft from a CUDA graph keyed
  ``(batch, sampled)`` with its settings copied in (2026-12-03) against drafting it eagerly (greedy
  batches only had graphs), reproduced by a draft graph set that drafts sampled batches with
  :func:`~trtllm_bole.spec.drafter.draft`. Run it with ``--temperature``;
- ``sampled-acceptance``: a sampled batch's acceptance on the device, every node's test at once on coins
  drawn ahead from each request's generator, replayed with its verify and commit from one CUDA graph
  (2026-12-03), against the walk of each tree on the host with a device sync for every candidate, its
  commit launched from Python after a replayed verify, reproduced by step graphs that do that (on the
  same coins, so both sides emit the same tokens). Run it with ``--temperature``;
- ``unfiltered-sampling``: a batch whose sampled requests set no top-k or top-p drafts and accepts on
  softmaxes of its logits at their temperatures (2026-12-03, ``DraftSettings.kind``), against the
  vocabulary sort of every row that top-k and top-p need, reproduced by ``DraftSettings.of`` making every
  sampled batch one that filters and ``ops.filter_floor`` answered by the sort (the CPU's reference, on
  the GPU too). Run it with ``--temperature``.

The embedded model, float32, bole with its default settings, the held-out code prompts, 96 tokens a
request (greedy, or sampled at ``--temperature``, request ``i`` seeded with ``i``), at batch 8, 16 and
32 (``--batches``), as many requests as the batch holds (all admitted at once) or ``--requests`` (then
admitted as others end, a prefill in most steps), a model for each side (warmed up and its graphs
captured under its variant, a sampled batch's too at a temperature; the sampled A/Bs of 2026-12-03 ran
before that, so their first run of each side captured them), ``--trials`` interleaved pairs (order
alternating); every run's tokens must equal plain greedy decoding's (``ar``, one untimed run a batch) at
temperature 0, the first run's when sampled, else it stops without a result. Writes the
tokens/s of every run and the medians as JSON. ``--device cpu`` smoke-runs it (on the CPU both forest
variants are the torch derivation).
"""

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from _bench_util import tagged_stem
from bench_filter_floor import sorting_floor

from trtllm_bole import ops
from trtllm_bole.config import BoleConfig, SamplingParams
from trtllm_bole.kernels import forest
from trtllm_bole.llm import LLM
from trtllm_bole.models import mtp
from trtllm_bole.models.cache import StepContext
from trtllm_bole.ops import library
from trtllm_bole.spec import draft_graphs, drafter
from trtllm_bole.spec import executor as ex
from trtllm_bole.spec.acceptance import Sampling, accept
from trtllm_bole.spec.calibration import device_name
from trtllm_bole.spec.sampling import process_logits
from trtllm_bole.spec.verify_graphs import VerifyGraphs
from trtllm_bole.transfer import device_tensor
from trtllm_bole.tree import MAX_TREE_DEPTH, TreeBatch, _owners

PROMPTS = Path("benchmarks/data/heldout_code_prompts.jsonl")
QUEUE = ex.QueuedOutcome.of


class _Done:
    def __init__(self, outcome):
        self.outcome = outcome

    def wait(self):
        return self.outcome


@contextmanager
def outcome_waited_first():
    ex.QueuedOutcome.of = staticmethod(lambda *args: _Done(QUEUE(*args).wait()))
    try:
        yield
    finally:
        ex.QueuedOutcome.of = staticmethod(QUEUE)


@contextmanager
def forest_in_torch():
    limit, forest.MAX_NODES = forest.MAX_NODES, 0
    try:
        yield
    finally:
        forest.MAX_NODES = limit


@contextmanager
def operators_called_directly():
    key = "CUDA" if torch.cuda.is_available() else "CPU"
    operators = {name: getattr(library, name) for name in library.IMPLEMENTATIONS}
    for name, impls in library.IMPLEMENTATIONS.items():
        setattr(library, name, impls[key])
    try:
        yield
    finally:
        for name, operator in operators.items():
            setattr(library, name, operator)


@contextmanager
def in_torch(*names: str):
    """The named operators run their CPU implementations, plain torch, on any device."""
    operators = {name: getattr(library, name) for name in names}
    for name in names:
        setattr(library, name, library.IMPLEMENTATIONS[name]["CPU"])
    try:
        yield
    finally:
        for name, operator in operators.items():
            setattr(library, name, operator)


class _NoGraphs:
    """Stands in for a graph set's class: its executors launch that phase from Python."""

    def __new__(cls, *args, **kwargs):
        return None

    of = staticmethod(lambda *args, **kwargs: None)


class _VerifyReplayed(VerifyGraphs):
    """A step's graphs before 2026-12-02: the verify replayed, its acceptance (``accept``) and commit
    launched from Python (StepGraphs' interface)."""

    accept = staticmethod(accept)

    def __init__(self, owner, *, coins, **settings):
        super().__init__(owner, **settings)

    def capture(self, shapes, variant):
        return super().capture(shapes, variant[0])  # the verify's variant: the GDN scheme

    def __call__(self, inputs, ctx, variant):
        (tokens, _armed, *sampling), (scheme, kind) = inputs, variant
        logits, hidden, pending = super().__call__((tokens,), ctx, scheme)
        sampling = Sampling(*sampling) if kind != "greedy" else None
        leaf, bonus = self.accept(ctx.tree, tokens, logits, sampling, filtered=kind == "filtered")
        self.owner.commit(pending, leaf, check=False)
        return hidden, leaf, bonus


def _walk_on_host(tree, tokens, logits, sampling, *, filtered):
    """Sampled acceptance before 2026-12-03: each request's tree walked on the host, the target's
    distribution processed at each node the walk reaches, a device sync for every candidate tested (it
    drew each coin from the request's generator as it went; here the coins are the step's, read one at a
    time, so that both sides emit the same tokens; every row sorted, ``filtered`` or not, as then)."""
    if sampling is None:
        return accept(tree, tokens, logits, None)
    children = [[] for _ in range(tree.num_nodes)]
    for node, parent in enumerate(tree.global_parents.tolist()):
        if parent >= 0:
            children[parent].append(node)
    leaves, bonus = [], []
    for b in range(tree.num_requests):
        node = first = int(tree.cu_seqlens[b])
        settings = [t[b : b + 1] for t in sampling[:3]]
        while True:
            residual = process_logits(logits[node : node + 1], *settings)[0]
            for child, token in zip(children[node], tokens[children[node]].tolist(), strict=True):
                if sampling.coins[b, child - first] < residual[token]:
                    node = child
                    break
                rest = residual.clone()
                rest[token] = 0.0
                residual = rest / rest.sum() if rest.sum() > 0 else residual
            else:
                cdf = residual.double().cumsum(0)
                bonus.append(
                    int(torch.searchsorted(cdf, sampling.coins[b, -1].double() * cdf[-1], right=True))
                )
                break
        leaves.append(node - first)
    return torch.tensor(leaves, device=tokens.device), torch.tensor(bonus, device=tokens.device)


class _WalkedOnHost(_VerifyReplayed):
    accept = staticmethod(_walk_on_host)


@contextmanager
def step_launched_from_python():
    graphs = ex.SelectGraphs, ex.StepGraphs
    ex.SelectGraphs, ex.StepGraphs = _NoGraphs, _VerifyReplayed
    try:
        yield
    finally:
        ex.SelectGraphs, ex.StepGraphs = graphs


@contextmanager
def always_sorted():
    """Every sampled batch drafted and accepted as one that filters (``DraftSettings.kind``), each row's
    floor found by the sort: so did every sampled step before 2026-12-03."""
    of = drafter.DraftSettings.__dict__["of"]

    def filtering(cls, *args, **kwargs):
        settings = of.__func__(cls, *args, **kwargs)
        settings.kind = "filtered" if settings.kind == "sampled" else settings.kind
        return settings

    drafter.DraftSettings.of = classmethod(filtering)
    try:
        with sorting_floor():
            yield
    finally:
        drafter.DraftSettings.of = of


@contextmanager
def sampled_walk_on_host():
    graphs = ex.StepGraphs
    ex.StepGraphs = _WalkedOnHost
    try:
        yield
    finally:
        ex.StepGraphs = graphs


def _prefill_first(self):
    """``Executor.step`` before 2026-12-02: the admitted prompts' prefill, then the running requests' step."""
    admitted = self.scheduler.admit(self.max_batch_size)
    if admitted:
        self.cache.reset_slots([r.slot for r in admitted])
    prefilling = [r for r in self.scheduler.running if r.runtime is None]
    events = self._prefill(prefilling) if prefilling else []
    running = [r for r in self.scheduler.running if r.runtime is not None and r not in prefilling]
    return events + (self._book(self._speculate(running)) if running else [])


@contextmanager
def prefill_first():
    step, ex.Executor.step = ex.Executor.step, torch.no_grad()(_prefill_first)
    try:
        yield
    finally:
        ex.Executor.step = step


def _chains_on_device(cls, lengths, device="cpu", *, max_depth=None, paths=True):
    """``TreeBatch.chains`` before 2026-12-02, on ``device`` from the lengths (``paths`` ignored: a
    table up to MAX_TREE_DEPTH deep, always)."""
    device = torch.device(device)
    sizes = device_tensor(lengths, device)
    cu_seqlens = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    num_nodes, max_depth = sum(lengths), max_depth or max(lengths)
    nodes = torch.arange(num_nodes, device=device)
    request = _owners(sizes, num_nodes)
    local = nodes - cu_seqlens[:-1][request]
    steps = torch.arange(max_depth if max_depth <= MAX_TREE_DEPTH else 0, device=device)
    table = torch.where(steps <= local[:, None], (nodes - local)[:, None] + steps, -1)
    return cls(local - 1, cu_seqlens, local + 1, request, torch.where(local > 0, nodes - 1, -1), table,
               nodes, sizes[request] - local, max_depth, max_depth)  # fmt: skip


@contextmanager
def chains_on_device():
    chains, TreeBatch.chains = TreeBatch.chains, classmethod(_chains_on_device)
    try:
        yield
    finally:
        TreeBatch.chains = chains


@contextmanager
def grown_by_gathers():
    alike, mtp._alike = mtp._alike, lambda old, tree: False
    try:
        yield
    finally:
        mtp._alike = alike


def _draft_before(mtp_head, pending, last_hidden, slots, block_tables, mtp_context_lens, settings, *,
                  top_k, depth):  # fmt: skip
    """``drafter.draft`` before 2026-12-02's carried forest: the MTP forest and the frontier's rows
    derived from the pool's indices at every level."""
    device, b = pending.device, pending.numel()
    requests = torch.arange(b, device=device)
    pool = drafter.CandidatePool(pending.long(), torch.full((b,), -1, dtype=torch.long, device=device),
                                 requests, torch.ones(b, dtype=torch.long, device=device),
                                 torch.zeros(b, device=device), root_children=top_k)  # fmt: skip
    frontier, frontier_hidden, mtp_nodes, past = requests, last_hidden, requests.new_empty(0), None
    for level in range(depth):
        grown = torch.cat([mtp_nodes.view(b, -1), frontier.view(b, -1)], dim=1).flatten()
        per_request = grown.numel() // b
        local_of = torch.full_like(pool.tokens, -1)
        local_of[grown] = torch.arange(grown.numel(), device=device) % per_request
        parents = pool.parents[grown]
        local_parents = torch.where(parents >= 0, local_of[parents.clamp(min=0)], -1)
        cu = torch.arange(0, grown.numel() + 1, per_request, device=device)
        tree = ops.forest(local_parents, cu, pool.depth[grown], max_depth=level + 1, max_nodes=per_request)
        mtp_nodes = grown
        ctx = StepContext(slots, block_tables, mtp_context_lens, tree)
        hidden, logits, past = mtp_head.verify(
            frontier_hidden, pool.tokens[frontier], ctx, past=past, check_growth=False
        )
        log_q, tokens = settings.top_log_probs(logits, pool.request[frontier], top_k)
        log_rho = drafter.children_log_rho(pool.log_rho[frontier], log_q)
        owners = pool.request[frontier].repeat_interleave(top_k)
        children = pool.extend(
            tokens.flatten(), frontier.repeat_interleave(top_k), owners, level + 2, log_rho.flatten()
        )
        beam = children.view(b, -1).gather(1, drafter._best_per_request(pool, children, b, top_k)).flatten()
        row_of = torch.full_like(pool.tokens, -1)
        row_of[frontier] = torch.arange(frontier.numel(), device=device)
        frontier, frontier_hidden = beam, hidden[row_of[pool.parents[beam]]]
    return pool


@contextmanager
def draft_before():
    draft = ex.draft
    ex.draft = draft_graphs.draft = _draft_before
    try:
        yield
    finally:
        ex.draft = draft_graphs.draft = draft


@contextmanager
def prefill_launched():
    classes = ex.TargetPrefillGraphs, ex.MTPPrefillGraphs
    ex.TargetPrefillGraphs = ex.MTPPrefillGraphs = SimpleNamespace(of=lambda owner, **settings: None)
    try:
        yield
    finally:
        ex.TargetPrefillGraphs, ex.MTPPrefillGraphs = classes


@contextmanager
def sampled_drafts_launched():
    call = draft_graphs.DraftGraphs.__call__

    def greedy_only(graphs, *inputs):
        if inputs[-1].all_greedy:
            return call(graphs, *inputs)
        return drafter.draft(graphs.mtp, *inputs, top_k=graphs.top_k, depth=graphs.depth)

    draft_graphs.DraftGraphs.__call__ = greedy_only
    try:
        yield
    finally:
        draft_graphs.DraftGraphs.__call__ = call


OLD = {
    "outcome-queue": outcome_waited_first,
    "forest-kernel": forest_in_torch,
    "dispatcher": operators_called_directly,
    "tree-attention": partial(in_torch, "tree_attention"),
    "step-graphs": step_launched_from_python,
    "gdn-inputs": partial(in_torch, "gdn_inputs", "gated_rms_norm"),
    "prefill-overlap": prefill_first,
    "host-chains": chains_on_device,
    "grown-alike": grown_by_gathers,
    "draft-forest": draft_before,
    "prefill-graphs": prefill_launched,
    "sampled-draft-graphs": sampled_drafts_launched,
    "sampled-acceptance": sampled_walk_on_host,
    "unfiltered-sampling": always_sorted,
}


def sampling(index: int, temperature: float) -> SamplingParams:
    """96 tokens; sampled requests seeded by their index, so that every run draws the same tokens."""
    seed = index if temperature > 0 else None
    return SamplingParams(max_tokens=96, temperature=temperature, seed=seed)


def plain_greedy(dev: str, batch: int, requests: list[str], params: list[SamplingParams]) -> list[list[int]]:
    """The requests' tokens under plain greedy decoding (``ar``: no speculation), which a greedy A/B's two
    sides must both equal token for token (they are compared with each other at every trial)."""
    llm = LLM(speculative_config=BoleConfig(mode="ar"), device=dev, dtype="float32", max_batch_size=batch)
    return [o.outputs[0].token_ids for o in llm.generate(requests, params, use_tqdm=False)]


def _batches(text: str) -> list[int]:
    try:
        values = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive batch sizes, got {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("change", choices=sorted(OLD), help="the executor change to measure")
    parser.add_argument("--trials", type=int, default=8, help="interleaved (old, new) pairs per batch")
    parser.add_argument(
        "--batches", type=_batches, default=[8, 16, 32], metavar="B,B,...", help="batch sizes"
    )
    parser.add_argument("--requests", type=int, default=0, help="requests a run (default: the batch size)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="> 0: sampled requests, request i seeded with i"
    )
    parser.add_argument("--device", default="cuda", help="cuda or cpu (a smoke run)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results", help="folder of the JSON"
    )
    args = parser.parse_args()
    old, dev = OLD[args.change], args.device
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    out = {}
    for batch in args.batches:
        variants, llms = {"old": old, "new": nullcontext}, {}
        for name, variant in variants.items():  # one model each: a captured graph keeps its variant's kernels
            with variant():
                llms[name] = LLM(
                    speculative_config=BoleConfig(), device=dev, dtype="float32", max_batch_size=batch
                )
                llms[name].warm_up(sampled=args.temperature > 0, use_tqdm=False)
        requests = (prompts * 8)[: args.requests or batch]
        params = [sampling(i, args.temperature) for i in range(len(requests))]
        res, ref = {"old": [], "new": []}, None
        if args.temperature == 0:
            ref = plain_greedy(dev, batch, requests, params)
        for trial in range(args.trials):
            for name in ("old", "new") if trial % 2 == 0 else ("new", "old"):
                with variants[name]():
                    sync()
                    t0 = time.perf_counter()
                    outs = llms[name].generate(requests, params, use_tqdm=False)
                    sync()
                    dt = time.perf_counter() - t0
                toks = [o.outputs[0].token_ids for o in outs]
                ref = ref or toks
                if toks != ref:
                    first = "plain greedy decoding's" if args.temperature == 0 else "the first run's"
                    sys.exit(f"batch {batch}, trial {trial}, {name}: outputs differ from {first}")
                res[name].append(sum(map(len, toks)) / dt)
        out[batch] = {k: {"median": statistics.median(v), "runs": v} for k, v in res.items()}
        ratio = out[batch]["new"]["median"] / out[batch]["old"]["median"]
        print(batch, {k: round(v["median"]) for k, v in out[batch].items()}, round(ratio, 3), flush=True)
    device = device_name(torch.device(dev))
    import triton

    result = {
        "change": args.change, "device": device, "torch": torch.__version__, "triton": triton.__version__,
        "command": " ".join(["python", *sys.argv]), "ab": out,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{tagged_stem('ab_' + args.change.replace('-', '_'), device, None)}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
