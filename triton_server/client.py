"""Stream a completion from the Bole model over gRPC (a stock ``tritonclient``), tokens printed as
they arrive, the request's speculation statistics at the end::

    python triton_server/client.py --url 127.0.0.1:8001 --prompt "def fibonacci(n):" --max-tokens 64
    python triton_server/client.py --ids 1,2,3 --max-tokens 16      # token ids in, token ids out

Exits non-zero when the server answers with an error. Ctrl-C cancels the request on the server.
"""

from __future__ import annotations

import argparse
import ipaddress
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


@dataclass(slots=True)
class Chunk:
    """One streamed response: the new text and token ids, and the request's running statistics."""

    text: str
    token_ids: list[int]
    final: bool
    finish_reason: str = ""
    stats: dict[str, float] = field(default_factory=dict)


STATS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "mean_accepted_tokens")


def build_inputs(
    prompt: str | None = None,
    ids: list[int] | None = None,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    end_id: int | None = None,
    stop_words: list[str] | None = None,
    stream: bool = True,
) -> list[grpcclient.InferInput]:
    """The request tensors (batch dimension 1), leaving out whatever is None. Raises ``ValueError`` for
    an integer its tensor's datatype cannot hold (NumPy 2 would raise ``OverflowError``)."""
    tensors: list[tuple[str, np.ndarray]] = []
    if prompt is not None:
        tensors.append(("text_input", np.array([[prompt.encode()]], dtype=np.object_)))
    if ids is not None:
        _check_range("input_ids", ids, np.int32)
        tensors.append(("input_ids", np.array([ids], dtype=np.int32)))
    scalars = {
        "max_tokens": (max_tokens, np.int32),
        "temperature": (temperature, np.float32),
        "top_k": (top_k, np.int32),
        "top_p": (top_p, np.float32),
        "random_seed": (seed, np.uint64),
        "end_id": (end_id, np.int32),
        "stream": (stream, np.bool_),
    }
    for name, (value, dtype) in scalars.items():
        if value is not None:
            if np.issubdtype(dtype, np.integer):
                _check_range(name, [value], dtype)
            tensors.append((name, np.array([[value]], dtype=dtype)))
    if stop_words:
        tensors.append(("stop_words", np.array([[s.encode() for s in stop_words]], dtype=np.object_)))
    inputs = []
    for name, array in tensors:
        datatype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _check_range(name: str, values: list[int], dtype: type[np.integer]) -> None:
    info = np.iinfo(dtype)
    if outside := [v for v in values if not info.min <= v <= info.max]:
        raise ValueError(
            f"{name} {outside[0]} does not fit the tensor's {np.dtype(dtype).name}: send a value in "
            f"[{info.min}, {info.max}]"
        )


def channel_args(url: str) -> list[tuple[str, int]] | None:
    """gRPC's options for ``url``: a server on this machine's loopback is reached directly, whatever
    ``http_proxy`` says (gRPC sends every target through it, and no proxy reaches this loopback)."""
    host = url.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: the proxy settings decide
        loopback = False
    return [("grpc.enable_http_proxy", 0)] if loopback else None


def stream(
    url: str, inputs: list[grpcclient.InferInput], *, model: str = "bole", timeout: float = 600.0
) -> Iterator[Chunk]:
    """Send one request on a gRPC stream and yield its responses until the final one. Raises
    :class:`InferenceServerException` on an error response, or naming the URL when no server answers
    there or the model is not ready; closing the generator early (or an exception in the caller)
    cancels the request on the server."""
    responses: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url, channel_args=channel_args(url)) as client:
        try:
            client.is_server_live()
        except InferenceServerException as e:
            raise InferenceServerException(
                f"no Triton server answers at {url} ({e.message()}); this client speaks gRPC: give the "
                "server's gRPC port (launch.py prints it; 8001 by default, 8000 is HTTP)"
            ) from None
        try:  # a live server that is not ready (loading, or draining to stop) answers with an error
            ready, why = client.is_model_ready(model), "no such model loaded"
        except InferenceServerException as e:
            ready, why = False, e.message()
        if not ready:
            raise InferenceServerException(
                f"the server at {url} has no ready model {model!r} ({why}): it may be starting or shutting "
                "down; retry, or check its --model name"
            )
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        finished = False
        try:
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
            while not finished:
                try:
                    result, error = responses.get(timeout=timeout)
                except queue.Empty:
                    raise InferenceServerException(f"no response within {timeout:g} s (--timeout)") from None
                if error is not None:
                    finished = True
                    raise error
                chunk = _chunk(result)
                finished = chunk.final
                yield chunk
        finally:
            client.stop_stream(cancel_requests=not finished)


def _chunk(result: grpcclient.InferResult) -> Chunk:
    final = result.get_response().parameters["triton_final_response"].bool_param
    text = result.as_numpy("text_output")
    ids = result.as_numpy("output_ids")
    reason = result.as_numpy("finish_reason")
    stats = {}
    for name in STATS:
        value = result.as_numpy(name)
        if value is not None:
            stats[name] = value.item()
    return Chunk(
        text.item().decode() if text is not None else "",
        ids.reshape(-1).tolist() if ids is not None else [],
        final,
        reason.item().decode() if reason is not None else "",
        stats,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--url", default="127.0.0.1:8001", help="gRPC endpoint host:port (default: 127.0.0.1:8001)"
    )
    p.add_argument("--model", default="bole", help="model name (default: bole)")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", default='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    )
    prompt.add_argument("--ids", default=None, help="comma-separated prompt token ids instead of --prompt")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--end-id", type=int, default=None, help="end token replacing the model's (-1: none)")
    p.add_argument("--stop", action="append", default=None, help="stop word (repeatable)")
    p.add_argument("--no-stream", action="store_true", help="one response with the whole output")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for each response (default: 600)"
    )
    args = p.parse_args(argv)
    # queue.get's range, checked before the request goes out: a negative, infinite or too long timeout
    # raised a traceback there, nan waited forever.
    if not 0 < args.timeout <= threading.TIMEOUT_MAX:
        p.error(f"--timeout takes seconds above 0, at most {threading.TIMEOUT_MAX:g}, got {args.timeout:g}")

    ids = None
    if args.ids is not None:
        try:
            ids = [int(t) for t in args.ids.split(",")]
        except ValueError:
            p.error(f"--ids takes comma-separated integers, got {args.ids!r}")
    try:
        inputs = build_inputs(
            args.prompt if ids is None else None, ids, max_tokens=args.max_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
            end_id=args.end_id, stop_words=args.stop, stream=not args.no_stream,
        )  # fmt: skip
    except ValueError as e:
        p.error(str(e))
    start, first, count, last = time.perf_counter(), None, 0, None
    try:
        for last in stream(args.url, inputs, model=args.model, timeout=args.timeout):
            first = first or time.perf_counter()
            count += len(last.token_ids)
            sys.stdout.write("".join(f"{t} " for t in last.token_ids) if ids is not None else last.text)
            sys.stdout.flush()
    except InferenceServerException as e:
        print(f"\nerror: {e.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ncancelled", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - start
    s = last.stats if last else {}
    print(
        f"\n\n[model {args.model}] finish: {last.finish_reason if last else '?'}; "
        f"{count} tokens in {elapsed:.2f} s "
        f"(first after {(first or start) - start:.2f} s); drafted {s.get('total_draft_tokens', 0)}, "
        f"accepted {s.get('total_accepted_draft_tokens', 0)} (rate {s.get('acceptance_rate', 0):.2f}); "
        f"mean accepted tokens per step {s.get('mean_accepted_tokens', 0):.2f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
