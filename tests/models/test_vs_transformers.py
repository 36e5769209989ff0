"""Our Qwen3.5 against transformers' own implementation, on checkpoints transformers wrote.

Weights are seeded random (every tensor perturbed, norms included: transformers initialises the
zero-centred norms to exactly 0, which would hide a missing ``1 +``), loaded into the transformers
model, written with ``save_pretrained``, then read back by our loader.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from trtllm_bole.models.cache import StepContext  # noqa: E402
from trtllm_bole.models.checkpoint import random_tensors  # noqa: E402
from trtllm_bole.models.config import load_config  # noqa: E402
from trtllm_bole.models.loader import load_model  # noqa: E402

VARIANTS = {
    "interval2-grouped-untied": {"full_attention_interval": 2, "tie_word_embeddings": False},
    "interval4-tied": {
        "full_attention_interval": 4,
        "linear_num_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "interval3-grouped3-tied": {
        "num_hidden_layers": 3,
        "full_attention_interval": 3,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 3,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
    },
}
ATOL = 1e-4
PROMPT_LENS = (90, 17)  # the first longer than any tree: its prefill chain carries no paths table
STEPS = 64


def _hf_text_model(settings: dict, seed: int):
    kwargs = {k: v for k, v in settings.items() if k != "model_type"}
    hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**kwargs)).eval()
    tensors = random_tensors(load_config(hf.config.to_dict()), seed=seed, mtp=False)
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert not unexpected
    assert set(missing) <= ({"lm_head.weight"} if settings["tie_word_embeddings"] else set())
    return hf


def _prompts(vocab: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab, (n,), generator=gen) for n in PROMPT_LENS]


def _chains(model, prompts: list[torch.Tensor], block_size: int = 8) -> StepContext:
    """A fresh cache and a context holding each prompt as a chain; interleaved, reversed block
    tables and reversed slots, so that nothing depends on an identity layout."""
    max_len = max(map(len, prompts)) + STEPS
    blocks = -(-max_len // block_size)
    model.allocate_cache(len(prompts), blocks * len(prompts), block_size)
    tables = torch.arange(blocks * len(prompts), dtype=torch.int32).view(blocks, -1).T.flip(1).contiguous()
    slots = torch.arange(len(prompts)).flip(0)
    return StepContext.chains(
        [len(p) for p in prompts], slots, tables, torch.zeros(len(prompts), dtype=torch.long)
    )


def _prefill(model, prompts: list[torch.Tensor]):
    ctx = _chains(model, prompts)
    _, logits = model.prefill(torch.cat(prompts), ctx)
    return logits, ctx.slots, ctx.block_tables


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tiny_settings, tmp_path_factory):
    settings = tiny_settings(**VARIANTS[request.param])
    hf = _hf_text_model(settings, seed=3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, load_model(path, dtype=torch.float32, progress=False)


def test_logits_match_transformers(pair):
    """Our float32 logits (the training forward, and the serving prefill) against transformers' in float64,
    within ATOL or twice transformers' own float32 error, whichever is larger: that error depends on the
    CPU (2.9e-4 on an AMD EPYC, where ours was 8.8e-5), a wrong layer moves the logits by far more."""
    hf, ours = pair
    prompts = _prompts(ours.config.vocab_size, seed=4)
    hf64 = copy.deepcopy(hf).double()
    with torch.no_grad():
        truth = [hf64(p[None]).logits[0] for p in prompts]
        hf_error = max(
            float((hf(p[None]).logits[0] - t).abs().max()) for p, t in zip(prompts, truth, strict=True)
        )
        _, full = ours.forward_sequences(prompts[0][None])
    atol = max(ATOL, 2 * hf_error)
    torch.testing.assert_close(full[0].double(), truth[0], atol=atol, rtol=0)
    last, _, _ = _prefill(ours, prompts)
    torch.testing.assert_close(last.double(), torch.stack([t[-1] for t in truth]), atol=atol, rtol=0)


def test_greedy_decoding_matches_generate(pair):
    hf, ours = pair
    prompts = _prompts(ours.config.vocab_size, seed=5)
    logits, slots, tables = _prefill(ours, prompts)
    lens = torch.tensor(PROMPT_LENS)
    tokens, step_logits = [logits.argmax(-1)], [logits]
    for _ in range(STEPS - 1):
        ctx = StepContext.single_tokens(slots, tables, lens)
        logits = ours.decode(tokens[-1], ctx)
        lens = lens + 1
        tokens.append(logits.argmax(-1))
        step_logits.append(logits)
    for b, prompt in enumerate(prompts):
        out = hf.generate(
            prompt[None],
            max_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        assert [int(t[b]) for t in tokens] == out.sequences[0, len(prompt) :].tolist()
        for ours_step, hf_step in zip(step_logits, out.logits, strict=True):
            torch.testing.assert_close(ours_step[b], hf_step[0], atol=ATOL, rtol=0)


def test_vision_language_wrapper_layout(tiny_settings, tmp_path):
    """The published ``qwen3_5`` layout (weights under ``model.language_model.``, a vision tower that
    is ignored); transformers computes text positions through its multimodal RoPE here, so this
    also checks that those reduce to plain 1-D positions for text."""
    text = {k: v for k, v in tiny_settings().items() if k != "model_type"}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    tensors = random_tensors(load_config(config.to_dict()), seed=6, mtp=False)
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert not unexpected and all(name.startswith("model.visual.") for name in missing)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype=torch.float32, progress=False)
    prompt = _prompts(text["vocab_size"], seed=7)[0]
    with torch.no_grad():
        expected = hf(input_ids=prompt[None]).logits[0]
        _, logits = ours.forward_sequences(prompt[None])
    torch.testing.assert_close(logits[0], expected, atol=ATOL, rtol=0)


def test_bfloat16_is_as_accurate_as_transformers_bfloat16(pair, tmp_path):
    """bf16 through the serving path: not bit-equal to transformers' bf16 (other fusions and op
    order), so the measure is the mean error against the float32 truth over 16 prompts, which must
    be no worse than transformers' own bf16 error (these random models amplify rounding: a single
    prompt's errors differ by tens of percent either way, their mean by a few)."""
    hf, _ = pair
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype=torch.bfloat16, progress=False)
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(ours.config.vocab_size, (n,), generator=gen) for n in range(24, 40)]
    with torch.no_grad():
        truth = torch.cat([hf(p[None]).logits[0] for p in prompts])
        theirs = torch.cat([hf.to(torch.bfloat16)(p[None]).logits[0] for p in prompts]).float()
        hf.to(torch.float32)
    logits, _, _ = ours.verify(torch.cat(prompts), _chains(ours, prompts))  # every position at once
    last, _, _ = _prefill(ours, prompts)
    assert logits.dtype == last.dtype == torch.bfloat16 and bool(last.isfinite().all())
    ours_err = (logits.float() - truth).abs().mean().item()
    their_err = (theirs - truth).abs().mean().item()
    print(f"bf16 mean abs error: ours {ours_err:.4f}, transformers {their_err:.4f}")
    assert ours_err <= 1.1 * their_err, f"bf16 mean error {ours_err:.4f} vs transformers' {their_err:.4f}"


def test_the_embedded_checkpoint_loads_in_transformers_with_the_same_logits():
    """What its model card says: transformers' AutoModelForCausalLM reads the embedded checkpoint (the
    ``mtp.*`` tensors are the only ones it leaves unused) and computes our logits."""
    from trtllm_bole.llm import DEFAULT_MODEL

    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        DEFAULT_MODEL, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"]
    assert all(name.startswith("mtp.") for name in info["unexpected_keys"])
    ours = load_model(DEFAULT_MODEL, dtype=torch.float32, progress=False)
    prompt = torch.arange(5, 69)
    with torch.no_grad():
        theirs = hf.eval()(prompt[None]).logits[0]
        _, mine = ours.forward_sequences(prompt[None])
    torch.testing.assert_close(mine[0], theirs, atol=ATOL, rtol=0)
