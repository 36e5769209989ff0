"""Open an engine directory: validate it against this installation and device, then load the model.

Every check raises ``ValueError`` saying what differs and how to fix it (rebuild with
``python build_scripts/build_engine.py``): the format and schema version, the config's own hash (an
edited ``config.json``), the trtllm_bole version, every listed file's size and SHA-256 (a corrupt or
swapped weight file), and — on a GPU — the compute capability and Triton version of the compiled
kernels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from trtllm_bole.config import BoleConfig, default_depth
from trtllm_bole.engine import format as fmt
from trtllm_bole.models.config import Qwen35Config, load_config, load_json
from trtllm_bole.models.model import Qwen35Model

_REBUILD = "rebuild it with `python build_scripts/build_engine.py`"


def is_engine_dir(path: str | Path) -> bool:
    """A directory whose ``config.json`` declares the engine format (cheap: no validation). An engine's
    ``weights/`` beside no ``config.json`` is refused here: read as a checkpoint, it would be named a
    checkpoint that lacks one."""
    config, has_weights = Path(path) / fmt.CONFIG, (Path(path) / fmt.WEIGHTS_DIR).is_dir()

    def broken(what: str) -> ValueError:
        return ValueError(
            f"{path}: an engine directory (it has {fmt.WEIGHTS_DIR}/) {what}, which a build never overwrites "
            "(not a complete engine): delete it, then rebuild it with `python build_scripts/build_engine.py`"
        )

    if not config.exists() and has_weights:
        raise broken(f"without its {fmt.CONFIG}")
    try:
        return json.loads(config.read_text()).get("format") == fmt.FORMAT
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        if has_weights and isinstance(e, json.JSONDecodeError):  # read as a checkpoint's, it misled
            raise broken(f"whose {fmt.CONFIG} is not JSON ({e})") from None
        return False


@dataclass(frozen=True, slots=True)
class Engine:
    path: Path
    config: dict[str, Any]
    model_config: Qwen35Config

    @property
    def build(self) -> dict[str, Any]:
        return self.config["build"]

    def check_files(self, progress: bool = True) -> None:
        """Every file hashed against the build's record (a minute at 27B): no file edited, missing or
        added since the build."""
        _check_files(self.path, self.config, progress)

    @property
    def dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.build["dtype"]]

    @property
    def hf_config(self) -> dict[str, Any]:
        return self.config["model"]["hf_config"]

    @property
    def generation_config(self) -> dict[str, Any] | None:
        return self.config["model"].get("generation_config")  # absent from engines built before it

    @property
    def budget_path(self) -> Path | None:
        budget = self.config.get("budget")
        return None if budget is None else self.path / budget["file"]

    def runtime_settings(
        self, dtype: str, max_batch_size: int | None, max_seq_len: int | None, bole: BoleConfig | None
    ) -> tuple[int, int, BoleConfig]:
        """LLM arguments resolved against the build: omitted ones (and the draft depth and size that
        ``bole`` leaves unset) take the engine's values, larger ones (or another dtype) are refused."""
        b = self.build
        if dtype not in ("auto", b["dtype"]):
            raise ValueError(
                f"{self.path}: the engine holds {b['dtype']} weights, dtype {dtype!r} was asked; leave the "
                "dtype at 'auto' (the engine's)"
                + (f" or rebuild the engine with --dtype {dtype}" if dtype in fmt.WEIGHT_DTYPES else "")
            )
        given = bole.model_dump(include=bole.model_fields_set) if bole else {}
        mode = given.pop("mode", BoleConfig.model_fields["mode"].default)
        bole = BoleConfig.for_mode(mode, **self.drafts(given))
        asked = {
            "max_batch_size": b["max_batch_size"] if max_batch_size is None else max_batch_size,
            "max_seq_len": b["max_seq_len"] if max_seq_len is None else max_seq_len,
            "max_draft_depth": bole.max_depth if bole.speculates else 0,
            "max_draft_nodes": bole.draft_tokens,
        }
        for name, value in asked.items():
            if value > b[name]:
                raise ValueError(
                    f"{self.path}: {name} {value} exceeds the engine's {b[name]}; ask for less or rebuild "
                    f"with --{name.replace('_', '-')} {value}"
                )
        return asked["max_batch_size"], asked["max_seq_len"], bole

    def drafts(self, given: dict) -> dict:
        """Draft settings ``given`` (``max_depth``, ``max_nodes``, ``top_k``: any of them), the unset tree
        size and depth the build's: its ``max_draft_nodes``, and its ``max_draft_depth`` or the nodes where
        fewer (:func:`~trtllm_bole.config.default_depth`)."""
        b = self.build
        nodes = given.get("max_nodes", b["max_draft_nodes"])
        return {
            "max_depth": default_depth(nodes, b["max_draft_depth"]),
            "max_nodes": b["max_draft_nodes"],
            **given,
        }

    def load_model(self, *, device: str = "cpu", mtp: bool = True, progress: bool = True) -> Qwen35Model:
        """The model, filled from the runtime-layout weights (names and shapes checked)."""
        with_mtp = mtp and self.config["model"]["has_mtp"]
        model = Qwen35Model(self.model_config, dtype=self.dtype, device=device, mtp=with_mtp)
        expected = dict(model.named_parameters())
        weights = self.path / fmt.WEIGHTS_DIR
        files = sorted(self.path / rel for rel in self.config["files"] if rel.endswith(".safetensors"))
        seen = set()
        with tqdm(
            total=len(expected), desc=f"loading {self.path.name}", unit="tensor", disable=not progress
        ) as bar:
            for file in files:
                with safe_open(file, framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 (safetensors' handle is not iterable)
                        if name.startswith("mtp.") and not with_mtp:
                            continue
                        param = expected.get(name)
                        if param is None or name in seen:
                            what = "unexpected" if param is None else "a second copy of"
                            raise ValueError(f"{file}: {what} tensor {name}; {_REBUILD}")
                        tensor = f.get_tensor(name)
                        if tensor.shape != param.shape or tensor.dtype != param.dtype:
                            raise ValueError(
                                f"{file}: {name} is {tensor.dtype} {list(tensor.shape)}, expected "
                                f"{param.dtype} {list(param.shape)}; {_REBUILD}"
                            )
                        param.copy_(tensor)
                        seen.add(name)
                        bar.update()
        missing = sorted(set(expected) - seen)
        if missing:
            raise ValueError(f"{weights}: missing tensors {missing[:5]}; {_REBUILD}")
        return model


def load_engine(
    path: str | Path,
    *,
    device: str = "cpu",
    check_device: bool = True,
    check_files: bool = True,
    progress: bool = True,
) -> Engine:
    """Validate the engine at ``path`` for use on ``device`` and return it (weights not loaded yet;
    every file hashed against the build's record, under a progress bar, unless ``check_files`` is False:
    then the caller calls :meth:`Engine.check_files` before it reads them)."""
    path = Path(path)
    config_path = path / fmt.CONFIG
    if not config_path.is_file():
        raise ValueError(f"{path}: no {fmt.CONFIG}; is this an engine directory?")
    try:
        config = load_json(config_path)
    except ValueError as e:
        raise ValueError(f"{e}; the engine is corrupt: {_REBUILD}") from None
    if config.get("format") != fmt.FORMAT:
        raise ValueError(f"{path}: {fmt.CONFIG} does not describe a trtllm_bole engine")
    if config.get("schema_version") != fmt.SCHEMA_VERSION:
        raise ValueError(
            f"{config_path}: engine schema version {config.get('schema_version')!r}, but this trtllm_bole "
            f"reads version {fmt.SCHEMA_VERSION}; {_REBUILD}"
        )
    if config.get("config_sha256") != fmt.canonical_hash(config):
        raise ValueError(
            f"{config_path}: the file was edited after the build (its hash does not match); restore it "
            f"or {_REBUILD} with the settings you want"
        )
    env = fmt.environment("cpu")
    built = config["environment"]
    if built["trtllm_bole"] != env["trtllm_bole"]:
        raise ValueError(
            f"{path}: built by trtllm_bole {built['trtllm_bole']}, this is trtllm_bole {env['trtllm_bole']}; "
            f"{_REBUILD}"
        )
    if built.get("source") != env["source"]:  # the weights' layout is the code's: see source_fingerprint
        raise ValueError(
            f"{path}: built by other trtllm_bole sources ({str(built.get('source', 'not recorded'))[:12]}, "
            f"this is {env['source'][:12]}): its weights may not be laid out as this code reads them; "
            f"{_REBUILD}"
        )
    if check_files:
        _check_files(path, config, progress)
    if check_device and str(device).startswith("cuda"):
        check_device_compat(config, fmt.environment(device), path)
    try:
        model_config = load_config(config["model"]["hf_config"])
    except ValueError as e:
        raise ValueError(f"{config_path}: model config: {e}") from None
    return Engine(path, config, model_config)


def check_device_compat(config: dict[str, Any], present: dict[str, Any], path: Path | str = "engine") -> None:
    """The engine's compiled kernels must match the GPU and Triton they are about to run with."""
    kernels = config["kernels"]
    if not kernels.get("compiled"):
        raise ValueError(
            f"{path}: built on {config['environment']['arch']} without GPU kernels, but loaded on "
            f"{present['arch']} ({present.get('device_name')}); {_REBUILD} on this GPU"
        )
    if kernels["arch"] != present["arch"]:
        raise ValueError(
            f"{path}: kernels compiled for {kernels['arch']}, but this GPU is {present['arch']} "
            f"({present.get('device_name')}); {_REBUILD} on this GPU"
        )
    if kernels["triton"] != present["triton"]:
        raise ValueError(
            f"{path}: kernels compiled with Triton {kernels['triton']}, but Triton {present['triton']} is "
            f"installed; {_REBUILD} (or install triton=={kernels['triton']})"
        )


def _check_files(path: Path, config: dict[str, Any], progress: bool) -> None:
    listed = {path / rel for rel in config["files"]}
    own = [path / name for name in (*fmt.TOKENIZER_FILES, fmt.BUDGET, fmt.PLAN)]  # names the build may write
    present = [*(path / fmt.WEIGHTS_DIR).rglob("*"), *(path / fmt.KERNELS_DIR).rglob("*"), *own]
    stray = sorted(f for f in present if f.is_file() and f not in listed)
    if stray:
        raise ValueError(
            f"{stray[0]}: not written by the build (the engine's files are listed in {fmt.CONFIG}); "
            f"remove it or {_REBUILD}"
        )
    for rel, entry in config["files"].items():
        file = path / rel
        if not file.is_file():
            raise ValueError(f"{file}: missing from the engine; {_REBUILD}")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise ValueError(
                f"{file}: {size} bytes, the build wrote {entry['bytes']} (truncated or replaced); {_REBUILD}"
            )
    files = [path / rel for rel in config["files"]]
    digests = fmt.sha256_files(files, desc=f"checking {path.name}", progress=progress)
    for rel, entry in config["files"].items():
        if digests[path / rel] != entry["sha256"]:
            raise ValueError(
                f"{path / rel}: content differs from the build (SHA-256 mismatch: corrupt); {_REBUILD}"
            )
