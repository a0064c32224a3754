"""A fake inference engine: `python -m llmgw.agent.fake_engine --port P`.

It behaves, from the outside, like a vLLM OpenAI server: it "loads" for a
while (`/health` answers 503), then serves `/health`, `/v1/models`,
`/v1/completions` and `/v1/chat/completions` (both with `stream: true`: SSE
chunks ending in `data: [DONE]`) and vLLM-format `/metrics`.

A simulated prefix cache makes routing quality measurable: the prompt's
tokens (whitespace-split) are cut into 16-token blocks, each block hashed with
the ones before it, and the hashes kept in an LRU. The first token comes after
`--latency` seconds when nothing is cached, `--cached-latency` when all of it
is, in proportion between; vLLM's counters `vllm:prefix_cache_queries_total`
and `vllm:prefix_cache_hits_total` count prompt tokens looked up and found. Tests and the demo run it where
there are no GPUs. Knobs for the unhappy paths: `--fail-after` exits with
`--exit-code`, `--ignore-sigterm` makes the agent escalate to SIGKILL,
`--hang-after` keeps the process up but `/health` failing; `--loaded-after PATH` keeps
it loading until a test creates PATH; `--stall-after`
stops generating while `/health` and `/metrics` still answer, as a vLLM whose
EngineCore is stopped does (its gauges no longer count the requests that arrive; only
`/load`, with `--enable-server-load-tracking`, does); `--health-delay` answers `/health` slowly (a busy
node). Its histograms have vLLM's buckets: end-to-end latency from 0.3 s, time to
first token fine from 1 ms. Like vLLM's (uvicorn's), it logs every request it
serves, except the paths given to `--disable-access-log-for-endpoints`.
`--traffic RATE` makes it serve simulated requests by itself, so that a demo
fleet has some busy replicas and some idle ones.

It sleeps as vLLM does: with `VLLM_SERVER_DEV_MODE=1` in its environment it has the
development endpoints `POST /sleep?level=N`, `POST /wake_up` and `GET /is_sleeping`
(without it they are 404, as vLLM's); `--enable-sleep-mode` lets them work (else a
sleep answers 500). A sleep takes `--sleep-seconds`, a wake `--wake-seconds`; asleep or
on its way, inference answers 503 naming the sleep, while `/health`, `/metrics` and
`/v1/models` still answer (`POST /collective_rpc` takes the `reload_weights` a level-2
wake asks for). With `LLMGW_FAKE_GPU_MEMORY_DIR` set it says what it holds on
its cards (CUDA_VISIBLE_DEVICES), `--gpu-memory-mib` each awake and only a CUDA context's
worth asleep (llmgw.agent.fake_process_memory); the fault `--sleep-keeps-memory` answers the
sleep 200 and keeps it all held (vLLM #47654).

It serves LoRA adapters as vLLM does (llmgw.agent.fake_lora): `--enable-lora`, `--max-loras`,
`--max-cpu-loras`, `--max-lora-rank`; with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` the
endpoints `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (else 404), each load
taking `--lora-load-seconds`. A loaded adapter is listed in `/v1/models` with its `parent`
and answers requests by its name, naming itself as the answer's `model`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llmgw.agent import fake_process_memory
from llmgw.agent.fake_lora import LoraConfig, LoraError, LoraState


@dataclass(frozen=True)
class FakeConfig:
    model: str = "fake-model"
    load_seconds: float = 2.0
    # A test's hold on the load: loading goes on, past load_seconds, until this exists.
    loaded_after: Path | None = None
    latency_s: float = 0.05  # how long one request "runs": its first token, nothing cached
    cached_latency_s: float | None = None  # first token with the whole prompt cached (latency/10)
    token_interval_s: float = 0.0  # between streamed tokens after the first
    cache_blocks: int = 4096  # prefix-cache capacity in blocks (0: no cache)
    traffic_rate: float = 0.0  # simulated requests per second, 0 = none
    traffic_duration_s: float | None = None  # stop simulated traffic after this long
    seed: int | None = None
    hang_after_s: float | None = None  # then /health answers 500, the process stays up
    stall_after_s: float | None = None  # then nothing generates; /health still answers 200
    health_delay_s: float = 0.0  # /health answers after this long
    load_tracking: bool = False  # /load counts requests (vLLM's --enable-server-load-tracking)
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: the sleep endpoints exist
    sleep_mode: bool = False  # --enable-sleep-mode: they work
    sleep_s: float = 0.2  # a sleep takes this long
    wake_s: float = 0.5  # a wake takes this long
    gpu_memory_mib: int = 16384  # held on each card awake
    sleep_keeps_memory: bool = False  # fault: a sleep answers 200 and frees nothing
    memory_dir: Path | None = None  # where it says what it holds (llmgw.agent.fake_process_memory)
    gpus: tuple[str, ...] = ()  # its cards (CUDA_VISIBLE_DEVICES)
    # Keys a client must present on the API's paths (`--api-key`, else VLLM_API_KEY): none
    # asked when empty, as vLLM.
    api_keys: tuple[str, ...] = ()
    lora: LoraConfig = field(default_factory=LoraConfig)


# What a sleeping vLLM still holds on each card: the CUDA context and its pools.
ASLEEP_MIB = 512


# vLLM 0.32's default buckets (vllm/v1/metrics/buckets.py): e2e starts at 0.3 s.
E2E_BUCKETS_S: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0)
E2E_BUCKETS_S += (30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25)
TTFT_BUCKETS_S += (0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class EngineMetrics:
    """The vLLM metric names the agent reads, in a registry of their own."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            registry=self.registry,
        ).labels(model)
        self.latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            buckets=E2E_BUCKETS_S,
            registry=self.registry,
        ).labels(model)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        ).labels(model)
        self.model = model

    def finished(
        self,
        prompt_tokens: int,
        generation_tokens: int,
        reason: str,
        latency_s: float,
        ttft_s: float | None = None,
    ) -> None:
        self.latency.observe(latency_s)
        self.ttft.observe(latency_s if ttft_s is None else ttft_s)
        self.success.labels(self.model, reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)


