"""Load a Hugging Face Qwen3.5 checkpoint into :class:`~trtllm_bole.models.model.Qwen35Model`.

Single-file (``model.safetensors``) and sharded (``model.safetensors.index.json``) checkpoints are
read tensor by tensor (one tensor in host memory at a time) through the name map of
:func:`~trtllm_bole.models.checkpoint.checkpoint_layout`, converted to the chosen dtype and copied
into the (possibly fused) parameters. All headers are checked before any data is read: missing,
unexpected and wrongly shaped tensors are reported together, each with its file. A weight holding NaN
or infinity, in the file or once converted (a float32 value beyond bfloat16's range), is refused by
name: it would serve NaN logits without a word.

Ignored: the vision tower (``model.visual.*``), ``rotary_emb.inv_freq`` buffers, and ``lm_head.weight``
when the embeddings are tied and it is their copy (another one is refused: transformers would serve it
untied). The MTP module (``mtp.*``) loads when present and complete; when it is
absent a warning says so (fine without speculation); a partial one is an error.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from trtllm_bole.models.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    TensorSlot,
    checkpoint_layout,
    random_tensors,
)
from trtllm_bole.models.config import WEIGHT_LAYOUTS, Qwen35Config, load_config, load_json
from trtllm_bole.models.model import Qwen35Model

log = logging.getLogger(__name__)

_IGNORED_PREFIXES = ("model.visual.", "visual.")
_COMPARE_ROWS = 4096  # rows of a vocabulary-sized tensor compared at a time


WEIGHT_DTYPES = ("F32", "F16", "BF16")
"""The safetensors dtypes loaded as weights (others, e.g. float8 without its scales, are refused)."""


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    mtp: bool = True,
    progress: bool = True,
) -> Qwen35Model:
    """Build the model from a checkpoint directory (``config.json`` + safetensors).

    ``mtp=False`` skips the ``mtp.*`` tensors even when present. ``model.mtp`` is None when the MTP
    module was not loaded.
    """
    path = Path(path)
    config = load_config(path)
    headers = _read_headers(path)
    gap = _mtp_gap(config, headers)
    load_mtp = mtp and gap is None
    if mtp and gap is not None:
        log.warning(
            "%s: %s; the built-in MTP drafter is unavailable (plain decoding is unaffected)", path, gap
        )
    layout = checkpoint_layout(config, mtp=load_mtp)
    _check_headers(path, config, headers, layout, load_mtp)
    _check_tied_head(config, headers)

    model = Qwen35Model(config, dtype=dtype, device=device, mtp=load_mtp)
    with tqdm(total=len(layout), desc=f"loading {path.name}", unit="tensor", disable=not progress) as bar:
        for file in sorted({file for file, _, _ in headers.values()}):
            with _open(file) as f:
                names = f.keys()  # a list: safetensors' handle is not iterable
                for name in names:
                    slot = layout.get(name)
                    if slot is None:
                        continue
                    try:
                        tensor = f.get_tensor(name)
                    except Exception as e:  # safetensors raises its own error type for bad data
                        raise ValueError(f"{file}: cannot read tensor {name} ({e})") from e
                    _check_finite(file, name, tensor, _copy_into(model, slot, tensor))
                    bar.update()
    return model


def random_model(
    config: Qwen35Config,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    mtp: bool = True,
) -> Qwen35Model:
    """A model with the seeded weights of :func:`~trtllm_bole.models.checkpoint.random_tensors`,
    filled through the same name map as a checkpoint (no files involved)."""
    model = Qwen35Model(config, dtype=dtype, device=device, mtp=mtp)
    layout = checkpoint_layout(config, mtp=mtp)
    for name, tensor in random_tensors(config, seed=seed, mtp=mtp).items():
        _copy_into(model, layout[name], tensor)
    return model


def _copy_into(model: Qwen35Model, slot: TensorSlot, tensor: torch.Tensor) -> torch.Tensor:
    """Copy ``tensor`` into its slot of the model's parameters; returns the slot."""
    target = model.get_parameter(slot.param)
    if slot.rows is not None:
        target = target[slot.rows[0] : slot.rows[1]]
    return target.copy_(tensor.reshape(target.shape))


