"""Checkpoint loading: published layouts in, clear errors (file + tensor or field) for bad ones."""

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trtllm_bole.models import loader
from trtllm_bole.models.checkpoint import INDEX_FILE, random_tensors, write_safetensors
from trtllm_bole.models.config import eos_token_ids, load_config, read_generation_config
from trtllm_bole.models.loader import load_model
from trtllm_bole.models.presets import QWEN35_PRESETS, num_gdn_layers

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, settings: dict, *, mtp: bool = True, shard_bytes: int | None = None, **edits) -> dict:
    """A checkpoint of the tiny config; ``edits`` maps tensor names to a replacement (None = drop)."""
    tensors = random_tensors(load_config(settings), seed=0, mtp=mtp)
    for name, value in edits.items():
        name = name.replace("__", ".")
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(settings))
    write_safetensors(path, tensors, shard_bytes=shard_bytes)
    return tensors


def _load(path: Path, **kwargs):
    return load_model(path, dtype=torch.float32, progress=False, **kwargs)


def test_sharded_and_single_file_load_the_same_weights(tmp_path, tiny_settings):
    _write(tmp_path / "one", tiny_settings())
    _write(tmp_path / "many", tiny_settings(), shard_bytes=20_000)
    assert len(list((tmp_path / "many").glob("model-*.safetensors"))) > 2
    one, many = _load(tmp_path / "one"), _load(tmp_path / "many")
    assert one.mtp is not None and many.mtp is not None
    for (name, a), (_, b) in zip(one.named_parameters(), many.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_bfloat16_load_converts_every_tensor(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings())
    model = load_model(tmp_path, dtype=torch.bfloat16, progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_tensor_names_the_checkpoint_and_tensor(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), **{"model__layers__2__linear_attn__A_log": None})
    with pytest.raises(
        ValueError, match=r"(?s)" + str(tmp_path) + r".*missing tensor model\.layers\.2\.linear_attn\.A_log"
    ):
        _load(tmp_path)


def test_wrong_shape_names_file_tensor_and_shapes(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), **{"model__layers__1__self_attn__k_proj__weight": torch.zeros(16, 32)})
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: tensor model\.layers\.1\.self_attn\.k_proj\.weight "
        r"has shape \[16, 32\], expected \[32, 32\]",
    ):
        _load(tmp_path)


def test_unexpected_tensor_names_file_and_tensor(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), **{"model__layers__0__linear_attn__extra": torch.zeros(3)})
    with pytest.raises(
        ValueError, match=r"model\.safetensors: unexpected tensor model\.layers\.0\.linear_attn\.extra"
    ):
        _load(tmp_path)