BLOCK_TOKENS = 16


class PrefixCache:
    """An LRU of prompt-block hashes; each hash covers its block and every one before."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def lookup(self, tokens: list[str]) -> int:
        """How many leading tokens were cached; the prompt's blocks are cached after."""
        h = hashlib.blake2b(digest_size=16)
        hit, matching = 0, True
        for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            h.update("\x00".join(tokens[start : start + BLOCK_TOKENS]).encode())
            key = h.copy().digest()
            if matching and key in self._blocks:
                hit += BLOCK_TOKENS
                self._blocks.move_to_end(key)
                continue
            matching = False
            if self.capacity > 0:
                self._blocks[key] = None
                if len(self._blocks) > self.capacity:
                    self._blocks.popitem(last=False)
        return hit


@dataclass
class EngineState:
    config: FakeConfig
    metrics: EngineMetrics
    ready_at: float  # monotonic
    created: int = field(default_factory=lambda: int(time.time()))
    requests: int = 0
    cache: PrefixCache = field(default_factory=lambda: PrefixCache(0))
    active: set[asyncio.Task[object]] = field(default_factory=set)  # requests running
    server_load: int = 0  # requests the HTTP server holds (vLLM's /load), stalled ones too
    sleep: SleepState = field(default_factory=lambda: SleepState())
    loras: LoraState | None = None  # set by make_app
    held_by: Path | None = None  # `--loaded-after`'s file until it is seen (then None)

    @property
    def loaded(self) -> bool:
        if time.monotonic() < self.ready_at:
            return False
        if self.held_by is not None:  # read on every request: the file is looked for
            if not self.held_by.exists():  # only until it is there
                return False
            self.held_by = None
        return True

    @property
    def hung(self) -> bool:
        hang = self.config.hang_after_s
        return hang is not None and time.monotonic() >= self.ready_at + hang

    async def stall_point(self) -> None:
        """Where generation stops for good once `--stall-after` has passed."""
        stall = self.config.stall_after_s
        if stall is not None and time.monotonic() >= self.ready_at + stall:
            await asyncio.Event().wait()


