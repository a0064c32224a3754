"""What an OpenAI client meets at the gateway's front door (issue 35 items 3 and 11,
issue 36 item 7), in process before a fake SMG: a body over `--max-body`, a model
nobody declared, a wrong key on a kept-alive connection, SMG restarting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, unused_port

from llmgw.gateway import front as front_module
from llmgw.gateway.front import Front
from llmgw.gateway.keyring import Keyring
from llmgw.gateway.keys import ApiKey

KEY = "sk-file-key-1"
MiB = 2**20


ASKED: dict[str, int] = {}  # model -> requests the fake SMG got for it


async def fake_smg(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    ASKED[body["model"]] = ASKED.get(body["model"], 0) + 1
    # "late" is registered on its third request, as SMG takes a new worker; "unhealthy"
    # has a worker that passes its health checks from its third request on.
    model = body["model"]
    served = model == "served" or (model in ("late", "unhealthy") and ASKED[model] > 2)
    if model in ("unhealthy", "never-healthy", "not-ours") and not served:
        return web.json_response(  # what SMG answers when no worker of it is healthy
            {"error": {"type": "server_error", "code": "no_available_workers",
                       "message": "All workers are unavailable (circuit breaker open or "
                                  "unhealthy)", "param": None}},
            status=503,
            headers={"x-smg-error-code": "no_available_workers", "retry-after": "1"},
        )  # fmt: skip
    if not served:  # what SMG answers for a model no worker serves
        return web.json_response(
            {"error": {"type": "invalid_request_error", "code": "model_not_found",
                       "message": f"No worker available for model '{body['model']}'",
                       "param": None}},
            status=404,
            headers={"x-smg-error-code": "model_not_found", "x-request-id": "chatcmpl-smg1"},
        )  # fmt: skip
    return web.json_response(
        {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "served",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "ok"}}]}
    )  # fmt: skip


def smg_app() -> web.Application:
    app = web.Application(client_max_size=1024 * MiB)
    app.router.add_post("/v1/chat/completions", fake_smg)
    return app


@pytest.fixture(autouse=True)
def _short_declared_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # What is tested is that a declared model is sent again, then refused with a 503;
    # the bound itself (15 s) would only make these tests wait.
    monkeypatch.setattr(front_module, "DECLARED_RETRY_S", 2.0)


@pytest.fixture
async def smg() -> AsyncIterator[TestServer]:
    server = TestServer(smg_app())
    await server.start_server()
    yield server
    await server.close()


async def start(upstream: str, **options: object) -> tuple[Front, str]:
    front = Front(Keyring([ApiKey("t", KEY)]), lambda: upstream, "up-key", **options)  # type: ignore[arg-type]
    port = unused_port()
    await front.start("127.0.0.1", port)
    return front, f"http://127.0.0.1:{port}"


_opened: list[openai.AsyncOpenAI] = []


def client(url: str) -> openai.AsyncOpenAI:
    made = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    _opened.append(made)
    return made


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Each test's clients closed in its own loop: one left to the collector closes
    itself in whatever test's loop runs then ("Event loop is closed", logged as an
    error there: a test that counts error logs failed for it in a clean-clone run)."""
    yield
    while _opened:
        await _opened.pop().close()


def chat(model: str, text: str = "hi") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


