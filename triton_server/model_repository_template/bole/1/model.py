"""The Bole model for Triton's Python backend: a thin adapter over ``trtllm_bole.serving``.

``execute`` only parses each request and hands it to one shared :class:`ServingEngine` (continuous
batching on its own thread) and returns at once; the engine's callbacks send each committed delta
through the request's response sender (decoupled mode) and the final flag with the last one. Bad
requests get an error response; client cancellation aborts the request and frees its slot. When
the launcher stops the server it writes the drain file: requests in flight get a grace period, then
an UNAVAILABLE error, so that Triton can unload the model. The engine's metrics
(:mod:`trtllm_bole.serving.metrics`) go to Triton's metrics endpoint, brought up to date every second.
"""

import json
import threading
import time
import traceback

import triton_python_backend_utils as pb_utils

from trtllm_bole import LLM
from trtllm_bole.serving import ServingEngine, close_on_drain_file
from trtllm_bole.serving.metrics import (
    COUNTER,
    FAMILIES,
    GAUGE,
    HEARTBEAT,
    HISTOGRAM,
    HISTOGRAMS,
    observations,
    updates,
)
from trtllm_bole.serving.protocol import (
    INPUT_NAMES,
    Reply,
    ResponseStream,
    check_prompt_text,
    check_request,
    drain_file,
    engine_kwargs,
    llm_kwargs,
    parse_request,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                "the bole model streams tokens: set model_transaction_policy { decoupled: true }"
            )
        if (batch := config.get("max_batch_size", 0)) < 1:  # without a batch dimension, every request refused
            raise pb_utils.TritonModelException(
                f"max_batch_size {batch}: the bole model reads its inputs with a batch dimension (of 1, "
                "one prompt a request); set max_batch_size >= 1"
            )
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        kwargs = llm_kwargs(parameters, args["model_instance_kind"], args["model_instance_device_id"])
        served, drain = engine_kwargs(parameters), drain_file(parameters)  # refused before the weights load
        self.llm = LLM(**kwargs)
        # Before the server reports ready: first-call costs, and on a GPU the Triton kernel variants of
        # every batch size class (compiled on first use, seconds each), and the CUDA graphs of greedy and
        # sampled batches.
        warmed = self.llm.warm_up(sampled=True, use_tqdm=False)
        self.engine = ServingEngine.for_llm(self.llm, **served)
        if drain is not None:  # the launcher's way to end requests in flight when it stops the server
            close_on_drain_file(self.engine, drain)
        # Metrics must never keep the model from serving (under --allow-metrics=false the backend takes
        # them and publishes nothing).
        try:
            self.metrics = Metrics(
                self.engine, {"model": args["model_name"], "version": args["model_version"]}
            )
        except Exception as e:
            self.metrics = None
            pb_utils.Logger.log_warn(f"bole: no metrics published ({e})")
        bole = self.llm.speculative_config
        pb_utils.Logger.log_info(
            f"bole: serving {self.llm.model_dir} on {kwargs['device']}, mode {bole.mode} "
            f"(depth {bole.max_depth}, nodes {bole.max_nodes}, top-k {bole.top_k}), "
            f"max batch {self.engine.max_batch_size}, context limit {self.engine.request_limit} tokens, "
            f"warmed up at batch {warmed}"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except ValueError as e:  # RequestError and tokenizer refusals: the client's to fix
                self.engine.note_refused("invalid")
                _refuse(sender, str(e), "invalid")
            except Exception as e:  # never let one request take the model down
                traceback.print_exc()
                self.engine.note_refused("internal")
                _refuse(sender, f"internal error: {e!r}", "internal")
        return None

    def _submit(self, request, sender) -> None:
        tensors = {}
        for name in INPUT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors[name] = tensor.as_numpy()
        limit = self.engine.request_limit
        parsed = parse_request(tensors, json.loads(request.parameters() or "{}"), context_limit=limit)
        if isinstance(parsed.prompt, str) and self.llm.tokenizer is not None:
            check_prompt_text(
                parsed.prompt, context_limit=limit, max_token_bytes=self.llm.tokenizer.max_token_bytes
            )
        prompt_ids = self.llm.encode(parsed.prompt)
        check_request(
            prompt_ids,
            parsed.params,
            context_limit=limit,
            vocab_size=self.llm.model.config.vocab_size,
            has_tokenizer=self.llm.tokenizer is not None,
            special_texts=self.llm.tokenizer.special_texts if self.llm.tokenizer is not None else (),
        )
        replies = ResponseStream(parsed.stream)

        def on_update(update):
            reply = replies(update)
            if reply is not None:
                _send(sender, reply)

        try:
            self.engine.submit(prompt_ids, parsed.params, on_update, is_cancelled=sender.is_cancelled)
        except RuntimeError as e:  # shutting down
            _refuse(sender, str(e), "unavailable")

    def finalize(self):
        self.engine.close()
        if self.metrics is not None:
            self.metrics.close()


class Metrics:
    """The engine's metrics as the Python backend's custom metrics, brought up to date every ``interval``
    seconds by a daemon thread, and once more when it closes."""

    def __init__(self, engine: ServingEngine, labels: dict[str, str], interval: float = 1.0) -> None:
        kinds = {
            GAUGE: pb_utils.MetricFamily.GAUGE,
            COUNTER: pb_utils.MetricFamily.COUNTER,
            HISTOGRAM: pb_utils.MetricFamily.HISTOGRAM,
        }
        heartbeat = pb_utils.MetricFamily(name=HEARTBEAT[0], description=HEARTBEAT[1], kind=kinds[GAUGE])
        self._families, self._metrics = [heartbeat], {}
        self._heartbeat = heartbeat.Metric(labels=labels)
        for f in (*FAMILIES, *HISTOGRAMS):
            family = pb_utils.MetricFamily(name=f.name, description=f.description, kind=kinds[f.kind])
            self._families.append(family)
            buckets = {"buckets": list(f.buckets)} if f.kind == HISTOGRAM else {}
            for value in f.samples:
                self._metrics[f.name, value] = family.Metric(labels={**labels, f.label: value}, **buckets)
        self._engine, self._published = engine, None
        self._publish()  # before the server reports ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="bole-metrics", daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self._publish()
            except Exception:  # a failed publication must not end the next ones
                pb_utils.Logger.log_error(f"bole: metrics not published: {traceback.format_exc()}")

    def _publish(self) -> None:
        now = self._engine.stats()
        # Every request counted in ``now`` has its latency taken here: it was kept before ``now`` was
        # published. Observed first, so that a scrape that sees a request counted sees its latencies.
        for name, value, seconds in observations(self._engine.take_latencies()):
            self._metrics[name, value].observe(seconds)
        for name, value, how, amount in updates(self._published, now):
            metric = self._metrics[name, value]
            if how == "set":
                metric.set(amount)
            else:
                metric.increment(amount)
        self._published = now
        self._heartbeat.set(time.time())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._publish()
        self._metrics.clear()  # every Metric before its MetricFamily (the backend's rule)
        self._heartbeat = None
        self._families.clear()


def _send(sender, reply: Reply) -> None:
    """Send one reply. Raises if the client is gone: the engine then drops the request."""
    if reply.error is not None:
        error = pb_utils.TritonError(reply.message, getattr(pb_utils.TritonError, reply.status))
        response = pb_utils.InferenceResponse(error=error)
    else:
        tensors = [pb_utils.Tensor(name, array) for name, array in reply.tensors.items()]
        response = pb_utils.InferenceResponse(output_tensors=tensors)
    sender.send(response, flags=FINAL if reply.final else 0)


def _refuse(sender, message: str, code: str) -> None:
    try:
        _send(sender, Reply(None, True, message, code))
    except Exception:  # the client is gone already
        traceback.print_exc()
