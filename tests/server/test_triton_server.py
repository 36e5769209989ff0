"""The Bole model behind a real tritonserver, queried by stock tritonclient (gRPC streaming) and
over HTTP: exact greedy tokens, batched concurrency, cancellation, bad input, clean shutdown."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from triton_harness import LAUNCH, ROOT, error_of, free_port, needs_server, start_server, stop_server

from trtllm_bole import LLM, BoleConfig, SamplingParams

pytestmark = [needs_server, pytest.mark.slow]

# A small draft tree keeps CPU steps short; the reference LLM runs the same scheme.
BOLE = BoleConfig(mode="bole", max_depth=4, max_nodes=8, top_k=2)
MAX_BATCH, MAX_SEQ_LEN = 16, 256
SERVER_ARGS = ["--mode", "bole", "--max-depth", "4", "--max-nodes", "8", "--draft-top-k", "2",
               "--max-batch-size", str(MAX_BATCH), "--max-seq-len", str(MAX_SEQ_LEN)]  # fmt: skip
PROMPTS = [
    "def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n", "import os\nimport sys\n\n",
    "def read_json(path):\n", "for i in range(10):\n", "def is_prime(n):\n    if n < 2:\n",
    "class Point:\n", "def main():\n    args = ", "with open(path) as f:\n", "def merge(a, b):\n",
    "try:\n    import numpy as np\n", "def __repr__(self):\n", "if __name__ == '__main__':\n",
    "def flatten(items):\n", "x = [i * i for i in", "def parse_args(argv=None):\n",
]  # fmt: skip
CONTEXT_LIMIT = MAX_SEQ_LEN - 1  # prompt + output, in every mode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("triton"), SERVER_ARGS)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def llm():
    return LLM(speculative_config=BOLE, max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ_LEN)


def generate(url: str, prompt: str | None = None, ids: list[int] | None = None, **params) -> dict:
    """Stream one request to the end: its ids, text, final chunk and timings."""
    from client import build_inputs, stream

    start = time.perf_counter()
    chunks, first = [], None
    for chunk in stream(url, build_inputs(prompt, ids, **params), timeout=300):
        first = first or time.perf_counter() - start
        chunks.append(chunk)
    return {
        "ids": [t for c in chunks for t in c.token_ids],
        "text": "".join(c.text for c in chunks),
        "final": chunks[-1],
        "chunks": len(chunks),
        "first_s": first,
        "total_s": time.perf_counter() - start,
    }


def test_server_starts_within_30_seconds(server):
    print(f"tritonserver start to ready: {server.ready_s:.1f} s")
    assert server.ready_s < 30
    published = bole_samples(server)  # before the server reports ready
    assert published["bole_request_metrics", "max"] == MAX_BATCH
    assert published["bole_engine_status", "serving"] == 1


def test_grpc_stream_returns_llm_generate_tokens(server, llm):
    params = SamplingParams(max_tokens=24)
    expected = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    got = generate(server.grpc_url, PROMPTS[0], max_tokens=24)
    assert got["ids"] == expected.token_ids
    assert got["text"] == expected.text
    assert got["chunks"] > 1  # streamed, not one response
    final = got["final"]
    assert final.final and final.finish_reason == "length"
    assert final.stats["total_draft_tokens"] > 0
    assert 0 <= final.stats["acceptance_rate"] <= 1 and final.stats["mean_accepted_tokens"] >= 1


def test_grpc_stream_with_token_ids(server, llm):
    ids = llm.encode(PROMPTS[1])
    expected = llm.generate([ids], SamplingParams(max_tokens=16), use_tqdm=False)[0].outputs[0]
    got = generate(server.grpc_url, ids=ids, max_tokens=16)
    assert got["ids"] == expected.token_ids


def bole_samples(server) -> dict[tuple[str, str], float]:
    """The engine's samples on Triton's metrics endpoint, by (family, its label's value)."""
    from trtllm_bole.serving.metrics import FAMILIES

    label = {f.name: f.label for f in FAMILIES}
    found = {}
    for line in server.metrics().splitlines():
        if match := re.fullmatch(r"(bole_\w+)\{([^}]*)\} (\S+)", line):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            assert (labels["model"], labels["version"]) == ("bole", "1"), line
            if match[1] in label:
                found[match[1], labels[label[match[1]]]] = float(match[3])
    return found


def settled_samples(server) -> dict[tuple[str, str], float]:
    """The engine's samples once nothing runs and two scrapes a publication apart agree (the requests of
    earlier tests all counted)."""
    deadline = time.monotonic() + 15
    now = bole_samples(server)
    while True:
        time.sleep(1.2)  # the model publishes every second
        before, now = now, bole_samples(server)
        if now == before and now["bole_request_metrics", "active"] == 0:
            return now
        assert time.monotonic() < deadline, "the engine's metrics never settled"


def histogram_counts(server) -> dict[tuple[str, str], float]:
    """Observations so far of the engine's latency histograms, by (family, its label's value)."""
    from trtllm_bole.serving.metrics import HISTOGRAMS

    found = {}
    for h in HISTOGRAMS:
        for line in server.metrics().splitlines():
            if match := re.fullmatch(rf'{h.name}_count\{{[^}}]*{h.label}="(\w+)"[^}}]*\}} (\S+)', line):
                found[h.name, match[1]] = float(match[2])
    return found


def test_metrics_count_a_requests_tokens_and_drafts(server, llm):
    """Triton's metrics endpoint serves its own request counters and every sample of the engine's
    families; once a request has ended its tokens and drafts are in the totals, its latencies in the
    histograms and its KV blocks free."""
    from trtllm_bole.serving.engine import EngineStats
    from trtllm_bole.serving.metrics import samples

    before = settled_samples(server)
    counted = histogram_counts(server)  # observed before the counters of the same requests
    assert before.keys() == samples(EngineStats()).keys()
    assert before["bole_request_metrics", "max"] == MAX_BATCH
    got = generate(server.grpc_url, PROMPTS[3], max_tokens=16)
    final = got["final"]

    def grown(family: str, value: str) -> float:
        return after[family, value] - before[family, value]

    deadline = time.monotonic() + 10  # the model publishes every second
    while (after := bole_samples(server))["bole_finished_requests", "length"] == before[
        "bole_finished_requests", "length"
    ]:
        assert time.monotonic() < deadline, "the request's end never reached the metrics"
        time.sleep(0.2)
    assert grown("bole_token_metrics", "generated") == len(got["ids"]) == 16
    assert grown("bole_token_metrics", "prompt") == len(llm.encode(PROMPTS[3]))
    assert grown("bole_spec_decode_metrics", "draft_tokens") == final.stats["total_draft_tokens"] > 0
    assert (
        grown("bole_spec_decode_metrics", "accepted_draft_tokens")
        == final.stats["total_accepted_draft_tokens"]
    )
    assert grown("bole_iteration_metrics", "steps") >= grown("bole_spec_decode_metrics", "verify_steps") > 0
    assert after["bole_kv_cache_block_metrics", "used"] == after["bole_request_metrics", "active"] == 0
    grew = {key: value - counted.get(key, 0) for key, value in histogram_counts(server).items()}
    assert grew == {
        ("bole_request_latency_seconds", "first_token"): 1,
        ("bole_request_latency_seconds", "total"): 1,
        ("bole_time_per_output_token_seconds", "generated"): 1,
    }
    assert 'nv_inference_request_success{model="bole",version="1"}' in server.metrics()


def test_sixteen_concurrent_streams_are_batched(server, llm):
    params = SamplingParams(max_tokens=16)
    expected = [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    one = generate(server.grpc_url, PROMPTS[0], max_tokens=16)["total_s"]
    results: list = [None] * len(PROMPTS)

    def client(i: int) -> None:
        results[i] = generate(server.grpc_url, PROMPTS[i], max_tokens=16)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    wall = time.perf_counter() - start
    print(f"one request {one:.2f} s; 16 concurrent {wall:.2f} s ({wall / one:.1f}x one request)")
    assert [r["ids"] for r in results] == [e.token_ids for e in expected]
    assert [r["text"] for r in results] == [e.text for e in expected]
    assert [r["final"].finish_reason for r in results] == [e.finish_reason for e in expected]
    assert wall < 16 * one / 2, f"16 clients took {wall:.1f} s, one alone {one:.1f} s: not batched"


def test_cancelled_stream_frees_its_slot(server):
    from client import build_inputs, stream

    long = stream(server.grpc_url, build_inputs(PROMPTS[2], max_tokens=CONTEXT_LIMIT - 16))
    for i, _ in enumerate(long):
        if i == 2:
            break
    long.close()  # stop_stream(cancel_requests=True)
    # A burst that needs every slot: had the cancelled request kept its slot (it had ~200 tokens to
    # go), the last of these would only start after another one finished.
    results: list = [None] * MAX_BATCH

    def client(i: int) -> None:  # end_id -1: no end token, so every request runs its 24 tokens
        results[i] = generate(server.grpc_url, PROMPTS[i], max_tokens=24, end_id=-1)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(MAX_BATCH)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    firsts = [start + r["first_s"] for r in results]
    finals = [start + r["total_s"] for r in results]
    assert all(len(r["ids"]) == 24 for r in results)
    assert max(firsts) < min(finals), "a request of the burst waited for a slot"
    assert server.ready()


def test_bad_requests_get_errors_while_others_are_served(server, llm):
    import tritonclient.grpc as grpcclient
    from client import build_inputs

    def raw(name: str, array: np.ndarray, datatype: str):
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return tensor

    good: dict = {}
    worker = threading.Thread(
        target=lambda: good.update(generate(server.grpc_url, PROMPTS[3], max_tokens=24))
    )
    worker.start()
    url = server.grpc_url
    cases = {
        "missing prompt": (build_inputs(max_tokens=4), "got neither"),
        "two prompts": (build_inputs("a", [1, 2], max_tokens=4), "got both"),
        "wrong dtype": (
            [*build_inputs("a"), raw("max_tokens", np.array([[4.0]], np.float32), "FP32")],
            "expects 'INT32'",
        ),
        "unknown input": (
            [*build_inputs("a"), raw("prompt", np.array([[1]], np.int32), "INT32")],
            "unexpected",
        ),
        "empty prompt": (build_inputs("", max_tokens=4), "empty prompt"),
        "empty ids": (build_inputs(ids=[], max_tokens=4), "empty prompt"),
        "max_tokens 0": (build_inputs("a", max_tokens=0), "max_tokens"),
        "max_tokens too large": (build_inputs("a", max_tokens=100_000), "max_tokens 100000 is out of range"),
        "prompt too long": (build_inputs(ids=[1] * CONTEXT_LIMIT, max_tokens=1), "too long"),  # no room left
        "ids outside the vocabulary": (build_inputs(ids=[1, 10**6], max_tokens=4), "outside the vocabulary"),
        "negative temperature": (build_inputs("a", temperature=-1.0), "temperature"),
        "two prompts in a batch": (
            [raw("text_input", np.array([[b"a"], [b"b"]], dtype=np.object_), "BYTES")],
            "one prompt per request",
        ),
    }
    tritons_own = {"wrong dtype", "unknown input"}  # refused before the model sees them
    invalid_before = bole_samples(server)["bole_rejected_requests", "invalid"]
    for case, (inputs, words) in cases.items():
        message = error_of(url, inputs)
        assert words in message, f"{case}: {message}"
        assert case in tritons_own or "[INVALID_ARG] " in message, f"{case}: {message}"
        assert server.ready(), f"server unhealthy after {case}"
    # Triton counts each as a success (its model answered); the engine's metrics count the model's refusals.
    refused = len(cases) - len(tritons_own)
    deadline = time.monotonic() + 10  # the model publishes every second
    while (counted := bole_samples(server)["bole_rejected_requests", "invalid"] - invalid_before) < refused:
        assert time.monotonic() < deadline, f"{counted} of {refused} refusals counted"
        time.sleep(0.2)
    assert counted == refused
    worker.join(300)
    expected = llm.generate([PROMPTS[3]], SamplingParams(max_tokens=24), use_tqdm=False)[0].outputs[0]
    assert good["ids"] == expected.token_ids
    assert generate(url, PROMPTS[4], max_tokens=4)["final"].finish_reason == "length"


def post(url: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_generate_and_generate_stream(server, llm):
    expected = llm.generate([PROMPTS[5]], SamplingParams(max_tokens=16), use_tqdm=False)[0].outputs[0]
    base = f"{server.http_url}/v2/models/bole"
    status, body = post(f"{base}/generate", {"text_input": PROMPTS[5], "max_tokens": 16})
    assert status == 200, body
    reply = json.loads(body)
    assert reply["text_output"] == expected.text and reply["output_ids"] == expected.token_ids
    assert reply["finish_reason"] == "length" and reply["total_draft_tokens"] > 0

    status, body = post(
        f"{base}/generate_stream", {"text_input": PROMPTS[5], "max_tokens": 16, "stream": True}
    )
    assert status == 200, body
    events = [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected.text
    ids = [t for e in events for t in np.atleast_1d(e["output_ids"]).tolist()]
    assert ids == expected.token_ids

    status, body = post(f"{base}/generate", {"text_input": PROMPTS[5], "parameters": {"max_tokens": 0}})
    error = json.loads(body)["error"]
    assert status == 400 and "[INVALID_ARG] " in error and "max_tokens" in error, body


def test_client_cli(server, llm):
    expected = llm.generate([PROMPTS[6]], SamplingParams(max_tokens=8), use_tqdm=False)[0].outputs[0]
    client = [sys.executable, str(ROOT / "triton_server" / "client.py"), "--url", server.grpc_url]
    done = subprocess.run(
        [*client, "--prompt", PROMPTS[6], "--max-tokens", "8"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == expected.text.rstrip("\n")
    assert "finish: length" in done.stderr and "mean accepted tokens per step" in done.stderr
    # A proxy that answers nothing: a loopback server is reached without it (gRPC had sent it there).
    proxied = {**os.environ, "http_proxy": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}
    done = subprocess.run(
        [*client, "--prompt", PROMPTS[6], "--max-tokens", "8"], capture_output=True, text=True, env=proxied
    )
    assert done.returncode == 0 and done.stdout.rstrip("\n") == expected.text.rstrip("\n"), done.stderr
    bad = subprocess.run([*client, "--prompt", "x", "--max-tokens", "0"], capture_output=True, text=True)
    assert bad.returncode == 1 and "error: [INVALID_ARG] max_tokens" in bad.stderr
    nobody = [
        sys.executable,
        str(ROOT / "triton_server" / "client.py"),
        "--url",
        "127.0.0.1:9",
        "--prompt",
        "x",
    ]
    unreachable = subprocess.run(nobody, capture_output=True, text=True)
    assert (
        unreachable.returncode == 1 and "error: no Triton server answers at 127.0.0.1:9" in unreachable.stderr
    )
    wrong = subprocess.run([*client, "--model", "llama", "--prompt", "x"], capture_output=True, text=True)
    assert wrong.returncode == 1 and "has no ready model 'llama'" in wrong.stderr


def test_a_second_launcher_on_a_served_workdir_is_refused(server):
    """Two launchers on one --workdir shared its drain file: stopping one drained and stopped the other
    too (whose engine then reported stopping unasked). The second stops before it writes anything."""
    workdir = server.log.parent
    ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1"]
    run = subprocess.run([sys.executable, str(LAUNCH), "--workdir", str(workdir), *SERVER_ARGS, *ports],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert f"error: --workdir {workdir} is in use by another launcher" in run.stderr, run.stderr
    assert "tritonserver" not in run.stdout and server.ready()


def test_a_repository_without_a_batch_dimension_fails_to_load_by_name(tmp_path):
    """``max_batch_size: 0`` (a repository served as is; fill_template refuses it) loaded, reported ready and
    refused every request for its shape; the model's initialize now refuses it, and tritonserver stops."""
    import launch

    values = launch.template_values(launch.parse_args(SERVER_ARGS), tmp_path / "drain")
    repository = launch.make_repository(tmp_path / "repository", values)
    config = repository / "bole" / "config.pbtxt"
    config.write_text(re.sub(r"(?m)^max_batch_size: \d+$", "max_batch_size: 0", config.read_text()))
    # It fails in ~10 s; loaded, it would serve on until the timeout.
    ports = ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", "-1"]
    run = subprocess.run([sys.executable, str(LAUNCH), "--model-repository", str(repository), *ports],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:]
    assert (
        "max_batch_size 0: the bole model reads its inputs with a batch dimension" in run.stdout + run.stderr
    )


@pytest.mark.parametrize("repository", ["filled", "served as is"])
def test_stopping_the_server_drains_requests_in_flight(tmp_path, repository):
    """SIGTERM while a request streams: it gets the drain grace, then UNAVAILABLE ("shut down"), so that
    Triton unloads the model and stops by itself with 0 (it used to wait for the request, give up,
    and be killed while the launcher still exited 0). A repository served as it is
    (``--model-repository``) drains through its own ``drain_file`` parameter."""
    import launch
    from client import build_inputs, stream
    from tritonclient.utils import InferenceServerException

    args = [a if a != str(MAX_SEQ_LEN) else "2048" for a in SERVER_ARGS]
    if repository == "served as is":
        values = launch.template_values(launch.parse_args(args), tmp_path / "its-drain")
        args = ["--model-repository", str(launch.make_repository(tmp_path / "repository", values))]
    server = start_server(tmp_path, [*args, "--drain-grace", "0.5"])
    chunks, errors, streaming = [], [], threading.Event()

    def client() -> None:  # 2,000 tokens: a minute on CPU
        try:
            for chunk in stream(server.grpc_url, build_inputs(PROMPTS[0], max_tokens=2000, end_id=-1)):
                chunks.append(chunk)
                streaming.set()
        except InferenceServerException as e:
            errors.append(e.message())
        finally:
            streaming.set()

    thread = threading.Thread(target=client)
    thread.start()
    assert streaming.wait(120) and not errors, errors
    start = time.monotonic()
    stop_server(server)  # the launcher and tritonserver exit 0, nothing outlives them
    thread.join(60)
    assert time.monotonic() - start < 20, server.log_tail()
    assert errors and "[UNAVAILABLE] the serving engine shut down" in errors[0], errors
    assert 0 < sum(len(c.token_ids) for c in chunks) < 2000


def test_an_engine_that_stops_serving_unasked_stops_the_server(tmp_path):
    """The engine's gauge drops to 0 without the launcher asking (here: someone else writes the drain
    file; a failed engine thread reads the same): the launcher stops tritonserver, which Triton would
    otherwise keep reporting ready while it refuses every request, and exits 1 for its supervisor."""
    import launch
    from client import build_inputs

    server = start_server(tmp_path, SERVER_ARGS)
    try:
        assert bole_samples(server)["bole_engine_status", "serving"] == 1
        launch.request_drain(tmp_path / "drain", 0.0)
        server.process.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher kept serving a stopped engine:\n{server.log_tail()}")
    finally:
        if server.process.poll() is None:
            stop_server(server)
    log = server.log.read_text(errors="replace")
    assert server.process.returncode == 1, server.log_tail()
    assert "error: the model's engine stopped taking requests" in log and "tritonserver stopped" in log, log
    pid = int(log.split("(pid ")[1].split(")")[0])
    assert not Path(f"/proc/{pid}").exists() and not server.ready()
    assert "no Triton server answers" in error_of(server.grpc_url, build_inputs(PROMPTS[0], max_tokens=1))


def _model_processes(pid: int) -> list[int]:
    """The Python backend's stub processes below ``pid`` (Linux /proc)."""
    import launch

    return [p for p, _ in launch.process_tree(pid) if b"python_backend_stub" in _cmdline(p)]


def test_an_idle_http_connection_holds_the_stop_and_the_launcher_says_why(tmp_path):
    """Triton 2.51 waits for every HTTP connection to close before it unloads the model: one client's idle
    keep-alive connection runs its stop out of its exit timeout (the grace + 10 s), and it exits 1 with the
    model never finalized. The launcher says why, and kills the model's process where Triton left it
    running (it does about every other time)."""
    server = start_server(tmp_path, [*SERVER_ARGS, "--drain-grace", "0"])
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as idle:
        idle.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200"), server.log_tail()
        stubs = _model_processes(server.process.pid)
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(60)
        finally:
            if server.process.poll() is None:
                server.process.kill()
    log = server.log.read_text(errors="replace")
    assert server.process.returncode == 1 and "tritonserver stopped (exit code 1)" in log, server.log_tail()
    assert "an HTTP client holding an idle keep-alive connection" in log, server.log_tail()
    import launch

    running = [s for s in stubs if (stat := launch._proc_stat(s)) is not None and stat[0] != "Z"]
    assert stubs and not running, (stubs, server.log_tail())


def test_a_dead_model_process_stops_the_server(tmp_path):
    """The model's process killed (as for its memory) with a request streaming: Triton keeps reporting the
    model ready with its last samples, and the request never ended (its client waited out its timeout).
    The heartbeat goes stale, the launcher stops tritonserver and exits 1, and the request ends with an
    error once the server is gone."""
    from client import build_inputs, stream

    server = start_server(tmp_path, SERVER_ARGS)
    ended: list[str] = []
    first = threading.Event()

    def request() -> None:
        try:
            inputs = build_inputs(PROMPTS[0], max_tokens=MAX_SEQ_LEN - 32, end_id=-1)
            for _ in stream(server.grpc_url, inputs, timeout=300):
                first.set()
            ended.append("finished")
        except Exception as e:  # any error ends it: which one, the server's stop decides
            ended.append(f"error: {e}")
        finally:
            first.set()

    streaming = threading.Thread(target=request)
    try:
        assert bole_samples(server)["bole_engine_status", "serving"] == 1
        (stub,) = _model_processes(server.process.pid)  # the launcher's
        streaming.start()
        assert first.wait(60)  # killed mid-stream (a fixed 2 s was the whole request on an idle CPU)
        os.kill(stub, signal.SIGKILL)
        server.process.wait(launch_timeout := 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher kept serving a dead model for {launch_timeout} s:\n{server.log_tail()}")
    finally:
        if server.process.poll() is None:
            stop_server(server)
    streaming.join(60)
    assert server.process.returncode == 1, server.log_tail()
    assert "error: the model's engine stopped taking requests" in server.log.read_text(errors="replace")
    assert ended and ended[0].startswith("error"), ended


def test_signals_during_the_launcher_s_own_stop_do_not_cut_it_short(tmp_path):
    """SIGTERM and SIGINT while the launcher stops a server whose engine stopped unasked (a request in
    flight keeps tritonserver up through the drain's grace): the stop runs to its end, exit 1, no
    traceback (the handler raised KeyboardInterrupt into that stop)."""
    import signal

    import launch
    from client import build_inputs, stream
    from tritonclient.utils import InferenceServerException

    server = start_server(tmp_path, [a if a != str(MAX_SEQ_LEN) else "2048" for a in SERVER_ARGS])
    streaming = threading.Event()

    def client() -> None:  # 2,000 tokens: a minute on CPU
        try:
            for _ in stream(server.grpc_url, build_inputs(PROMPTS[0], max_tokens=2000, end_id=-1)):
                streaming.set()
        except InferenceServerException:
            pass  # ended by the drain
        finally:
            streaming.set()

    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert streaming.wait(120), server.log_tail()
        launch.request_drain(tmp_path / "drain", 3.0)  # not the launcher's doing
        deadline = time.monotonic() + 30
        while "error: the model's engine stopped taking requests" not in server.log.read_text(
            errors="replace"
        ):
            assert time.monotonic() < deadline and server.process.poll() is None, server.log_tail()
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        server.process.send_signal(signal.SIGINT)
        server.process.wait(60)
    finally:
        if server.process.poll() is None:
            server.process.kill()
        thread.join(60)
    log = server.log.read_text(errors="replace")
    assert server.process.returncode == 1 and "Traceback" not in log, server.log_tail()
    assert "tritonserver stopped (exit code 0)" in log, server.log_tail()


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_a_stop_while_the_model_loads_exits_0(tmp_path, signum):
    """SIGTERM before the server is ready: tritonserver, still loading the model, dies of the SIGTERM the
    launcher forwards (-15); that stop was asked for, so the launcher exits 0 (it exited 1). SIGHUP (the
    launcher's terminal closed) stops it the same way: it used to end the launcher unhandled, leaving its
    temporary repository behind."""
    import signal

    log = tmp_path / "launch.log"
    args = ["--workdir", str(tmp_path), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, str(LAUNCH), *args], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while '"loading: bole:1"' not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text(errors="replace")
            time.sleep(0.05)
        launcher.send_signal(getattr(signal, signum))
        assert launcher.wait(60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = log.read_text(errors="replace")
    assert "tritonserver stopped (exit code" in text and "Traceback" not in text, text[-3000:]


def test_a_full_queue_refuses_a_request_with_unavailable(tmp_path):
    """``--max-queue-size 1`` with a batch of one: while one request streams and one waits, a third is
    refused with UNAVAILABLE and counted; the waiting one runs once the first is cancelled."""
    from client import build_inputs, stream

    args = [*SERVER_ARGS[:-4], "--max-batch-size", "1", "--max-seq-len", "2048", "--max-queue-size", "1"]
    server = start_server(tmp_path, args)
    try:
        first = stream(server.grpc_url, build_inputs(PROMPTS[0], max_tokens=2000, end_id=-1))
        next(first)  # running
        waiting: list = []
        thread = threading.Thread(
            target=lambda: waiting.append(generate(server.grpc_url, PROMPTS[1], max_tokens=4))
        )
        thread.start()
        deadline = time.monotonic() + 30
        while bole_samples(server)["bole_request_metrics", "waiting"] < 1:
            assert time.monotonic() < deadline, "the second request never waited"
            time.sleep(0.2)
        refused = error_of(server.grpc_url, build_inputs(PROMPTS[2], max_tokens=4))
        assert (
            "[UNAVAILABLE] the serving engine's queue is full: 1 of max_queue_size 1 waiting for a place"
            in refused
        )
        first.close()  # cancelled: the waiting request takes its place
        thread.join(120)
        assert waiting and waiting[0]["final"].finish_reason == "length" and len(waiting[0]["ids"]) == 4
        deadline = time.monotonic() + 10  # the model publishes every second
        while bole_samples(server)["bole_rejected_requests", "queue_full"] < 1:
            assert time.monotonic() < deadline, "the refusal never reached the metrics"
            time.sleep(0.2)
        assert bole_samples(server)["bole_rejected_requests", "queue_full"] == 1
    finally:
        stop_server(server)


@pytest.mark.parametrize("ids", ["", "1,,2", "a"])
def test_client_refuses_malformed_ids_by_name(ids, capsys):
    from client import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--ids", ids])
    assert exit_info.value.code == 2 and "--ids takes comma-separated integers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--seed", "-1"], "random_seed -1 does not fit the tensor's uint64: send a value in [0, "),
        (["--max-tokens", "3000000000"], "max_tokens 3000000000 does not fit the tensor's int32"),
        (["--end-id", "-2147483649"], "end_id -2147483649 does not fit the tensor's int32"),
        (["--ids", "1,99999999999"], "input_ids 99999999999 does not fit the tensor's int32"),
    ],
)
def test_client_refuses_values_its_tensors_cannot_hold_by_name(args, words, capsys):
    """Before the request is built: NumPy 2 raised an OverflowError traceback for them."""
    from client import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_the_client_reaches_a_loopback_server_past_any_proxy():
    from client import channel_args

    direct = [("grpc.enable_http_proxy", 0)]
    for url in ("127.0.0.1:8001", "localhost:8001", "[::1]:8001", "127.0.0.2:9"):
        assert channel_args(url) == direct, url
    for url in ("10.0.0.5:8001", "triton.internal:8001", "[2001:db8::1]:8001"):  # the proxy settings decide
        assert channel_args(url) is None, url


@pytest.mark.parametrize("timeout", ["0", "-1", "inf", "nan", "1e10"])
def test_client_refuses_a_timeout_its_wait_cannot_take(timeout, capsys):
    """Before the request goes out: the wait for a response raised a traceback for these, or (nan) never
    ended."""
    from client import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--timeout", timeout])
    assert exit_info.value.code == 2 and "--timeout takes seconds above 0, at most" in capsys.readouterr().err


def served(tmp_path: Path, drain_file: str) -> Path:
    import launch

    values = launch.model_parameters(launch.parse_args([])) | {"drain_file": drain_file}
    return launch.make_repository(tmp_path / "repository", values)


@pytest.mark.parametrize("drain_file", ["{tmp}/drain", "", "${drain_file}"])
def test_a_served_repository_s_drain_file_is_its_model_s_parameter(tmp_path, drain_file):
    import launch

    value = drain_file.replace("{tmp}", str(tmp_path))
    watched = Path(value) if value.startswith("/") else None  # unset: not drained
    assert launch.repository_drain_file(served(tmp_path, value)) == watched


def test_a_served_repository_s_drain_file_is_read_in_any_text_format_spelling(tmp_path):
    """Protobuf text format: the ':' before a message is optional, fields may end in ',' or ';', and a
    commented-out line is no parameter (the template's own spelling is one of many Triton reads)."""
    import launch

    repository = served(tmp_path, f"{tmp_path}/drain")
    config = repository / "bole" / "config.pbtxt"
    template = config.read_text()
    entry = f'key: "drain_file"\n  value: {{ string_value: "{tmp_path}/drain" }}'
    assert entry in template
    for spelling in (
        f'key: "drain_file", value {{ string_value: "{tmp_path}/drain" }}',
        f'key: "drain_file";\n  value {{string_value:"{tmp_path}/drain"}}',
        f'# key: "drain_file" value: {{ string_value: "/old/drain" }}\n  {entry}',
    ):
        config.write_text(template.replace(entry, spelling))
        assert launch.repository_drain_file(repository) == tmp_path / "drain", spelling
    config.write_text(template.replace(entry, 'key: "drain_file" value: { string_value: 7 }'))
    with pytest.raises(SystemExit, match="its drain_file parameter could not be read"):
        launch.repository_drain_file(repository)


@pytest.mark.parametrize(
    ("drain_file", "words"),
    [("drain", "must be an absolute path"), ("{tmp}/missing/drain", "its folder is missing or not writable")],
)
def test_a_served_repository_s_drain_file_that_could_not_be_written_is_refused(tmp_path, drain_file, words):
    """Else the launcher failed while stopping and left tritonserver running."""
    import launch

    with pytest.raises(SystemExit, match=words):
        launch.repository_drain_file(served(tmp_path, drain_file.replace("{tmp}", str(tmp_path))))
    assert launch.repository_drain_file(tmp_path / "no-model") is None


def test_the_engine_s_serving_gauge_is_read_from_triton_s_metrics():
    import launch

    text = (
        "# HELP bole_engine_status 1 while the engine takes requests\n# TYPE bole_engine_status gauge\n"
        'bole_engine_status{model="bole",state="serving",version="1"} {value}\n'
        'nv_inference_count{model="bole",version="1"} 3\n'
    )
    assert launch.serving_gauge(text.replace("{value}", "1")) is True
    assert launch.serving_gauge(text.replace("{value}", "0")) is False
    reordered = 'bole_engine_status{state="serving",model="bole",version="1"} 0\n'
    assert launch.serving_gauge(reordered) is False
    for absent in ("", 'nv_inference_count{model="bole",version="1"} 3\n', 'bole_engine_status{state="x"} 0'):
        assert launch.serving_gauge(absent) is None, absent
    # The heartbeat (Unix seconds, printed in full): a stale one is a dead or hung model process.
    beat = 'bole_engine_heartbeat_seconds{model="bole",version="1"} 1764903812.25\n'
    serving = text.replace("{value}", "1") + beat
    assert launch.serving_gauge(serving, now=1764903812.25 + launch.HEARTBEAT_STALE_S) is True
    assert launch.serving_gauge(serving, now=1764903812.25 + launch.HEARTBEAT_STALE_S + 0.5) is False
    assert launch.serving_gauge(serving.replace(beat, ""), now=2e9) is True  # no heartbeat: the gauge alone
    assert launch.engine_serving(free_port()) is None  # nothing answers there
    with socket.socket() as garbled:  # an answer cut short, as from a server stopping: not an error either
        garbled.bind(("127.0.0.1", 0))
        garbled.listen()
        answer = threading.Thread(target=lambda: _answer_once(garbled, b"HTTP/1.1 2"), daemon=True)
        answer.start()
        assert launch.engine_serving(garbled.getsockname()[1]) is None
        answer.join()


def test_the_launcher_s_probes_of_its_server_bypass_http_proxy(monkeypatch):
    """A ``no_proxy=localhost`` does not cover 127.0.0.1: the probes went to the proxy, so the server was
    never ready (stopped at --ready-timeout) and the engine's gauge never read."""
    import launch

    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "localhost")
    body = b'bole_engine_status{model="bole",state="serving",version="1"} 1\n'
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    server = subprocess.Popen(["sleep", "60"])  # wait_ready's server process: running
    try:
        for probe in (
            lambda port: launch.engine_serving(port) is True,
            lambda port: launch.wait_ready(server, port, 10, launch.StopFlag()) is not None,
        ):
            with socket.socket() as listening:
                listening.bind(("127.0.0.1", 0))
                listening.listen()
                answer = threading.Thread(target=lambda: _answer_once(listening, reply), daemon=True)
                answer.start()
                assert probe(listening.getsockname()[1])
                answer.join()
    finally:
        server.kill()
        server.wait()


def test_a_stop_kills_what_the_server_leaves_behind():
    """Triton 2.51 can exit (or be killed) with its model's stub still running, stuck and holding the
    model's memory: after the stop, the processes below the server that outlive it are killed."""
    import launch

    # A shell that leaves a child behind when it ends: SIGTERM ends the shell alone.
    server = subprocess.Popen(["bash", "-c", "sleep 600 & trap 'exit 0' TERM; while :; do sleep 0.1; done"])
    deadline = time.monotonic() + 30
    while not (left := [p for p, _ in launch.process_tree(server.pid) if b"600" in _cmdline(p)]):
        assert time.monotonic() < deadline, "the shell started no sleep 600"
        time.sleep(0.05)
    assert launch.stop(server, timeout=30) == 0
    time.sleep(0.5)  # reaped by init, or by the reaper of this container
    stat = launch._proc_stat(left[0])
    assert stat is None or stat[0] == "Z", stat
    # A process of the same pid that started later is not the one left behind: not killed.
    started = launch._proc_stat(os.getpid())[19]
    assert launch.kill_left_behind([(os.getpid(), str(int(started) + 1))], grace=0) == []


# A stand-in for tritonserver in serve()'s protocol only: ready at once, its engine's gauge at 0 (stopped
# unasked); at SIGTERM it records the drain file the launcher wrote, if any.
_STOPPED_ENGINE_SERVER = """
import http.server, pathlib, signal, sys, threading
http_port, metrics_port, drain, record = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'bole_engine_status{model="bole",state="serving",version="1"} 0\\n'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
for port in (http_port, metrics_port):
    server = http.server.HTTPServer(("127.0.0.1", port), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
def on_term(*_):
    path = pathlib.Path(drain)
    pathlib.Path(record).write_text(path.read_text() if path.exists() else "none")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
signal.pause()
"""


def test_an_engine_stopped_unasked_is_drained_at_once(tmp_path):
    """The engine's gauge read 0 (a failed thread, or a heartbeat gone stale while the process was busy):
    the launcher stopped tritonserver without the drain file, so a model still alive held its requests
    until Triton's exit timeout. It now asks for a drain with no grace first."""
    import launch

    http_port, metrics_port = launch.free_ports(2)
    drain, record = tmp_path / "drain", tmp_path / "record"
    command = [sys.executable, "-c", _STOPPED_ENGINE_SERVER, str(http_port), str(metrics_port), str(drain),
               str(record)]  # fmt: skip
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:  # serve() installs the launcher's signal handlers: put pytest's back
        code = launch.serve(command, dict(os.environ), (http_port, 0, metrics_port), tmp_path, 30,
                            drain=(drain, 7.0), stop_timeout=30, engine_watch=0.2)  # fmt: skip
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert code == 1 and record.read_text().strip() == "0.0"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return b""


def _answer_once(listening: socket.socket, reply: bytes) -> None:
    """In a daemon thread: a probe that never comes (a failing test) leaves it waiting, not the run."""
    connection, _ = listening.accept()
    with connection:
        connection.recv(4096)
        connection.sendall(reply)


@pytest.mark.parametrize("value", ["-1", "3601"])
def test_launch_refuses_an_engine_watch_out_of_range(value):
    command = [sys.executable, str(LAUNCH), "--engine-watch", value]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 1 and "--engine-watch must lie in [0, 3600] seconds" in done.stderr


@pytest.mark.parametrize("value", ["0", "-5", "nan", "86401"])
def test_launch_refuses_a_ready_timeout_out_of_range(value):
    """nan and -5 started tritonserver, then stopped it at once: "not ready within nan s"."""
    command = [sys.executable, str(LAUNCH), "--ready-timeout", value]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 1 and "--ready-timeout must lie in (0, 86400] seconds" in done.stderr


@pytest.mark.parametrize("value", ["0", "-3"])
def test_launch_refuses_a_max_batch_size_below_one(value):
    """0 used to serve the engine's (or the default) batch of 8 without a word, and a negative size failed
    in Triton with its own field's name ("'max_batch_size' must be non-negative")."""
    command = [sys.executable, str(LAUNCH), "--max-batch-size", value, "--prepare-only"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 1 and f"--max-batch-size must be at least 1, got {value}" in done.stderr


def test_launch_refuses_a_taken_port_and_a_missing_engine_dir_before_starting(tmp_path):
    """Tritonserver reported ready over HTTP, then exited 1 on a taken metrics port (a second server with
    the defaults), and a missing --engine-dir was a line deep in its log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, str(LAUNCH), "--metrics-port", str(port)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1 and f"error: --metrics-port {port} is taken" in run.stderr, run.stderr
    assert "tritonserver" not in run.stdout
    missing = tmp_path / "nowhere"
    run = subprocess.run([sys.executable, str(LAUNCH), "--engine-dir", str(missing)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1 and f"error: --engine-dir {missing} is not a directory" in run.stderr


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--max-queue-size", "0"], "error: model parameter max_queue_size must be positive, got 0"),
        (["--max-seq-len", "x"], "error: model parameter max_seq_len must be an integer, got 'x'"),
        (["--max-depth", "40"], "error: --max-depth: Input should be less than or equal to 15 (got 40)"),
        (["--mode", "ar", "--draft-top-k", "4"], "error: --mode ar does not use --draft-top-k: it drafts"),
        (
            ["--mode", "chain", "--max-nodes", "5"],
            "error: --mode chain does not use --max-nodes",
        ),  # were params
        # the LLM's own checks before its weights load: these failed in tritonserver's log
        (["--max-seq-len", "2"], "error: max_seq_len must be an integer of at least 3, got 2"),
        (["--max-seq-len", "5000"], "error: max_seq_len 5000 exceeds the model's max_position_embeddings"),
        (["--device", "cuda:64"], "error: device 'cuda:64' asked for, but"),
    ],
)
def test_launch_refuses_bad_model_settings_before_starting(flags, words):
    """Read only by the model's initialize() (after its weights loaded and it warmed up: minutes on a
    GPU), these failed as a line of tritonserver's log ("Failed to initialize Python stub")."""
    ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1"]
    run = subprocess.run([sys.executable, str(LAUNCH), *ports, *flags], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.returncode == 1 and words in run.stderr, run.stderr
    assert "tritonserver" not in run.stdout


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--http-port", "70000"], "error: --http-port must lie in [0, 65535] (0: any free port), got 70000"),
        (["--grpc-port", "-5"], "error: --grpc-port must lie in [0, 65535]"),  # "already in use", once loaded
        (["--metrics-port", "-2"], "error: --metrics-port must lie in [-1, 65535] (0: any free port, -1"),
    ],
)
def test_launch_refuses_a_port_out_of_range(flags, words):
    """70000 was an OverflowError traceback, -1 for HTTP waited out the whole ready timeout."""
    run = subprocess.run([sys.executable, str(LAUNCH), *flags], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and words in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_launch_refuses_model_flags_beside_a_served_repository(tmp_path):
    """A repository served as it is holds the model's parameters: these flags were ignored without a word."""
    run = subprocess.run([sys.executable, str(LAUNCH), "--model-repository", str(tmp_path), "--mode", "ar",
                          "--max-batch-size", "2"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and "--mode, --max-batch-size set the model's parameters" in run.stderr


def test_launch_refuses_one_port_for_two_servers():
    port = str(free_port())
    run = subprocess.run([sys.executable, str(LAUNCH), "--http-port", port, "--grpc-port", port],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1 and f"--http-port and --grpc-port are both {port}" in run.stderr, run.stderr


def test_launch_help_runs_without_a_server():
    done = subprocess.run([sys.executable, str(LAUNCH), "--help"], capture_output=True, text=True, check=True)
    assert "--engine-dir" in done.stdout
    entries = re.split(r"\n  (?=-)", done.stdout.split("options:")[1])[1:]  # one per option
    named = {e.split()[0].rstrip(","): "default:" in " ".join(e.split()) for e in entries}
    undocumented = [option for option, has in named.items() if not has]
    assert len(named) == 25 and undocumented == ["-h", "--prepare-only"]  # the flags
