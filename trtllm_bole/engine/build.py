"""Build an engine directory from a Qwen3.5 checkpoint (the format: :mod:`trtllm_bole.engine.format`).

The build validates the checkpoint (every tensor name and shape, through the loader), converts the
weights to the runtime layout and dtype, compiles the Bole kernels for the present GPU (sm_XY PTX +
cubin, through the same AOT path as the TensorRT plugins; nothing on CPU, where the runtime runs the
torch reference), optionally calibrates the verification budget on the present device (BOLE.md §5),
and writes ``config.json`` last.

Safety: everything is written to a temporary sibling directory that is renamed into place only when
complete, so an interrupted build leaves no half-written engine. An existing engine built from the
same inputs is left as it is (the build is a no-op); a different one is replaced only with
``force=True``; a non-empty directory that is not an engine is never touched.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from trtllm_bole.config import BoleConfig, check_device, one_line, short_repr
from trtllm_bole.engine import format as fmt
from trtllm_bole.engine.load import is_engine_dir
from trtllm_bole.models.checkpoint import write_safetensors
from trtllm_bole.models.config import (
    GENERATION_CONFIG,
    Qwen35Config,
    eos_token_ids,
    load_config,
    load_json,
    read_generation_config,
)
from trtllm_bole.models.loader import checkpoint_files, load_model
from trtllm_bole.spec.budget import check_buckets
from trtllm_bole.spec.calibration import CalibrationSettings, calibrate_model
from trtllm_bole.spec.scheduler import MIN_SEQ_LEN
from trtllm_bole.text import Tokenizer

log = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in fmt.WEIGHT_DTYPES}
SHARD_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What an engine is built for; the runtime refuses to exceed it."""

    dtype: str = "auto"  # float32 | bfloat16 | auto (bfloat16 on a GPU, float32 on CPU)
    max_batch_size: int = 8
    max_seq_len: int = 1024
    max_draft_depth: int = 8  # draft tokens on the longest path (the tree holds one more: the pending token)
    max_draft_nodes: int = 63  # draft tokens per request and step (+ the pending token: one 64-node tile)

    def validated(self, device: str) -> BuildSettings:
        dtype = self.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16', got {self.dtype!r}")
        for name in ("max_batch_size", "max_seq_len", "max_draft_depth", "max_draft_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        try:  # the runtime's limits: an engine that LLM could not serve is refused now
            BoleConfig(max_depth=self.max_draft_depth, max_nodes=self.max_draft_nodes)
        except ValidationError as e:
            reasons = one_line(e, {"max_depth": "max_draft_depth", "max_nodes": "max_draft_nodes"})
            raise ValueError(
                f"max_draft_depth {self.max_draft_depth} / max_draft_nodes {self.max_draft_nodes} cannot "
                f"be served: {reasons}"
            ) from None
        if self.max_seq_len < MIN_SEQ_LEN:
            raise ValueError(
                f"max_seq_len must be at least {MIN_SEQ_LEN} (a context of max_seq_len - 1 tokens: a prompt "
                f"token and an output token), got {self.max_seq_len}"
            )
        return BuildSettings(
            dtype, self.max_batch_size, self.max_seq_len, self.max_draft_depth, self.max_draft_nodes
        )

    @property
    def tree_depth(self) -> int:
        return self.max_draft_depth + 1


class BuildStepError(RuntimeError):
    """A step of the build failed (a kernel's compilation, the TensorRT plan); the message says which,
    the cause is chained."""


PlanBuilder = Callable[[Path, dict[str, Any]], dict[str, Any]]
"""``(staging_dir, engine_config) -> plan record``: writes ``bole.plan`` (see ``plugins/network.py``)."""


def build_engine(
    checkpoint: str | Path,
    output: str | Path,
    settings: BuildSettings | None = None,
    *,
    device: str | None = None,
    calibration: CalibrationSettings | None = None,
    plan_builder: PlanBuilder | None = None,
    force: bool = False,
    progress: bool = True,
) -> tuple[Path, bool]:
    """Build (or keep) the engine at ``output``; returns ``(path, built)`` with ``built`` False when an
    identical engine was already there. ``device``: where kernels are compiled and calibration runs
    (default: ``cuda`` when available, else ``cpu``). ``calibration``: measure the budget table."""
    checkpoint, output = Path(checkpoint), Path(output).resolve()
    here = Path.cwd()
    if output == here or output in here.parents:  # "." failed after the whole build (a swap of ".")
        raise ValueError(
            f"output {output} holds the current folder, which a build replaces as a whole: name a folder "
            "inside it (--output ./engine, say)"
        )
    if output.is_mount():  # a volume mounted there: the swap renames it, which Linux refuses (EBUSY)
        raise ValueError(
            f"output {output} is a mount point, which a build cannot replace as a whole (it renames the "
            f"folder): name a folder inside it (--output {output}/engine, say)"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    settings = (settings or BuildSettings()).validated(device)
    if not checkpoint.is_dir():
        raise ValueError(f"checkpoint {checkpoint} is not a directory (config.json + safetensors expected)")
    if is_engine_dir(checkpoint):
        raise ValueError(
            f"checkpoint {checkpoint} is a trtllm_bole engine, not a checkpoint: pass the Hugging Face "
            f"checkpoint it was built from (source.checkpoint in its {fmt.CONFIG})"
        )
    model_config = load_config(checkpoint)
    model_config.check_seq_len(settings.max_seq_len)
    # End ids that every load would refuse are refused now, before minutes of loading and timing.
    eos_token_ids(checkpoint, load_json(checkpoint / "config.json"), read_generation_config(checkpoint))
    metadata = [checkpoint / name for name in ("config.json", GENERATION_CONFIG, *fmt.TOKENIZER_FILES)]
    source_files = [*checkpoint_files(checkpoint), *(f for f in metadata if f.is_file())]
    digests = fmt.sha256_files(source_files, desc=f"hashing {checkpoint.name}", progress=progress)
    sources = {f.name: digests[f] for f in source_files}  # an edited config rebuilds too
    env = fmt.environment(device)
    if calibration is not None:
        calibration = calibration.fitted(
            settings.max_batch_size,
            settings.max_seq_len,
            settings.max_batch_size * (settings.max_draft_nodes + 1),
        )  # and the engine's trees: the table is used at its depth
        calibration = replace(calibration, timing=replace(calibration.timing, depth=settings.tree_depth))
        check_buckets(calibration.capacities, calibration.batch_buckets)  # before the model loads
    # TensorRT's version when a plan is built (a new TensorRT rebuilds); False keeps earlier engines' ids.
    tensorrt = _tensorrt_version() if plan_builder is not None else False
    identity = _build_key(sources, settings, calibration, tensorrt, env)
    build_id = _hash(identity)
    with _build_lock(output):  # from the look at what is there to the swap: one build of an output at a time
        if _keep_existing(output, identity, force, progress):
            return output, False

        leftovers = sorted(
            p for kind in ("building", "old") for p in output.parent.glob(f".{output.name}.{kind}-*")
        )
        # No other build runs: a killed one (SIGKILL, out of memory) left these, a whole copy of weights each.
        if leftovers:
            log.warning(
                "%s: staging (or replaced) folders of earlier builds that were killed: %s; remove them",
                output,
                ", ".join(map(str, leftovers)),
            )
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.building-", dir=output.parent))
        try:
            config = _stage(checkpoint, staging, model_config, settings, device, calibration, env, progress)
            # What the id hashes: a rebuild says what changed.
            config.update(build_id=build_id, identity=identity)
            config.update(source={"checkpoint": str(checkpoint.resolve()), "files": sources})
            if plan_builder is not None:
                try:
                    config["tensorrt"] = plan_builder(staging, config)
                except RuntimeError as e:
                    raise BuildStepError(f"the TensorRT plan: {e}") from e
            _make_readable(staging)
            config["files"] = fmt.file_entries(staging, progress=progress)
            (staging / fmt.CONFIG).write_text(json.dumps(fmt.seal(config), indent=2) + "\n")
            _swap_in(staging, output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return output, True


def _build_key(
    sources: dict,
    settings: BuildSettings,
    calibration: CalibrationSettings | None,
    tensorrt: str | bool,
    env: dict,
) -> dict[str, Any]:
    """What makes an engine: its inputs' hashes, settings, calibration, TensorRT, environment (as JSON
    reads it back: lists, not tuples)."""
    names = ["trtllm_bole", "source", "torch", "triton", "arch"]
    if calibration is not None:  # a budget is its GPU's own: another GPU of the arch, another engine
        names.append("device_name")
    key = {
        "sources": sources,
        "settings": asdict(settings),
        "calibration": None if calibration is None else asdict(calibration),
        "tensorrt": tensorrt,
        "env": {k: env[k] for k in names},
        "schema": fmt.SCHEMA_VERSION,
    }
    return json.loads(json.dumps(key))


def _hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _differences(old: object, new: object, path: str = "") -> list[str]:
    """Where two build keys differ: each differing leaf's dotted path with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(old.keys() | new.keys())
        return [d for k in keys for d in _differences(old.get(k), new.get(k), f"{path}.{k}".lstrip("."))]
    return [] if old == new else [f"{path}: {short_repr(old)} -> {short_repr(new)}"]


def _tensorrt_version() -> str:
    """The installed TensorRT's version, read without importing it (the plan builder imports it)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def _keep_existing(output: Path, identity: dict[str, Any], force: bool, progress: bool) -> bool:
    """True when ``output`` already holds this very engine (of this build key); raises when it must not be
    replaced."""
    build_id = _hash(identity)
    if not output.exists():
        return False
    if not output.is_dir():
        raise ValueError(f"output {output} exists and is not a directory; choose another --output")
    if not any(output.iterdir()):
        return False
    try:
        existing = json.loads((output / fmt.CONFIG).read_text())
        is_engine = existing.get("format") == fmt.FORMAT
    except (OSError, json.JSONDecodeError, AttributeError):
        is_engine = False
    if not is_engine:
        raise ValueError(
            f"output {output} is a non-empty directory that is not a trtllm_bole engine; it is never "
            f"overwritten: choose another --output or empty it"
        )
    if existing.get("build_id") == build_id and not force:  # forced: rebuilt (a new calibration, say)
        from trtllm_bole.engine.load import load_engine

        try:
            load_engine(output, check_device=False, progress=progress)
        except ValueError as e:
            raise ValueError(f"{e} (the same build is asked again: pass --force to rebuild it)") from None
        log.info("%s: an identical engine is already there; nothing to do", output)
        return True
    if not force:
        changed = _differences(existing.get("identity"), identity) if "identity" in existing else []
        if changed:  # engines built before 2026-12-05 do not record their identity
            what = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        else:
            what = f"built from {existing.get('source', {}).get('checkpoint')} with {existing.get('build')}"
        raise ValueError(f"output {output} holds a different engine ({what}); pass --force to replace it")
    return False


def _make_readable(root: Path) -> None:
    """mkdtemp and some writers create owner-only modes; an engine is read by servers too."""
    root.chmod(0o755)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


@contextmanager
def _build_lock(output: Path) -> Iterator[None]:
    """Held by one build of ``output`` at a time (``ValueError`` while another holds it: two builds of one
    output had each swapped in its engine, the later replacing the other's without ``--force``); the
    system releases it when the build ends or its process dies. The lock file goes with the build."""
    output.parent.mkdir(parents=True, exist_ok=True)
    path = output.parent / f".{output.name}.lock"
    while True:
        lock = open(path, "a+")  # noqa: SIM115 (closed below, after the unlink)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "its pid unknown"
            lock.close()
            raise ValueError(
                f"another build of {output} is running ({holder}): wait for it, or build to another --output"
            ) from None
        if path.exists() and path.stat().st_ino == os.fstat(lock.fileno()).st_ino:
            break
        lock.close()  # its holder removed the file as this build opened it: lock the one there now
    try:
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield
    finally:
        path.unlink(missing_ok=True)
        lock.close()


def _swap_in(staging: Path, output: Path) -> None:
    """``staging`` becomes ``output``; an engine already there is put back if that fails, or is
    interrupted (a Ctrl-C right after it was moved aside left no engine at ``output``)."""
    old = output.parent / f".{output.name}.old-{os.getpid()}-{time.time_ns()}" if output.exists() else None
    try:
        if old is not None:
            output.rename(old)
        staging.rename(output)
    except BaseException:
        if old is not None and old.exists() and not output.exists():
            old.rename(output)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _stage(
    checkpoint: Path,
    staging: Path,
    model_config: Qwen35Config,
    settings: BuildSettings,
    device: str,
    calibration: CalibrationSettings | None,
    env: dict,
    progress: bool,
) -> dict[str, Any]:
    Tokenizer.find(checkpoint, model_config.vocab_size)  # refuse now one that every load would refuse
    dtype = DTYPES[settings.dtype]
    model = load_model(checkpoint, dtype=dtype, device=device, mtp=True, progress=progress)
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    write_safetensors(staging / fmt.WEIGHTS_DIR, tensors, shard_bytes=SHARD_BYTES)
    for name in fmt.TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, staging / name)
    hf_config = load_json(checkpoint / "config.json")
    config: dict[str, Any] = {
        "format": fmt.FORMAT,
        "schema_version": fmt.SCHEMA_VERSION,
        "environment": env,
        "model": {
            "hf_config": hf_config,
            "generation_config": read_generation_config(checkpoint),  # its end-of-turn ids stop requests
            "has_mtp": model.mtp is not None,
            "parameters": sum(t.numel() for t in tensors.values()),
        },
        "build": asdict(settings),
        "weights": {"dir": fmt.WEIGHTS_DIR, "layout": "trtllm_bole-runtime-v1", "dtype": settings.dtype},
        "kernels": _compile_kernels(staging, model_config, settings, env, progress),
        "budget": None,
        "tensorrt": None,
    }
    if calibration is not None:
        table = calibrate_model(
            model, calibration, max_depth=settings.tree_depth, per_request=settings.max_draft_nodes + 1,
            progress=progress,
        )  # fmt: skip
        table.save(staging / fmt.BUDGET)
        config["budget"] = {
            "file": fmt.BUDGET,
            "device": table.device,
            "gpu_seconds": table.gpu_seconds,
            "settings": asdict(calibration),
        }
    return config


def _compile_kernels(
    staging: Path, config: Qwen35Config, settings: BuildSettings, env: dict, progress: bool
) -> dict[str, Any]:
    if env["arch"] == "cpu":
        return {
            "compiled": False,
            "reason": "no GPU at build time: on CPU the runtime runs the torch reference; build on the "
            "target GPU for compiled kernels",
        }
    from tqdm import tqdm

    from trtllm_bole.engine.kernel_set import engine_payloads

    arch = int(env["arch"].removeprefix("sm_"))
    out = staging / fmt.KERNELS_DIR
    out.mkdir()
    records = []
    jobs = engine_payloads(config, settings)
    for key, job in tqdm(jobs.items(), desc="compiling Bole kernels", unit="kernel", disable=not progress):
        try:
            payload = job(arch)
        except Exception as e:  # Triton's compiler or ptxas: name the kernel, keep the cause chained
            raise BuildStepError(f"compiling kernel {key} for sm_{arch} failed: {e}") from e
        (out / f"{key}.ptx").write_text(payload.ptx)
        (out / f"{key}.cubin").write_bytes(payload.kernel.cubin)
        records.append(
            {
                "key": key,
                "entry": payload.kernel_name,
                "ptx": f"{fmt.KERNELS_DIR}/{key}.ptx",
                "cubin": f"{fmt.KERNELS_DIR}/{key}.cubin",
                "block": list(payload.launch.block),
                "shared_mem": payload.launch.shared_mem,
                "params": list(payload.params),
                # The cubin keeps Triton's unused scratch pointers after these: launch it with as many nulls.
                "cubin_trailing_null_params": payload.kernel.cubin_num_params - payload.kernel.num_params,
            }
        )
    return {"compiled": True, "arch": env["arch"], "triton": env["triton"], "list": records}
