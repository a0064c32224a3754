"""Inbound types are strict: no coercion, finite numbers, bounded integers,
unique GPUs, no control characters; terminal output is escaped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llmgw import render
from llmgw.wire import (
    DrainRequest,
    ModelSpec,
    NodeReport,
    NodeRow,
    ReasonRequest,
    printable,
)
from tests.security.conftest import ADMIN, AGENT, auth, report_body, views


def refused(model: type[Any], body: dict[str, Any] | str) -> str:
    raw = body if isinstance(body, str) else json.dumps(body)
    with pytest.raises(ValidationError) as exc:
        model.model_validate_json(raw)
    return str(exc.value)


def with_gpu(**fields: Any) -> dict[str, Any]:
    body = report_body()
    body["gpus"][0].update(fields)
    return body


def with_replica(**fields: Any) -> dict[str, Any]:
    replica = {"id": "r1", "model": "m", "state": "ready", **fields}
    return report_body(replicas=[replica])


@pytest.mark.parametrize(
    "body",
    [
        with_gpu(index="0"),  # "5" is not 5
        with_gpu(index=True),  # true is not 1
        with_gpu(in_use="true"),  # "true" is not true
        with_gpu(in_use=1),
        with_gpu(memory_total_mib=81920.0),
        with_gpu(health=1),
        report_body(interval_s="5"),
        with_replica(idle_seconds="3"),
        with_replica(state=2),
    ],
)
def test_nothing_is_coerced(body: dict[str, Any]) -> None:
    refused(NodeReport, body)


def test_bools_and_numbers_in_admin_bodies_are_not_coerced() -> None:
    refused(DrainRequest, {"reason": "x", "force": "true"})
    refused(DrainRequest, {"reason": "x", "force": 1})
    refused(ModelSpec, {"name": "m", "source": "s", "min_replicas": "5"})
    refused(ModelSpec, {"name": "m", "source": "s", "min_replicas": 5.0})
    assert ModelSpec.model_validate_json('{"name":"m","source":"s","min_replicas":5}')


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_non_finite_numbers_are_refused(number: str) -> None:
    replica = '{"id":"r1","model":"m","state":"ready","idle_seconds":' + number + "}"
    base = json.dumps(report_body())[:-1]
    refused(NodeReport, f'{base}, "replicas": [{replica}]}}')
    refused(NodeReport, f'{base}, "uptime_s": {number}}}')


@pytest.mark.parametrize(
    "body",
    [
        with_replica(exit_code=2**31),
        with_replica(exit_code=-(2**31) - 1),
        with_replica(exit_code=10**30),
        with_replica(idle_seconds=10**20),
        report_body(uptime_s=10**20),
        with_gpu(memory_total_mib=10**30),
    ],
)
def test_integers_are_bounded_to_what_they_mean(body: dict[str, Any]) -> None:
    refused(NodeReport, body)


def test_exit_codes_in_range_are_fine() -> None:
    for code in (0, 1, -9, 2**31 - 1, -(2**31)):
        NodeReport.model_validate_json(json.dumps(with_replica(exit_code=code)))


def test_duplicate_gpu_uuids_and_indexes_are_refused() -> None:
    body = report_body(n_gpus=4)
    for g in body["gpus"]:
        g["uuid"] = "GPU-SAME"
    assert "uuid repeated: GPU-SAME" in refused(NodeReport, body)
    body = report_body(n_gpus=2)
    body["gpus"][1]["index"] = 0
    assert "index repeated: 0" in refused(NodeReport, body)


@pytest.mark.parametrize("bad", ["a\nb", "a\x1b[2J", "a\rb", "a\x00b", "a\x9bb", "a\x7f"])
def test_control_characters_are_refused_in_names_and_short_fields(bad: str) -> None:
    refused(NodeReport, with_gpu(gpu_class=bad))
    refused(NodeReport, with_gpu(uuid=bad))
    refused(NodeReport, with_gpu(name=bad))
    refused(NodeReport, report_body(agent_version=bad))
    refused(NodeReport, report_body(node=bad))
    refused(ModelSpec, {"name": "m", "source": "s", "engine": bad})
    refused(ModelSpec, {"name": bad, "source": "s"})
    message = refused(ReasonRequest, {"reason": f"disk{bad}FAKE LINE"})
    assert "string_pattern_mismatch" in message


def test_agent_error_text_keeps_lines_but_not_escapes() -> None:
    NodeReport.model_validate_json(json.dumps(with_replica(error="exit 1\nlast line\tx")))
    assert "string_pattern_mismatch" in refused(NodeReport, with_replica(error="red \x1b[31m"))


@given(st.text(max_size=50))
def test_printable_leaves_no_control_characters(text: str) -> None:
    shown = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    if text.isprintable():
        assert shown == text


def test_printable_shows_escapes_as_text() -> None:
    assert printable("a\nb\x1b[2J") == "a\\nb\\x1b[2J"
    assert printable("a\nb\x1b", keep_lines=True) == "a\nb\\x1b"


def test_ctl_nodes_table_escapes_report_text() -> None:
    row = NodeRow.model_validate(
        {
            "name": "gpu01",
            "state": "ready",
            "admin": {"flag": "none"},
            "report_age_s": 1.0,
            "classes": {},
            "gpus_total": 0,
            "gpus_used": 0,
            "gpus_unhealthy": 0,
            "gpus_unknown": 0,
            "fabrics": [],
            "models": [],
            "replicas": 0,
            "gpu_error": "nvml\nFAKE LINE: all nodes ready\x1b[2J",
        }
    )
    out = render.nodes_table([row]).format(color=False)
    assert "\x1b" not in out
    assert "FAKE LINE" in out
    assert not any(line.lstrip().startswith("FAKE LINE") for line in out.splitlines())


# -- over HTTP ---------------------------------------------------------------------------------


async def test_a_reason_with_control_characters_is_a_400_saying_so(client: TestClient) -> None:
    before = await views(client)
    resp = await client.post(
        "/v1/nodes/gpu01/cordon",
        json={"reason": "disk\nFAKE LINE: all nodes ready\x1b[2J"},
        headers=auth(ADMIN),
    )
    assert resp.status == 400
    assert "control characters" in await resp.text()
    assert await views(client) == before


async def test_infinity_in_a_report_is_a_400_and_status_still_renders(client: TestClient) -> None:
    before = await views(client)
    base = json.dumps(report_body())[:-1]
    raw = base + ', "replicas": [{"id":"r1","model":"m","state":"ready","idle_seconds":1e400}]}'
    resp = await client.post("/v1/agent/report", data=raw, headers=auth(AGENT))
    assert resp.status == 400
    assert await views(client) == before


async def test_a_report_with_an_escape_in_a_field_is_a_400_saying_so(client: TestClient) -> None:
    before = await views(client)
    body = with_gpu(gpu_class="H100\x1b[2J")
    resp = await client.post("/v1/agent/report", json=body, headers=auth(AGENT))
    assert resp.status == 400
    detail = (await resp.json())["detail"]
    assert detail[0]["loc"] == "gpus.0.gpu_class"
    assert "control characters" in detail[0]["msg"]
    assert await views(client) == before


async def test_uncordon_validates_its_body(client: TestClient) -> None:
    await client.post("/v1/nodes/gpu01/cordon", json={"reason": "x"}, headers=auth(ADMIN))
    before = await views(client)
    for bad in ("{not json", '{"surprise": 1}', "[]"):
        resp = await client.post("/v1/nodes/gpu01/uncordon", data=bad, headers=auth(ADMIN))
        assert resp.status == 400, bad
        assert (await resp.json())["error"]
    assert await views(client) == before
    resp = await client.post("/v1/nodes/gpu01/uncordon", headers=auth(ADMIN))  # no body: fine
    assert resp.status == 200
    assert (await resp.json())["admin"]["flag"] == "none"


def test_a_directory_named_with_control_characters_is_shown_escaped(tmp_path: Path) -> None:
    """A hostile directory name on a weights disk must not break the node's report."""
    from llmgw.agent.storage import StorageDir, StorageScanner

    (tmp_path / "evil\x1b[2Jdir\n").mkdir()
    scanner = StorageScanner([StorageDir(str(tmp_path))])
    (loc,) = scanner.scan()
    assert loc.error is None
    (bad,) = loc.incomplete
    assert bad.name == "evil\\x1b[2Jdir\\n"