@dataclass
class SleepState:
    """Where the engine is in vLLM's sleep cycle; one sleep or wake at a time."""

    level: int = 0  # 0: awake; 1 or 2: asleep at that level (or on its way)
    asleep: bool = False  # the sleep finished (what /is_sleeping says)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def serving(self) -> bool:
        return self.level == 0 and not self.asleep


STATE = web.AppKey("fake_engine_state", EngineState)


def _hold(state: EngineState, mib: int) -> None:
    """Say what this process holds on each of its cards, as the driver would list it."""
    cfg = state.config
    if cfg.memory_dir is not None and cfg.gpus:
        fake_process_memory.write(cfg.memory_dir, os.getpid(), cfg.gpus, mib)


async def post_sleep(request: web.Request) -> web.Response:
    """vLLM's POST /sleep?level=N: level 1 keeps the weights in host memory, level 2
    drops them; both drop the KV cache (here: the prefix cache)."""
    state = request.app[STATE]
    if not state.config.sleep_mode:
        return _error(500, "Sleep mode is not enabled (--enable-sleep-mode)", "InternalServerError")
    raw = request.query.get("level", "1")
    if raw not in ("1", "2"):
        return _error(400, f"level must be 1 or 2, not {raw!r}", "BadRequestError")
    async with state.sleep.lock:
        if state.sleep.asleep:
            return web.Response(status=200)
        state.sleep.level = int(raw)  # from now on inference is refused
        await asyncio.sleep(state.config.sleep_s)
        state.cache = PrefixCache(state.config.cache_blocks)
        if not state.config.sleep_keeps_memory:
            _hold(state, min(ASLEEP_MIB, state.config.gpu_memory_mib))
        state.sleep.asleep = True
    _say(f"asleep at level {raw}")
    return web.Response(status=200)


async def post_wake_up(request: web.Request) -> web.Response:
    """vLLM's POST /wake_up (its `tags` are accepted and ignored: everything wakes)."""
    state = request.app[STATE]
    if not state.config.sleep_mode:
        return _error(500, "Sleep mode is not enabled (--enable-sleep-mode)", "InternalServerError")
    async with state.sleep.lock:
        if state.sleep.serving:
            return web.Response(status=200)
        await asyncio.sleep(state.config.wake_s)
        _hold(state, state.config.gpu_memory_mib)
        state.sleep.level, state.sleep.asleep = 0, False
    _say("awake")
    return web.Response(status=200)


async def collective_rpc(request: web.Request) -> web.Response:
    """vLLM's POST /collective_rpc, for the one method a level-2 wake needs."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("method") != "reload_weights":
        return _error(400, 'only {"method": "reload_weights"} is simulated', "BadRequestError")
    return web.json_response({"results": [None]})


async def get_is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[STATE].sleep.asleep})


async def _serve_one(state: EngineState, prompt_tokens: int, max_tokens: int) -> str:
    """Run one request through the metrics: running while it sleeps, then counted."""
    started = time.monotonic()
    await state.stall_point()
    state.metrics.running.inc()
    try:
        await asyncio.sleep(state.config.latency_s)
    finally:
        state.metrics.running.dec()
    state.requests += 1
    state.metrics.finished(prompt_tokens, max_tokens, "length", time.monotonic() - started)
    return " lorem" * max_tokens


def _first_token_delay(state: EngineState, tokens: list[str]) -> float:
    """Look the prompt up in the prefix cache and count it; the delay follows what was cached."""
    cfg = state.config
    hit = state.cache.lookup(tokens)
    state.metrics.cache_queries.inc(len(tokens))
    state.metrics.cache_hits.inc(hit)
    cached = cfg.latency_s / 10 if cfg.cached_latency_s is None else cfg.cached_latency_s
    fraction = hit / len(tokens) if tokens else 0.0
    return cfg.latency_s + (cached - cfg.latency_s) * fraction


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.config.health_delay_s:
        await asyncio.sleep(state.config.health_delay_s)
    if not state.loaded:
        return web.Response(status=503, text="loading\n")
    if state.hung:
        return web.Response(status=500, text="engine core is not responding\n")
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    item = {
        "id": state.config.model,
        "object": "model",
        "created": state.created,
        "owned_by": "llmgw-fake",
    }
    adapters = state.loras.cards(state.created) if state.loras is not None else []
    return web.json_response({"object": "list", "data": [item, *adapters]})


def _lora_error(exc: LoraError) -> web.Response:
    """vLLM's ErrorResponse for its LoRA endpoints: the status is also the `code`."""
    body = {"error": {"message": exc.message, "type": exc.kind, "param": None, "code": exc.status}}
    return web.json_response(body, status=exc.status)


