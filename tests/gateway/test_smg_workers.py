"""How the gateway registers workers in SMG (issue 36 item 1): through SMG's API, each
engine with its replica's key (`api_key`, which SMG's file manifest cannot carry), an
explainer with none; a key that changes at the same URL re-registers the worker;
what leaves is removed; a worker the gateway did not add is left to the evictor."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from llmgw.gateway import smg as smg_module
from llmgw.gateway.smg import Smg, SmgOptions
from llmgw.gateway.sync import Follower
from llmgw.wire import Endpoint

ADMIN = "admin-key"


class FakeSmg:
    """SMG's worker API as the gateway uses it: lists at once, removes at once."""

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}  # id -> worker
        self.posts: list[dict[str, Any]] = []
        self.deletes: list[str] = []
        self.auth: set[str] = set()
        self.settle = False  # keep a removed worker listed (SMG's drain settle)
        self._ids = itertools.count(1)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/workers", self.list)
        app.router.add_post("/workers", self.add)
        app.router.add_delete("/workers/{id}", self.remove)
        return app

    async def list(self, request: web.Request) -> web.Response:
        self.auth.add(request.headers.get("Authorization", ""))
        return web.json_response({"workers": list(self.workers.values())})

    async def add(self, request: web.Request) -> web.Response:
        self.auth.add(request.headers.get("Authorization", ""))
        body = await request.json()
        self.posts.append(body)
        if "bad" in body["url"]:
            return web.json_response({"error": "invalid url"}, status=400)
        wid = f"w{next(self._ids)}"
        self.workers[wid] = {"id": wid, "url": body["url"], "is_healthy": True}
        return web.json_response({"status": "accepted"}, status=202)

    async def remove(self, request: web.Request) -> web.Response:
        wid = request.match_info["id"]
        self.deletes.append(self.workers[wid]["url"])
        if not self.settle:
            del self.workers[wid]
        return web.json_response({"status": "accepted"}, status=202)


@pytest.fixture
async def fake(
    aiohttp_server: AiohttpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeSmg, Smg]]:
    monkeypatch.setattr(smg_module, "ASK_AGAIN_S", 0.0)
    monkeypatch.setattr(smg_module, "LEAVE_AGAIN_S", 0.0)
    fake = FakeSmg()
    server = await aiohttp_server(fake.app())
    smg = Smg(SmgOptions(host="127.0.0.1", port=server.port, policy="x", keys=[], workdir=tmp_path))
    smg.admin_key = ADMIN
    smg._session = aiohttp.ClientSession()
    try:
        yield fake, smg
    finally:
        await smg._session.close()


async def test_each_engine_is_registered_with_its_key(fake: tuple[FakeSmg, Smg]) -> None:
    api, smg = fake
    smg.write_workers({"http://10.0.0.1:8000": "key-a", "http://127.0.0.1:9/u/x": None})
    await smg.converge()
    assert sorted(api.posts, key=lambda b: b["url"]) == [
        {"url": "http://10.0.0.1:8000", "api_key": "key-a"},
        {"url": "http://127.0.0.1:9/u/x"},  # an explainer: no key
    ]
    assert api.auth == {f"Bearer {ADMIN}"}
    await smg.converge()
    assert len(api.posts) == 2  # listed: not asked again
    # A replica replaced by one whose engine got the same address and port: a new key.
    smg.write_workers({"http://10.0.0.1:8000": "key-b", "http://127.0.0.1:9/u/x": None})
    await smg.converge()
    assert api.deletes == ["http://10.0.0.1:8000"]
    await smg.converge()
    assert api.posts[-1] == {"url": "http://10.0.0.1:8000", "api_key": "key-b"}
    # One that leaves is removed; one the gateway never added is not this pass's.
    api.workers["foreign"] = {"id": "foreign", "url": "http://6.6.6.6:1", "is_healthy": True}
    smg.write_workers({"http://10.0.0.1:8000": "key-b"})
    await smg.converge()
    assert api.deletes[-1] == "http://127.0.0.1:9/u/x"
    assert sorted(w["url"] for w in api.workers.values()) == [
        "http://10.0.0.1:8000",
        "http://6.6.6.6:1",
    ]


async def test_a_restarted_smg_is_filled_again(fake: tuple[FakeSmg, Smg]) -> None:
    api, smg = fake
    smg.write_workers({"http://10.0.0.1:8000": "key-a"})
    await smg.converge()
    api.workers.clear()  # SMG died and came back empty
    smg._asked.clear()  # what `run` forgets when SMG exits
    await smg.converge()
    assert [b["url"] for b in api.posts] == ["http://10.0.0.1:8000"] * 2
    assert api.posts[-1]["api_key"] == "key-a"


class Recorder:
    """A stand-in SMG for the follower: what it was last told to have."""

    def __init__(self) -> None:
        self.told: dict[str, str | None] = {}
        self.listed: dict[str, bool] = {}

    def ours(self, url: str) -> bool:
        return url in self.told

    def write_workers(self, workers: dict[str, str | None]) -> None:
        self.told = dict(workers)
        self.listed = dict.fromkeys(workers, True)

    async def workers(self) -> dict[str, bool]:
        return self.listed


async def test_the_follower_gives_smg_and_its_explainer_each_engines_key() -> None:
    rec = Recorder()
    f = Follower("http://127.0.0.1:1", None, "gw", rec)  # type: ignore[arg-type]
    ep = Endpoint(
        replica_id="r1",
        model="m",
        url="http://10.0.0.1:8000",
        node="n1",
        fabric=None,
        state="serving",
        engine_key="key-r1",
    )
    old = ep.model_copy(update={"replica_id": "r0", "url": "http://10.0.0.2:8000"})
    f.endpoints = {"r1": ep, "r0": old.model_copy(update={"engine_key": None})}
    f.usable = f.entries.usable(f.endpoints.values())
    await f._apply({ep.url: "m", old.url: "m"})
    assert rec.told == {ep.url: "key-r1", old.url: None}
    from llmgw.wire import EndpointsDelta

    f._take(EndpointsDelta.build(cursor="c1", full=True, endpoints=[ep], removed=[], unserved={}))
    assert f.explainer._keys == {ep.url: "key-r1"}


async def test_a_worker_settling_out_is_not_asked_to_leave_again(
    fake: tuple[FakeSmg, Smg], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SMG keeps a removed worker listed about 5 s while its requests end; a second
    DELETE then would drop it at once (smg 1.13), so none is sent before LEAVE_AGAIN_S."""
    monkeypatch.setattr(smg_module, "LEAVE_AGAIN_S", 30.0)
    api, smg = fake
    smg.write_workers({"http://10.0.0.1:8000": "key-a"})
    await smg.converge()
    api.settle = True
    smg.write_workers({})
    for _ in range(3):
        await smg.converge()
    assert api.deletes == ["http://10.0.0.1:8000"]


async def test_a_worker_smg_refuses_holds_up_no_other(fake: tuple[FakeSmg, Smg]) -> None:
    api, smg = fake
    smg.write_workers({"http://bad:1": "k0", "http://10.0.0.1:8000": "key-a"})
    await smg.converge()
    assert [w["url"] for w in api.workers.values()] == ["http://10.0.0.1:8000"]
