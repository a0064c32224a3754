"""The admin API over real HTTP: auth matrix, bad input, durability."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from fleet_factories import location, report
from pydantic import BaseModel

from llmgw import wire
from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.main import parser as controller_parser
from llmgw.controller.main import settings_from_args

AGENT, ADMIN, READ = "agent-secret", "admin-secret", "read-secret"
ClientFactory = Callable[..., Awaitable[TestClient]]


def tokens() -> Tokens:
    return Tokens(
        ((AGENT, "agent", Role.AGENT), (ADMIN, "alice", Role.ADMIN), (READ, "reader", Role.READ))
    )


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    app = create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens()))
    c = await aiohttp_client(app)
    resp = await c.post(
        "/v1/agent/report", data=report("gpu01").model_dump_json(), headers=auth(AGENT)
    )
    assert resp.status == 200
    return c


async def snapshot(client: TestClient) -> tuple[Any, Any]:
    summary = await (await client.get("/v1/summary", headers=auth(ADMIN))).json()
    summary.pop("generated_at")
    nodes = await (await client.get("/v1/nodes", headers=auth(ADMIN))).json()
    for n in nodes:
        n.pop("report_age_s")
    return summary, nodes


# -- auth matrix -------------------------------------------------------------------------

REPORT_BODY = report("gpu01").model_dump_json()
ENDPOINTS = [
    ("POST", "/v1/agent/report", REPORT_BODY, {AGENT}),
    ("GET", "/v1/summary", None, {AGENT, ADMIN, READ}),
    ("GET", "/v1/nodes", None, {AGENT, ADMIN, READ}),
    ("GET", "/v1/nodes/gpu01", None, {AGENT, ADMIN, READ}),
    ("GET", "/v1/models", None, {AGENT, ADMIN, READ}),
    ("GET", "/v1/replicas", None, {AGENT, ADMIN, READ}),
    ("POST", "/v1/nodes/gpu01/cordon", '{"reason": "x"}', {ADMIN}),
    ("POST", "/v1/nodes/gpu01/uncordon", "{}", {ADMIN}),
    ("POST", "/v1/nodes/gpu01/drain", '{"reason": "x"}', {ADMIN}),
    ("POST", "/v1/models", '{"models": []}', {ADMIN}),
    ("GET", "/v1/events", None, {AGENT, ADMIN, READ}),
]


@pytest.mark.parametrize(("method", "path", "body", "allowed"), ENDPOINTS)
async def test_auth_matrix(
    client: TestClient, method: str, path: str, body: str | None, allowed: set[str]
) -> None:
    for token in (None, "wrong-token", AGENT, ADMIN, READ):
        resp = await client.request(method, path, data=body, headers=auth(token))
        if token is None or token == "wrong-token":
            expected = 401
        else:
            expected = 200 if token in allowed else 403
        assert resp.status == expected, (token, await resp.text())
        if expected != 200:
            assert "error" in await resp.json()


async def test_healthz_needs_no_token(client: TestClient) -> None:
    assert (await client.get("/healthz")).status == 200


async def test_a_malformed_authorization_header_is_401(client: TestClient) -> None:
    resp = await client.get("/v1/summary", headers={"Authorization": f"Basic {ADMIN}"})
    assert resp.status == 401


async def test_cordon_records_who_and_when(client: TestClient) -> None:
    headers = {**auth(ADMIN), "X-LLMGW-User": "bob"}
    resp = await client.post("/v1/nodes/gpu01/cordon", json={"reason": "fan"}, headers=headers)
    row = await resp.json()
    assert row["state"] == "cordoned"
    assert row["admin"]["reason"] == "fan"
    assert row["admin"]["by"] == "alice (bob)"  # token identity, then the claimed login
    assert row["admin"]["at"] > 1.7e9
    detail = await (await client.get("/v1/nodes/gpu01", headers=auth(READ))).json()
    assert [(e["action"], e["reason"]) for e in detail["history"]] == [("cordon", "fan")]


# -- bad input changes nothing ----------------------------------------------------------------

BAD_REQUESTS = [
    ("malformed json", "POST", "/v1/agent/report", "{not json", AGENT, 400, None),
    (
        "wrong type",
        "POST",
        "/v1/agent/report",
        json.dumps({**report("gpu01").model_dump(mode="json"), "interval_s": "soon"}),
        AGENT,
        400,
        "interval_s",
    ),
    (
        "unknown field",
        "POST",
        "/v1/agent/report",
        json.dumps({**report("gpu01").model_dump(mode="json"), "extra": 1}),
        AGENT,
        400,
        "extra",
    ),
    (
        "bad gpu field",
        "POST",
        "/v1/agent/report",
        json.dumps({**report("gpu01").model_dump(mode="json"), "gpus": [{"uuid": "x"}]}),
        AGENT,
        400,
        "gpus.0.index",
    ),
    ("empty body", "POST", "/v1/agent/report", "", AGENT, 400, None),
    ("missing reason", "POST", "/v1/nodes/gpu01/cordon", "{}", ADMIN, 400, "reason"),
    ("blank reason", "POST", "/v1/nodes/gpu01/cordon", '{"reason": "   "}', ADMIN, 400, "reason"),
    (
        "drain without reason",
        "POST",
        "/v1/nodes/gpu01/drain",
        '{"force": true}',
        ADMIN,
        400,
        "reason",
    ),
    *(
        (
            f"drain deadline {bad}",
            "POST",
            "/v1/nodes/gpu01/drain",
            f'{{"reason": "x", "force_after_s": {bad}}}',
            ADMIN,
            400,
            "force_after_s",
        )
        for bad in ("0", "-5", "604801", "1e400", "NaN", "true", '"60"', "[]")
    ),
    ("unknown node cordon", "POST", "/v1/nodes/nope/cordon", '{"reason": "x"}', ADMIN, 404, "nope"),
    ("unknown node drain", "POST", "/v1/nodes/nope/drain", '{"reason": "x"}', ADMIN, 404, "nope"),
    ("unknown node read", "GET", "/v1/nodes/nope", None, READ, 404, "nope"),
    ("wrong token", "POST", "/v1/nodes/gpu01/cordon", '{"reason": "x"}', "nope", 401, None),
    ("read token mutates", "POST", "/v1/nodes/gpu01/cordon", '{"reason": "x"}', READ, 403, None),
    ("agent token mutates", "POST", "/v1/nodes/gpu01/drain", '{"reason": "x"}', AGENT, 403, None),
    (
        "bad model spec",
        "POST",
        "/v1/models",
        '{"models": [{"name": "m", "source": "s", "gpus_per_shard": 0}]}',
        ADMIN,
        400,
        "gpus_per_shard",
    ),
    (
        "duplicate models",
        "POST",
        "/v1/models",
        '{"models": [{"name": "m", "source": "s"}, {"name": "m", "source": "t"}]}',
        ADMIN,
        400,
        "repeated",
    ),
    ("unknown model delete", "DELETE", "/v1/models/nope", None, ADMIN, 404, "nope"),
    (
        "duplicate models in a dry run",
        "POST",
        "/v1/models?dry_run=true",
        '{"models": [{"name": "m", "source": "s"}, {"name": "m", "source": "t"}]}',
        ADMIN,
        400,
        "repeated",
    ),
    (
        "dry_run neither true nor false",
        "POST",
        "/v1/models?dry_run=yes",
        '{"models": [{"name": "m", "source": "s"}]}',
        ADMIN,
        400,
        "dry_run",
    ),
    (
        "dry run by a read token",
        "POST",
        "/v1/models?dry_run=true",
        '{"models": [{"name": "m", "source": "s"}]}',
        READ,
        403,
        None,
    ),
    (
        "max below min",
        "POST",
        "/v1/models",
        '{"models": [{"name": "m", "source": "s", "min_replicas": 3, "max_replicas": 2}]}',
        ADMIN,
        400,
        "max_replicas (2) is below min_replicas (3)",
    ),
    *(
        (
            f"autoscaling {field} {bad}",
            "POST",
            "/v1/models",
            f'{{"models": [{{"name": "m", "source": "s", "{field}": {bad}}}]}}',
            ADMIN,
            400,
            field,
        )
        for field, bad in (
            ("target_in_flight", "0"),
            ("target_in_flight", "2.5"),
            ("scale_down_after_s", "-1"),
            ("scale_down_after_s", '"600"'),
            ("priority", "1e9"),
            ("max_replicas", "true"),
        )
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "token", "status", "mentions"),
    [b[1:] for b in BAD_REQUESTS],
    ids=[b[0] for b in BAD_REQUESTS],
)
async def test_bad_input_is_refused_and_changes_nothing(
    client: TestClient,
    method: str,
    path: str,
    body: str | None,
    token: str,
    status: int,
    mentions: str | None,
) -> None:
    before = await snapshot(client)
    resp = await client.request(method, path, data=body, headers=auth(token))
    assert resp.status == status
    payload = await resp.json()
    assert payload["error"]
    # The field at fault and what is wrong, never the class that checked it.
    assert not [name for name in WIRE_CLASSES if name in payload["error"]], payload["error"]
    if mentions:
        assert mentions in json.dumps(payload)
    assert await snapshot(client) == before


WIRE_CLASSES = [
    name
    for name, value in vars(wire).items()
    if isinstance(value, type) and issubclass(value, BaseModel) and len(name) > 6
]


async def test_oversized_body_is_413_and_changes_nothing(client: TestClient) -> None:
    before = await snapshot(client)
    big = report("gpu01", storage=[location("/m", [f"org/model-{i:05d}" for i in range(4000)])] * 3)
    body = big.model_dump_json()
    assert len(body) > 1024 * 1024
    resp = await client.post("/v1/agent/report", data=body, headers=auth(AGENT))
    assert resp.status == 413
    assert "limit" in (await resp.json())["error"]
    assert await snapshot(client) == before


async def test_over_long_lists_are_refused(client: TestClient) -> None:
    body = report("gpu01").model_dump(mode="json")
    body["fabrics"] = [f"ib-{i}" for i in range(17)]
    resp = await client.post("/v1/agent/report", json=body, headers=auth(AGENT))
    assert resp.status == 400
    assert "fabrics" in await resp.text()


# -- durability -------------------------------------------------------------------------------------


async def test_a_restart_keeps_cordons_specs_and_known_nodes(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    settings = ControllerSettings(state_dir=tmp_path, tokens=tokens())
    first = await aiohttp_client(create_app(settings))
    await first.post(
        "/v1/agent/report", data=report("gpu01").model_dump_json(), headers=auth(AGENT)
    )
    await first.post(
        "/v1/agent/report", data=report("gpu02").model_dump_json(), headers=auth(AGENT)
    )
    await first.post("/v1/nodes/gpu01/cordon", json={"reason": "PSU swap"}, headers=auth(ADMIN))
    await first.post("/v1/nodes/gpu02/drain", json={"reason": "BIOS"}, headers=auth(ADMIN))
    spec = {"name": "llama", "source": "meta/llama", "min_replicas": 0, "gpus_per_shard": 8}
    assert (
        await first.post("/v1/models", json={"models": [spec]}, headers=auth(ADMIN))
    ).status == 200
    await first.close()

    second = await aiohttp_client(create_app(settings))
    nodes = {n["name"]: n for n in await (await second.get("/v1/nodes", headers=auth(READ))).json()}
    assert nodes["gpu01"]["admin"]["flag"] == "cordoned"
    assert nodes["gpu01"]["admin"]["reason"] == "PSU swap"
    assert nodes["gpu01"]["admin"]["by"] == "alice"
    assert nodes["gpu02"]["admin"]["flag"] in ("draining", "cordoned")
    models = await (await second.get("/v1/models", headers=auth(READ))).json()
    assert [m["spec"]["name"] for m in models] == ["llama"]
    assert models[0]["spec"]["gpus_per_shard"] == 8
    detail = await (await second.get("/v1/nodes/gpu01", headers=auth(READ))).json()
    assert detail["history"][0]["reason"] == "PSU swap"


# -- listening safely ------------------------------------------------------------------------------


def test_refuses_a_public_address_without_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("LLMGW_AGENT_TOKEN", "LLMGW_ADMIN_TOKEN", "LLMGW_READ_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    args = controller_parser().parse_args(
        ["--listen", "0.0.0.0:7460", "--state-dir", str(tmp_path)]
    )
    with pytest.raises(ValueError, match="without tokens"):
        settings_from_args(args)
    loopback = controller_parser().parse_args(
        ["--listen", "127.0.0.1:7460", "--state-dir", str(tmp_path)]
    )
    assert not settings_from_args(loopback).tokens.enabled


def test_listens_publicly_with_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_AGENT_TOKEN", "a")
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "b")
    args: argparse.Namespace = controller_parser().parse_args(
        ["--listen", "0.0.0.0:7460", "--state-dir", str(tmp_path), "--allow-shared-agent-token"]
    )
    assert settings_from_args(args).tokens.enabled


def test_token_files_name_each_operator(tmp_path: Path) -> None:
    path = tmp_path / "admins"
    path.write_text("# admins\nalice s3cret-a\nbob s3cret-b\n")
    loaded = Tokens.load(env={}, files={Role.ADMIN: path})
    assert loaded.identify("s3cret-b").name == "bob"  # type: ignore[union-attr]
    assert loaded.identify("s3cret-c") is None


async def test_healthz_names_the_role_epoch_and_url(client: TestClient) -> None:
    body = await (await client.get("/healthz")).json()
    assert body["ok"] is True and body["role"] == "leader" and body["epoch"] == 1
    assert body["leader"].startswith("http://")


async def test_rollout_history_and_undo_over_http(client: TestClient) -> None:
    spec = {"name": "org/m", "source": "org/m", "engine_args": ["--a"]}
    for args in (["--a"], ["--b"], ["--b"]):  # the third changes nothing the engine sees
        body = {"models": [{**spec, "engine_args": args}]}
        assert (await client.post("/v1/models", json=body, headers=auth(ADMIN))).status == 200
    path = "/v1/models/org%2Fm"
    revs = await (await client.get(f"{path}/revisions", headers=auth(READ))).json()
    assert [(r["revision"], r["by"], r["change"]) for r in revs] == [
        (1, "alice", "created"),
        (2, "alice", "engine_args: --a -> --b"),
    ]
    refused = await client.post(f"{path}/undo", json={}, headers=auth(READ))
    assert refused.status == 403
    bad = await client.post(f"{path}/undo", json={"to_revision": 9}, headers=auth(ADMIN))
    assert bad.status == 400
    assert "revision 9 of org/m is not an earlier revision kept" in (await bad.json())["error"]
    for body in ({"to_revision": 0}, {"to_revision": "x"}, {"extra": 1}):
        r = await client.post(f"{path}/undo", json=body, headers=auth(ADMIN))
        assert r.status == 400, body
    undone = await client.post(f"{path}/undo", json={}, headers=auth(ADMIN))
    assert undone.status == 200, await undone.text()
    view = await undone.json()
    assert view["rollout"]["revision"] == 3 and view["spec"]["engine_args"] == ["--a"]
    revs = await (await client.get(f"{path}/revisions", headers=auth(READ))).json()
    assert revs[-1]["change"] == "undo to revision 1: engine_args: --b -> --a"
    again = await client.post(f"{path}/undo", json={"to_revision": 1}, headers=auth(ADMIN))
    assert again.status == 400 and "nothing to undo" in (await again.json())["error"]
    missing = await client.get("/v1/models/nope/revisions", headers=auth(READ))
    assert missing.status == 404


async def test_events_answer_since_and_for_and_refuse_bad_ones(client: TestClient) -> None:
    for query in ("since=abc", "since=-1", "for=replica/x", "for=node/", "since=1e9"):
        r = await client.get(f"/v1/events?{query}", headers=auth(READ))
        assert r.status == 400, query
        assert "error" in await r.json()
    r = await client.get("/v1/events?since=0&for=node/gpu01", headers=auth(READ))
    assert r.status == 200 and await r.json() == {"events": [], "cursor": 0}
