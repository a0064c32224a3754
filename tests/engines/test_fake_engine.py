"""The fake engine's HTTP surface, in-process (pytest-aiohttp) and as a process."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient

from llmgw.agent.fake_engine import FakeConfig, make_app
from llmgw.agent.metrics import parse_engine_metrics


async def test_health_503_while_loading(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(FakeConfig(load_seconds=60)))
    resp = await client.get("/health")
    assert resp.status == 503
    resp = await client.post("/v1/completions", json={"prompt": "x"})
    assert resp.status == 503


async def test_a_load_held_until_a_file_exists(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """`--loaded-after PATH`: a test holds the load past `--load-seconds` until it
    creates PATH (a wake that must not finish before the test's clients are gone)."""
    gate = tmp_path / "go"
    client = await aiohttp_client(make_app(FakeConfig(load_seconds=0, loaded_after=gate)))
    assert (await client.get("/health")).status == 503
    gate.touch()
    assert (await client.get("/health")).status == 200


async def test_serves_models_completions_and_vllm_metrics(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(FakeConfig(model="org/m", load_seconds=0, latency_s=0)))
    assert (await client.get("/health")).status == 200
    models = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["org/m"]

    before = parse_engine_metrics(await (await client.get("/metrics")).text())
    assert before is not None
    assert before.gauges["vllm:num_requests_running"] == 0

    resp = await client.post(
        "/v1/completions", json={"model": "org/m", "prompt": "a b c", "max_tokens": 4}
    )
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}

    text = await (await client.get("/metrics")).text()
    assert 'model_name="org/m"' in text
    after = parse_engine_metrics(text)
    assert after is not None
    assert after.counters["vllm:request_success_total"] == 1
    assert after.counters["vllm:prompt_tokens_total"] == 3
    assert after.counters["vllm:generation_tokens_total"] == 4


async def test_a_long_prompt_is_served_as_vllm_serves_it(aiohttp_client: AiohttpClient) -> None:
    """Past aiohttp's 1 MiB default: vLLM bounds no body, and the gateway lets 64 MiB through."""
    client = await aiohttp_client(make_app(FakeConfig(model="m", load_seconds=0, latency_s=0)))
    prompt = "word " * (3 * 1024 * 1024 // 5)  # 3 MiB
    resp = await client.post("/v1/completions", json={"model": "m", "prompt": prompt})
    assert resp.status == 200, await resp.text()


async def test_rejects_bad_requests(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(FakeConfig(load_seconds=0)))
    assert (await client.post("/v1/completions", json={"model": "other"})).status == 404
    assert (await client.post("/v1/completions", json={"max_tokens": -1})).status == 400
    assert (await client.post("/v1/completions", data=b"nope")).status == 400


async def test_running_gauge_counts_in_flight_requests(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(FakeConfig(load_seconds=0, latency_s=1.0)))
    req = asyncio.create_task(client.post("/v1/completions", json={"prompt": "x"}))
    running = 0.0
    for _ in range(50):  # until the request is in flight
        s = parse_engine_metrics(await (await client.get("/metrics")).text())
        assert s is not None
        running = s.gauges["vllm:num_requests_running"]
        if running:
            break
        await asyncio.sleep(0.01)
    assert running == 1
    assert (await req).status == 200
    s = parse_engine_metrics(await (await client.get("/metrics")).text())
    assert s is not None and s.gauges["vllm:num_requests_running"] == 0


async def test_simulated_traffic_moves_counters(aiohttp_client: AiohttpClient) -> None:
    cfg = FakeConfig(load_seconds=0, latency_s=0.01, traffic_rate=50, seed=7)
    client = await aiohttp_client(make_app(cfg))
    await asyncio.sleep(0.4)
    s = parse_engine_metrics(await (await client.get("/metrics")).text())
    assert s is not None and s.counters["vllm:request_success_total"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_health(port: int, want: int, within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as r:
                    if r.status == want:
                        return
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"/health never answered {want}")
            await asyncio.sleep(0.05)


async def test_process_loads_serves_and_stops_on_sigterm() -> None:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.agent.fake_engine",
        "--port",
        str(port),
        "--load-seconds",
        "0.3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await _wait_health(port, 200)
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 5) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_fail_after_exits_with_code() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.agent.fake_engine",
        "--port",
        str(_free_port()),
        "--fail-after",
        "0.2",
        "--exit-code",
        "7",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 7
    assert b"simulated failure" in err


async def test_chat_completions_whole_and_streamed(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(make_app(FakeConfig(model="m", load_seconds=0, latency_s=0)))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"

    for path, payload in (
        ("/v1/chat/completions", {"messages": messages}),
        ("/v1/completions", {"prompt": "a b"}),
    ):
        resp = await client.post(path, json={**payload, "stream": True, "max_tokens": 3})
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [
            line.removeprefix("data: ")
            for line in (await resp.text()).splitlines()
            if line.startswith("data: ")
        ]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert len(chunks) == 4  # three tokens, then the finish reason
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    assert (await client.post("/v1/chat/completions", json={"messages": []})).status == 400


async def test_prefix_cache_counts_hits_and_answers_faster(aiohttp_client: AiohttpClient) -> None:
    cfg = FakeConfig(load_seconds=0, latency_s=0.3, cached_latency_s=0.0)
    client = await aiohttp_client(make_app(cfg))
    words = [f"t{i}" for i in range(64)]  # four 16-token blocks
    prompt = " ".join(words)

    async def timed(text: str) -> float:
        t0 = time.monotonic()
        resp = await client.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
        assert resp.status == 200
        return time.monotonic() - t0

    cold = await timed(prompt)
    warm = await timed(prompt)
    other = await timed(" ".join(words[:32] + ["different"] * 40))
    assert warm < cold / 2  # cached: much less than the uncached first-token delay
    assert other > warm
    text = await (await client.get("/metrics")).text()
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("vllm:prefix_cache")
    }
    assert samples["vllm:prefix_cache_queries_total"] == 64 + 64 + 72
    assert samples["vllm:prefix_cache_hits_total"] == 64 + 32  # all, then the shared half
