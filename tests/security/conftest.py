"""A controller app with tokens and one reporting node, for the hardening tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app

AGENT, ADMIN, READ, ENROLL = "agent-secret", "admin-secret", "read-secret", "enroll-secret"
GATEWAY = "gateway-secret"
ClientFactory = Callable[..., Awaitable[TestClient]]


def gpu(node: str, index: int) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "gpu_class": "H100-SXM-80GB",
        "memory_total_mib": 81920,
        "health": "healthy",
    }


def report_body(node: str = "gpu01", n_gpus: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "node": node,
        "agent_version": "test",
        "boot_id": "boot-1",
        "interval_s": 5.0,
        "gpus": [gpu(node, i) for i in range(n_gpus)],
        **extra,
    }


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        (
            (AGENT, "agent", Role.AGENT),
            (ADMIN, "alice", Role.ADMIN),
            (READ, "reader", Role.READ),
            (ENROLL, "enroll", Role.ENROLL),
            (GATEWAY, "gw", Role.GATEWAY),
        )
    )
    # No background reconcile: a placement between two views is not the request's doing.
    settings = ControllerSettings(
        state_dir=tmp_path, tokens=tokens, reconcile_interval_s=86_400, reconcile_on_news=False
    )
    app = create_app(settings)
    c = await aiohttp_client(app)
    resp = await c.post("/v1/agent/report", json=report_body(), headers=auth(AGENT))
    assert resp.status == 200
    return c


async def views(client: TestClient) -> Any:
    """Everything a reader can see, minus what moves with the clock."""
    out: dict[str, Any] = {}
    paths = (
        "/v1/summary",
        "/v1/nodes",
        "/v1/models",
        "/v1/replicas",
        "/v1/credentials",
        "/v1/credentials/tokens",
    )
    for path in paths:
        resp = await client.get(path, headers=auth(ADMIN))
        out[path] = await resp.json()
    out["/v1/summary"].pop("generated_at", None)
    gateways = await (await client.get("/v1/gateways", headers=auth(ADMIN))).json()
    out["/v1/gateways"] = [{k: v for k, v in g.items() if k != "age_s"} for g in gateways]
    for row in out["/v1/nodes"]:
        row.pop("report_age_s", None)
        detail = await (await client.get(f"/v1/nodes/{row['name']}", headers=auth(ADMIN))).json()
        detail["row"].pop("report_age_s", None)
        out[f"/v1/nodes/{row['name']}"] = detail
    return out
