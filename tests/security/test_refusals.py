"""Every refusal of the admin API as a client sees it: status, the exact JSON body
and the headers that matter. Each is raised where it is decided and answered by the
one front middleware (llmgw.errors); this table pins what clients read."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.state import enroll_tokens
from tests.security.conftest import ADMIN, AGENT, ENROLL, READ, ClientFactory, auth, report_body

FILE_NODE, FILE_CRED = "gpu05", "cred-gpu05"


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        (
            (AGENT, "agent", Role.AGENT),
            (ADMIN, "alice", Role.ADMIN),
            (READ, "reader", Role.READ),
            (ENROLL, "enroll", Role.ENROLL),
        ),
        ((FILE_CRED, FILE_NODE),),
    )
    settings = ControllerSettings(
        state_dir=tmp_path, tokens=tokens, reconcile_interval_s=86_400, reconcile_on_news=False
    )
    c = await aiohttp_client(create_app(settings))
    resp = await c.post("/v1/agent/report", json=report_body(), headers=auth(AGENT))
    assert resp.status == 200
    return c


async def refused(resp: Any, status: int, body: dict[str, Any]) -> None:
    assert (resp.status, await resp.json()) == (status, body)


async def enroll(c: TestClient, node: str, token: str = ENROLL) -> Any:
    return await c.post("/v1/agent/enroll", json={"node": node}, headers=auth(token))


async def test_authentication_refusals(client: TestClient) -> None:
    await refused(
        await client.get("/v1/nodes"),
        401,
        {"error": "missing token: this controller needs a bearer token"},
    )
    await refused(
        await client.get("/v1/nodes", headers=auth("nope")), 401, {"error": "invalid token"}
    )
    await refused(
        await client.post("/v1/nodes/gpu01/cordon", json={"reason": "x"}, headers=auth(READ)),
        403,
        {"error": "a read token cannot do this; it needs an admin token"},
    )
    made = await client.post("/v1/credentials/tokens", json={"uses": 1}, headers=auth(ADMIN))
    token = (await made.json())["token"]
    assert (await enroll(client, "gpu10", token)).status == 200
    spent = await enroll(client, "gpu11", token)
    token_id = token.removeprefix("llmgw-enroll-").split(".")[0]
    await refused(
        spent,
        401,
        {
            "error": f"enrollment token {token_id} is used up (1 of 1 uses): "
            "ask an admin for a new one (llmgw ctl credentials token create)"
        },
    )


async def test_node_credential_refusals(client: TestClient) -> None:
    cred = (await (await enroll(client, "gpu09")).json())["credential"]
    await refused(
        await client.get("/v1/nodes", headers=auth(cred)),
        403,
        {"error": "a node credential (node gpu09) may only report as its node"},
    )
    other = await client.post("/v1/agent/report", json=report_body("gpu08"), headers=auth(cred))
    assert other.status == 403
    assert "gpu09" in (await other.json())["error"]
    await refused(
        await enroll(client, "gpu09"),
        409,
        {
            "error": "node 'gpu09' already holds a credential; revoke it first "
            "(`llmgw ctl credentials revoke gpu09`) to enroll it again"
        },
    )
    await refused(
        await enroll(client, "gpu01"),
        409,
        {
            "error": "node 'gpu01' has reported to this controller before: an enrollment "
            "could take it over, so an admin must allow it first "
            "(`llmgw ctl credentials allow gpu01`)"
        },
    )


async def test_credential_admin_refusals(client: TestClient) -> None:
    await refused(
        await client.delete("/v1/credentials/gpu77", headers=auth(ADMIN)),
        404,
        {"error": "node 'gpu77' holds no issued credential"},
    )
    await refused(
        await client.delete(f"/v1/credentials/{FILE_NODE}", headers=auth(ADMIN)),
        409,
        {
            "error": f"node '{FILE_NODE}''s credential is configured in --agent-token-file: "
            "remove its line and restart the controller"
        },
    )
    await refused(
        await client.post("/v1/credentials/gpu77/approve", headers=auth(ADMIN)),
        404,
        {"error": "node 'gpu77' holds no credential to approve"},
    )
    assert (await enroll(client, "gpu09")).status == 200
    await refused(
        await client.post("/v1/credentials/gpu09/approve", headers=auth(ADMIN)),
        409,
        {"error": "node 'gpu09' awaits no approval: it may take replicas already"},
    )
    await refused(
        await client.post("/v1/credentials/gpu77/allow", headers=auth(ADMIN)),
        409,
        {"error": "node 'gpu77' has never reported here: it may enroll without an allowance"},
    )
    await refused(
        await client.delete("/v1/credentials/tokens/zzzzzz", headers=auth(ADMIN)),
        404,
        {"error": "no enrollment token 'zzzzzz' (llmgw ctl credentials token list)"},
    )


async def test_token_bound_refusal(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(enroll_tokens, "MAX_TOKENS", 1)
    assert (await client.post("/v1/credentials/tokens", headers=auth(ADMIN))).status == 201
    await refused(
        await client.post("/v1/credentials/tokens", headers=auth(ADMIN)),
        409,
        {
            "error": "1 enrollment tokens are kept already: delete some "
            "(`llmgw ctl credentials token delete ID`; `token list` shows the spent ones)"
        },
    )


async def test_compressed_body_refusal_closes(client: TestClient) -> None:
    resp = await client.post(
        "/v1/nodes/gpu01/cordon",
        data=gzip.compress(b'{"reason": "x"}'),
        headers={**auth(ADMIN), "Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    await refused(
        resp,
        415,
        {
            "error": "compressed request bodies are refused (Content-Encoding: gzip); "
            "send the body uncompressed"
        },
    )
    assert resp.headers["Connection"] == "close"


async def test_unknown_route_is_json(client: TestClient) -> None:
    await refused(await client.get("/v1/nowhere", headers=auth(ADMIN)), 404, {"error": "Not Found"})
