"""Usage and limits at the controller, in process over HTTP: batches from gateways
counted once and by the hour, what each gateway is told the others spent, budgets
read back from the store, `/v1/usage` summed by tenant and model, limits set,
listed, followed on the keys feed and deleted, and who may do what; the Prometheus
counters. The sums and rows without a server (usage.rows_of)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.records import UsageCount
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.state.usage import hour_of, rows_of
from llmgw.controller.store.sqlite import Store

GATEWAY, ADMIN, READ = "gateway-secret", "admin-secret", "read-secret"
TOKENS = Tokens(
    ((GATEWAY, "gw", Role.GATEWAY), (ADMIN, "alice", Role.ADMIN), (READ, "reader", Role.READ))
)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(aiohttp_client: AiohttpClient, tmp_path: Path) -> TestClient:
    return await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path, tokens=TOKENS)))


def row(tenant: str, model: str, requests: int = 1, prompt: int = 0, completion: int = 0) -> Any:
    return {
        "tenant": tenant,
        "model": model,
        "requests": requests,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
    }


async def post(
    client: TestClient, name: str, seq: int, rows: list[Any], run: str = "run1"
) -> dict[str, Any]:
    body = {"name": name, "run": run, "seq": seq, "rows": rows}
    resp = await client.post("/v1/gateways/usage", json=body, headers=auth(GATEWAY))
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def usage(client: TestClient, **query: str) -> list[dict[str, Any]]:
    resp = await client.get("/v1/usage", params=query, headers=auth(READ))
    assert resp.status == 200, await resp.text()
    rows: list[dict[str, Any]] = (await resp.json())["rows"]
    return rows


def test_rows_sum_over_what_by_leaves_out() -> None:
    counts = [
        UsageCount(0, "acme", "a", 1, 10, 5, 1, 0),
        UsageCount(0, "acme", "b", 2, 1, 1, 0, 3),
        UsageCount(0, "beta", "a", 1, 100, 100, 0, 0),
    ]
    by_tenant = rows_of(counts, ("tenant",))
    assert [(r.tenant, r.model, r.requests, r.prompt_tokens) for r in by_tenant] == [
        ("beta", "", 1, 100),
        ("acme", "", 3, 11),
    ]
    assert [(r.model, r.rate_limited) for r in rows_of(counts, ("model",))] == [("a", 0), ("b", 3)]
    assert len(rows_of(counts, ("tenant", "model"))) == 3


async def test_a_batch_counts_once_and_sums_by_tenant_and_model(client: TestClient) -> None:
    rows = [row("acme", "m", 2, 10, 4), row("beta", "m", 1, 3, 3)]
    await post(client, "gw-a", 1, rows)
    await post(client, "gw-a", 1, rows)  # sent again (its answer lost): counted once
    await post(client, "gw-b", 1, [row("acme", "m", 1, 1, 1)])  # another gateway, its own seq
    await post(client, "gw-a", 1, [row("acme", "m", 5)], run="run2")  # restarted: a new run
    got = {(r["tenant"], r["model"]): r for r in await usage(client)}
    assert got[("acme", "m")] == {
        "tenant": "acme",
        "model": "m",
        "requests": 8,
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "errors": 0,
        "rate_limited": 0,
    }
    assert got[("beta", "m")]["requests"] == 1
    by_tenant = await usage(client, by="tenant", since="1h")
    assert [(r["tenant"], r["model"]) for r in by_tenant] == [("acme", ""), ("beta", "")]
    for bad in ({"since": "0s"}, {"since": "soon"}, {"by": "node"}, {"since": "500d"}):
        resp = await client.get("/v1/usage", params=bad, headers=auth(READ))
        assert resp.status == 400, bad
    # Prometheus: one series per tenant and model, the fleet's.
    text = await (await client.get("/metrics", headers=auth(READ))).text()
    assert 'llmgw_tenant_prompt_tokens_total{model="m",tenant="acme"} 11.0' in text
    assert 'llmgw_tenant_requests_total{model="m",tenant="beta"} 1.0' in text


async def test_who_may_post_read_and_set(client: TestClient) -> None:
    body = {"name": "gw", "run": "r", "seq": 1, "rows": []}
    for token, status in ((READ, 403), (ADMIN, 403), (None, 401)):
        headers = auth(token) if token else {}
        resp = await client.post("/v1/gateways/usage", json=body, headers=headers)
        assert resp.status == status, token
    limit = {"tenant": "acme", "rpm": 5}
    assert (await client.put("/v1/limits", json=limit, headers=auth(READ))).status == 403
    assert (await client.put("/v1/limits", json=limit, headers=auth(GATEWAY))).status == 403
    assert (await client.get("/v1/usage", headers=auth(GATEWAY))).status == 403
    for bad in (
        {"tenant": "acme"},  # nothing limited
        {"tenant": "acme", "budget": 5},  # a budget without its period
        {"tenant": "acme", "rpm": 5, "per": "day"},  # a period without a budget
        {"tenant": "acme", "rpm": 0},
        {"tenant": "acme", "rpm": "5"},
        {"tenant": "a b", "rpm": 5},
        {"tenant": "acme", "budget": 5, "per": "week"},
    ):
        resp = await client.put("/v1/limits", json=bad, headers=auth(ADMIN))
        assert resp.status == 400, bad
    assert (await client.get("/v1/limits", headers=auth(READ))).status == 200
    assert await (await client.get("/v1/limits", headers=auth(READ))).json() == []


async def test_limits_set_merge_follow_the_feed_and_delete(client: TestClient) -> None:
    feed = await (await client.get("/v1/keys/feed", headers=auth(GATEWAY))).json()
    assert feed["limits"] == []
    resp = await client.put("/v1/limits", json={"tenant": "acme", "rpm": 5}, headers=auth(ADMIN))
    assert resp.status == 200
    body = {"tenant": "acme", "budget": 1000, "per": "month"}
    made = await (await client.put("/v1/limits", json=body, headers=auth(ADMIN))).json()
    assert (made["rpm"], made["budget"], made["per"], made["by"]) == (5, 1000, "month", "alice")
    on_model = {"tenant": "acme", "model": "big", "tpm": 100}
    assert (await client.put("/v1/limits", json=on_model, headers=auth(ADMIN))).status == 200
    # The feed moved on: a long poll from the earlier cursor answers at once.
    started = time.monotonic()
    newer = await client.get(
        "/v1/keys/feed", params={"since": feed["cursor"], "wait": "5"}, headers=auth(GATEWAY)
    )
    assert time.monotonic() - started < 2
    limits = (await newer.json())["limits"]
    assert [(k["tenant"], k["model"], k["tpm"]) for k in limits] == [
        ("acme", None, None),
        ("acme", "big", 100),
    ]
    resp = await client.delete("/v1/limits/acme", params={"model": "big"}, headers=auth(ADMIN))
    assert resp.status == 200
    resp = await client.delete("/v1/limits/acme", params={"model": "big"}, headers=auth(ADMIN))
    assert resp.status == 404 and "no limit of tenant 'acme'" in (await resp.json())["error"]
    assert len(await (await client.get("/v1/limits", headers=auth(READ))).json()) == 1


async def test_each_gateway_hears_what_the_others_spent_and_the_budget_so_far(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    # Usage from an earlier hour of this month, in the store before the controller starts.
    store = Store(tmp_path)
    early = hour_of(time.time()) - 3600 if time.gmtime().tm_mday > 1 else hour_of(time.time())
    assert store.add_usage("old-gw", "r0", 1, [UsageCount(early, "acme", "m", 3, 50, 50)], at=0)
    store.close()
    client = await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path, tokens=TOKENS)))
    body = {"tenant": "acme", "rpm": 100, "budget": 10_000, "per": "month"}
    assert (await client.put("/v1/limits", json=body, headers=auth(ADMIN))).status == 200
    a = await post(client, "gw-a", 1, [row("acme", "m", 2, 10, 10)])
    assert a["shares"] == [
        {
            "tenant": "acme",
            "model": None,
            "others_requests": 0,
            "others_tokens": 0,
            "budget_used": 120,  # the store's 100 and this batch's 20
        }
    ]
    b = await post(client, "gw-b", 1, [row("acme", "m", 3, 5, 5)])
    assert b["shares"][0]["others_requests"] == 2 and b["shares"][0]["others_tokens"] == 20
    assert b["shares"][0]["budget_used"] == 130
    a = await post(client, "gw-a", 2, [])  # nothing new here: told what changed elsewhere
    assert a["shares"][0]["others_requests"] == 3 and a["shares"][0]["budget_used"] == 130
    a = await post(client, "gw-a", 3, [])
    assert a["shares"] == []  # nothing changed since it was told