def test_truncated_file_names_the_file(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(
        ValueError, match=rf"{shard.name}: cannot read the safetensors file .*truncated or corrupt"
    ):
        _load(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_by_name(tmp_path, tiny_settings, bad):
    tensors = random_tensors(load_config(tiny_settings()), seed=0)
    weight = tensors["model.layers.1.mlp.down_proj.weight"].clone()
    weight[3, 5] = bad
    _write(tmp_path, tiny_settings(), **{"model__layers__1__mlp__down_proj__weight": weight})
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: tensor model\.layers\.1\.mlp\.down_proj\.weight holds 1 NaN or "
        r"infinite value\(s\) of \d+; the checkpoint is corrupt",
    ):
        _load(tmp_path)


def test_weights_beyond_the_dtype_are_refused_by_name(tmp_path, tiny_settings):
    tensors = random_tensors(load_config(tiny_settings()), seed=0)
    norm = tensors["model.norm.weight"].clone()
    norm[0] = 3.4e38  # finite in float32 (largest 3.403e38), rounds to infinity in bfloat16 (3.390e38)
    _write(tmp_path, tiny_settings(), **{"model__norm__weight": norm})
    assert torch.isfinite(_load(tmp_path).norm).all()  # float32 holds it
    overflow = r"model\.norm\.weight overflows torch\.bfloat16 \(torch\.float32 .* dtype \(--dtype float32\)"
    with pytest.raises(ValueError, match=overflow):
        load_model(tmp_path, dtype=torch.bfloat16, progress=False)


def test_index_naming_an_absent_shard_names_it(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    index["weight_map"]["model.norm.weight"] = "model-00099-of-00099.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(
        ValueError,
        match=r"model-00099-of-00099\.safetensors: listed in model\.safetensors\.index\.json but missing",
    ):
        _load(tmp_path)


def test_a_weights_file_that_is_a_dangling_link_or_a_folder_is_named(tmp_path, tiny_settings):
    """As a Hugging Face cache snapshot holds it (a link to a blob) once the blob is gone: named, not taken
    for a folder with no weights, nor for a shard an index lists."""
    _write(tmp_path, tiny_settings())
    blob = tmp_path / "blob"
    (tmp_path / "model.safetensors").rename(blob)
    (tmp_path / "model.safetensors").symlink_to(blob)
    assert _load(tmp_path).config.vocab_size == 96  # a link is followed
    blob.unlink()
    with pytest.raises(
        ValueError, match=r"model\.safetensors: missing or not a file \(a link to .*blob, which"
    ):
        _load(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(ValueError, match=r"model\.safetensors: missing or not a file$"):
        _load(tmp_path)


def test_a_leftover_single_file_beside_shards_is_refused(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    (tmp_path / "model.safetensors").write_bytes(shard.read_bytes())  # e.g. a later unsharded save
    with pytest.raises(ValueError, match=r"both model\.safetensors and model\.safetensors\.index\.json"):
        _load(tmp_path)


def test_writing_a_checkpoint_again_replaces_its_weights(tmp_path, tiny_settings):
    """Sharded, then a single file, then fewer shards, into one folder: each write leaves only its own."""
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    _write(tmp_path, tiny_settings())
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]
    _load(tmp_path)
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    many = len(list(tmp_path.glob("model-*.safetensors")))
    _write(tmp_path, tiny_settings(), shard_bytes=200_000)
    assert (
        len(list(tmp_path.glob("model-*.safetensors"))) < many
        and not (tmp_path / "model.safetensors").exists()
    )
    _load(tmp_path)


def test_missing_mtp_is_reported_not_fatal(tmp_path, tiny_settings, caplog):
    _write(tmp_path, tiny_settings(), mtp=False)
    with caplog.at_level(logging.WARNING, logger="trtllm_bole.models.loader"):
        model = _load(tmp_path)
    assert model.mtp is None
    assert "no mtp.* tensors" in caplog.text and str(tmp_path) in caplog.text


def test_partial_mtp_is_an_error_unless_skipped(tmp_path, tiny_settings):
    _write(tmp_path, tiny_settings(), **{"mtp__layers__0__self_attn__q_norm__weight": None})
    with pytest.raises(
        ValueError,
        match=r"(?s)mtp\.\* module is incomplete: complete or remove it; mode 'ar' serves it as it is"
        r".*missing tensor mtp\.layers\.0\.self_attn\.q_norm\.weight",
    ):
        _load(tmp_path)
    assert _load(tmp_path, mtp=False).mtp is None  # what mode "ar" loads


def test_tied_checkpoint_may_carry_an_lm_head_copy(tmp_path, tiny_settings):
    settings = tiny_settings(tie_word_embeddings=True)
    embed = random_tensors(load_config(settings), seed=0)["model.embed_tokens.weight"]
    _write(tmp_path, settings, lm_head__weight=embed.clone())  # as torch .bin conversions write it
    model = _load(tmp_path)
    assert model.lm_head is None
    assert torch.equal(model.lm_head_weight, embed)


def test_tied_config_beside_another_lm_head_is_refused(tmp_path, tiny_settings):
    """transformers serves such a checkpoint untied (its lm_head, with a warning); tying it would serve other
    logits without a word."""
    _write(tmp_path, tiny_settings(tie_word_embeddings=True), lm_head__weight=torch.zeros(96, 32))
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: lm_head\.weight differs from model\.embed_tokens\.weight, but "
        r".*config\.json sets tie_word_embeddings = true",
    ):
        _load(tmp_path)


@pytest.mark.parametrize("weight_map", [["model.norm.weight"], {"model.norm.weight": 1}])
def test_an_index_without_a_map_of_file_names_is_named(tmp_path, tiny_settings, weight_map):
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=rf"{INDEX_FILE}: not a safetensors index with a weight_map"):
        _load(tmp_path)


