"""The gateway's front door in process, before a fake SMG that echoes what it got:
what passes, with which key, and what a limited key sees."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.gateway.front import Front
from llmgw.gateway.keyring import Keyring
from llmgw.gateway.keys import ApiKey
from llmgw.tenant_keys import digest
from llmgw.wire import ClientKeyEntry

CONTROL_KEY = "smg-admin-key"  # SMG's control-plane key, which only the gateway knows
LIMITED, EVERY, FILED = "sk-llmgw-lim-1", "sk-llmgw-all-1", "sk-file-key-1"


async def fake_smg(request: web.Request) -> web.StreamResponse:
    if request.path == "/v1/models":
        data = [{"id": m, "object": "model"} for m in ("llama-8b", "chat", "llama-70b")]
        return web.json_response({"object": "list", "data": data})
    body = await request.read()
    answer = web.json_response(
        {
            "path": request.path,
            "auth": request.headers.get("Authorization"),
            "body": body.decode(),
            "length": request.headers.get("Content-Length"),
            "cookie": request.headers.get("Cookie"),
        },
        headers={"x-smg": "yes"},
    )
    if request.query.get("set_cookie"):
        answer.set_cookie("session", request.query["set_cookie"])
    return answer


@pytest.fixture
async def smg() -> AsyncIterator[TestServer]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake_smg)
    server = TestServer(app)
    await server.start_server()
    yield server
    await server.close()


async def start(smg: TestServer, keyring: Keyring, *, public: bool = False) -> tuple[Front, str]:
    front = Front(keyring, lambda: str(smg.make_url("")).rstrip("/"), CONTROL_KEY, public=public)
    port = aiohttp.test_utils.unused_port()
    await front.start("127.0.0.1", port)
    return front, f"http://127.0.0.1:{port}"


def ring(*, file: bool = False) -> Keyring:
    keyring = Keyring([ApiKey("filed", FILED)] if file else [])
    keyring.set_controller_keys(
        [
            ClientKeyEntry(id="lim", tenant="acme", digest=digest(LIMITED), models=["llama-*"]),
            ClientKeyEntry(id="all", tenant="beta", digest=digest(EVERY), models=["*"]),
        ]
    )
    return keyring


async def call(
    url: str, method: str, path: str, key: str | None = None, body: Any = None
) -> tuple[int, Any, Mapping[str, str]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url + path, json=body, headers=headers) as r,
    ):
        text = await r.text()
        return r.status, json.loads(text) if text else None, r.headers.copy()


async def test_no_client_key_passes_to_smg_which_gives_each_engine_its_own(
    smg: TestServer,
) -> None:
    """Issue 36: SMG sends an engine its own key only when the request it forwards
    carries no Authorization (a client's header wins), so none reaches SMG but SMG's
    control-plane key, on a request for its control plane."""
    front, url = await start(smg, ring(file=True))
    try:
        chat = {"model": "chat", "messages": []}
        status, got, headers = await call(url, "POST", "/v1/chat/completions", EVERY, chat)
        assert status == 200 and got["auth"] is None
        assert json.loads(got["body"]) == chat and headers["x-smg"] == "yes"
        assert got["length"] == str(len(got["body"])), "the body and its length pass whole"
        status, got, _ = await call(url, "POST", "/v1/chat/completions", FILED, chat)
        assert status == 200 and got["auth"] is None
        for key in (None, "sk-llmgw-wrong", LIMITED + "x"):
            status, got, _ = await call(url, "POST", "/v1/chat/completions", key, chat)
            assert status == 401 and got["error"]["code"] == "invalid_api_key", key
        # /health, and SMG's control plane with its key, are SMG's to judge; any other
        # path needs a client key (SMG's data plane checks none), and carries none on.
        status, got, _ = await call(url, "GET", "/health")
        assert status == 200 and got["auth"] is None
        status, got, _ = await call(url, "GET", "/workers", CONTROL_KEY)
        assert status == 200 and got["auth"] == f"Bearer {CONTROL_KEY}"
        for key in (None, "sk-llmgw-wrong"):
            for path in ("/workers", "/generate", "/rerank", "/invocations"):
                status, got, _ = await call(url, "POST", path, key, {"model": "chat"})
                assert status == 401 and got["error"]["code"] == "invalid_api_key", (key, path)
        status, got, _ = await call(url, "POST", "/generate", EVERY, {"model": "chat"})
        assert status == 200 and got["auth"] is None
    finally:
        await front.stop()


async def test_a_limited_key_sees_and_uses_only_its_models(smg: TestServer) -> None:
    front, url = await start(smg, ring())
    try:
        status, got, _ = await call(url, "GET", "/v1/models", LIMITED)
        assert status == 200 and [m["id"] for m in got["data"]] == ["llama-8b", "llama-70b"]
        status, got, _ = await call(url, "GET", "/v1/models", EVERY)
        assert [m["id"] for m in got["data"]] == ["llama-8b", "chat", "llama-70b"]
        ok = {"model": "llama-8b", "prompt": "x"}
        status, got, _ = await call(url, "POST", "/v1/completions", LIMITED, ok)
        assert status == 200 and json.loads(got["body"]) == ok
        status, got, headers = await call(
            url, "POST", "/v1/completions", LIMITED, {"model": "chat", "prompt": "x"}
        )
        assert status == 404 and got == {
            "error": {
                "type": "invalid_request_error",
                "code": "model_not_found",
                "message": "The model `chat` does not exist or you do not have access to it.",
                "param": None,
            }
        }
        assert headers["x-smg-error-code"] == "model_not_found"
        assert headers["x-request-id"].startswith("cmpl-")
        status, got, _ = await call(url, "GET", "/v1/models/chat", LIMITED)
        assert status == 404 and got["error"]["code"] == "model_not_found"
        status, got, _ = await call(url, "GET", "/v1/models/llama-8b", LIMITED)
        assert status == 200
        for body in ({"prompt": "x"}, {"model": 3}, ["llama-8b"]):
            status, got, _ = await call(url, "POST", "/v1/completions", LIMITED, body)
            assert status == 400 and got["error"]["code"] == "missing_required_parameter", body
    finally:
        await front.stop()


async def test_before_the_keys_are_known_and_with_none(smg: TestServer) -> None:
    keyring = Keyring()
    front, url = await start(smg, keyring)
    public, public_url = await start(smg, Keyring(), public=True)
    try:
        status, got, headers = await call(url, "POST", "/v1/completions", EVERY, {"model": "m"})
        assert status == 503 and headers["Retry-After"] == "1"
        assert (await call(url, "GET", "/health"))[0] == 200
        keyring.set_controller_keys([])  # none anywhere: open, on loopback
        status, got, _ = await call(url, "POST", "/v1/completions", None, {"model": "m"})
        assert status == 200 and got["auth"] is None
        public.keyring.set_controller_keys([])  # ... and refused on a public address
        status, got, _ = await call(public_url, "POST", "/v1/completions", None, {"model": "m"})
        assert status == 401 and "no client keys" in got["error"]["message"]
        # A key file serves at once, before the controller's keys are read.
        filed = Keyring([ApiKey("filed", FILED)])
        front2, url2 = await start(smg, filed)
        try:
            status, got, _ = await call(url2, "POST", "/v1/completions", FILED, {"model": "m"})
            assert status == 200
            status, got, _ = await call(url2, "POST", "/v1/completions", None, {"model": "m"})
            assert status == 401
        finally:
            await front2.stop()
    finally:
        await front.stop()
        await public.stop()


async def test_a_cookie_an_answer_sets_reaches_its_client_and_no_other_request(
    smg: TestServer,
) -> None:
    """The front's client to SMG is shared by every client: a cookie kept there would
    go on with other clients' requests (aiohttp's jar takes none from an IP address,
    so SMG is named here as a host would be)."""
    front = Front(ring(), lambda: f"http://localhost:{smg.port}", CONTROL_KEY)
    port = aiohttp.test_utils.unused_port()
    await front.start("127.0.0.1", port)
    url = f"http://127.0.0.1:{port}"
    try:
        chat = {"model": "chat", "messages": []}
        _, got, headers = await call(
            url, "POST", "/v1/chat/completions?set_cookie=acme", EVERY, chat
        )
        assert got["cookie"] is None and "session=acme" in headers["Set-Cookie"]
        _, got, _ = await call(url, "POST", "/v1/chat/completions", EVERY, chat)
        assert got["cookie"] is None
    finally:
        await front.stop()