def _check_finite(file: Path, name: str, tensor: torch.Tensor, loaded: torch.Tensor) -> None:
    """Refuse a weight that holds NaN or infinity, in the file or once converted to the model's dtype
    (e.g. a float32 value beyond bfloat16's range): such a model would serve NaN logits silently."""
    if bool(torch.isfinite(loaded).all()):
        return
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        raise ValueError(
            f"{file}: tensor {name} holds {int(bad.sum())} NaN or infinite value(s) of {tensor.numel()}; "
            "the checkpoint is corrupt"
        )
    raise ValueError(
        f"{file}: tensor {name} overflows {loaded.dtype} ({tensor.dtype} values up to "
        f"{tensor.abs().max().item():.3g}); load it in a wider dtype (--dtype float32)"
    )


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (sharded or single), checked to exist."""
    index, single = path / INDEX_FILE, path / SINGLE_FILE
    single_there = single.exists() or single.is_symlink()  # a dangling link is named below, not overlooked
    if index.exists() and single_there:
        raise ValueError(
            f"{path}: holds both {SINGLE_FILE} and {INDEX_FILE} (shards): one of them is left over from an "
            "earlier save; remove it"
        )
    if index.exists():
        files = [path / name for name in sorted(set(_weight_map(index).values()))]
    elif single_there:
        files = [single]
    elif any(path.glob("pytorch_model*.bin")):
        raise ValueError(
            f"{path}: holds pytorch_model*.bin weights, which are not read (pickles run code when loaded); "
            "re-save the checkpoint as safetensors (save_pretrained(..., safe_serialization=True))"
        )
    else:
        raise ValueError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}; is this a checkpoint directory?")
    for file in files:
        if not file.is_file():
            listed = f"listed in {INDEX_FILE} but " if index.exists() else ""
            link = f" (a link to {file.readlink()}, which is not there)" if file.is_symlink() else ""
            raise ValueError(f"{file}: {listed}missing or not a file{link}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from a ``model.safetensors.index.json``."""
    weight_map = load_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(
            f"{index}: not a safetensors index with a weight_map (an object of tensor name: file name)"
        )
    return weight_map


def _open(file: Path) -> safe_open:
    try:
        return safe_open(file, framework="pt", device="cpu")
    except Exception as e:  # a truncated file fails here, while its header is parsed
        raise ValueError(f"{file}: cannot read the safetensors file ({e}); it is truncated or corrupt") from e


def missing_mtp(path: str | Path, config: Qwen35Config) -> str | None:
    """Why the checkpoint at ``path`` (whose config is ``config``) has no MTP module to draft with, or None
    when it has one (from the safetensors headers: no weights are read)."""
    return _mtp_gap(config, _read_headers(Path(path)))


def _mtp_gap(config: Qwen35Config, headers: dict) -> str | None:
    if not any(name.startswith("mtp.") for name in headers):
        return "the checkpoint has no mtp.* tensors"
    if config.mtp_num_hidden_layers == 0:
        return f"{config.source} sets {config.text_scope}mtp_num_hidden_layers = 0"
    return None