@pytest.mark.parametrize("name", ["config.json", INDEX_FILE])
def test_a_config_or_index_that_is_not_utf8_text_is_named(tmp_path, tiny_settings, name):
    """A binary file saved under the name: the error names the file, not only the codec."""
    _write(tmp_path, tiny_settings(), shard_bytes=20_000)
    (tmp_path / name).write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=rf"{name}: not valid JSON \('utf-8' codec can't decode"):
        _load(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"linear_num_value_heads": 3},
            r"linear_num_value_heads = 3 must be a multiple of linear_num_key_heads = 2",
        ),
        (
            {"num_key_value_heads": 3},
            r"num_attention_heads = 4 must be a multiple of num_key_value_heads = 3",
        ),
        ({"layer_types": ["linear_attention"] * 3}, r"layer_types has 3 entries but num_hidden_layers = 4"),
        (
            {"layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]},
            r"layer_types\[1\] = 'mamba'",
        ),
        ({"hidden_size": 0}, r"hidden_size = 0 must be a positive integer"),
        ({"head_dim": None}, r"head_dim = None must be a positive integer"),
        ({"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported"),
        ({"mtp_use_dedicated_embeddings": True}, r"mtp_use_dedicated_embeddings = True is not supported"),
        ({"rope_parameters": {"rope_type": "yarn"}}, r"rope_type = 'yarn'; only 'default'"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5}}},
            r"rope_parameters holds settings per layer type \(full_attention\)",
        ),
        ({"rms_norm_eps": "1e-6"}, r"rms_norm_eps = '1e-6' must be a finite number"),
        ({"rms_norm_eps": float("inf")}, r"rms_norm_eps = inf must be a finite number"),
        (
            {"rope_parameters": {"partial_rotary_factor": float("nan")}},
            r"rope_parameters\.partial_rotary_factor = nan must be a finite number",
        ),
        ({"partial_rotary_factor": float("inf")}, r"partial_rotary_factor = inf must be a finite number"),
        ({"mtp_num_hidden_layers": 2}, r"mtp_num_hidden_layers = 2; only 0 or 1"),
        ({"mtp_num_hidden_layers": "1"}, r"mtp_num_hidden_layers = '1'; only 0 or 1"),
        ({"mtp_num_hidden_layers": True}, r"mtp_num_hidden_layers = True; only 0 or 1"),
        ({"tie_word_embeddings": "false"}, r"tie_word_embeddings = 'false' must be true or false"),
        ({"max_position_embeddings": 0}, r"max_position_embeddings = 0 must be a positive integer"),
        ({"model_type": "llama"}, r"model_type = 'llama'"),
    ],
)
def test_bad_config_field_names_file_and_field(tmp_path, tiny_settings, edit, message):
    (tmp_path / "config.json").write_text(json.dumps(tiny_settings(**edit)))
    with pytest.raises(ValueError, match=str(tmp_path / "config.json") + ": .*" + message):
        load_config(tmp_path)