async def test_a_body_over_the_bound_is_a_413_in_openais_shape(smg: TestServer) -> None:
    front, url = await start(str(smg.make_url("")), max_body=2 * MiB)
    try:
        # 1.5 MiB passes (SMG and aiohttp's own default stop at 1 MiB): a long prompt.
        answer = await client(url).chat.completions.create(**chat("served", "x" * (3 * MiB // 2)))  # type: ignore[call-overload]
        assert answer.choices[0].message.content == "ok"
        with pytest.raises(openai.APIStatusError) as refused:
            await client(url).chat.completions.create(**chat("served", "x" * (3 * MiB)))  # type: ignore[call-overload]
        assert refused.value.status_code == 413
        assert refused.value.code == "request_too_large"
        error = refused.value.response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] is None
        assert "--max-body" in error["message"] and str(2 * MiB) in error["message"]

        # Chunked (no Content-Length) and over: the same answer.
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"x" * MiB

        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{url}/v1/chat/completions",
                data=chunks(),
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r,
        ):
            assert r.status == 413 and (await r.json())["error"]["code"] == "request_too_large"
    finally:
        await front.stop()


async def test_an_undeclared_model_does_not_exist_and_a_declared_one_is_retried(
    smg: TestServer,
) -> None:
    front, url = await start(str(smg.make_url("")), declared={"declared-not-routed", "late"})
    try:
        with pytest.raises(openai.NotFoundError) as missing:
            await client(url).chat.completions.create(**chat("no-such-model"))  # type: ignore[call-overload]
        assert missing.value.code == "model_not_found"
        assert missing.value.response.json()["error"] == {
            "type": "invalid_request_error",
            "code": "model_not_found",
            "message": "The model `no-such-model` does not exist or you do not have access to it.",
            "param": None,
        }
        assert missing.value.response.headers["x-request-id"] == "chatcmpl-smg1"
        assert ASKED["no-such-model"] == 1
        # Declared, and SMG takes its worker a moment later: sent again, answered.
        answer = await client(url).chat.completions.create(**chat("late"))  # type: ignore[call-overload]
        assert answer.choices[0].message.content == "ok" and ASKED["late"] == 3
        # Declared, and SMG has no worker for it within the bound: never a 404, a 503
        # to retry.
        with pytest.raises(openai.InternalServerError) as waiting:
            await client(url).chat.completions.create(**chat("declared-not-routed"))  # type: ignore[call-overload]
        assert waiting.value.status_code == 503 and waiting.value.code == "model_not_ready"
        assert waiting.value.response.headers["Retry-After"] == "1"
    finally:
        await front.stop()


async def test_a_declared_model_whose_worker_is_not_healthy_yet_is_retried(
    smg: TestServer,
) -> None:
    """SMG answers 503 no_available_workers, with its circuit-breaker words, while a
    model's only worker is registered but not yet healthy (seen right after a model
    first serves, the rare 503 of test_keys_unknown_and_unserved_models): it sent the
    request nowhere, so the front sends it again within the bound, as for its 404."""
    declared = {"unhealthy", "never-healthy"}
    front, url = await start(str(smg.make_url("")), declared=declared)
    try:
        answer = await client(url).chat.completions.create(**chat("unhealthy"))  # type: ignore[call-overload]
        assert answer.choices[0].message.content == "ok" and ASKED["unhealthy"] == 3
        with pytest.raises(openai.InternalServerError) as waiting:
            await client(url).chat.completions.create(**chat("never-healthy"))  # type: ignore[call-overload]
        assert waiting.value.code == "model_not_ready"
        assert "circuit breaker" not in waiting.value.message
        assert waiting.value.response.headers["Retry-After"] == "1"
        # A model llmgw never declared keeps SMG's answer as it is, sent once.
        with pytest.raises(openai.InternalServerError) as theirs:
            await client(url).chat.completions.create(**chat("not-ours"))  # type: ignore[call-overload]
        assert theirs.value.code == "no_available_workers" and ASKED["not-ours"] == 1
    finally:
        await front.stop()


async def test_a_wrong_key_leaves_the_kept_alive_connection_usable(smg: TestServer) -> None:
    front, url = await start(str(smg.make_url("")))
    try:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as http:
            for i in range(200):
                key = KEY if i % 2 else "sk-wrong"
                r = await http.post(
                    "/v1/chat/completions",
                    json=chat("served", "x" * 2000),
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert r.status_code == (200 if i % 2 else 401), i
    finally:
        await front.stop()


async def test_what_never_reached_smg_is_sent_again_once_it_is_back() -> None:
    """SMG restarting: nothing listens on its port for a while. A request then
    waits for it (within UPSTREAM_RETRY_S) instead of failing."""
    port = unused_port()
    front, url = await start(f"http://127.0.0.1:{port}")
    runner = web.AppRunner(smg_app())
    try:
        asked = asyncio.create_task(client(url).chat.completions.create(**chat("served")))  # type: ignore[call-overload]
        await asyncio.sleep(0.5)  # refused meanwhile, tried again
        assert not asked.done()
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        answer = await asked
        assert answer.choices[0].message.content == "ok"
        # Past the bound: the 503 to retry, as before.
        await runner.cleanup()
        with pytest.raises(openai.InternalServerError) as down:
            await client(url).chat.completions.create(**chat("served"))  # type: ignore[call-overload]
        assert down.value.code == "gateway_unavailable"
    finally:
        await runner.cleanup()
        await front.stop()


async def test_the_front_says_when_an_answer_through_smg_has_ended(smg: TestServer) -> None:
    """The hook the status follows (a replica may have just gone idle): called once per
    answer SMG gave, after its end, and not for what the front refused itself."""
    ended: list[None] = []
    front, url = await start(
        str(smg.make_url("")), declared={"late"}, on_answered=lambda: ended.append(None)
    )
    try:
        answer = await client(url).chat.completions.create(**chat("served"))  # type: ignore[call-overload]
        assert answer.choices[0].message.content == "ok"
        assert len(ended) == 1
        await client(url).chat.completions.create(**chat("late"))  # type: ignore[call-overload]
        assert len(ended) == 2, "the 404s SMG gave before were sent again, not answered"
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/v1/chat/completions", json=chat("served"))
        assert r.status_code == 401 and len(ended) == 2, "refused by the front: no answer of SMG's"
    finally:
        await front.stop()
