"""Who may call what, as the API reference's table (docs/api.md) says it, is what the controller enforces
(issue 25 item 7): the table names every route with the token kinds the route table
allows, and `/metrics` and `/v1/whoami` answer the whole matrix of token kinds as
documented (`/metrics` answered admin and shared agent tokens, unlike the docs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.routes import ROUTE_ROLES
from tests.security.conftest import ClientFactory, auth

API_DOC = Path(__file__).parents[2] / "docs" / "api.md"
ANY = {Role.ADMIN, Role.READ, Role.AGENT}
# The API reference's words for who may call a route -> the roles they mean.
WORDS: dict[str, set[Role] | None] = {
    "none": None,
    "agent": {Role.AGENT},
    "any": ANY,
    "admin": {Role.ADMIN},
    "enroll": {Role.ENROLL},
    "gateway": {Role.GATEWAY},
    "gateway or any": ANY | {Role.GATEWAY},
    "any or metrics": ANY | {Role.METRICS},
    "every token": set(Role),
}
ROW = re.compile(r"^\| `(GET|POST|DELETE|PUT) ([^`?]+)[^`]*` \| ([^|]+) \|", re.MULTILINE)


def documented() -> dict[str, set[Role] | None]:
    text = API_DOC.read_text().split("\n## ", 1)[0]  # the routes, before the summary
    rows = {}
    for method, path, who in ROW.findall(text):
        assert who.strip() in WORDS, f"docs/api.md's table: unknown token words {who!r}"
        rows[f"{method} {path}"] = WORDS[who.strip()]
    return rows


def test_readme_names_every_route_with_exactly_the_tokens_it_takes() -> None:
    table = documented()
    enforced: dict[str, set[Role] | None] = {k: set(v) for k, v in ROUTE_ROLES.items()}
    enforced["GET /healthz"] = None
    assert table == enforced


METRICS, NODE = "metrics-secret", "node-secret"
TOKENS = {
    "admin": "admin-secret",
    "read": "read-secret",
    "shared-agent": "agent-secret",
    "node-credential": NODE,
    "metrics": METRICS,
    "enroll": "enroll-secret",
    "gateway": "gateway-secret",
}


@pytest.fixture
async def every_kind(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    tokens = Tokens(
        (
            (TOKENS["admin"], "alice", Role.ADMIN),
            (TOKENS["read"], "reader", Role.READ),
            (TOKENS["shared-agent"], "agents", Role.AGENT),
            (METRICS, "prometheus", Role.METRICS),
            (TOKENS["enroll"], "enroll", Role.ENROLL),
            (TOKENS["gateway"], "gw", Role.GATEWAY),
        ),
        nodes=((NODE, "gpu01"),),
    )
    settings = ControllerSettings(
        state_dir=tmp_path, tokens=tokens, reconcile_interval_s=86_400, reconcile_on_news=False
    )
    return await aiohttp_client(create_app(settings))


@pytest.mark.parametrize(
    "kind, metrics, whoami",
    [
        (None, 401, 401),
        ("wrong", 401, 401),
        ("admin", 200, 200),
        ("read", 200, 200),
        ("shared-agent", 200, 200),
        ("metrics", 200, 200),
        ("node-credential", 403, 200),
        ("enroll", 403, 200),
        ("gateway", 403, 200),
    ],
)
async def test_metrics_and_whoami_answer_the_token_kinds_readme_names(
    every_kind: TestClient, kind: str | None, metrics: int, whoami: int
) -> None:
    token = None if kind is None else TOKENS.get(kind, "not-a-token")
    got = await every_kind.get("/metrics", headers=auth(token))
    assert got.status == metrics, await got.text()
    if metrics == 200:
        assert "llmgw_nodes" in await got.text()
    else:
        assert "error" in await got.json()
    me = await every_kind.get("/v1/whoami", headers=auth(token))
    assert me.status == whoami, await me.text()
    if whoami == 200:
        body = await me.json()
        role = {"shared-agent": "agent", "node-credential": "agent"}.get(str(kind), kind)
        assert body["role"] == role
        if kind == "node-credential":
            assert body["name"] == "gpu01"