def _read_headers(path: Path) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Tensor name -> (file, shape, safetensors dtype), from the headers alone."""
    headers: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    files = checkpoint_files(path)
    for file in files:
        with _open(file) as f:
            names = f.keys()
            for name in names:
                if name in headers:
                    raise ValueError(f"{file}: tensor {name} is also in {headers[name][0]}")
                header = f.get_slice(name)
                headers[name] = (file, tuple(header.get_shape()), header.get_dtype())
    index = path / INDEX_FILE
    if index.exists():
        for name, file in _weight_map(index).items():
            if headers.get(name, (None,))[0] != path / file:
                raise ValueError(
                    f"{path / file}: {INDEX_FILE} lists tensor {name} but the file does not hold it"
                )
    return headers


def _check_tied_head(config: Qwen35Config, headers: dict[str, tuple[Path, tuple[int, ...], str]]) -> None:
    """A tied config beside an ``lm_head.weight`` that is not a copy of the embeddings is refused:
    transformers serves such a checkpoint untied, with its lm_head, and tying it would serve other logits.
    Compared a few thousand rows at a time: neither vocabulary-sized tensor is ever whole in host memory."""
    embed = f"{config.weight_prefix}embed_tokens.weight"
    if not config.tie_word_embeddings or "lm_head.weight" not in headers:
        return
    (head_file, head_shape, _), (embed_file, embed_shape, _) = headers["lm_head.weight"], headers[embed]
    with _open(head_file) as h, _open(embed_file) as e:
        head, table = h.get_slice("lm_head.weight"), e.get_slice(embed)
        same = head_shape == embed_shape and all(
            torch.equal(head[i : i + _COMPARE_ROWS].float(), table[i : i + _COMPARE_ROWS].float())
            for i in range(0, embed_shape[0], _COMPARE_ROWS)
        )
    if not same:
        raise ValueError(
            f"{head_file}: lm_head.weight differs from {embed}, but {config.source} sets "
            "tie_word_embeddings = true (transformers would serve this lm_head untied): set it to false, or "
            "remove lm_head.weight to tie"
        )


def _other_layout(
    config: Qwen35Config, headers: dict[str, tuple[Path, tuple[int, ...], str]], layout: dict[str, TensorSlot]
) -> str | None:
    """The other layout's weight prefix where every tensor the config's own layout misses is there under it
    (a text config over the wrapper's weights, or the reverse), else None."""
    (other,) = set(WEIGHT_LAYOUTS) - {config.weight_prefix}
    missing = [n for n in layout if n not in headers and n.startswith(config.weight_prefix)]
    renamed = (other + n.removeprefix(config.weight_prefix) for n in missing)
    return other if missing and all(n in headers for n in renamed) else None


def _check_headers(
    path: Path,
    config: Qwen35Config,
    headers: dict[str, tuple[Path, tuple[int, ...], str]],
    layout: dict[str, TensorSlot],
    load_mtp: bool,
) -> None:
    def ignored(name: str) -> bool:
        return (
            name.startswith(_IGNORED_PREFIXES)
            or name.endswith("rotary_emb.inv_freq")
            or (name == "lm_head.weight" and config.tie_word_embeddings)
            or (name.startswith("mtp.") and not load_mtp)
        )

    for name, (file, _, dtype) in headers.items():
        if name in layout and dtype not in WEIGHT_DTYPES:
            raise ValueError(
                f"{file}: {name} is {dtype}; only float32, float16 and bfloat16 (F32, F16, BF16) weights "
                "are loaded (dequantize the checkpoint first)"
            )
    problems = [f"missing tensor {name}" for name in layout if name not in headers]
    for name, (file, shape, _) in headers.items():
        if name in layout:
            if shape != layout[name].shape:
                problems.append(
                    f"{file.name}: tensor {name} has shape {list(shape)}, expected {list(layout[name].shape)}"
                )
        elif not ignored(name):
            problems.append(f"{file.name}: unexpected tensor {name}")
    if problems:
        hint = ""
        if any(n.startswith("mtp.") for n in headers) and any(
            p.startswith("missing tensor mtp.") for p in problems
        ):
            hint = " (the mtp.* module is incomplete: complete or remove it; mode 'ar' serves it as it is)"
        if (other := _other_layout(config, headers, layout)) is not None:
            hint = f" (its tensors are named {other}*: {WEIGHT_LAYOUTS[other]})"
        shown = "\n  ".join(problems[:50]) + (
            f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        )
        raise ValueError(
            f"{path}: checkpoint does not match its config.json ({config.source}){hint}:\n  {shown}"
        )