async def _lora_body(request: web.Request, fields: tuple[str, ...]) -> dict[str, str]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or any(not isinstance(body.get(f, ""), str) for f in fields):
        raise LoraError(400, "BadRequestError", f"the body must be a JSON object with {fields}")
    return {f: body.get(f, "") for f in fields}


async def load_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    assert state.loras is not None
    try:
        body = await _lora_body(request, ("lora_name", "lora_path"))
        text = await state.loras.load(body["lora_name"], body["lora_path"])
    except LoraError as exc:
        _say(f"LoRA load refused: {exc.message}")
        return _lora_error(exc)
    _say(f"loaded LoRA adapter {body['lora_name']} from {body['lora_path']}")
    return web.Response(status=200, text=text)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    assert state.loras is not None
    try:
        body = await _lora_body(request, ("lora_name",))
        text = await state.loras.unload(body["lora_name"])
    except LoraError as exc:
        return _lora_error(exc)
    _say(f"unloaded LoRA adapter {body['lora_name']}")
    return web.Response(status=200, text=text)


def _error(
    status: int, message: str, kind: str, *, param: str | None = None, code: str | None = None
) -> web.Response:
    """OpenAI's error shape: `type` and `code` are strings (or `code` null), never
    the status; `param` names the field at fault."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def _bad(message: str, param: str | None = None) -> web.Response:
    return _error(400, message, "invalid_request_error", param=param)


MAX_N = 128  # choices per request


class BadBody(ValueError):
    pass


def _prompt_of(body: dict[str, object], chat: bool) -> str:
    if not chat:
        prompt = body.get("prompt", "")
        return " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadBody("messages must be a non-empty list")
    parts = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadBody("each message needs a role and content")
        content = m.get("content", "")
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{m['role']}: {content}")
    return "\n".join(parts)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    if not state.loaded:
        return _error(
            503,
            "the model is still loading; retry shortly",
            "service_unavailable",
            code="model_not_ready",
        )
    if not state.sleep.serving:  # vLLM's protected endpoints answer 503 while it sleeps
        return _error(
            503,
            "The model is sleeping; wake it up first",
            "service_unavailable",
            code="model_sleeping",
        )
    try:
        body = await request.json()
    except ValueError:
        return _bad("the body must be a JSON object")
    if not isinstance(body, dict):
        return _bad("the body must be a JSON object")
    model = body.get("model", state.config.model)
    adapter = model if state.loras is not None and model in state.loras.registered else None
    if model != state.config.model and adapter is None:
        return _error(
            404,
            f"The model `{model}` does not exist.",
            "invalid_request_error",
            param="model",
            code="model_not_found",
        )
    try:
        text_in = _prompt_of(body, chat)
    except BadBody as exc:
        return _bad(str(exc), "messages" if chat else "prompt")
    limit = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(limit, 16)
    if type(max_tokens) is not int or not 0 < max_tokens <= 4096:
        return _bad(f"{limit} must be an integer in 1..4096", limit)
    n = body.get("n", 1)
    if type(n) is not int or not 0 < n <= MAX_N:
        return _bad(f"n must be an integer in 1..{MAX_N}", "n")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and not stream:  # vLLM's check, word for word
        return _bad("Stream options can only be defined when `stream=True`.", "stream_options")
    usage_chunk = stream and isinstance(options, dict) and options.get("include_usage") is True
    # vLLM's continuous_usage_stats: the usage so far on every chunk (with include_usage).
    continuous = usage_chunk and options.get("continuous_usage_stats") is True  # type: ignore[union-attr]
    tokens = text_in.split()
    gen = _Generation(state, chat, len(tokens), max_tokens, stream, n, usage_chunk, continuous)
    gen.model = str(model)
    first = _first_token_delay(state, tokens)
    state.server_load += 1  # the API server holds it, whatever the engine core does
    task = asyncio.current_task()
    if task is not None:
        state.active.add(task)
    try:
        if adapter is not None and state.loras is not None:
            await state.loras.enter_batch(adapter)
        # A stalled core never schedules it: like vLLM's, its gauges do not count it.
        await state.stall_point()
        state.metrics.running.inc()
        try:
            if gen.stream:
                return await gen.stream_to(request, first)
            await asyncio.sleep(first)
            gen.first_token_at = time.monotonic()
            await asyncio.sleep(state.config.token_interval_s * (max_tokens - 1))
            return web.json_response(gen.whole())
        finally:
            state.metrics.running.dec()
            if adapter is not None and state.loras is not None:
                state.loras.leave_batch(adapter)
    finally:
        state.server_load -= 1
        state.active.discard(task)


class _Generation:
    """One request's answer, in OpenAI's shapes (whole, or as SSE chunks): `n`
    choices, and with `stream_options.include_usage` a last chunk with the usage
    and no choices, as vLLM ends a stream (the other chunks carry no `usage` field,
    as vLLM's; OpenAI's carry `"usage": null`); with `continuous_usage_stats` too,
    every chunk carries the usage so far, its choice's tokens (vLLM's own).

    Its token counters count as vLLM's do, per token as it is made rather than per
    request finished: the prompt once its first token is out, each token of a stream
    once it is written, so a stream cut short counts the tokens it sent."""

    def __init__(
        self,
        state: EngineState,
        chat: bool,
        prompt_tokens: int,
        max_tokens: int,
        stream: bool,
        n: int = 1,
        usage_chunk: bool = False,  # stream_options.include_usage
        continuous: bool = False,  # stream_options.continuous_usage_stats
    ) -> None:
        self.state, self.chat, self.stream = state, chat, stream
        self.prompt_tokens, self.max_tokens, self.n = prompt_tokens, max_tokens, n
        self.usage_chunk = usage_chunk
        self.continuous = continuous
        self.sent = [0] * n  # tokens written per choice (a stream's)
        prefix = "chatcmpl" if chat else "cmpl"
        # Random, as vLLM's: ids stay unique across engines and restarts.
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.model = state.config.model  # an adapter's name when one was asked for

    def _done(self, counted: bool = False) -> None:
        """`counted`: its tokens are counted already (a stream counts them as sent)."""
        self.state.requests += 1
        now = time.monotonic()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        self.state.metrics.finished(
            0 if counted else self.prompt_tokens,
            0 if counted else self.completion_tokens,
            "length",
            now - self.started,
            ttft,
        )

    @property
    def completion_tokens(self) -> int:
        return self.max_tokens * self.n

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def whole(self) -> dict[str, object]:
        self._done()
        text = " lorem" * self.max_tokens
        choices: list[dict[str, object]] = []
        for index in range(self.n):
            choice: dict[str, object] = {
                "index": index,
                "finish_reason": "length",
                "logprobs": None,
            }
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._usage(),
        }

    def _chunk(self, piece: str | None, finish: str | None, index: int) -> bytes:
        choice: dict[str, object] = {"index": index, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = {} if piece is None else {"content": piece}
        else:
            choice["text"] = piece or ""
        usage = None
        if self.continuous:  # vLLM's: this choice's tokens so far
            done = self.sent[index]
            usage = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done,
            }
        return self._event([choice], usage)

    def _event(
        self, choices: list[dict[str, object]], usage: dict[str, int] | None = None
    ) -> bytes:
        chunk: dict[str, object] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:  # vLLM's: no `usage` field at all on the others
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def stream_to(self, request: web.Request, first_delay: float) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        await asyncio.sleep(first_delay)
        interval = self.state.config.token_interval_s
        metrics = self.state.metrics
        for i in range(self.max_tokens):
            if i:
                await asyncio.sleep(interval)
            else:
                self.first_token_at = time.monotonic()
                metrics.prompt_tokens.inc(self.prompt_tokens)
            for index in range(self.n):
                self.sent[index] += 1
                await resp.write(self._chunk(" lorem", None, index))
                metrics.generation_tokens.inc()  # written: sent
        for index in range(self.n):
            await resp.write(self._chunk(None, "length", index))
        self._done(counted=True)
        if self.usage_chunk:  # OpenAI's and vLLM's last chunk: no choices, the usage
            await resp.write(self._event([], self._usage()))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """As vLLM's: empty the prefix cache (benchmarks start each run cold)."""
    state = request.app[STATE]
    state.cache = PrefixCache(state.config.cache_blocks)
    return web.Response(status=200)


