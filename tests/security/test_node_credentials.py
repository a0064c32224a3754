"""Per-node agent credentials, in-process: the node authorizer's matrix,
enrollment, revocation, forgetting a node, and the startup rules."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.keys import term_of
from llmgw.controller.main import parser as controller_parser
from llmgw.controller.main import settings_from_args
from llmgw.wire import ReplicaState
from tests.security.conftest import auth, report_body

ADMIN, ENROLL, SHARED = "admin-secret", "enroll-secret", "shared-secret"
CRED = {"gpu01": "cred-gpu01", "gpu02": "cred-gpu02"}
ClientFactory = Callable[..., Awaitable[TestClient]]
MakeClient = Callable[..., Awaitable[TestClient]]


def tokens(shared: bool = False) -> Tokens:
    entries: list[tuple[str, str, Role]] = [
        (ADMIN, "alice", Role.ADMIN),
        (ENROLL, "enroll", Role.ENROLL),
    ]
    if shared:
        entries.append((SHARED, "agent", Role.AGENT))
    return Tokens(tuple(entries), tuple((secret, node) for node, secret in CRED.items()))


@pytest.fixture
def make_client(aiohttp_client: ClientFactory, tmp_path: Path) -> MakeClient:
    async def make(shared: bool = False) -> TestClient:
        # The tests put replicas in by hand (of no declared model): no pass may run
        # between their reads, at its interval or on a report's news.
        settings = ControllerSettings(
            state_dir=tmp_path,
            tokens=tokens(shared),
            reconcile_interval_s=86_400,
            reconcile_on_news=False,
        )
        app = create_app(settings)
        return await aiohttp_client(app)

    return make


async def post_report(c: TestClient, token: str, node: str, **extra: Any) -> Any:
    return await c.post("/v1/agent/report", json=report_body(node, **extra), headers=auth(token))


async def node_views(c: TestClient) -> Any:
    nodes = await (await c.get("/v1/nodes", headers=auth(ADMIN))).json()
    replicas = await (await c.get("/v1/replicas", headers=auth(ADMIN))).json()
    details = {}
    for n in nodes:
        n.pop("report_age_s")
        d = await (await c.get(f"/v1/nodes/{n['name']}", headers=auth(ADMIN))).json()
        d["row"].pop("report_age_s")
        details[n["name"]] = d
    return nodes, replicas, details


async def test_a_node_credential_reports_only_as_its_node(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    c = await make_client()
    assert (await post_report(c, CRED["gpu01"], "gpu01")).status == 200
    assert (await post_report(c, CRED["gpu02"], "gpu02")).status == 200
    before = await node_views(c)
    caplog.set_level(logging.WARNING)
    for node in ("gpu02", "gpu99", "gpu02"):
        resp = await post_report(c, CRED["gpu01"], node, n_gpus=8)
        assert resp.status == 403
        assert "speaks for node 'gpu01'" in (await resp.json())["error"]
    assert await node_views(c) == before  # nothing overwritten, nothing invented
    refusals = [r for r in caplog.records if "refused a report" in r.getMessage()]
    assert len(refusals) == 1, "logged once per node, not per report"


async def test_a_node_credential_reads_nothing_else(make_client: MakeClient) -> None:
    c = await make_client()
    await post_report(c, CRED["gpu01"], "gpu01")
    for path in ("/v1/models", "/v1/nodes", "/v1/nodes/gpu01", "/v1/summary", "/v1/replicas"):
        resp = await c.get(path, headers=auth(CRED["gpu01"]))
        assert resp.status == 403, path
    resp = await c.post("/v1/nodes/gpu01/cordon", json={"reason": "x"}, headers=auth(CRED["gpu01"]))
    assert resp.status == 403


def replica(rid: str, node: str, rank: int = 0) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid,
        model="m",
        state=ReplicaState.STARTING,
        shards=(ShardRecord(node, rank, (f"GPU-{node}-0",)),),
        created_at=1.0,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["node-credential", "shared-token"])
async def test_a_node_may_not_report_another_nodes_shard(
    make_client: MakeClient, shared: bool
) -> None:
    c = await make_client(shared=shared)
    a, b = (SHARED, SHARED) if shared else (CRED["gpu01"], CRED["gpu02"])
    await post_report(c, a, "gpu01")
    await post_report(c, b, "gpu02")
    term_of(c.server.app).facts.put_replicas([replica("r-b", "gpu02")])
    before = await node_views(c)
    for state in ("failed", "ready"):
        forged = [{"id": "r-b", "model": "m", "state": state, "gpus": ["GPU-gpu02-0"]}]
        resp = await post_report(c, a, "gpu01", replicas=forged)
        assert resp.status == 403
        assert "not assigned to node 'gpu01'" in (await resp.json())["error"]
    wrong_rank = [{"id": "r-b", "model": "m", "state": "ready", "rank": 1}]
    assert (await post_report(c, b, "gpu02", replicas=wrong_rank)).status == 403
    assert await node_views(c) == before
    own = [{"id": "r-b", "model": "m", "state": "ready", "gpus": ["GPU-gpu02-0"]}]
    assert (await post_report(c, b, "gpu02", replicas=own)).status == 200
    (view,) = await (await c.get("/v1/replicas", headers=auth(ADMIN))).json()
    assert view["state"] == "ready"
    # A leftover engine of a replica nobody holds is not refused: the reply stops it.
    stale = [{"id": "gone", "model": "m", "state": "ready"}]
    assert (await post_report(c, a, "gpu01", replicas=stale)).status == 200


async def test_enrollment_issues_one_durable_credential_per_node(
    make_client: MakeClient, tmp_path: Path
) -> None:
    c = await make_client()
    resp = await c.post("/v1/agent/enroll", json={"node": "gpu03"}, headers=auth(ENROLL))
    assert resp.status == 200
    secret = (await resp.json())["credential"]
    assert (await post_report(c, secret, "gpu03")).status == 200
    assert (await post_report(c, secret, "gpu01")).status == 403
    # Once per node: whoever holds the enrollment token cannot take over a node.
    for node in ("gpu03", "gpu01"):
        resp = await c.post("/v1/agent/enroll", json={"node": node}, headers=auth(ENROLL))
        assert resp.status == 409, node
        assert "already holds a credential" in (await resp.json())["error"]
    # The enrollment token does nothing else; other tokens cannot enroll.
    assert (await post_report(c, ENROLL, "gpu04")).status == 403
    for token in (ADMIN, CRED["gpu01"]):
        resp = await c.post("/v1/agent/enroll", json={"node": "gpu04"}, headers=auth(token))
        assert resp.status == 403
    creds = await (await c.get("/v1/credentials", headers=auth(ADMIN))).json()
    assert [(x["node"], x["source"]) for x in creds] == [
        ("gpu01", "file"),
        ("gpu02", "file"),
        ("gpu03", "enrolled"),
    ]
    assert secret not in str(creds)
    await c.close()
    # Durable: a restarted controller still knows it (only its hash is stored).
    c = await make_client()
    assert (await post_report(c, secret, "gpu03")).status == 200
    assert not stored_anywhere(tmp_path, secret)


def stored_anywhere(state_dir: Path, secret: str) -> bool:
    return any(secret.encode() in db.read_bytes() for db in state_dir.glob("controller.sqlite3*"))


async def test_revoke_then_enroll_again(make_client: MakeClient) -> None:
    c = await make_client()
    resp = await c.post("/v1/agent/enroll", json={"node": "gpu03"}, headers=auth(ENROLL))
    old = (await resp.json())["credential"]
    resp = await c.delete("/v1/credentials/gpu03", headers=auth(ADMIN))
    assert resp.status == 200
    assert (await post_report(c, old, "gpu03")).status == 401
    assert (await c.delete("/v1/credentials/gpu03", headers=auth(ADMIN))).status == 404
    assert (await c.delete("/v1/credentials/gpu01", headers=auth(ADMIN))).status == 409
    resp = await c.post("/v1/agent/enroll", json={"node": "gpu03"}, headers=auth(ENROLL))
    assert resp.status == 200


async def test_forget_revokes_and_removes_the_node_and_its_replicas(
    make_client: MakeClient,
) -> None:
    c = await make_client()
    resp = await c.post("/v1/agent/enroll", json={"node": "gpu03"}, headers=auth(ENROLL))
    secret = (await resp.json())["credential"]
    await post_report(c, secret, "gpu03")
    term_of(c.server.app).facts.put_replicas([replica("r3", "gpu03")])
    resp = await c.post("/v1/nodes/gpu03/forget", headers=auth(ADMIN))
    assert resp.status == 200
    assert (await resp.json())["credential_revoked"] is True
    assert (await c.get("/v1/nodes/gpu03", headers=auth(ADMIN))).status == 404
    assert await (await c.get("/v1/replicas", headers=auth(ADMIN))).json() == []
    summary = await (await c.get("/v1/summary", headers=auth(ADMIN))).json()
    assert summary["nodes"]["total"] == 0
    assert (await post_report(c, secret, "gpu03")).status == 401
    assert (await c.post("/v1/nodes/gpu03/forget", headers=auth(ADMIN))).status == 404


def test_agent_token_file_lines_bind_nodes(tmp_path: Path) -> None:
    path = tmp_path / "agents"
    path.write_text("# nodes\ngpu01 tok-1\ngpu02 tok-2\nshared-tok\n")
    loaded = Tokens.load(env={}, files={Role.AGENT: path})
    one = loaded.identify("tok-1")
    assert one is not None and (one.node, one.role) == ("gpu01", Role.AGENT)
    shared = loaded.identify("shared-tok")
    assert shared is not None and shared.node is None
    assert loaded.shared_agent


def test_agent_token_file_node_names_are_normalised_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "agents"
    path.write_text("GPU01 tok-1\n")
    one = Tokens.load(env={}, files={Role.AGENT: path}).identify("tok-1")
    assert one is not None and one.node == "gpu01"
    path.write_text("gpu01. tok-1\n")
    with pytest.raises(ValueError, match="no trailing dot"):
        Tokens.load(env={}, files={Role.AGENT: path})


def start_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return controller_parser().parse_args(["--state-dir", str(tmp_path), *extra])


def test_a_shared_agent_token_needs_the_operator_to_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_AGENT_TOKEN", "shared")
    with pytest.raises(ValueError, match="--allow-shared-agent-token"):
        settings_from_args(start_args(tmp_path))
    assert settings_from_args(
        start_args(tmp_path, "--allow-shared-agent-token")
    ).tokens.shared_agent
    monkeypatch.delenv("LLMGW_AGENT_TOKEN")
    path = tmp_path / "agents"
    path.write_text("gpu01 tok-1\n")
    assert not settings_from_args(
        start_args(tmp_path, "--agent-token-file", str(path))
    ).tokens.shared_agent


def test_a_public_bind_may_rely_on_enrollment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("LLMGW_AGENT_TOKEN", "LLMGW_READ_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "a")
    monkeypatch.setenv("LLMGW_ENROLL_TOKEN", "e")
    settings = settings_from_args(
        start_args(tmp_path, "--listen", "0.0.0.0:7460", "--allow-static-enroll-token")
    )
    assert settings.tokens.has(Role.ENROLL)
    # Without an admin-made token's expiry and uses, the operator must say so.
    with pytest.raises(ValueError, match="never expires and has no use limit") as refused:
        settings_from_args(start_args(tmp_path, "--listen", "0.0.0.0:7460"))
    assert "--allow-static-enroll-token" in str(refused.value)
    assert "ctl credentials token create" in str(refused.value)
    path = tmp_path / "enroll.token"
    path.write_text("e\n")
    monkeypatch.delenv("LLMGW_ENROLL_TOKEN")
    with pytest.raises(ValueError, match="--allow-static-enroll-token"):
        settings_from_args(start_args(tmp_path, "--enroll-token-file", str(path)))
    monkeypatch.delenv("LLMGW_ADMIN_TOKEN")
    admin_made_only = settings_from_args(start_args(tmp_path))  # tokens from ctl: no flag
    assert not admin_made_only.tokens.has(Role.ENROLL)
