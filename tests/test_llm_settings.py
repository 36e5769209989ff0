"""LLM API and speculative settings at their edges."""

import pytest
from pydantic import ValidationError

from trtllm_bole import LLM, BoleConfig


@pytest.fixture(scope="module")
def llm():
    return LLM(max_batch_size=2, max_seq_len=48, speculative_config=BoleConfig(mode="ar"))


def test_kv_cache_tokens_round_up_to_whole_blocks():
    """``kv_cache_tokens`` is a floor: a partial block is a whole one more, never one fewer."""
    llm = LLM(max_batch_size=1, max_seq_len=48, kv_cache_tokens=40, speculative_config=BoleConfig(mode="ar"))
    assert llm.executor.cache.num_blocks == 3  # 40 tokens / 16 per block
    assert (
        llm.executor.scheduler.request_limit == 47
    )  # 48 KV tokens hold max_seq_len - 1 and a one-token tree


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("block_size", "block_size must be an integer of at least 1, got None"),
        ("max_prefill_tokens", "max_prefill_tokens must be an integer of at least 1, got None"),
        ("cuda_graphs", "cuda_graphs must be True or False, got None"),
    ],
)
def test_a_setting_without_an_unset_value_is_refused_as_none(setting, words):
    """None is the default of max_batch_size, max_seq_len and kv_cache_tokens only: these three had been a
    TypeError from inside the executor (block_size, cuda_graphs) or from the scheduler at the first
    generate, after the weights had loaded (max_prefill_tokens)."""
    with pytest.raises(ValueError, match=words):
        LLM(speculative_config=BoleConfig(mode="ar"), **{setting: None})


@pytest.mark.parametrize("model", ["", 5])
def test_a_model_that_names_no_directory_is_refused_as_such(model, tmp_path, monkeypatch):
    """The empty string read the working directory ("config.json: no such file", naming none), 5 was pathlib's
    TypeError."""
    monkeypatch.chdir(tmp_path)
    refused = rf"model must be a checkpoint's or an engine's directory, got {model!r}"
    with pytest.raises(ValueError, match=refused):
        LLM(model=model)


def test_an_output_stops_where_one_request_fits_whichever_limit_sets_it():
    """A KV cache that holds fewer tokens than the context lowers the request limit, and a max_tokens past
    it ends there ("length"), as past the context: it was refused instead. Both read alike (greedy,
    speculative), and a prompt that leaves no room for a token is refused by either."""
    from trtllm_bole import SamplingParams

    by_context, by_cache = LLM(max_seq_len=104), LLM(kv_cache_tokens=112)
    params = SamplingParams(max_tokens=200)
    outputs = []
    for llm in (by_context, by_cache):
        assert llm.executor.scheduler.request_limit == 103
        [out] = llm.generate([[5] * 5], params, use_tqdm=False)
        done = out.outputs[0]
        assert (out.error, done.finish_reason, len(done.token_ids)) == (None, "length", 98)
        outputs.append(done.token_ids)
        [refused] = llm.generate([[5] * 103], SamplingParams(max_tokens=1), use_tqdm=False)
        assert "so a prompt of at most 102" in refused.error
    assert outputs[0] == outputs[1]


def test_no_prompts_give_no_outputs(llm):
    assert llm.generate([], use_tqdm=False) == []


def test_a_speculative_config_is_frozen():
    """An executor sizes its KV headroom, coins and graphs from its config once: changing the object a
    live LLM was built with (to build another with deeper trees) broke the first one's next step with an
    MTP shape error. A changed config is a new object."""
    config = BoleConfig(max_depth=4, max_nodes=8)
    with pytest.raises(ValueError, match="frozen"):
        config.max_depth = 8
    deeper = BoleConfig(**{**config.model_dump(), "max_depth": 8})
    assert (config.max_depth, deeper.max_depth, deeper.max_nodes) == (4, 8, 8)


@pytest.mark.parametrize("config", [{"mode": "ar"}, "chain"])
def test_a_speculative_config_that_is_no_bole_config_is_refused_by_type(config):
    """A dict or a mode's name was an AttributeError from deep in the settings."""
    with pytest.raises(ValueError, match=r"speculative_config must be a BoleConfig or None, got (dict|str)"):
        LLM(speculative_config=config)


def test_a_budget_table_that_cannot_serve_the_epsilon_asked_is_refused_at_once(tmp_path):
    """A table without the timings to re-derive its budgets at another epsilon loaded, and then every
    step failed (a review); it is refused as the LLM is made, saying why."""
    from trtllm_bole.spec.budget import BudgetEntry, BudgetTable

    path = tmp_path / "budget.json"
    BudgetTable(0.2, [8], 9, "cpu", [BudgetEntry(64, 10**6, 8, 1.0, [1.0])]).save(path)
    assert LLM(speculative_config=BoleConfig(budget_table=path)).executor.budget.lookup(4, 100) == 8
    with pytest.raises(ValueError, match=r"cannot re-derive a budget at epsilon 0\.3"):
        LLM(speculative_config=BoleConfig(budget_table=path, epsilon=0.3))