async def server_load(request: web.Request) -> web.Response:
    """vLLM's /load: requests in the HTTP server, 0 unless tracking was asked for."""
    state = request.app[STATE]
    return web.json_response(
        {"server_load": state.server_load if state.config.load_tracking else 0}
    )


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


async def _simulate_traffic(state: EngineState) -> None:
    """Poisson arrivals at the configured rate, once loaded, for the configured time."""
    cfg = state.config
    rng = random.Random(cfg.seed)
    await asyncio.sleep(max(0.0, state.ready_at - time.monotonic()))  # traffic only once loaded
    stop_at = None if cfg.traffic_duration_s is None else time.monotonic() + cfg.traffic_duration_s
    tasks: set[asyncio.Task[str]] = set()
    while stop_at is None or time.monotonic() < stop_at:
        await asyncio.sleep(rng.expovariate(cfg.traffic_rate))
        task = asyncio.create_task(_serve_one(state, rng.randint(8, 512), rng.randint(16, 256)))
        tasks.add(task)  # keep a reference until done
        task.add_done_callback(tasks.discard)


async def _traffic_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    task = None
    if state.config.traffic_rate > 0:
        task = asyncio.create_task(_simulate_traffic(state))
    yield
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _memory_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    _hold(state, state.config.gpu_memory_mib)
    yield
    if state.config.memory_dir is not None:
        fake_process_memory.forget(state.config.memory_dir, os.getpid())


