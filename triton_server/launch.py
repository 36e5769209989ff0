"""Start a real Triton Inference Server (the ``tritonserver`` bundled in the nvidia-pytriton wheel)
serving the Bole model, wait until it is ready, print the endpoints, and stop it on SIGTERM/SIGINT/SIGHUP::

    python triton_server/launch.py                        # embedded tiny model, CPU, ports 8000/8001/8002
    python triton_server/launch.py --engine-dir DIR --http-port 0 --grpc-port 0   # 0: any free port

It fills a fresh model repository from ``model_repository_template/`` (``--model-repository`` serves
an existing one instead) and runs ``tritonserver`` with the *server environment*: a backend
directory holding pytriton's Python backend and the stub built for this Python (links; pytriton's
site-packages is never modified), and the stub's Python first on PATH.

That Python is its own small venv because the backend stub of nvidia-pytriton 0.7.0 was compiled
against NumPy 1.x: under NumPy 2 it silently corrupts every input tensor of more than one element
(``input_ids`` [1, 2, 3] arrives as [1, 1, 1]) and aborts on any BYTES tensor. The venv holds only
NumPy 1.26 and adds this venv's site-packages (torch, trtllm_bole, ...) behind it. The server
environment is made once, under this venv (``--prepare-only`` makes it and exits; it needs pip and
the package index once). Needs ``pip install --no-deps nvidia-pytriton==0.7.0`` (README, "Serving
with Triton").

Stopping drains: Triton neither unloads a model nor calls its ``finalize`` while requests are in
flight, so on SIGTERM/SIGINT/SIGHUP the launcher first writes ``--drain-grace`` into the model's drain file
(the ``drain_file`` parameter of the repository it fills, or of the ``bole`` model of one served as it
is with ``--model-repository``; such a repository that sets none is not drained): the model refuses new
requests, lets those in flight run for up to that many seconds, then ends the rest with an
UNAVAILABLE error ("the serving engine shut down"), and Triton stops. The exit code is 0 when
tritonserver stopped by itself with 0, or when a stop came while it was still loading the model (the
SIGTERM then ends it), non-zero when it failed or had to be killed. An idle HTTP keep-alive connection
holds Triton 2.51's stop for its whole exit timeout (it waits for every HTTP connection to close), which
then exits 1 without finalizing the model.

Metrics: Triton's Prometheus endpoint on ``--metrics-port`` (default 8002; -1: none) serves Triton's own
``nv_inference_*`` and the model's ``bole_*`` (:mod:`trtllm_bole.serving.metrics`).

Watching the engine: Triton keeps reporting a Python model ready whatever its own threads do, so the
launcher reads the model's ``bole_engine_status{state="serving"}`` gauge every ``--engine-watch``
seconds (default 1; 0, or no metrics endpoint: not watched), and its heartbeat (set every second). Once
the gauge reads 0 while the launcher has not asked for a drain (the engine thread failed, or the drain
file was written by someone else), every request is being refused; once the heartbeat is 15 s old, the
model's process died or hangs (Triton keeps its last samples, reports the model ready, and the requests
in flight never end). Either way the launcher stops tritonserver (requests still in flight keep Triton's
exit timeout) and exits 1, so that whatever supervises it (systemd, Kubernetes) starts a fresh server.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import importlib.util
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fill_template import fill

TEMPLATE = Path(__file__).resolve().parent / "model_repository_template"
MODEL = "bole"
STUB = "triton_python_backend_stub"
STUB_NUMPY = "numpy==1.26.4"  # the NumPy ABI the bundled Python backend stub was built for


def triton_root() -> Path:
    """``<site-packages>/pytriton/tritonserver`` (found without importing pytriton, whose own
    dependencies are deliberately not installed)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "tritonserver not found: install it with `pip install --no-deps nvidia-pytriton==0.7.0`"
        )
    root = Path(spec.origin).parent / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise SystemExit(f"{root}/bin/tritonserver is missing: reinstall nvidia-pytriton==0.7.0")
    return root


