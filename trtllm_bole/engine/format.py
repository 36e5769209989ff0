"""The engine directory format (schema version :data:`SCHEMA_VERSION`).

::

    <engine>/
      config.json            engine config: format, schema, versions and the package's source hash
                             (:func:`source_fingerprint`), device, model, build, Bole settings,
                             the files below with their SHA-256, and its own hash (``config_sha256``)
      weights/               model weights in the runtime layout (our fused parameters, in the
                             engine's dtype): model.safetensors, or shards + model.safetensors.index.json
      tokenizer.json, tokenizer_config.json   (when the checkpoint has them)
      budget.json            the calibrated verification budget (``--calibrate``, BOLE.md §5)
      kernels/               AOT-compiled Bole kernels for the build GPU (PTX + cubin; none on CPU)
      bole.plan              TensorRT plan (``--tensorrt``)

Every file is listed in ``config.json`` with its size and SHA-256; ``config.json`` carries the hash of
its own canonical JSON. Anything edited, truncated or swapped after the build is caught at load.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from pathlib import Path
from typing import Any

from tqdm import tqdm

FORMAT = "trtllm_bole-engine"
SCHEMA_VERSION = 1
CONFIG = "config.json"
WEIGHTS_DIR = "weights"
KERNELS_DIR = "kernels"
BUDGET = "budget.json"
PLAN = "bole.plan"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_DTYPES = ("float32", "bfloat16")  # what an engine may hold


def sha256_files(paths: list[Path], *, desc: str = "hashing", progress: bool = True) -> dict[Path, str]:
    """SHA-256 of each file, with one progress bar in bytes over all of them (a 27B engine is ~54 GB:
    about a minute a pass)."""
    digests = {}
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not progress, leave=False) as bar:
        for path in paths:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
                    bar.update(len(block))
            digests[path] = h.hexdigest()
    return digests


def canonical_hash(config: dict[str, Any]) -> str:
    """SHA-256 of the config's canonical JSON, without its own ``config_sha256`` field."""
    body = {k: v for k, v in config.items() if k != "config_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "config_sha256": canonical_hash(config)}


def file_entries(root: Path, *, progress: bool = True) -> dict[str, dict[str, Any]]:
    """Relative path -> {bytes, sha256} for every file under ``root`` except ``config.json``."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != CONFIG)
    digests = sha256_files(files, desc="hashing the engine", progress=progress)
    return {p.relative_to(root).as_posix(): {"bytes": p.stat().st_size, "sha256": digests[p]} for p in files}


@functools.cache
def source_fingerprint() -> str:
    """SHA-256 of the package's Python sources (each file's path and contents). An engine is tied to it,
    as a TensorRT engine to its TensorRT: ``trtllm_bole.__version__`` does not move between commits, and
    the weights are stored in the layout this code fuses them into and reads them back in (names, shapes
    and dtypes are checked, not which rows went where), so an engine of other sources could load its
    weights into the wrong places without an error."""
    import trtllm_bole

    root = Path(trtllm_bole.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment(device: str) -> dict[str, Any]:
    """Versions, sources and the device an engine is built for (or loaded on): ``arch`` is ``"cpu"`` or
    ``"sm_<major><minor>"``."""
    import torch

    import trtllm_bole

    env: dict[str, Any] = {
        "trtllm_bole": trtllm_bole.__version__,
        "source": source_fingerprint(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "arch": "cpu",
        "device_name": platform.processor() or platform.machine(),
    }
    if str(device).startswith("cuda"):
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        env["arch"] = f"sm_{major}{minor}"
        env["device_name"] = torch.cuda.get_device_name(index)
        env["cuda"] = torch.version.cuda
    return env


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__