def _access_log(quiet: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """uvicorn's access-log line for every request, as vLLM prints them."""

    def said(request: web.Request, status: int) -> None:
        if request.path not in quiet:
            peer = request.remote or "-"
            print(
                f'INFO:     {peer} - "{request.method} {request.path_qs} HTTP/1.1" {status}',
                flush=True,
            )

    @web.middleware
    async def log_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # no such path: a 404, logged as uvicorn does
            said(request, exc.status)
            raise
        said(request, resp.status)
        return resp

    return log_access


MAX_BODY = 512 * 1024 * 1024  # SMG's own default bound (--max-payload-size)
# The paths vLLM's key guards (vllm/entrypoints/serve/middleware/authenticate.py); the
# rest (/health, /metrics, /load, the sleep endpoints) answer without one.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def _authenticate(keys: tuple[str, ...]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """vLLM's AuthenticationMiddleware: on a guarded path, anything but OPTIONS needs
    `Authorization: Bearer KEY` for one of `keys` (compared as SHA-256 digests, in
    constant time), else 401 `{"error": "Unauthorized"}`."""
    digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def presented(request: web.Request) -> bool:
        scheme, _, param = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        mine = hashlib.sha256(param.encode()).digest()
        found = False
        for d in digests:
            found |= hmac.compare_digest(mine, d)
        return found

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        guarded = request.path.startswith(GUARDED_PREFIX) and request.method != "OPTIONS"
        if guarded and not presented(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return authenticate


def make_app(config: FakeConfig, quiet_paths: frozenset[str] = frozenset()) -> web.Application:
    # vLLM (uvicorn) bounds no body; aiohttp's 1 MiB default would refuse, in plain
    # text, a long prompt the gateway lets through (its --max-body, 64 MiB by default).
    middlewares = [_access_log(quiet_paths)]
    if config.api_keys:
        middlewares.append(_authenticate(config.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app[STATE] = EngineState(
        config=config,
        metrics=EngineMetrics(config.model),
        ready_at=time.monotonic() + config.load_seconds,
        cache=PrefixCache(config.cache_blocks),
        loras=LoraState(config.lora, config.model),
        held_by=config.loaded_after,
    )
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/load", server_load)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    if config.lora.runtime_updates:  # vLLM adds its runtime LoRA endpoints only then
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    if config.dev_mode:  # vLLM registers its development endpoints only then
        app.router.add_post("/sleep", post_sleep)
        app.router.add_post("/wake_up", post_wake_up)
        app.router.add_get("/is_sleeping", get_is_sleeping)
        app.router.add_post("/collective_rpc", collective_rpc)
    app.cleanup_ctx.append(_memory_ctx)
    app.cleanup_ctx.append(_traffic_ctx)
    return app


async def _chatter(every_s: float, for_s: float) -> None:
    start = time.monotonic()
    while (done := time.monotonic() - start) < for_s:
        _say(f"loading: {done:.1f}s of {for_s:g}s")
        await asyncio.sleep(every_s)


def _share(text: str) -> float:
    """vLLM's check of --gpu-memory-utilization: a share of the card, above 0, at most 1."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"GPU memory utilization must be in (0, 1], got {text}")
    return value


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m llmgw.agent.fake_engine", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fake-model")
    p.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="keys a client must present on /v1 (as vLLM's; VLLM_API_KEY, which keeps a "
        "key off the command line, when not given)",
    )
    p.add_argument("--load-seconds", type=float, default=2.0, help="time /health answers 503")
    p.add_argument(
        "--loaded-after",
        type=Path,
        default=None,
        metavar="PATH",
        help="a test's hold: still loading, past --load-seconds, until PATH exists",
    )
    p.add_argument(
        "--load-chatter",
        type=float,
        default=None,
        metavar="S",
        help="while loading, print a progress line every S seconds (as vLLM's loaders do)",
    )
    p.add_argument(
        "--latency", type=float, default=0.05, help="seconds to the first token, nothing cached"
    )
    p.add_argument(
        "--cached-latency",
        type=float,
        default=None,
        help="seconds to the first token with the whole prompt cached (default: latency/10)",
    )
    p.add_argument("--token-interval", type=float, default=0.0, help="seconds between later tokens")
    p.add_argument(
        "--cache-blocks",
        type=int,
        default=4096,
        help=f"prefix-cache capacity in {BLOCK_TOKENS}-token blocks (0: none)",
    )
    p.add_argument("--traffic", type=float, default=0.0, help="simulated requests per second")
    p.add_argument("--traffic-duration", type=float, default=None, help="then go quiet")
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=0.0,
        help="seconds requests in flight may finish after a stop signal (default: none)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--fail-after", type=float, default=None, help="crash after this many seconds")
    p.add_argument("--exit-code", type=int, default=1, help="exit status of --fail-after")
    p.add_argument("--ignore-sigterm", action="store_true", help="only SIGKILL stops it")
    p.add_argument(
        "--hang-after", type=float, default=None, help="seconds after loading: /health fails"
    )
    p.add_argument(
        "--stall-after",
        type=float,
        default=None,
        help="seconds after loading: nothing generates, /health still answers 200",
    )
    p.add_argument("--health-delay", type=float, default=0.0, help="seconds /health takes")
    p.add_argument(
        "--enable-server-load-tracking",
        action="store_true",
        help="/load counts the requests in the server (as vLLM's option)",
    )
    p.add_argument(
        "--disable-access-log-for-endpoints",
        default="",
        help="comma-separated paths left out of the access log (as vLLM's option)",
    )
    p.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="POST /sleep and /wake_up work (they exist only with VLLM_SERVER_DEV_MODE=1)",
    )
    p.add_argument("--sleep-seconds", type=float, default=0.2, help="time a sleep takes")
    p.add_argument("--wake-seconds", type=float, default=0.5, help="time a wake takes")
    p.add_argument(
        "--gpu-memory-mib",
        type=int,
        default=16384,
        help=f"MiB held on each card awake ({fake_process_memory.ENV_DIR} says where it is told)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=_share,
        default=0.9,
        help="taken and checked as vLLM's option (a share of each card, above 0, at most 1); "
        "what it holds is --gpu-memory-mib",
    )
    p.add_argument(
        "--sleep-keeps-memory",
        action="store_true",
        help="fault: a sleep answers 200 and keeps the memory held",
    )
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    p.add_argument("--max-loras", type=int, default=1, help="distinct adapters in one batch")
    p.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="adapters resident in host memory (default: --max-loras)",
    )
    p.add_argument("--max-lora-rank", type=int, default=16, help="largest adapter rank loaded")
    p.add_argument(
        "--lora-load-seconds", type=float, default=0.05, help="time reading one adapter takes"
    )
    # Real engines take many more options; accept and ignore unknown ones so a
    # model spec's engine_args written for vLLM do not crash the fake.
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"fake engine: ignoring options {unknown}", flush=True)
    return args


