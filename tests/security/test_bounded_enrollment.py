"""Bounded enrollment, in-process (issue 25 item 4): tokens an admin makes expire and
count their uses, new nodes may await approval and get no work meanwhile, a node
that reported before enrolls only when an admin allows it, and the route is
rate-limited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.ratelimit import Once, TokenBucket
from tests.security.conftest import auth, report_body
from tests.security.test_node_credentials import stored_anywhere

ADMIN, ENROLL, SHARED = "admin-secret", "enroll-secret", "shared-secret"
ClientFactory = Callable[..., Awaitable[TestClient]]
MakeClient = Callable[..., Awaitable[TestClient]]
MODEL = {
    "name": "m",
    "source": "org/m",
    "engine_args": ["--hf-token", "s3cret"],
    "min_replicas": 2,
    "gpus_per_shard": 8,
}


@pytest.fixture
def make_client(aiohttp_client: ClientFactory, tmp_path: Path) -> MakeClient:
    async def make(**settings: Any) -> TestClient:
        tokens = Tokens(
            (
                (ADMIN, "alice", Role.ADMIN),
                (ENROLL, "enroll", Role.ENROLL),
                (SHARED, "agent", Role.AGENT),
            )
        )
        settings.setdefault("reconcile_interval_s", 0.05)
        app = create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens, **settings))
        return await aiohttp_client(app)

    return make


async def enroll(c: TestClient, node: str, token: str = ENROLL) -> Any:
    return await c.post("/v1/agent/enroll", json={"node": node}, headers=auth(token))


async def make_token(c: TestClient, **body: Any) -> dict[str, Any]:
    resp = await c.post("/v1/credentials/tokens", json=body, headers=auth(ADMIN))
    assert resp.status == 201, await resp.text()
    made: dict[str, Any] = await resp.json()
    return made


async def get(c: TestClient, path: str) -> Any:
    resp = await c.get(path, headers=auth(ADMIN))
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def report(c: TestClient, token: str, node: str, n_gpus: int = 8) -> Any:
    body = report_body(node, n_gpus=n_gpus)
    resp = await c.post("/v1/agent/report", json=body, headers=auth(token))
    assert resp.status == 200, await resp.text()
    return await resp.json()


# -- tokens with an expiry and a use limit --------------------------------------------------


async def test_a_token_enrolls_as_many_nodes_as_it_has_uses(
    make_client: MakeClient, tmp_path: Path
) -> None:
    c = await make_client()
    made = await make_token(c, uses=2, ttl_s=3600, description="rack 7")
    token = made["token"]
    assert token.startswith(f"llmgw-enroll-{made['id']}.")
    assert made["state"] == "valid" and made["expires_at"] > time.time() + 3500
    assert (await enroll(c, "gpu01", token)).status == 200
    assert (await enroll(c, "gpu02", token)).status == 200
    resp = await enroll(c, "gpu03", token)
    assert resp.status == 401
    assert "used up (2 of 2 uses)" in (await resp.json())["error"]
    listed = await get(c, "/v1/credentials/tokens")
    assert [(t["id"], t["used"], t["state"], t["token"]) for t in listed] == [
        (made["id"], 2, "used up", None)
    ]
    creds = await get(c, "/v1/credentials")
    assert [x["node"] for x in creds] == ["gpu01", "gpu02"]
    assert creds[0]["by"] == f"enrollment token {made['id']}"
    # Only its hash is kept; a restart keeps the count.
    assert not stored_anywhere(tmp_path, token)
    await c.close()
    c = await make_client()
    assert (await enroll(c, "gpu03", token)).status == 401


async def test_an_expired_or_deleted_token_enrolls_nothing(make_client: MakeClient) -> None:
    c = await make_client()
    short = (await make_token(c, ttl_s=0.3))["token"]
    forever = await make_token(c, ttl_s=0)
    assert forever["expires_at"] is None and forever["uses"] is None
    await asyncio.sleep(0.4)
    resp = await enroll(c, "gpu01", short)
    assert resp.status == 401 and "expired at" in (await resp.json())["error"]
    # A wrong secret under a real id is just an invalid token.
    forged = forever["token"][:-4] + "AAAA"
    assert (await enroll(c, "gpu01", forged)).status == 401
    resp = await c.delete(f"/v1/credentials/tokens/{forever['id']}", headers=auth(ADMIN))
    assert resp.status == 204
    assert (await enroll(c, "gpu01", forever["token"])).status == 401
    assert await get(c, "/v1/credentials") == []
    # The token enrolls and does nothing else.
    fresh = (await make_token(c))["token"]
    assert (await c.get("/v1/nodes", headers=auth(fresh))).status == 403


@pytest.mark.parametrize(
    "body",
    [{"uses": 0}, {"uses": "3"}, {"ttl_s": -1}, {"ttl_s": 1e12}, {"lifetime": 3}],
)
async def test_a_bad_token_request_is_a_400_and_makes_nothing(
    make_client: MakeClient, body: dict[str, Any]
) -> None:
    c = await make_client()
    resp = await c.post("/v1/credentials/tokens", json=body, headers=auth(ADMIN))
    assert resp.status == 400
    assert await get(c, "/v1/credentials/tokens") == []


# -- approval -----------------------------------------------------------------------------------


async def test_an_enrolled_node_gets_no_work_until_approved(make_client: MakeClient) -> None:
    c = await make_client(enroll_approval=True)
    resp = await enroll(c, "gpu01")
    assert resp.status == 200
    reply = await resp.json()
    assert reply["awaiting_approval"] is True
    secret = reply["credential"]
    first = await report(c, secret, "gpu01")
    assert first["state"] == "cordoned" and first["assignments"] == []
    resp = await c.post("/v1/models", json={"models": [MODEL]}, headers=auth(ADMIN))
    assert resp.status == 200
    await asyncio.sleep(0.5)  # several reconcile passes
    assert (await report(c, secret, "gpu01"))["assignments"] == []
    assert await get(c, "/v1/replicas") == []
    row = (await get(c, "/v1/nodes"))[0]
    assert row["state"] == "cordoned"
    assert row["admin"]["awaiting_approval"] is True
    assert row["admin"]["reason"].startswith("awaiting approval: llmgw ctl credentials approve")
    assert (await get(c, "/v1/credentials"))[0]["awaiting_approval"] is True
    metrics = await (await c.get("/metrics", headers=auth(ADMIN))).text()
    assert "llmgw_nodes_awaiting_approval 1.0" in metrics
    # An uncordon is not an approval.
    resp = await c.post("/v1/nodes/gpu01/uncordon", headers=auth(ADMIN))
    assert resp.status == 409 and "approve" in (await resp.json())["error"]

    resp = await c.post("/v1/credentials/GPU01/approve", headers=auth(ADMIN))
    assert resp.status == 200
    assert (await c.post("/v1/credentials/gpu01/approve", headers=auth(ADMIN))).status == 409
    assert (await c.post("/v1/credentials/gpu09/approve", headers=auth(ADMIN))).status == 404
    for _ in range(100):
        assignments = (await report(c, secret, "gpu01"))["assignments"]
        if assignments:
            break
        await asyncio.sleep(0.05)
    assert [a["model"] for a in assignments] == ["m"]
    metrics = await (await c.get("/metrics", headers=auth(ADMIN))).text()
    assert "llmgw_nodes_awaiting_approval 0.0" in metrics
    detail = await get(c, "/v1/nodes/gpu01")
    assert detail["row"]["admin"]["flag"] == "none"
    assert (detail["history"][0]["action"], detail["history"][0]["by"]) == ("approve", "alice")
    events = (await get(c, "/v1/events?for=node/gpu01"))["events"]
    assert [e["reason"] for e in events] == ["Enrolled", "AwaitingApproval"]
    await c.close()
    # Durable: a restart neither forgets an approval nor grants one.
    c = await make_client(enroll_approval=True)
    assert (await enroll(c, "gpu02")).status == 200
    await c.close()
    c = await make_client(enroll_approval=True)
    creds = {x["node"]: x["awaiting_approval"] for x in await get(c, "/v1/credentials")}
    assert creds == {"gpu01": False, "gpu02": True}


async def test_fabricated_nodes_awaiting_approval_draw_no_replica(
    make_client: MakeClient,
) -> None:
    """Issue 25: 300 fabricated nodes claiming 8 H100s each drew every replica of a
    new model, with its engine arguments (a secret among them) in their assignments."""
    c = await make_client(enroll_approval=True, enroll_rate=1000)
    secrets = {}
    for i in range(30):
        resp = await enroll(c, f"fake{i:03d}")
        secrets[f"fake{i:03d}"] = (await resp.json())["credential"]
    for node, secret in secrets.items():
        await report(c, secret, node)
    resp = await c.post("/v1/models", json={"models": [MODEL]}, headers=auth(ADMIN))
    assert resp.status == 200
    await asyncio.sleep(0.5)
    for node, secret in secrets.items():
        assert (await report(c, secret, node))["assignments"] == []
    assert await get(c, "/v1/replicas") == []
    summary = await get(c, "/v1/summary")
    assert summary["nodes"]["cordoned"] == 30 and summary["nodes"]["ready"] == 0
    # One reason group for all of them, as `sinfo -R` lists them.
    assert [len(g["nodes"]) for g in summary["reasons"]] == [30]


# -- nodes that reported before ----------------------------------------------------------------


async def test_a_node_that_reported_before_enrolls_only_when_allowed(
    make_client: MakeClient,
) -> None:
    c = await make_client()
    await report(c, SHARED, "gpu05")  # known from the shared token
    resp = await enroll(c, "GPU05")
    assert resp.status == 409
    assert "llmgw ctl credentials allow gpu05" in (await resp.json())["error"]
    assert (await enroll(c, "gpu05")).status == 409
    events = (await get(c, "/v1/events?for=node/gpu05"))["events"]
    assert [e["reason"] for e in events] == ["EnrollRefused"], "once, not per try"
    assert await get(c, "/v1/credentials") == []
    # Allowances only for nodes that reported; one enrollment each.
    resp = await c.post("/v1/credentials/gpu77/allow", headers=auth(ADMIN))
    assert resp.status == 409 and "never reported" in (await resp.json())["error"]
    assert (await c.post("/v1/credentials/gpu05/allow", headers=auth(ADMIN))).status == 200
    assert (await enroll(c, "gpu05")).status == 200
    resp = await c.post("/v1/credentials/gpu05/allow", headers=auth(ADMIN))
    assert resp.status == 409 and "already holds a credential" in (await resp.json())["error"]
    # Revoked, it is a known node again: allowed again before it enrolls again.
    assert (await c.delete("/v1/credentials/gpu05", headers=auth(ADMIN))).status == 200
    assert (await enroll(c, "gpu05")).status == 409
    history = (await get(c, "/v1/nodes/gpu05"))["history"]
    assert ("allow enrollment", "alice") in [(h["action"], h["by"]) for h in history]


# -- the rate limit ----------------------------------------------------------------------------


async def test_enrollments_past_the_rate_get_429_with_retry_after(
    make_client: MakeClient,
) -> None:
    c = await make_client(enroll_rate=1)  # bursts of 2
    assert (await enroll(c, "gpu01")).status == 200
    assert (await enroll(c, "gpu02")).status == 200
    resp = await enroll(c, "gpu03")
    assert resp.status == 429
    assert int(resp.headers["Retry-After"]) >= 1
    assert "at most 1 per second" in (await resp.json())["error"]
    assert [x["node"] for x in await get(c, "/v1/credentials")] == ["gpu01", "gpu02"]


def test_the_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2, burst=2, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [0, 0, 0.5]
    now[0] = 0.5
    assert bucket.take() == 0 and bucket.take() == 0.5


def test_once_says_yes_once_per_period_and_stays_bounded() -> None:
    now = [0.0]
    once = Once(every_s=10, max_keys=2, clock=lambda: now[0])
    assert once.due("a") and not once.due("a")
    assert once.due("b") and once.due("c")  # "a" forgotten: at most 2 kept
    assert once.due("a")
    now[0] = 11
    assert once.due("b")


async def test_a_revoked_node_awaiting_approval_stays_out_of_placement(
    make_client: MakeClient,
) -> None:
    c = await make_client(enroll_approval=True)
    secret = (await (await enroll(c, "gpu01")).json())["credential"]
    await report(c, secret, "gpu01")
    assert (await c.delete("/v1/credentials/gpu01", headers=auth(ADMIN))).status == 200
    row = (await get(c, "/v1/nodes"))[0]
    assert row["state"] == "cordoned" and row["admin"]["awaiting_approval"] is True
    # Allowed and enrolled again, it awaits approval again.
    assert (await c.post("/v1/credentials/gpu01/allow", headers=auth(ADMIN))).status == 200
    assert (await (await enroll(c, "gpu01")).json())["awaiting_approval"] is True


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/credentials/tokens"),
        ("GET", "/v1/credentials/tokens"),
        ("DELETE", "/v1/credentials/tokens/abc123"),
        ("POST", "/v1/credentials/gpu01/approve"),
        ("POST", "/v1/credentials/gpu01/allow"),
    ],
)
async def test_only_an_admin_makes_tokens_approves_or_allows(
    make_client: MakeClient, method: str, path: str
) -> None:
    c = await make_client()
    made = (await make_token(c))["token"]
    for token, status in ((None, 401), ("wrong", 401), (ENROLL, 403), (made, 403), (SHARED, 403)):
        resp = await c.request(method, path, json={}, headers=auth(token))
        assert resp.status == status, (token, await resp.text())
    assert [t["used"] for t in await get(c, "/v1/credentials/tokens")] == [0]