def make_repository(dest: Path, values: dict[str, str]) -> Path:
    """Copy the template to ``dest`` and fill every ``config.pbtxt``."""
    shutil.copytree(TEMPLATE, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    for config in dest.glob("*/config.pbtxt"):
        config.write_text(fill(config.read_text(), values))
    return dest


def prepare_server_env(env_dir: Path, root: Path) -> Path:
    """Make (once; safe against concurrent launchers) what the server runs with, and return it:

    - ``bin/``: the stub's Python, a venv with NumPy 1.x whose ``.pth`` adds this interpreter's
      site-packages after its own;
    - ``backends/python/``: pytriton's Python backend with the stub built for this Python beside it
      (links, so that pytriton's site-packages is never modified and the stub's ``$ORIGIN`` rpath
      still finds pytriton's libraries).
    """
    site_packages = sysconfig.get_paths()["purelib"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stamp = f"{STUB_NUMPY} {site_packages} {root} {version}"
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.with_name(env_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = env_dir / "bole-server-env"
        if marker.is_file() and marker.read_text() == stamp:
            return env_dir
        shutil.rmtree(env_dir, ignore_errors=True)
        _link_backend(env_dir / "backends" / "python", root, version)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        python = env_dir / "bin" / "python"
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", purelib, STUB_NUMPY],
            check=True,
        )
        (Path(purelib) / "zz_bole_main_venv.pth").write_text(
            f"import site; site.addsitedir({site_packages!r})\n"
        )
        marker.write_text(stamp)
    return env_dir


def _link_backend(dest: Path, root: Path, version: str) -> None:
    stub = root / "python_backend_stubs" / version / STUB
    if not stub.is_file():
        raise SystemExit(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub})")
    dest.mkdir(parents=True)
    for item in (root / "backends" / "python").iterdir():
        if item.name not in (STUB, "__pycache__"):
            (dest / item.name).symlink_to(item)
    (dest / STUB).symlink_to(stub)


def default_server_env_dir() -> Path:
    return Path(sys.prefix) / "triton-server-env"


def server_env(server_dir: Path, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(server_dir / "bin"), env.get("PATH", "")])
    # libpython for the stub; pytriton's own libraries for the backend loaded through a link.
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(root.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (*libs, env.get("LD_LIBRARY_PATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def server_command(
    root: Path,
    server_dir: Path,
    repository: Path,
    ports: tuple[int, int, int | None],
    *,
    log_verbose: int,
    shm_prefix: str,
    exit_timeout: int,
) -> list[str]:
    http_port, grpc_port, metrics_port = ports
    metrics = (
        ["--allow-metrics=false"]
        if metrics_port is None
        else ["--allow-metrics=true", "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}"]
    )
    return [
        str(root / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={server_dir / 'backends'}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        *metrics,
        "--allow-gpu-metrics=false",
        "--pinned-memory-pool-byte-size=0",
        "--cuda-memory-pool-byte-size=0:0",
        # Servers sharing /dev/shm need distinct Python-backend shared-memory names.
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--exit-timeout-secs={exit_timeout}",
        f"--log-verbose={log_verbose}",
    ]


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports free now, each held until all are drawn (drawn one at a time, three in a
    row repeated a port about once in 5,000, and tritonserver exited 1 on the pair)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def check_ports_free(ports: dict[str, int]) -> None:
    """Refuse ports another process listens on, or one port given twice (tritonserver would report ready
    over HTTP and then exit 1 on its metrics or gRPC port, a line deep in its log, after the model loaded)."""
    flags_of: dict[int, list[str]] = {}
    for flag, port in ports.items():
        flags_of.setdefault(port, []).append(flag)
    for port, flags in flags_of.items():
        if len(flags) > 1:
            raise SystemExit(f"error: {' and '.join(flags)} are both {port}: each needs a port of its own")
    for flag, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed port's TIME_WAIT is free
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise SystemExit(
                    f"error: {flag} {port} is taken ({e.strerror}): is another server running? Pass another "
                    f"port, or 0 for any free one"
                ) from None


class StopFlag:
    """Set by SIGTERM/SIGINT/SIGHUP once :meth:`install` ran. Its handler only sets it: one that raised (as
    KeyboardInterrupt) could cut the launcher's own stop short, and a ``threading.Event`` set in a
    handler can deadlock on its lock."""

    def __init__(self) -> None:
        self.asked = False

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: its terminal closed
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.asked = True

    def sleep(self, seconds: float) -> bool:
        """Sleep, then say whether a stop was asked (a signal does not end the sleep: PEP 475)."""
        time.sleep(seconds)
        return self.asked


LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""The launcher's own probes of its server: never through ``http_proxy`` (a ``no_proxy=localhost`` does
not cover 127.0.0.1, and every probe went to the proxy: the server never ready, the engine unwatched)."""


def wait_ready(process: subprocess.Popen, http_port: int, timeout: float, stop: StopFlag) -> float | None:
    """Seconds until ``/v2/health/ready`` answers 200, None once a stop is asked; raises if the server
    exits or times out."""
    start = time.monotonic()
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    while time.monotonic() - start < timeout:
        if stop.asked:
            return None
        if process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {process.returncode} before it was ready")
        try:
            with LOOPBACK.open(url, timeout=1) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        stop.sleep(0.2)
    raise TimeoutError(f"tritonserver was not ready within {timeout:.0f} s")


_SERVING_SAMPLE = re.compile(r'^bole_engine_status\{[^}]*\bstate="serving"[^}]*\} (\S+)$', re.MULTILINE)
_HEARTBEAT_SAMPLE = re.compile(r"^bole_engine_heartbeat_seconds\{[^}]*\} (\S+)$", re.MULTILINE)
HEARTBEAT_STALE_S = 15.0
"""A heartbeat this much older than the launcher's clock is a model process that died (killed for its
memory, a crash in native code) or hangs whole (the metrics thread publishes it, so an engine thread
stuck alone in a GPU call does not stop it): Triton keeps its last samples, and reports it ready."""


def serving_gauge(metrics: str, now: float | None = None) -> bool | None:
    """Whether the engine takes requests, from Prometheus text holding its ``bole_engine_status{state=
    "serving"}`` sample and its heartbeat (Unix seconds, ``now`` by default the current time): False where
    the gauge reads 0 or the heartbeat is stale; None where there is no such sample (not published yet,
    or the model unloaded)."""
    match = _SERVING_SAMPLE.search(metrics)
    if match is None:
        return None
    beat = _HEARTBEAT_SAMPLE.search(metrics)
    if beat is not None and (time.time() if now is None else now) - float(beat.group(1)) > HEARTBEAT_STALE_S:
        return False
    return float(match.group(1)) != 0


def engine_serving(metrics_port: int) -> bool | None:
    """:func:`serving_gauge` of Triton's metrics endpoint; None where it does not answer."""
    try:
        with LOOPBACK.open(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as response:
            return serving_gauge(response.read().decode(errors="replace"))
    except (OSError, http.client.HTTPException):  # one stopping mid-answer: BadStatusLine, IncompleteRead
        return None


class EngineStopped(Exception):
    """The model's engine stopped taking requests while the launcher had not asked it to."""


def wait_serving(
    process: subprocess.Popen, metrics_port: int | None, interval: float, stop: StopFlag
) -> None:
    """Until tritonserver exits or a stop is asked; raises :class:`EngineStopped` once the engine's gauge
    reads 0 (every ``interval`` seconds; never with no metrics endpoint or ``interval`` 0)."""
    watched = metrics_port is not None and interval > 0
    next_read = time.monotonic() + interval
    while not stop.sleep(0.2) and process.poll() is None:
        if watched and time.monotonic() >= next_read:
            next_read = time.monotonic() + interval
            if engine_serving(metrics_port) is False and process.poll() is None:  # not Triton's own exit
                raise EngineStopped


LEFT_BEHIND_GRACE_S = 5.0
"""How long the model's processes may outlive tritonserver before they are killed."""


def stop(process: subprocess.Popen, timeout: float) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit code, or None if it had to be killed.
    Then the processes below it that outlive it by :data:`LEFT_BEHIND_GRACE_S`: Triton 2.51 leaves its
    model's stub running when its stop outlasts its exit timeout (and so does a kill), holding the
    model's memory (a GPU's, on a GPU) that the restarted server needs."""
    below, killed_it = process_tree(process.pid), False
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            killed_it = True
    killed = kill_left_behind(below, LEFT_BEHIND_GRACE_S)
    if killed:
        print(f"warning: killed the processes tritonserver left behind (pids {killed})", file=sys.stderr,
              flush=True)  # fmt: skip
    return None if killed_it else process.returncode


def _proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state, parent, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(pid: int) -> list[tuple[int, str]]:
    """Every live process below ``pid``, each with its start time (which tells it from a later process
    given the same pid); Linux's /proc, empty elsewhere."""
    children: dict[str, list[tuple[int, str]]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _proc_stat(entry.name)
        if fields is not None:
            children.setdefault(fields[1], []).append((int(entry.name), fields[19]))
    found, queue = [], [str(pid)]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(str(child[0]))
    return found


def kill_left_behind(processes: list[tuple[int, str]], grace: float) -> list[int]:
    """SIGKILL those of ``processes`` (pid, start time) still running after ``grace`` seconds (at once
    when none are); the pids killed."""
    deadline = time.monotonic() + grace

    def running() -> list[int]:
        stats = [(pid, started, _proc_stat(pid)) for pid, started in processes]
        return [pid for pid, started, f in stats if f is not None and f[19] == started and f[0] != "Z"]

    while (alive := running()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


def request_drain(drain_file: Path, grace: float) -> None:
    """Tell the model to drain (atomically: it never reads a half-written file)."""
    partial = drain_file.with_suffix(".partial")
    partial.write_text(f"{grace}\n")
    partial.replace(drain_file)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies, so no server outlives it (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine-dir", default="", help="engine or checkpoint dir (default: the embedded model)")
    p.add_argument("--mode", default="", choices=["", "ar", "chain", "tree-serial", "bole"],
                   help="speculative mode (default: bole)")  # fmt: skip
    p.add_argument(
        "--max-depth",
        default="",
        help="draft tree depth (default: the engine's, else 8; --max-nodes where fewer)",
    )
    p.add_argument(
        "--max-nodes", default="", help="draft tokens per request and step (default: the engine's, else 63)"
    )
    p.add_argument("--draft-top-k", default="", help="children per draft node (default: 4)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="requests the engine runs at once (default: the engine's, else 8)")  # fmt: skip
    p.add_argument(
        "--max-seq-len",
        default="",
        help="the context: prompt + output hold at most this - 1 tokens (default: the engine's, else 1024)",
    )
    p.add_argument(
        "--kv-cache-tokens",
        default="",
        help="paged KV cache size in tokens (default: every slot can hold max-seq-len - 1 tokens and the "
        "longest path a step accepts past them, max-depth + 1)",
    )
    p.add_argument(
        "--max-prefill-tokens", default="", help="prompt tokens one prefill forward takes (default: 8192)"
    )
    p.add_argument(
        "--max-queue-size", default="", help="requests that may wait for the batch (default: no bound)"
    )
    p.add_argument("--device", default="", help="cpu, cuda or cuda:N (default: from the instance kind)")
    p.add_argument(
        "--dtype",
        default="",
        choices=["", "auto", "float32", "bfloat16"],
        help="auto, float32 or bfloat16 (default: auto: the engine's, else float32 on CPU, bfloat16 on CUDA)",
    )
    p.add_argument(
        "--instance-kind",
        default="KIND_CPU",
        choices=["KIND_CPU", "KIND_GPU"],
        help="where Triton places the model instance (default: KIND_CPU)",
    )
    p.add_argument("--http-port", type=int, default=8000, help="0: any free port (default: 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="0: any free port (default: 8001)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        help="Prometheus metrics; 0: any free port, -1: none (default: 8002)",
    )
    p.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="serve this filled repository as is (default: fill the template into --workdir)",
    )
    p.add_argument("--workdir", type=Path, default=None, help="where to write the repository (default: temp)")
    p.add_argument("--server-env", type=Path, default=None,
                   help="the stub Python environment (default: triton-server-env in this venv)")  # fmt: skip
    p.add_argument("--prepare-only", action="store_true", help="make the server environment and exit")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the server to be ready: the model's weights load and it warms up (minutes "
        "for a real model on a GPU); past them tritonserver is stopped, the launcher exits 1 (default: 1800)",
    )
    p.add_argument(
        "--drain-grace",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT/SIGHUP: seconds in-flight requests may still run (default: 10)",
    )
    p.add_argument(
        "--engine-watch",
        type=float,
        default=1.0,
        help="seconds between reads of the engine's serving gauge; once it reads 0 unasked, the server is "
        "stopped and the launcher exits 1 (default: 1; 0: not watched)",
    )
    p.add_argument("--log-verbose", type=int, default=0, help="tritonserver's --log-verbose (default: 0)")
    args = p.parse_args(argv)
    if args.model_repository is not None:  # its config.pbtxt holds them: a flag would be ignored unsaid
        given = [
            f"--{name.replace('_', '-')}"
            for name in MODEL_FLAGS
            if getattr(args, name) != p.get_default(name)
        ]
        if given:
            p.error(
                f"{', '.join(given)} set the model's parameters, which --model-repository serves from its "
                "own config.pbtxt: drop them, or set them in that file"
            )
    return args


# The flags that fill the model's config.pbtxt (:func:`model_parameters`).
MODEL_FLAGS = ("engine_dir", "mode", "max_depth", "max_nodes", "draft_top_k", "max_batch_size",
               "max_seq_len", "kv_cache_tokens", "max_prefill_tokens", "max_queue_size", "device", "dtype",
               "instance_kind")  # fmt: skip


# A parameters entry in protobuf text format: the ':' before a message is optional, fields may end in ','
# or ';'. Comments (# to the end of a line) are removed first.
_DRAIN_PARAMETER = re.compile(
    r'key\s*:\s*"drain_file"\s*[,;]?\s*value\s*:?\s*\{\s*string_value\s*:\s*"([^"]*)"'
)


def repository_drain_file(repository: Path) -> Path | None:
    """The drain file the ``bole`` model of a filled repository watches (its ``drain_file`` parameter);
    None where the parameter is unset (empty, or still a ``${...}`` placeholder) or there is no such model.
    A drain file the launcher could not write on stop (relative, in a missing or read-only folder) is
    refused now."""
    config = repository / MODEL / "config.pbtxt"
    text = re.sub(r"#[^\n]*", "", config.read_text()) if config.is_file() else ""
    match = _DRAIN_PARAMETER.search(text)
    if match is None and '"drain_file"' in text:
        raise SystemExit(f"error: {config}: its drain_file parameter could not be read")
    value = match.group(1).strip() if match else ""
    if not value or value.startswith("${"):
        return None
    path = Path(value)
    if not path.is_absolute():  # the model's process runs in another working directory
        raise SystemExit(f"error: {config}: drain_file {value!r} must be an absolute path")
    if not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
        raise SystemExit(f"error: {config}: drain_file {value!r}: its folder is missing or not writable")
    return path


def check_model_parameters(values: dict[str, str]) -> None:
    """The model's parameters read as its ``initialize`` reads them (:mod:`trtllm_bole.serving.protocol`),
    and checked against its checkpoint or engine as :class:`~trtllm_bole.LLM` checks them before any
    weight loads, before tritonserver starts: a bad value stops the launcher at once, not after the
    model's weights load and its warm-up (minutes on a GPU), as an error deep in tritonserver's log."""
    from pydantic import ValidationError

    from trtllm_bole.config import one_line
    from trtllm_bole.llm import resolve_settings  # torch: only once the flags parse
    from trtllm_bole.serving.protocol import engine_kwargs, llm_kwargs

    flags = {
        "mode": "--mode", "max_depth": "--max-depth", "max_nodes": "--max-nodes", "top_k": "--draft-top-k"
    }  # fmt: skip
    try:
        resolve_settings(**llm_kwargs(values, values["instance_kind"], names=flags))
        engine_kwargs(values)
    except ValidationError as e:  # the speculative config's fields
        raise SystemExit(f"error: {one_line(e, flags)}") from None
    except ValueError as e:  # "model parameter NAME must be ..."
        raise SystemExit(f"error: {e}") from None


def template_values(args: argparse.Namespace, drain_file: Path) -> dict[str, str]:
    """What the launcher fills the repository's templates with: the model's parameters and its drain file."""
    return {"drain_file": str(drain_file), **model_parameters(args)}


def model_parameters(args: argparse.Namespace) -> dict[str, str]:
    return {
        # Triton's own batch bound: each request carries one prompt, so any value >= 1 serves.
        "triton_max_batch_size": str(args.max_batch_size or 64),
        "instance_kind": args.instance_kind,
        "engine_dir": str(Path(args.engine_dir).resolve()) if args.engine_dir else "",
        "speculative_mode": args.mode,
        "max_depth": args.max_depth,
        "max_nodes": args.max_nodes,
        "draft_top_k": args.draft_top_k,
        "max_batch_size": str(args.max_batch_size or ""),
        "max_seq_len": args.max_seq_len,
        "kv_cache_tokens": args.kv_cache_tokens,
        "max_prefill_tokens": args.max_prefill_tokens,
        "max_queue_size": args.max_queue_size,
        "device": args.device,
        "dtype": args.dtype,
    }


def check_args(args: argparse.Namespace) -> None:
    """The launcher's own flags, refused before anything starts."""
    if not 0 <= args.drain_grace <= 3600:
        raise SystemExit(f"error: --drain-grace must lie in [0, 3600] seconds, got {args.drain_grace}")
    if not 0 < args.ready_timeout <= 86400:  # nan or <= 0 failed at once as "not ready within nan s"
        raise SystemExit(f"error: --ready-timeout must lie in (0, 86400] seconds, got {args.ready_timeout}")
    if not 0 <= args.engine_watch <= 3600:
        raise SystemExit(f"error: --engine-watch must lie in [0, 3600] seconds, got {args.engine_watch}")
    if args.max_batch_size is not None and args.max_batch_size < 1:  # 0 used to serve the default batch
        raise SystemExit(f"error: --max-batch-size must be at least 1, got {args.max_batch_size}")
    if args.engine_dir and not Path(args.engine_dir).is_dir():  # else a line deep in tritonserver's log
        raise SystemExit(f"error: --engine-dir {args.engine_dir} is not a directory")
    for flag, port, least in (("--http-port", args.http_port, 0), ("--grpc-port", args.grpc_port, 0),
                              ("--metrics-port", args.metrics_port, -1)):  # fmt: skip
        if not least <= port <= 65535:
            none = ", -1: none" if least < 0 else ""
            raise SystemExit(
                f"error: {flag} must lie in [{least}, 65535] (0: any free port{none}), got {port}"
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    if not args.prepare_only:
        ports = {
            "--http-port": args.http_port,
            "--grpc-port": args.grpc_port,
            "--metrics-port": args.metrics_port,
        }
        check_ports_free({flag: port for flag, port in ports.items() if port > 0})
        if args.model_repository is None:  # one served as it is holds its own parameters
            check_model_parameters(model_parameters(args))
    root = triton_root()
    server_dir = prepare_server_env(args.server_env or default_server_env_dir(), root)
    if args.prepare_only:
        print(f"server environment ready: {server_dir}")
        return 0
    repository = args.model_repository.resolve() if args.model_repository is not None else None
    drain_file = repository_drain_file(repository) if repository is not None else None
    workdir = Path(tempfile.mkdtemp(prefix="bole-triton-")) if args.workdir is None else args.workdir
    if repository is not None:
        hold(repository, "--model-repository")
    elif args.workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        hold(workdir, "--workdir")
    if repository is None:
        drain_file = (workdir / "drain").resolve()  # the model's process has another working directory
        repository = make_repository(workdir / "model_repository", template_values(args, drain_file))
    asked = (args.http_port, args.grpc_port, None if args.metrics_port < 0 else args.metrics_port)
    drawn = iter(free_ports(asked.count(0)))  # port 0: any free one
    ports = tuple(next(drawn) if port == 0 else port for port in asked)
    shm_prefix = f"bole{os.getpid()}_"
    exit_timeout = math.ceil(args.drain_grace) + 10  # Triton's wait for in-flight requests
    command = server_command(root, server_dir, repository, ports, log_verbose=args.log_verbose,
                             shm_prefix=shm_prefix, exit_timeout=exit_timeout)  # fmt: skip
    try:
        return serve(command, server_env(server_dir, root), ports, repository, args.ready_timeout,
                     drain=(drain_file, args.drain_grace), stop_timeout=exit_timeout + 20,
                     engine_watch=args.engine_watch)  # fmt: skip
    finally:
        for leftover in Path("/dev/shm").glob(f"{shm_prefix}*"):  # left behind when a stub dies
            leftover.unlink(missing_ok=True)
        if drain_file is not None:  # a --workdir outlives the server: leave no drain request in it
            drain_file.unlink(missing_ok=True)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def hold(directory: Path, flag: str) -> None:
    """Lock ``directory`` for this launcher's life (the lock goes with the process). Two launchers on one
    directory share its drain file, so stopping one drained and stopped the other too; a second one now
    stops before it starts anything."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)  # left open: the lock lasts while it is
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(
            f"error: {flag} {directory} is in use by another launcher (their drain file would be one: "
            "stopping either would stop both); give each server its own"
        ) from None


def serve(
    command: list[str],
    env: dict[str, str],
    ports: tuple[int, int, int | None],
    repository: Path,
    ready_timeout: float,
    *,
    drain: tuple[Path | None, float],
    stop_timeout: float,
    engine_watch: float = 0.0,
) -> int:
    """Run the server until it exits or we are told to stop (then drain and stop it); its exit code,
    1 if it had to be killed or its engine stopped unasked (:func:`wait_serving`)."""
    stop_flag = StopFlag()
    stop_flag.install()
    # In the launcher's process group: a signal to the group (a terminal, a supervisor, a test runner's
    # timeout) reaches tritonserver and the model's process too.
    process = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent)
    http_port, grpc_port, metrics_port = ports
    engine_stopped = False
    try:
        seconds = wait_ready(process, http_port, ready_timeout, stop_flag)
        if seconds is not None:  # else a stop was asked before the server was ready
            print(
                f"tritonserver ready in {seconds:.1f} s (pid {process.pid}); "
                f"model {MODEL!r} from {repository}\n"
                f"  gRPC  127.0.0.1:{grpc_port}\n"
                f"  HTTP  http://127.0.0.1:{http_port}/v2/models/{MODEL}/generate (and /generate_stream)"
                + ("" if metrics_port is None else f"\n  metrics  http://127.0.0.1:{metrics_port}/metrics"),
                flush=True,
            )
            wait_serving(process, metrics_port, engine_watch, stop_flag)
    except EngineStopped:
        engine_stopped = True
        print(
            "error: the model's engine stopped taking requests (its thread failed, it was drained without "
            f"the launcher, or its process died or hangs: no heartbeat for {HEARTBEAT_STALE_S:g} s): "
            "stopping tritonserver so that it can be restarted",
            file=sys.stderr,
            flush=True,
        )
    except (RuntimeError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        stop(process, stop_timeout)
        return 1
    drain_file, grace = drain
    if (stop_flag.asked or engine_stopped) and drain_file is not None and process.poll() is None:
        try:  # an engine stopped unasked ends what it still holds at once (a hung one reads nothing)
            request_drain(drain_file, grace if stop_flag.asked else 0.0)
        except OSError as e:  # the server is stopped all the same, without the grace
            warning = f"warning: could not write the drain file ({e}); stopping without draining"
            print(warning, file=sys.stderr, flush=True)
    code = stop(process, stop_timeout)
    if code is None:
        print(f"error: tritonserver did not stop within {stop_timeout:.0f} s and was killed", file=sys.stderr,
              flush=True)  # fmt: skip
    else:
        print(f"tritonserver stopped (exit code {code})", flush=True)
    if stop_flag.asked and code in (None, 1):
        print(
            "note: Triton 2.51 exits 1 (or hangs) when its stop outlasts its exit timeout (the drain's grace "
            "+ 10 s), as an HTTP client holding an idle keep-alive connection or a gRPC client holding its "
            "stream open makes it: it waits for every HTTP connection and gRPC stream to close before it "
            "unloads the model",
            file=sys.stderr,
            flush=True,
        )
    if code is None:
        return 1
    if stop_flag.asked and code == -signal.SIGTERM:  # a stop during the model's load: what was asked
        return 0
    return 1 if engine_stopped or code < 0 else code


if __name__ == "__main__":
    raise SystemExit(main())
