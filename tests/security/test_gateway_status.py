"""What a gateway token can make the controller keep is bounded (issue 25 item 3),
and a node's address is a host name or an IP literal (issue 25 item 1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient

from llmgw.controller.views import endpoints
from tests.security.conftest import ADMIN, AGENT, GATEWAY, auth, report_body, views


async def post_status(client: TestClient, body: dict[str, object]) -> int:
    resp = await client.post("/v1/gateways/status", json=body, headers=auth(GATEWAY))
    if resp.status >= 400:
        assert (await resp.json())["error"]
    return resp.status


async def gateways(client: TestClient) -> list[dict[str, object]]:
    resp = await client.get("/v1/gateways", headers=auth(ADMIN))
    return list(await resp.json())


@pytest.mark.parametrize("key", ["\x1b[2J", "a\nb", "\x00", "r\x9b1"])
async def test_control_characters_in_replica_keys_are_400(client: TestClient, key: str) -> None:
    for field in ("in_flight", "requests", "rejected"):
        value: object = "why" if field == "rejected" else 1
        assert await post_status(client, {"name": "gw", field: {key: value}}) == 400
    assert await gateways(client) == []


async def test_entries_are_kept_only_for_replicas_that_exist(client: TestClient) -> None:
    junk = {f"r{i}": 1 for i in range(2000)}
    assert await post_status(client, {"name": "gw", "in_flight": junk, "requests": junk}) == 200
    (g,) = await gateways(client)
    assert g["in_flight"] == 0 and g["requests"] == 0 and g["rejected"] == {}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_status_bigger_than_the_replicas_could_fill_is_413_unparsed(
    client: TestClient, chunked: bool
) -> None:
    """A gateway token sending 20,000 ghost entries a status (700 KB) took the
    controller's report p50 from 9 to 130-210 ms (bench_hostile.py): such a status
    is refused before it is parsed, with no replica to fill it."""
    ghosts = {f"ghost-{i}": 1 for i in range(20_000)}
    body = json.dumps({"name": "gw", "in_flight": ghosts, "requests": ghosts}).encode()
    assert len(body) > endpoints.STATUS_BYTES_BASE

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    resp = await client.post(
        "/v1/gateways/status",
        data=chunks() if chunked else body,
        headers={**auth(GATEWAY), "Content-Type": "application/json"},
    )
    assert resp.status == 413, await resp.text()
    assert f"the limit is {endpoints.STATUS_BYTES_BASE} bytes" in (await resp.json())["error"]
    assert await gateways(client) == []


async def test_names_per_token_are_bounded(client: TestClient) -> None:
    for i in range(endpoints.MAX_NAMES_PER_TOKEN):
        assert await post_status(client, {"name": f"gw-{i}"}) == 200
    resp = await client.post(
        "/v1/gateways/status", json={"name": "one-more"}, headers=auth(GATEWAY)
    )
    assert resp.status == 429
    assert "too many gateway names" in (await resp.json())["error"]
    assert await post_status(client, {"name": "gw-0"}) == 200  # a known name still reports
    assert len(await gateways(client)) == endpoints.MAX_NAMES_PER_TOKEN


async def test_a_silent_gateway_is_forgotten(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoints, "FORGET_S", 0.3)
    assert await post_status(client, {"name": "gw-old"}) == 200
    assert [g["name"] for g in await gateways(client)] == ["gw-old"]
    await asyncio.sleep(0.5)
    assert await gateways(client) == []
    metrics = await (await client.get("/metrics", headers=auth(ADMIN))).text()
    assert 'gateway="gw-old"' not in metrics


@pytest.mark.parametrize(
    "address", [" ", "%2e%2e", "host/path", "evil:1/x", "a..b", "n1.", "[::1]", "1.2.3"]
)
async def test_a_report_address_that_is_no_host_is_400(client: TestClient, address: str) -> None:
    before = await views(client)
    resp = await client.post(
        "/v1/agent/report", json=report_body(address=address), headers=auth(AGENT)
    )
    assert resp.status == 400
    body = await resp.json()
    assert "address" in body["error"] and "host name or an IP literal" in str(body["detail"])
    assert await views(client) == before


@pytest.mark.parametrize("address", ["10.0.0.7", "fd00::7", "gpu-a01.example.com", "localhost"])
async def test_a_host_name_or_ip_literal_is_taken(client: TestClient, address: str) -> None:
    resp = await client.post(
        "/v1/agent/report", json=report_body(address=address), headers=auth(AGENT)
    )
    assert resp.status == 200