def test_a_budget_table_of_another_model_warns(tmp_path):
    """A table names the architecture it was timed on: one of another model's was taken without a word
    (its budgets fit other costs; the output stays exact)."""
    import warnings

    from trtllm_bole.spec.budget import BudgetEntry, BudgetTable

    path, llm = tmp_path / "budget.json", LLM(max_batch_size=1)
    entries = [BudgetEntry(64, 10**6, 8, 1.0, [1.0])]
    for model, warns in (("0123456789abcdef", True), (llm.model.config.architecture_id, False), ("", False)):
        BudgetTable(0.2, [8], 9, "cpu", entries, model=model).save(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            LLM(speculative_config=BoleConfig(budget_table=path))
        said = [w for w in caught if "another model (0123456789abcdef, this is" in str(w.message)]
        assert bool(said) == warns, (model, [str(w.message) for w in caught])


def test_a_budget_setting_that_nothing_would_read_is_refused(tmp_path):
    """Both were dropped without a word: an epsilon with no table to re-derive (the embedded checkpoint has
    none), and a table or epsilon for a mode that verifies every tree in full."""
    with pytest.raises(ValueError, match=r"epsilon=0\.5 re-derives a budget table's budgets, and there is"):
        LLM(speculative_config=BoleConfig(epsilon=0.5))
    for mode in ("ar", "chain", "tree-serial"):
        for setting in ({"epsilon": 0.5}, {"budget_table": tmp_path / "budget.json"}):
            with pytest.raises(ValueError, match=f"mode 'bole' only; mode '{mode}' has none"):
                BoleConfig(mode=mode, **setting)


def test_a_chain_may_be_deeper_than_the_tree_node_limit():
    """``max_nodes`` bounds trees; a chain drafts ``max_depth`` tokens, and is deeper than the default
    tree node limit where it likes."""
    chain = BoleConfig(mode="chain", max_depth=15)
    assert chain.draft_tokens == 15 and chain.branching == 1 and chain.max_nodes == 63
    with pytest.raises(ValueError, match=r"max_nodes \(4\) must be at least max_depth \(8\)"):
        BoleConfig(mode="bole", max_depth=8, max_nodes=4)
    assert BoleConfig(mode="bole", max_depth=8, max_nodes=8).draft_tokens == 8
    assert BoleConfig(mode="ar").draft_tokens == 0


@pytest.mark.parametrize(("depth", "top_k", "drafts"), [(2, 3, 12), (4, 2, 14), (3, 4, 20), (8, 4, 20)])
def test_draft_tokens_are_what_a_shallow_tree_drafts_where_that_is_fewer(depth, top_k, drafts):
    """A step of depth-2 top-3 trees verifies 12 drafts a request (3 + 3 x 3), not max_nodes 20: the CUDA
    graphs captured ahead of traffic were of 21 nodes a request, a shape no step met."""
    assert BoleConfig(max_depth=depth, max_nodes=20, top_k=top_k).draft_tokens == drafts


def test_an_unset_depth_fits_the_node_limit_and_stays_unset():
    """``max_nodes`` below the default depth brings the depth down with it (it failed, "must be at least
    max_depth (8)"); the depth stays unset, so an engine's own replaces it; a chain keeps its 8."""
    small = BoleConfig(max_nodes=3)
    assert small.max_depth == 3 and small.model_fields_set == {"max_nodes"}
    assert BoleConfig().max_depth == BoleConfig(max_nodes=20).max_depth == 8
    assert BoleConfig(mode="chain").max_depth == 8


@pytest.mark.parametrize(
    ("mode", "unused"), [("ar", ["top_k", "max_depth", "max_nodes"]), ("chain", ["top_k", "max_nodes"])]
)
def test_draft_settings_a_mode_does_not_use_are_refused(mode, unused):
    """``BoleConfig(mode="chain", max_nodes=2)`` drafted 8 a step, ``mode="ar"`` ignored all three: a
    setting that changes nothing is a mistake to point out. Their defaults are let through, so that a
    config rebuilt from its dump is the same config; :meth:`BoleConfig.for_mode` leaves them out for
    callers that share one set of draft settings between modes."""
    drafts = {"top_k": 2, "max_depth": 3, "max_nodes": 5}
    for name in unused:
        with pytest.raises(ValidationError, match=rf"mode '{mode}' does not use {name} \({drafts[name]}\): "):
            BoleConfig(mode=mode, **{name: drafts[name]})
    config = BoleConfig.for_mode(mode, **drafts)
    assert config.model_fields_set == {"mode", *drafts} - set(unused)
    assert BoleConfig.for_mode("bole", **drafts).model_fields_set == {"mode", *drafts}
    for kept in (BoleConfig(mode=mode), config):
        assert BoleConfig(**kept.model_dump()) == kept


@pytest.mark.parametrize("field", ["top_k", "max_nodes", "max_depth", "epsilon"])
def test_speculative_settings_refuse_booleans(field):
    """``BoleConfig(top_k=True)`` was one child a node, ``epsilon=True`` a slack of 1.0: numbers to pydantic's
    lax mode, refused as SamplingParams' are."""
    extra = {"budget_table": "budget.json"} if field == "epsilon" else {}
    with pytest.raises(ValueError, match=f"{field}\n.*not booleans: got True"):
        BoleConfig(**{field: True}, **extra)