def runtime_lora_updates(env: Mapping[str, str]) -> bool:
    """vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING: "1" or "true", any case."""
    return env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} fake engine: {text}", flush=True)


async def _run(args: argparse.Namespace) -> int:
    config = FakeConfig(
        model=args.model,
        load_seconds=args.load_seconds,
        loaded_after=args.loaded_after,
        latency_s=args.latency,
        cached_latency_s=args.cached_latency,
        token_interval_s=args.token_interval,
        cache_blocks=args.cache_blocks,
        traffic_rate=args.traffic,
        traffic_duration_s=args.traffic_duration,
        seed=args.seed,
        hang_after_s=args.hang_after,
        stall_after_s=args.stall_after,
        health_delay_s=args.health_delay,
        load_tracking=args.enable_server_load_tracking,
        dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
        sleep_mode=args.enable_sleep_mode,
        sleep_s=args.sleep_seconds,
        wake_s=args.wake_seconds,
        gpu_memory_mib=args.gpu_memory_mib,
        sleep_keeps_memory=args.sleep_keeps_memory,
        memory_dir=Path(d) if (d := os.environ.get(fake_process_memory.ENV_DIR)) else None,
        gpus=tuple(g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g),
        # vLLM: --api-key wins over VLLM_API_KEY; an empty key asks for none.
        api_keys=tuple(k for k in (args.api_key or [os.environ.get("VLLM_API_KEY", "")]) if k),
        lora=LoraConfig(
            enabled=args.enable_lora,
            runtime_updates=runtime_lora_updates(os.environ),
            max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras,
            max_lora_rank=args.max_lora_rank,
            load_s=args.lora_load_seconds,
        ),
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    quiet = frozenset(p for p in args.disable_access_log_for_endpoints.split(",") if p)
    app = make_app(config, quiet)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    _say(f"loading {args.model} on {args.host}:{args.port} for {args.load_seconds:g}s")
    loop.call_later(args.load_seconds, _say, "ready")
    chatter = (
        asyncio.create_task(_chatter(args.load_chatter, args.load_seconds))
        if args.load_chatter
        else None
    )
    code = 0
    try:
        if args.fail_after is None:
            await stop.wait()
            _say("stopping on signal")
        else:
            try:
                await asyncio.wait_for(stop.wait(), timeout=args.fail_after)
                _say("stopping on signal")
            except TimeoutError:
                print(f"fatal: simulated failure, exit code {args.exit_code}", file=sys.stderr)
                code = args.exit_code
    finally:
        if chatter is not None:
            chatter.cancel()
        await _abort_in_flight(app[STATE], args.stop_timeout)
        await runner.cleanup()
    return code


async def _abort_in_flight(state: EngineState, timeout_s: float) -> None:
    """As a real engine does, a stop cuts the requests still running (after
    `timeout_s`): routing must have moved them away before it."""
    if state.active and timeout_s > 0:
        await asyncio.wait(set(state.active), timeout=timeout_s)
    if state.active:
        _say(f"stopping: cutting {len(state.active)} request(s) in flight")
    for task in list(state.active):
        task.cancel()
    await asyncio.sleep(0)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(_run(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
