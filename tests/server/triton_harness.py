"""A real tritonserver for tests: started through triton_server/launch.py on free loopback ports and
stopped (and checked gone) by :func:`stop_server`; ``conftest.py`` attaches its log to failing tests."""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "triton_server" / "launch.py"
# launch.py, client.py and fill_template.py are scripts, not a package: importable by the tests.
sys.path.insert(0, str(LAUNCH.parent))
from launch import free_ports  # noqa: E402  (after the path it is found on)

MISSING = [name for name in ("pytriton", "tritonclient") if importlib.util.find_spec(name) is None]
needs_server = pytest.mark.skipif(
    bool(MISSING),
    reason=f"{', '.join(MISSING)} not installed: pip install --no-deps nvidia-pytriton==0.7.0 and "
    "tritonclient[grpc,http] (README, Serving with Triton)",
)


@dataclass
class Server:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path
    ready_s: float = 0.0

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def metrics(self) -> str:
        """Triton's Prometheus endpoint, as text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(line for line in text.splitlines() if not line.startswith(("+", "|")))[
            -lines * 200 :
        ]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics_listening(self) -> bool:
        """Whether the metrics endpoint accepts connections: tritonserver starts it after the HTTP
        endpoint, so a server :meth:`ready` over HTTP may still refuse a scrape for a moment."""
        try:
            socket.create_connection(("127.0.0.1", self.metrics_port), timeout=2).close()
            return True
        except OSError:
            return False


def free_port() -> int:
    return free_ports(1)[0]


def start_server(workdir: Path, args: list[str], timeout: float = 120.0) -> Server:
    # The stub's NumPy-1 environment is made once, outside the timed start.
    subprocess.run([sys.executable, str(LAUNCH), "--prepare-only"], check=True, timeout=600)
    http_port, grpc_port, metrics_port = free_ports(3)
    log = workdir / "server.log"
    command = [sys.executable, str(LAUNCH), "--http-port", str(http_port), "--grpc-port", str(grpc_port),
               "--metrics-port", str(metrics_port), "--workdir", str(workdir), *args]  # fmt: skip
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, http_port, grpc_port, metrics_port, log)
    while not (server.ready() and server.metrics_listening()):
        if process.poll() is not None or time.monotonic() - start > timeout:
            stop_server(server)
            pytest.fail(f"tritonserver did not become ready:\n{server.log_tail()}")
        time.sleep(0.1)
    server.ready_s = time.monotonic() - start
    return server


def stop_server(server: Server) -> None:
    """SIGTERM the launcher; it must stop tritonserver cleanly (exit 0) and leave no process behind."""
    process = server.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the launcher did not stop within 60 s:\n{server.log_tail()}")
    log = server.log.read_text(errors="replace")
    assert process.returncode == 0, f"launcher exit code {process.returncode}:\n{server.log_tail()}"
    assert "tritonserver stopped (exit code 0)" in log, server.log_tail()
    pid = int(log.split("(pid ")[1].split(")")[0]) if "(pid " in log else None
    if pid is not None:
        assert not os.path.exists(f"/proc/{pid}"), f"tritonserver {pid} outlived its launcher"


def error_of(url: str, inputs, within_s: float = 120.0) -> str:
    """The error reply's message. The reply must also end the stream: the client closes its stream only
    after the server's final flag, so an error sent without it would hang every client (checked here in
    ``within_s``, not by the runner's timeout)."""
    from client import stream
    from tritonclient.utils import InferenceServerException

    ended: list = []

    def request() -> None:
        try:
            list(stream(url, inputs, timeout=within_s))
            ended.append(None)
        except InferenceServerException as e:
            ended.append(e)

    worker = threading.Thread(target=request, daemon=True)  # a hung stream must not hold pytest's exit
    worker.start()
    worker.join(within_s + 10)
    assert ended, (
        f"the stream did not end within {within_s:g} s of its request (an error without the final flag?)"
    )
    assert ended[0] is not None, "the request was served, not refused"
    return ended[0].message()
