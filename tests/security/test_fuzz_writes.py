"""Fuzz every write endpoint: never a 5xx, and an error changes nothing.

Bodies are random JSON, random bytes, or a valid body with one field replaced,
dropped or added. CI runs a bounded number of examples; set
LLMGW_FUZZ_EXAMPLES=5000 for a longer hunt.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.wire import host_problem
from tests.security.conftest import ADMIN, AGENT, ENROLL, GATEWAY, auth, report_body, views

EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "60"))

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["5", "true", "ready", "GPU-gpu01-0", "\x1b[2J", "a\nb", "\udcff"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

VALID: dict[str, dict[str, Any]] = {
    "report": {
        **report_body(address="10.0.0.1"),
        "replicas": [{"id": "r1", "model": "m", "state": "ready", "gpus": ["GPU-gpu01-0"]}],
    },
    "gateway-status": {"name": "gw-1", "cursor": "", "in_flight": {"r1": 0}, "requests": {}},
    "cordon": {"reason": "disk"},
    "drain": {"reason": "disk", "force": False, "force_after_s": 60},
    "uncordon": {},
    "models": {"models": [{"name": "m", "source": "s", "min_replicas": 1, "engine": "fake"}]},
    "drain-plan": {"nodes": ["gpu01"]},
    "enroll": {"node": "gpu07"},
    "forget": {},
    "approve": {},
    "allow": {},
    "token-create": {"ttl_s": 60, "uses": 2, "description": "rack 7"},
}
# Where engines are reached: it becomes the host of URLs every gateway uses.
ADDRESSES = (
    st.sampled_from(
        [
            " ",
            "%2e%2e",
            "host/path",
            "evil:1/x",
            "[::1]",
            "a..b",
            "n1.",
            "-x",
            "1.2.3",
            "a b",
            "\x1b",
        ]
    )
    | st.sampled_from(["fe80::1%eth0", "0x7f.0.0.1", "0x7f000001"])
    | st.text(max_size=20)
)
# Keys of a gateway's status maps are replica ids: no control characters.
REPLICA_KEYS = st.sampled_from(["r1", "\x1b[2J", "a\nb", "\x00", "x" * 65, ""]) | st.text(
    max_size=8
)
NODE_NAMES = st.sampled_from(["gpu01", "nope", "a b", "..", "x" * 300, "\u00e9"]) | st.text(
    max_size=12
)


def paths(body: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(body, dict):
        for k, v in body.items():
            out += paths(v, (*prefix, k))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, kind: str) -> bytes:
    body = json.loads(json.dumps(VALID[kind]))
    where = draw(st.sampled_from(paths(body)))
    action = draw(st.sampled_from(["replace", "drop", "add"]))
    if not where:
        return json.dumps(draw(JSON)).encode("utf-8", "surrogatepass")
    parent = body
    for key in where[:-1]:
        parent = parent[key]
    last = where[-1]
    if action == "replace":
        parent[last] = draw(JSON)
    elif action == "drop":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = draw(JSON)
    else:
        parent.append(draw(JSON))
    return json.dumps(body).encode("utf-8", "surrogatepass")


@st.composite
def targeted(draw: st.DrawFn, kind: str) -> bytes:
    """A valid body with a hostile address, or hostile replica-id keys."""
    body = json.loads(json.dumps(VALID[kind]))
    if kind == "report":
        body["address"] = draw(ADDRESSES)
    else:
        field = draw(st.sampled_from(["in_flight", "requests", "rejected"]))
        value: Any = "why" if field == "rejected" else 1
        body[field] = {draw(REPLICA_KEYS): value}
    return json.dumps(body).encode("utf-8", "surrogatepass")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes, str]:
    kind = draw(st.sampled_from([*VALID, "delete-model", "revoke", "token-delete"]))
    node = quote(draw(NODE_NAMES), safe="")
    method, path, token = {
        "report": ("POST", "/v1/agent/report", AGENT),
        "gateway-status": ("POST", "/v1/gateways/status", GATEWAY),
        "cordon": ("POST", f"/v1/nodes/{node}/cordon", ADMIN),
        "drain": ("POST", f"/v1/nodes/{node}/drain", ADMIN),
        "uncordon": ("POST", f"/v1/nodes/{node}/uncordon", ADMIN),
        "models": ("POST", "/v1/models", ADMIN),
        "drain-plan": ("POST", "/v1/drain-plan", ADMIN),
        "delete-model": ("DELETE", f"/v1/models/{node}", ADMIN),
        "enroll": ("POST", "/v1/agent/enroll", ENROLL),
        "forget": ("POST", f"/v1/nodes/{node}/forget", ADMIN),
        "revoke": ("DELETE", f"/v1/credentials/{node}", ADMIN),
        "approve": ("POST", f"/v1/credentials/{node}/approve", ADMIN),
        "allow": ("POST", f"/v1/credentials/{node}/allow", ADMIN),
        "token-create": ("POST", "/v1/credentials/tokens", ADMIN),
        "token-delete": ("DELETE", f"/v1/credentials/tokens/{node}", ADMIN),
    }[kind]
    if kind in ("delete-model", "revoke", "token-delete"):
        body = b""
    elif kind in ("report", "gateway-status") and draw(st.booleans()):
        body = draw(targeted(kind))
    else:
        body = draw(
            mutated(kind)
            | st.binary(max_size=64)
            | JSON.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))
        )
    return method, path, body, token


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=requests())
async def test_write_endpoints_never_5xx_and_errors_change_nothing(
    client: TestClient, case: tuple[str, str, bytes, str]
) -> None:
    method, path, body, token = case
    before = await views(client)
    resp = await client.request(
        method, path, data=body, headers={**auth(token), "Content-Type": "application/json"}
    )
    text = await resp.text()
    assert resp.status < 500, (resp.status, text)
    if resp.status >= 400:
        assert json.loads(text)["error"]
        assert await views(client) == before, (path, body)
    elif path == "/v1/agent/report":  # taken: its address is a host name or an IP literal
        address = json.loads(body).get("address")
        assert address is None or host_problem(address) is None, address
    elif path == "/v1/gateways/status":  # taken: only the replica ids that exist are kept
        for g in await (await client.get("/v1/gateways", headers=auth(ADMIN))).json():
            assert set(g["rejected"]) <= {"r1"}, g
