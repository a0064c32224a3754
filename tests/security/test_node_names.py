"""Node names are host names, normalised in one place (llmgw.wire): lower case,
no empty label, no trailing dot, not a bare number (issue 25 item 4)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient
from pydantic import TypeAdapter, ValidationError

from llmgw.wire import EnrollRequest, NodeName, node_name
from tests.security.conftest import ADMIN, AGENT, ENROLL, auth, report_body

NAMES = TypeAdapter(NodeName)
BAD = ["n1.", "a..b", ".a", "0", "123", "1.2.3", "-a", "a-", "a_b", "a b", "é", "a" * 64, ""]


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


@pytest.mark.parametrize("bad", BAD)
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
