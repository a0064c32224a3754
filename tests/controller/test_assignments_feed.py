"""`GET /v1/agent/assignments/NODE`: a node's reply once it changes, long-polled by its
agent (so a wake or a start reaches it at once, not at its next report)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from fleet_factories import report
from test_api import ADMIN, AGENT, ClientFactory, auth

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.wire import ReportReply, reply_version

NODE_SECRET = "node-secret"


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        ((AGENT, "agent", Role.AGENT), (ADMIN, "alice", Role.ADMIN)),
        nodes=((NODE_SECRET, "gpu01"),),
    )
    app = create_app(
        ControllerSettings(
            state_dir=tmp_path, tokens=tokens, reconcile_interval_s=86_400, reconcile_on_news=False
        )
    )
    c = await aiohttp_client(app)
    for node in ("gpu01", "gpu02"):
        body = report(node).model_dump_json()
        assert (await c.post("/v1/agent/report", data=body, headers=auth(AGENT))).status == 200
    return c


async def poll(
    client: TestClient, node: str, have: str = "", wait: float = 0, token: str = AGENT
) -> tuple[int, str, bytes]:
    headers = auth(token) | ({"If-None-Match": f'"{have}"'} if have else {})
    resp = await client.get(f"/v1/agent/assignments/{node}?wait={wait:g}", headers=headers)
    return resp.status, resp.headers.get("ETag", "").strip('"'), await resp.read()


async def test_the_reply_then_not_modified_then_the_change_the_moment_it_happens(
    client: TestClient,
) -> None:
    status, etag, body = await poll(client, "gpu01")
    assert status == 200 and etag == reply_version(body)
    reply = ReportReply.model_validate_json(body)
    assert reply.node == "gpu01" and reply.admin_flag.value == "none"
    assert (await poll(client, "gpu01", have=etag))[0] == 304

    async def cordon_soon() -> None:
        await asyncio.sleep(0.3)
        resp = await client.post(
            "/v1/nodes/gpu01/cordon", json={"reason": "test"}, headers=auth(ADMIN)
        )
        assert resp.status == 200

    t0 = time.monotonic()
    cordon = asyncio.create_task(cordon_soon())
    status, new_etag, body = await poll(client, "gpu01", have=etag, wait=20)
    took = time.monotonic() - t0
    await cordon
    assert status == 200 and new_etag != etag
    assert ReportReply.model_validate_json(body).admin_flag.value == "cordoned"
    assert took < 15, f"answered at the change, not at the end of the wait ({took:.1f}s)"


async def test_a_change_of_another_node_does_not_answer_the_wait(client: TestClient) -> None:
    _, etag, _ = await poll(client, "gpu01")

    async def cordon_other() -> None:
        await asyncio.sleep(0.2)
        resp = await client.post(
            "/v1/nodes/gpu02/cordon", json={"reason": "test"}, headers=auth(ADMIN)
        )
        assert resp.status == 200

    other = asyncio.create_task(cordon_other())
    status, same, _ = await poll(client, "gpu01", have=etag, wait=1)
    await other
    assert (status, same) == (304, etag)


async def test_bad_waits_unknown_nodes_and_other_nodes_credentials_are_refused(
    client: TestClient,
) -> None:
    for wait in ("-1", "31", "soon"):
        resp = await client.get(f"/v1/agent/assignments/gpu01?wait={wait}", headers=auth(AGENT))
        assert resp.status == 400 and "wait" in (await resp.json())["error"]
    assert (await poll(client, "gpu09"))[0] == 404
    assert (await poll(client, "gpu01", token=NODE_SECRET))[0] == 200
    status, _, body = await poll(client, "gpu02", token=NODE_SECRET)
    assert status == 403 and "gpu01" in json.loads(body)["error"]
    assert (await poll(client, "gpu01", token=ADMIN))[0] == 403


async def test_a_node_not_heard_from_since_a_restart_is_answered_only_after_its_report(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """A restarted controller knows the node (its store) but not its address until it
    reports, so its assignments would name no leader address: an agent handed those
    restarted its engines. Its poll waits for its report."""

    def app() -> web.Application:
        return create_app(
            ControllerSettings(state_dir=tmp_path, reconcile_interval_s=86_400,
                               reconcile_on_news=False)
        )  # fmt: skip

    first = await aiohttp_client(app())
    body = report("gpu01").model_dump_json()
    assert (await first.post("/v1/agent/report", data=body)).status == 200
    _, etag, _ = await poll(first, "gpu01", token="")
    await first.close()
    again = await aiohttp_client(app())  # the same store: gpu01 known, not heard
    status, _, _ = await poll(again, "gpu01", token="", wait=0.3)
    assert status == 304
    status, _, _ = await poll(again, "gpu01", have=etag, token="", wait=0.3)
    assert status == 304
    assert (await again.post("/v1/agent/report", data=body)).status == 200
    status, _, reply = await poll(again, "gpu01", token="")
    assert status == 200 and ReportReply.model_validate_json(reply).node == "gpu01"
