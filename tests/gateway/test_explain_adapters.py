"""The gateway routes a LoRA adapter's requests by name (issue 33 item 3): only to a
replica that holds it, the least busy first; none holding it, the request is held
(and counted) until one does, or answered 503 with Retry-After past the bound; an
engine that let go of it (404) is not asked again for that request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from pytest_aiohttp import AiohttpServer

from llmgw.agent.fake_engine import FakeConfig, make_app
from llmgw.agent.fake_lora import LoraConfig
from llmgw.agent.sample_models import write_adapter
from llmgw.gateway.explain import Explainer
from llmgw.wire import Unserved, UnservedKind

LORA = FakeConfig(
    model="base",
    load_seconds=0,
    latency_s=0.2,
    lora=LoraConfig(enabled=True, runtime_updates=True, max_loras=4, max_cpu_loras=4, load_s=0),
)


async def _engine(server_factory: AiohttpServer, tmp_path: Path, loaded: list[str]) -> str:
    server = await server_factory(make_app(LORA))
    url = str(server.make_url("")).rstrip("/")
    async with httpx.AsyncClient() as http:
        for name in loaded:
            body = {"lora_name": name, "lora_path": str(write_adapter(tmp_path / name))}
            assert (await http.post(f"{url}/v1/load_lora_adapter", json=body)).status_code == 200
    return url


async def _soon(condition: Callable[[], object]) -> None:
    """Wait up to a second for `condition()` to be true."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.01)


async def test_requests_go_only_where_the_adapter_is_held_and_spread(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    holder_a = await _engine(aiohttp_server, tmp_path, ["sql"])
    holder_b = await _engine(aiohttp_server, tmp_path, ["sql"])
    other = await _engine(aiohttp_server, tmp_path, [])
    e = Explainer(wake_timeout_s=5)
    await e.start()
    try:
        workers = e.set_adapters({"sql": "base"})
        (url,) = workers
        assert workers[url] == "sql"
        e.set_serving({"base": [holder_a, holder_b, other], "sql": [holder_a, holder_b]})
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "sql", "prompt": "x", "max_tokens": 1}
            answers = await asyncio.gather(
                *(http.post(f"{url}/v1/completions", json=body) for _ in range(6))
            )
            assert all(a.status_code == 200 and a.json()["model"] == "sql" for a in answers)
            served = {}
            for engine in (holder_a, holder_b, other):
                metrics = (await http.get(f"{engine}/metrics")).text
                served[engine] = sum(
                    float(x.rsplit(" ", 1)[1])
                    for x in metrics.splitlines()
                    if x.startswith("vllm:request_success_total")
                )
        assert served[other] == 0  # never where it is not held
        assert served[holder_a] == served[holder_b] == 3  # the least busy first
        assert e.adapter_requests["sql"] == 6 and not e.adapter_in_flight
    finally:
        await e.stop()


@pytest.fixture
async def explainer() -> AsyncIterator[Explainer]:
    e = Explainer(wake_timeout_s=5)
    await e.start()
    yield e
    await e.stop()


async def test_the_adapters_in_flight_at_each_engine_are_known_while_they_run(
    explainer: Explainer, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """What the status says busy (`adapter_busy`): an unload there waits for it."""
    e, holder = explainer, await _engine(aiohttp_server, tmp_path, ["sql"])
    (url,) = e.set_adapters({"sql": "base"})
    e.set_serving({"sql": [holder]})
    async with httpx.AsyncClient(timeout=10) as http:
        body = {"model": "sql", "prompt": "x", "max_tokens": 1}
        running = asyncio.gather(*(http.post(f"{url}/v1/completions", json=body) for _ in range(2)))
        await _soon(e.adapters_in_flight_at)
        assert e.adapters_in_flight_at() == {holder: {"sql"}}
        assert all(a.status_code == 200 for a in await running)
    assert e.adapters_in_flight_at() == {}


async def test_how_long_requests_have_been_held_is_known_per_model(
    explainer: Explainer, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """The status's `held_age`: since when some request for it has been waiting."""
    e = explainer
    (url,) = e.set_adapters({"sql": "base"})
    async with httpx.AsyncClient(timeout=10) as http:
        body = {"model": "sql", "prompt": "x", "max_tokens": 1}
        waiting = asyncio.ensure_future(http.post(f"{url}/v1/completions", json=body))
        await _soon(lambda: e.held)
        await asyncio.sleep(0.25)
        assert set(e.held_ages()) == {"sql"} and e.held_ages()["sql"] >= 0.2
        e.set_serving({"sql": [await _engine(aiohttp_server, tmp_path, ["sql"])]})
        assert (await waiting).status_code == 200
    assert e.held_ages() == {}


async def test_held_until_a_replica_holds_it_then_served(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    engine = await _engine(aiohttp_server, tmp_path, ["sql"])
    told: list[str] = []
    e = Explainer(wake_timeout_s=10, on_hold=lambda: told.append("held"))
    await e.start()
    try:
        (url,) = e.set_adapters({"sql": "base"})
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "sql", "prompt": "x", "max_tokens": 1}
            asking = asyncio.create_task(http.post(f"{url}/v1/completions", json=body))
            for _ in range(200):
                if e.held.get("sql"):
                    break
                await asyncio.sleep(0.01)
            assert e.held == {"sql": 1} and told == ["held"]
            e.set_serving({"sql": [engine]})
            answer = await asyncio.wait_for(asking, 5)
        assert answer.status_code == 200 and answer.json()["model"] == "sql"
        assert e.held == {}
    finally:
        await e.stop()


async def test_past_the_bound_a_503_with_retry_after(aiohttp_server: AiohttpServer) -> None:
    e = Explainer(wake_timeout_s=0.3)
    await e.start()
    try:
        (url,) = e.set_adapters({"sql": "base"})
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{url}/v1/completions", json={"model": "sql", "prompt": "x"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        assert r.json()["error"]["code"] == "model_waking"
        assert "no replica of base loaded adapter sql" in r.json()["error"]["message"]
        assert e.held == {}
    finally:
        await e.stop()


async def test_an_engine_that_let_go_is_not_asked_again(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    gone = await _engine(aiohttp_server, tmp_path, [])
    holder = await _engine(aiohttp_server, tmp_path, ["sql"])
    e = Explainer(wake_timeout_s=5)
    await e.start()
    try:
        (url,) = e.set_adapters({"sql": "base"})
        e.set_serving({"sql": [gone, holder]})  # the feed is a moment behind
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(3):
                r = await http.post(f"{url}/v1/completions", json={"model": "sql", "prompt": "x"})
                assert r.status_code == 200 and r.json()["model"] == "sql"
    finally:
        await e.stop()


async def test_an_adapter_whose_files_are_nowhere_gets_the_unplaceable_503_at_once() -> None:
    """Issue 33 item 1: declared, but complete on no node's storage: never served, so
    its requests get the 503 of a model that cannot be placed, not a wait."""
    e = Explainer(wake_timeout_s=30)
    await e.start()
    try:
        why = Unserved(kind=UnservedKind.UNPLACEABLE, message="adapter sql: acme/sql is nowhere")
        e.set_unserved({"sql": why})
        (url,) = e.set_adapters({"sql": "base"})
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{url}/v1/completions", json={"model": "sql", "prompt": "x"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_unplaceable"
        assert "acme/sql is nowhere" in r.json()["error"]["message"]
        assert r.headers["x-should-retry"] == "false"
        assert e.held == {}, "never held"
    finally:
        await e.stop()
