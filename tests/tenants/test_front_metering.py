"""The front's metering and limits in process, before the fake engine itself (no SMG
between: the front proxies to whatever answers OpenAI's routes). Tokens counted
exactly as the engine counted them, for whole answers, streams and a stream the
client left; a client that did not ask for usage sees none; a tenant over its
limit gets OpenAI's 429 before the engine sees anything, another tenant does not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.fake_engine import FakeConfig, make_app
from llmgw.gateway.front import Front
from llmgw.gateway.keyring import Keyring
from llmgw.tenant_keys import digest
from llmgw.wire import ClientKeyEntry, TenantLimitView

ACME, BETA = "sk-llmgw-acme-0123456789", "sk-llmgw-beta-0123456789"
MESSAGES = [{"role": "user", "content": "one two three"}]  # 4 prompt tokens: "user: one two three"


@pytest.fixture
async def engine() -> AsyncIterator[TestServer]:
    config = FakeConfig(model="m", load_seconds=0, latency_s=0.01, token_interval_s=0.3)
    server = TestServer(make_app(config))
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def front(engine: TestServer) -> AsyncIterator[tuple[Front, str]]:
    keyring = Keyring()
    keyring.set_controller_keys(
        [
            ClientKeyEntry(id="a", tenant="acme", digest=digest(ACME), models=["*"]),
            ClientKeyEntry(id="b", tenant="beta", digest=digest(BETA), models=["m"]),
        ]
    )
    front = Front(keyring, lambda: str(engine.make_url("")).rstrip("/"), "upstream", declared={"m"})
    port = aiohttp.test_utils.unused_port()
    await front.start("127.0.0.1", port)
    yield front, f"http://127.0.0.1:{port}"
    await front.stop()


async def engine_tokens(engine: TestServer) -> tuple[int, int]:
    async with aiohttp.ClientSession() as http, http.get(engine.make_url("/metrics")) as r:
        text = await r.text()
    found = {s.name: int(s.value) for f in text_string_to_metric_families(text) for s in f.samples}
    return found["vllm:prompt_tokens_total"], found["vllm:generation_tokens_total"]


def counts(front: Front) -> dict[tuple[str, str], tuple[int, int, int, int, int]]:
    return {
        k: (t.requests, t.prompt_tokens, t.completion_tokens, t.errors, t.rate_limited)
        for k, t in front.meter.cut(100).items()
    }


_opened: list[openai.AsyncOpenAI] = []


def client(url: str, key: str) -> openai.AsyncOpenAI:
    made = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)
    _opened.append(made)
    return made


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Each test's clients closed in its own loop (see tests/gateway/test_front_answers.py)."""
    yield
    while _opened:
        await _opened.pop().close()


async def test_whole_and_streamed_answers_are_metered_as_the_engine_counted(
    engine: TestServer, front: tuple[Front, str]
) -> None:
    gw, url = front
    acme = client(url, ACME)
    whole = await acme.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert whole.usage is not None and (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    ) == (4, 2)
    # A stream the client asked no usage of: it sees none (no usage chunk, no field).
    chunks = [
        c
        async for c in await acme.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=3,
            stream=True,  # type: ignore[arg-type]
        )
    ]
    assert all(c.choices and c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " lorem" * 3
    # One that asked: the closing usage chunk, as the engine sends it.
    chunks = [
        c
        async for c in await acme.completions.create(
            model="m",
            prompt="a b",
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])
    assert counts(gw) == {("acme", "m"): (3, 4 + 4 + 2, 2 + 3 + 2, 0, 0)}
    assert await engine_tokens(engine) == (10, 7)


async def test_a_stream_left_mid_way_counts_the_tokens_sent(
    engine: TestServer, front: tuple[Front, str]
) -> None:
    gw, url = front
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 50, "stream": True}
    got = 0
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {BETA}"},
        ) as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                assert '"usage"' not in line
                got += 1
            if got == 2:
                break  # the client leaves
    for _ in range(100):  # the front's handler ends once it sees the client gone
        if gw.meter:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # past the engine's next token: it wrote no more
    assert counts(gw) == {("beta", "m"): (1, 4, 2, 0, 0)}
    assert await engine_tokens(engine) == (4, 2)


async def test_over_a_limit_429_before_the_engine_and_another_tenant_untouched(
    engine: TestServer, front: tuple[Front, str]
) -> None:
    gw, url = front
    gw.limiter.set_limits([TenantLimitView(tenant="acme", rpm=1)])
    acme, beta = client(url, ACME), client(url, BETA)
    await acme.completions.create(model="m", prompt="a", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        await acme.completions.create(model="m", prompt="a", max_tokens=1)
    answer = refused.value.response
    assert answer.headers["Retry-After"] == "60" and answer.headers["x-llmgw-limit"] == "rpm"
    assert refused.value.body == {
        "type": "rate_limit_exceeded",
        "code": "rate_limit_exceeded",
        "message": "Rate limit reached for tenant acme on requests per minute (RPM): "
        "limit 1. Please try again in 60s.",
        "param": None,
    }
    await beta.completions.create(model="m", prompt="a", max_tokens=1)  # untouched
    assert counts(gw) == {("acme", "m"): (1, 1, 1, 0, 1), ("beta", "m"): (1, 1, 1, 0, 0)}
    assert await engine_tokens(engine) == (2, 2), "the refused request never reached it"
    # A model the controller never declared: neither limited nor counted (SMG's 404).
    with pytest.raises(openai.NotFoundError):
        await acme.completions.create(model="nope", prompt="a", max_tokens=1)
    assert counts(gw) == {}


async def test_a_client_that_leaves_before_a_whole_answer_is_no_error(
    front: tuple[Front, str],
) -> None:
    gw, url = front
    body = {"model": "m", "prompt": "a", "max_tokens": 20}  # 20 tokens at 0.3 s: 6 s
    headers = {"Authorization": f"Bearer {ACME}"}
    async with httpx.AsyncClient(timeout=0.5) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{url}/v1/completions", json=body, headers=headers)
    for _ in range(100):
        if gw.meter:
            break
        await asyncio.sleep(0.02)
    assert counts(gw) == {("acme", "m"): (1, 0, 0, 0, 0)}, "nothing sent: no tokens, no error"