def test_weights_only_as_pytorch_pickles_are_named(tmp_path, tiny_settings):
    (tmp_path / "config.json").write_text(json.dumps(tiny_settings()))
    with pytest.raises(ValueError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        _load(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"pytorch_model\*\.bin weights, which are not read .*as safetensors"
    ):
        _load(tmp_path)


def test_missing_config_field_and_file(tmp_path, tiny_settings):
    settings = tiny_settings()
    del settings["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"config\.json: required field intermediate_size is missing"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match=r"nowhere: no such file"):
        load_config(tmp_path / "nowhere")


def test_end_tokens_are_every_id_each_file_declares(tmp_path):
    wrapper = {"eos_token_id": [4, 2], "text_config": {"eos_token_id": 3}}
    assert eos_token_ids(tmp_path, wrapper, {"eos_token_id": [9, 3]}) == [9, 3, 4, 2]
    assert eos_token_ids(tmp_path, {"eos_token_id": 1}, None) == [1]
    assert eos_token_ids(tmp_path, {}, None) == []
    for bad in ("</s>", [1, True], -1, 2.0):
        with pytest.raises(ValueError, match=r"\(generation_config\.json\): eos_token_id must be a token id"):
            eos_token_ids(tmp_path, {"eos_token_id": 1}, {"eos_token_id": bad})
    with pytest.raises(ValueError, match=r"eos_token_id \[512\] outside the vocabulary \[0, 512\) \(a stale"):
        eos_token_ids(tmp_path, {"text_config": {"vocab_size": 512}}, {"eos_token_id": [3, 512]})
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"generation_config\.json: not valid JSON"):
        read_generation_config(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 5}')
    assert read_generation_config(tmp_path) == {"eos_token_id": 5}
    assert read_generation_config(tmp_path / "nowhere") is None


@pytest.mark.parametrize("name", ["qwen3.5-9b", "qwen3.5-27b"])
def test_published_configs_parse(name):
    """The released layout: VL wrapper, multimodal RoPE parameters, explicit layer types, MTP."""
    text = dict(QWEN35_PRESETS[name], model_type="qwen3_5_text", mtp_num_hidden_layers=1)
    text["layer_types"] = [
        "linear_attention" if (i + 1) % 4 else "full_attention" for i in range(text["num_hidden_layers"])
    ]
    text["rope_parameters"] = {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
    }
    text.update(attn_output_gate=True, mtp_use_dedicated_embeddings=False, mamba_ssm_dtype="float32")
    config = load_config({"model_type": "qwen3_5", "text_config": text, "vision_config": {"depth": 27}})
    assert config.weight_prefix == "model.language_model."
    assert config.num_gdn_layers == num_gdn_layers(QWEN35_PRESETS[name]) == 3 * config.num_attn_layers
    assert (config.rotary_dim, config.rope_theta, config.conv_dim) == (
        64,
        1e7,
        2 * 16 * 128 + text["linear_num_value_heads"] * 128,
    )


def test_wrapper_fields_are_named_with_their_prefix(tiny_settings):
    text = tiny_settings(linear_num_value_heads=5)
    with pytest.raises(ValueError, match=r"text_config\.linear_num_value_heads = 5"):
        load_config({"model_type": "qwen3_5", "text_config": text})


@pytest.mark.parametrize(
    "raw",
    [
        {"model_type": "qwen3_5_moe", "text_config": {}},
        {"model_type": "qwen3_5_moe_text"},
        {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_moe_text"}},
        {"model_type": "qwen3_5_text", "num_experts": 256},
    ],
)
def test_mixture_of_experts_is_refused_clearly(raw):
    with pytest.raises(ValueError, match=r"mixture-of-experts.*refused rather than half-loaded"):
        load_config(raw)


def test_quantized_checkpoints_are_refused_by_name(tmp_path, tiny_settings):
    with pytest.raises(ValueError, match=r"quantized checkpoint \(quantization_config, fp8\).*dequantize"):
        load_config(tiny_settings(quantization_config={"quant_method": "fp8"}))
    weight = "model.norm.weight"
    _write(tmp_path, tiny_settings(), model__norm__weight=torch.zeros(32).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=rf"{weight} is F8_E4M3; only float32, float16 and bfloat16"):
        _load(tmp_path)


def test_weight_dtypes_are_refused_from_the_headers(tmp_path, tiny_settings, monkeypatch):
    """As names and shapes: before the model is built or any tensor read."""
    _write(tmp_path, tiny_settings(), model__norm__weight=torch.zeros(32).to(torch.float8_e4m3fn))

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the checkpoint's dtypes were checked")

    monkeypatch.setattr(loader, "Qwen35Model", built)
    with pytest.raises(ValueError, match="is F8_E4M3"):
        _load(tmp_path)


def test_the_wrapper_ties_embeddings_by_its_own_field(tiny_settings):
    """transformers reads the vision-language wrapper's top-level tie_word_embeddings (default False),
    not its text_config's."""
    text = tiny_settings(tie_word_embeddings=True)
    assert not load_config({"model_type": "qwen3_5", "text_config": text}).tie_word_embeddings
    tied = {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True}
    assert load_config(tied).tie_word_embeddings


# ---------------------------------------------------------------------------------------------- #
# build_scripts/make_checkpoint.py                                                                #
# ---------------------------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def make_checkpoint():
    spec = importlib.util.spec_from_file_location(
        "make_checkpoint", ROOT / "build_scripts" / "make_checkpoint.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_make_checkpoint_writes_what_transformers_and_we_load(tmp_path, make_checkpoint):
    transformers = pytest.importorskip("transformers")
    make_checkpoint(["--out", str(tmp_path), "--seed", "1"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([tokenizer("def main(argv=None):\n    return 0\n")["input_ids"]])
    assert tokenizer.decode(ids[0]) == "def main(argv=None):\n    return 0\n"
    ours = _load(tmp_path)
    assert ours.mtp is not None and ours.config.vocab_size == len(tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_sequences(ids)[1], hf(ids).logits, atol=1e-4, rtol=0)


def test_make_checkpoint_wrapper_sharded_bf16_without_mtp(tmp_path, make_checkpoint):
    make_checkpoint(
        ["--out", str(tmp_path), "--wrapper", "--no-mtp", "--dtype", "bfloat16", "--shard-size", "0.1",
         "--preset", "tiny-interval4"]
    )  # fmt: skip
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["tie_word_embeddings"]
    names = json.loads((tmp_path / INDEX_FILE).read_text())["weight_map"]
    assert all(n.startswith("model.language_model.") for n in names) and len(set(names.values())) > 1
    first = load_file(sorted(tmp_path.glob("model-*.safetensors"))[0])
    assert {t.dtype for t in first.values()} == {torch.bfloat16}
    model = _load(tmp_path, mtp=False)
    assert model.mtp is None and model.config.layer_types.count("full_attention") == 1


def test_make_checkpoint_is_seeded(tmp_path, make_checkpoint):
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        make_checkpoint(["--out", str(tmp_path / name), "--seed", seed])
    a, b, c = (load_file(tmp_path / name / "model.safetensors") for name in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["mtp.fc.weight"], c["mtp.fc.weight"])


def test_a_config_of_the_other_layout_is_named(tmp_path, make_checkpoint):
    """The text config taken out of a vision-language checkpoint (or a text checkpoint's config wrapped):
    one hint saying whose tensors these are, beside the list of missing and unexpected ones."""
    make_checkpoint(["--out", str(tmp_path / "vl"), "--wrapper", "--no-mtp"])
    make_checkpoint(["--out", str(tmp_path / "text"), "--no-mtp"])
    config = json.loads((tmp_path / "vl" / "config.json").read_text())
    (tmp_path / "vl" / "config.json").write_text(
        json.dumps({**config["text_config"], "model_type": "qwen3_5_text"})
    )
    with pytest.raises(ValueError, match=r"tensors are named model\.language_model\.\*: the vision-language"):
        _load(tmp_path / "vl", mtp=False)
    (tmp_path / "text" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensors are named model\.\*: the text model's layout"):
        _load(tmp_path / "text", mtp=False)


@pytest.mark.parametrize("size", ["nan", "0", "-1"])
def test_make_checkpoint_refuses_a_shard_size_before_writing(tmp_path, capsys, make_checkpoint, size):
    """A NaN shard size left a folder holding only config.json, then a ValueError."""
    with pytest.raises(SystemExit) as exit_info:
        make_checkpoint(["--out", str(tmp_path / "ckpt"), "--shard-size", size])
    assert exit_info.value.code == 2 and "--shard-size takes megabytes above 0" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("size", ["-3", "0", "258"])
def test_make_checkpoint_refuses_a_vocabulary_below_its_bytes_and_specials(
    tmp_path, capsys, make_checkpoint, size
):
    """-3 was a traceback from the tokenizer's trainer; 0 or 258 gave 259 tokens without a word."""
    with pytest.raises(SystemExit) as exit_info:
        make_checkpoint(["--out", str(tmp_path / "ckpt"), "--vocab-size", size])
    assert (
        exit_info.value.code == 2
        and f"--vocab-size must be at least 259 (256 bytes + 3 special tokens), got {size}"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "ckpt").exists()


def test_checkpoint_weights_are_readable_by_others(tmp_path, make_checkpoint):
    """safetensors writes its files owner-only (0600, whatever the umask): a server running as another user
    could not load a checkpoint made here, while its config and tokenizer were 0644."""
    make_checkpoint(["--out", str(tmp_path / "one"), "--no-mtp"])
    make_checkpoint(["--out", str(tmp_path / "sharded"), "--no-mtp", "--shard-size", "0.1"])
    weights = [*tmp_path.glob("*/*.safetensors")]
    assert len(weights) > 2 and {w.stat().st_mode & 0o777 for w in weights} == {0o644}
