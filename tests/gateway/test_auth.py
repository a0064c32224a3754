"""The gateway token may read endpoints and post gateway status, nothing else;
client keys and the gateway's refusal to serve a public address without them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.gateway import main as gateway_main
from llmgw.gateway.keys import load_keys
from tests.controller.fleet_factories import report

GATEWAY, ADMIN, READ, AGENT = "gateway-secret", "admin-secret", "read-secret", "agent-secret"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(aiohttp_client: AiohttpClient, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        (
            (GATEWAY, "gw", Role.GATEWAY),
            (ADMIN, "alice", Role.ADMIN),
            (READ, "reader", Role.READ),
            (AGENT, "agent", Role.AGENT),
        )
    )
    c = await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens)))
    resp = await c.post(
        "/v1/agent/report", data=report("gpu01").model_dump_json(), headers=auth(AGENT)
    )
    assert resp.status == 200
    return c


async def test_gateway_token_reads_endpoints_and_posts_status_only(client: TestClient) -> None:
    resp = await client.get("/v1/endpoints", headers=auth(GATEWAY))
    assert resp.status == 200
    cursor = (await resp.json())["cursor"]
    status = {"name": "gw-1", "cursor": cursor, "in_flight": {}, "requests": {}}
    assert (
        await client.post("/v1/gateways/status", json=status, headers=auth(GATEWAY))
    ).status == 200
    denied = [
        ("GET", "/v1/summary", None),
        ("GET", "/v1/nodes", None),
        ("GET", "/v1/replicas", None),
        ("GET", "/v1/gateways", None),
        ("POST", "/v1/nodes/gpu01/cordon", {"reason": "x"}),
        ("POST", "/v1/models", {"models": []}),
        ("POST", "/v1/agent/report", report("gpu01").model_dump(mode="json")),
    ]
    for method, path, body in denied:
        resp = await client.request(method, path, json=body, headers=auth(GATEWAY))
        assert resp.status == 403, (method, path, resp.status)
        assert "gateway token cannot" in (await resp.json())["error"]
    # Only gateways post status; readers see the gateways.
    assert (await client.post("/v1/gateways/status", json=status, headers=auth(READ))).status == 403
    views = await (await client.get("/v1/gateways", headers=auth(READ))).json()
    assert [v["name"] for v in views] == ["gw-1"]
    assert (await client.get("/v1/endpoints")).status == 401


async def test_long_poll_wakes_on_a_change_and_bad_input_is_a_400(client: TestClient) -> None:
    first = await (await client.get("/v1/endpoints", headers=auth(GATEWAY))).json()
    poll = asyncio.create_task(
        client.get(f"/v1/endpoints?since={first['cursor']}&wait=20", headers=auth(GATEWAY))
    )
    await asyncio.sleep(0.2)
    assert not poll.done()
    await client.post("/v1/nodes/gpu01/cordon", json={"reason": "x"}, headers=auth(ADMIN))
    resp = await asyncio.wait_for(poll, 5)  # well before the 20 s wait
    assert (await resp.json())["cursor"] != first["cursor"]
    for query in ("since=nonsense", "wait=99", "wait=abc"):
        resp = await client.get(f"/v1/endpoints?{query}", headers=auth(GATEWAY))
        assert resp.status == 400, query
    bad = {"name": "gw 1", "cursor": "", "in_flight": {"r": -1}}
    assert (await client.post("/v1/gateways/status", json=bad, headers=auth(GATEWAY))).status == 400


def test_client_keys_file_and_env(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# tenants\nacme sk-acme-0001\nsk-plain-0002\n")
    keys = load_keys(path, env={})
    assert [(k.tenant, k.key) for k in keys] == [
        ("acme", "sk-acme-0001"),
        ("key3", "sk-plain-0002"),
    ]
    assert [k.tenant for k in load_keys(None, env={"LLMGW_GATEWAY_API_KEY": "sk-env-0003"})] == [
        "default"
    ]
    path.write_text("a b c\n")
    with pytest.raises(ValueError, match="TENANT KEY"):
        load_keys(path, env={})


def test_gateway_refuses_a_public_listen_without_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_GATEWAY_API_KEY", raising=False)
    code = gateway_main.main(["--controller", "http://127.0.0.1:1", "--listen", "0.0.0.0:8080"])
    assert code == 2
    assert "refusing to listen on 0.0.0.0 without client keys" in capsys.readouterr().err


def test_a_wake_timeout_longer_than_the_request_timeout_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SMG would end a held request at --request-timeout, before the wake timeout."""
    code = gateway_main.main(
        ["--controller", "http://127.0.0.1:1", "--wake-timeout", "600", "--request-timeout", "60"]
    )
    assert code == 2
    assert "--wake-timeout must be more than 0 and at most --request-timeout (60 s" in (
        capsys.readouterr().err
    )
