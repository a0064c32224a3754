"""Node names are host names, normalised in one place (llmgw.wire): lower case,
no empty label, no trailing dot, not a bare number (issue 25 item 4). A node's
address is a host name or an IP literal that can be the host of an engine URL:
no IPv6 zone id, no hex number that a resolver reads as an IPv4 address (issue 36
item 7)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient
from pydantic import TypeAdapter, ValidationError

from llmgw.wire import EnrollRequest, NodeName, node_name
from tests.security.conftest import ADMIN, AGENT, ENROLL, auth, report_body

NAMES = TypeAdapter(NodeName)
BAD = ["n1.", "a..b", ".a", "0", "123", "1.2.3", "-a", "a-", "a_b", "a b", "é", "a" * 64, ""]
# What a resolver reads as 127.0.0.1 (issue 36 item 7).
HEX_IPV4 = ["0x7f.0.0.1", "0x7f000001", "0X7F.1"]


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("GPU-A01", "gpu-a01"),
        ("gpu-a01.Example.COM", "gpu-a01.example.com"),
        ("10.0.0.7", "10.0.0.7"),  # an IPv4 address is a name some fleets use
        ("a" * 63, "a" * 63),
        ("n1", "n1"),
        ("0a", "0a"),
    ],
)
def test_names_are_kept_in_lower_case(given: str, kept: str) -> None:
    assert NAMES.validate_python(given) == kept
    assert node_name(given) == kept


@pytest.mark.parametrize("bad", BAD + HEX_IPV4)
def test_names_that_are_not_host_names_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        NAMES.validate_python(bad)
    with pytest.raises(ValueError, match="host name"):
        node_name(bad)


def test_a_long_name_of_short_labels_is_bounded() -> None:
    NAMES.validate_python(".".join(["a"] * 127))  # 253 characters
    with pytest.raises(ValidationError):
        NAMES.validate_python(".".join(["a"] * 128))


async def test_a_report_in_capitals_is_the_same_node(client: TestClient) -> None:
    resp = await client.post("/v1/agent/report", json=report_body("GPU01"), headers=auth(AGENT))
    assert resp.status == 200 and (await resp.json())["node"] == "gpu01"
    nodes = await (await client.get("/v1/nodes", headers=auth(ADMIN))).json()
    assert [n["name"] for n in nodes] == ["gpu01"]
    # A name in a URL is the same node too.
    resp = await client.post("/v1/nodes/GPU01/cordon", json={"reason": "test"}, headers=auth(ADMIN))
    assert resp.status == 200 and (await resp.json())["name"] == "gpu01"
    # An enrollment under capitals is the same node, and so is its events' object.
    resp = await client.post("/v1/agent/enroll", json={"node": "GPU09"}, headers=auth(ENROLL))
    assert resp.status == 200 and (await resp.json())["node"] == "gpu09"
    resp = await client.get("/v1/events?for=node/GPU09", headers=auth(ADMIN))
    assert [e["object"] for e in (await resp.json())["events"]] == ["node/gpu09"]


@pytest.mark.parametrize("bad", ["n1.", "a..b", "0"])
async def test_a_report_or_enrollment_under_a_bad_name_is_a_400_saying_the_rule(
    client: TestClient, bad: str
) -> None:
    resp = await client.post("/v1/agent/report", json=report_body(bad), headers=auth(AGENT))
    assert resp.status == 400
    body = await resp.json()
    assert "host name" in body["detail"][0]["msg"], body
    with pytest.raises(ValidationError):
        EnrollRequest.model_validate({"node": bad})
    nodes = await (await client.get("/v1/nodes", headers=auth(ADMIN))).json()
    assert [n["name"] for n in nodes] == ["gpu01"]


async def test_a_url_naming_no_possible_node_is_a_400(client: TestClient) -> None:
    resp = await client.post("/v1/nodes/a..b/cordon", json={"reason": "x"}, headers=auth(ADMIN))
    assert resp.status == 400
    assert "host name" in (await resp.json())["error"]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("fe80::1%eth0", "has an IPv6 zone id"),
        ("fd00::7%25eth0", "has an IPv6 zone id"),
        *((hexed, "reads as an IPv4 address in hex") for hexed in HEX_IPV4),
    ],
)
async def test_an_address_no_engine_url_can_carry_is_a_400_saying_why(
    client: TestClient, address: str, why: str
) -> None:
    before = await (await client.get("/v1/nodes/gpu01", headers=auth(ADMIN))).json()
    body = report_body(address=address)
    resp = await client.post("/v1/agent/report", json=body, headers=auth(AGENT))
    assert resp.status == 400
    [detail] = (await resp.json())["detail"]
    assert detail["loc"] == "address" and why in detail["msg"], detail
    after = await (await client.get("/v1/nodes/gpu01", headers=auth(ADMIN))).json()
    assert after["address"] == before["address"], "nothing changed"


@pytest.mark.parametrize(
    "address", ["10.0.0.7", "fd00::7", "fe80::1", "gpu-a01.example.com", "box0x1"]
)
async def test_addresses_that_are_hosts_are_taken(client: TestClient, address: str) -> None:
    body = report_body(address=address)
    resp = await client.post("/v1/agent/report", json=body, headers=auth(AGENT))
    assert resp.status == 200
    detail = await (await client.get("/v1/nodes/gpu01", headers=auth(ADMIN))).json()
    assert detail["address"] == address
