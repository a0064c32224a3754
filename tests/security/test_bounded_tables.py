"""Tables that never shrank (issue 36 item 5): a node's admin history is bounded and
goes with `node forget`, so a name used again starts clean; a credential that its
node never reports with expires, listed with its expiry until then."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmgw import render
from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.state import credentials
from llmgw.controller.state.credentials import UNREPORTED_TTL_S, Credentials
from llmgw.controller.store.sqlite import Store
from tests.security.conftest import ADMIN, AGENT, ENROLL, ClientFactory, auth, report_body


async def test_a_forgotten_name_used_again_shows_none_of_the_old_nodes_history(
    client: TestClient,
) -> None:
    await client.post("/v1/nodes/gpu01/cordon", json={"reason": "bad PSU"}, headers=auth(ADMIN))
    await client.post("/v1/nodes/gpu01/uncordon", headers=auth(ADMIN))
    assert (await client.post("/v1/nodes/gpu01/forget", headers=auth(ADMIN))).status == 200
    # Another machine takes the name.
    resp = await client.post("/v1/agent/report", json=report_body(), headers=auth(AGENT))
    assert resp.status == 200
    detail = await (await client.get("/v1/nodes/gpu01", headers=auth(ADMIN))).json()
    assert [(e["action"], e["reason"]) for e in detail["history"]] == [("forget", None)]


def test_a_credential_never_reported_with_expires(tmp_path: Path) -> None:
    store = Store(tmp_path)
    creds = Credentials(store, Tokens(()))
    used = creds.enroll("gpu-a", by="enroll", at=1000.0)
    idle = creds.enroll("gpu-b", by="enroll", at=1000.0)
    creds.reported("gpu-a", 1001.0)
    expiry = 1000.0 + UNREPORTED_TTL_S
    assert [(c.node, c.expires_at) for c in creds.list()] == [("gpu-a", None), ("gpu-b", expiry)]
    assert creds.identify(idle, expiry - 1) == "gpu-b"
    assert creds.identify(idle, expiry) is None, "expired: it no longer authenticates"
    assert creds.identify(used, expiry * 10) == "gpu-a"
    assert creds.expire(expiry - 1) == []
    assert creds.expire(expiry) == ["gpu-b"]
    assert not creds.holds("gpu-b")
    store.close()
    again = Credentials(Store(tmp_path), Tokens(()))
    assert [(c.node, c.expires_at) for c in again.list()] == [("gpu-a", None)]
    assert again.identify(used, expiry * 10) == "gpu-a"


class Wall:
    """time.time, standing still but where the test moves it."""

    def __init__(self) -> None:
        self.start = time.time()
        self.ahead = 0.0

    def __call__(self) -> float:
        return self.start + self.ahead


async def test_an_enrolled_node_that_never_reports_loses_its_credential(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = Wall()
    monkeypatch.setattr(time, "time", wall)

    async def enroll(node: str) -> str:
        resp = await client.post("/v1/agent/enroll", json={"node": node}, headers=auth(ENROLL))
        assert resp.status == 200
        return str((await resp.json())["credential"])

    async def listed() -> dict[str, Any]:
        found = await (await client.get("/v1/credentials", headers=auth(ADMIN))).json()
        return {c["node"]: c["expires_at"] for c in found}

    reporting, silent = await enroll("gpu-a"), await enroll("gpu-b")
    resp = await client.post("/v1/agent/report", json=report_body("gpu-a"), headers=auth(reporting))
    assert resp.status == 200
    expires = await listed()
    assert expires["gpu-a"] is None
    assert expires["gpu-b"] == wall.start + UNREPORTED_TTL_S
    wall.ahead = UNREPORTED_TTL_S + 1
    resp = await client.post("/v1/agent/report", json=report_body("gpu-b"), headers=auth(silent))
    assert resp.status == 401
    assert set(await listed()) == {"gpu-a"}
    events = await (await client.get("/v1/events?for=node/gpu-b", headers=auth(ADMIN))).json()
    assert [e["reason"] for e in events["events"]] == ["Enrolled", "CredentialExpired"]
    resp = await client.post("/v1/agent/report", json=report_body("gpu-a"), headers=auth(reporting))
    assert resp.status == 200, "a credential that reported never expires"
    await enroll("gpu-b")  # the name is free again


async def test_an_enrollment_flood_keeps_an_hour_of_credentials(
    aiohttp_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the bound: credentials issued over two TTLs, none reported, leave one TTL's."""
    tokens = Tokens(((ADMIN, "alice", Role.ADMIN), (ENROLL, "enroll", Role.ENROLL)))
    settings = ControllerSettings(state_dir=tmp_path, tokens=tokens, enroll_rate=1000.0)
    client = await aiohttp_client(create_app(settings))
    wall = Wall()
    monkeypatch.setattr(time, "time", wall)
    monkeypatch.setattr(credentials, "UNREPORTED_TTL_S", 100.0)
    for i in range(200):  # one a second
        wall.ahead = float(i)
        resp = await client.post("/v1/agent/enroll", json={"node": f"n{i}"}, headers=auth(ENROLL))
        assert resp.status == 200, await resp.text()
    wall.ahead = 199.5
    found = await (await client.get("/v1/credentials", headers=auth(ADMIN))).json()
    assert sorted(int(c["node"][1:]) for c in found) == list(range(100, 200))


def test_ctl_lists_each_credentials_expiry() -> None:
    table = render.credentials_table(
        [
            {"node": "gpu-a", "source": "enrolled", "issued_at": 0.0, "by": "e"},
            {"node": "gpu-b", "source": "enrolled", "issued_at": 0.0, "expires_at": 3600.0},
        ]
    )
    lines = table.format().splitlines()
    assert lines[0].split()[-1] == "EXPIRES"
    assert lines[1].endswith(" -")
    assert lines[2].endswith("1970-01-01 01:00:00 UTC")
