"""`wire.validate_json` (the controller's body validation) answers exactly as the
model's own `model_validate_json`: it only skips the control-character patterns
for a body that cannot hold a control character."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from llmgw.wire import GatewayStatus, NodeReport, may_hold_control, validate_json
from tests.security.conftest import report_body


def outcome(validate: Any, model: type[BaseModel], raw: bytes) -> Any:
    try:
        return ("ok", validate(raw).model_dump())
    except ValidationError as exc:
        return ("refused", exc.title, exc.errors(include_url=False, include_context=False))


def same(model: type[BaseModel], raw: bytes) -> Any:
    lean = outcome(lambda b: validate_json(model, b), model, raw)
    assert lean == outcome(model.model_validate_json, model, raw)
    return lean


def with_text(where: str, text: str, *, ensure_ascii: bool = True) -> bytes:
    body = report_body()
    if where == "gpu name":
        body["gpus"][0]["name"] = text
    elif where == "gpu reason":  # free text: tab and newline allowed
        body["gpus"][0]["health_reason"] = text
    elif where == "agent_version":
        body["agent_version"] = text
    else:
        body["gpu_error"] = text
    return json.dumps(body, ensure_ascii=ensure_ascii).encode()


CONTROLS = ["\x00", "\x1b", "\n", "\t", "\r", "\x7f", "\x85", "\x9b", "\x9f"]


@pytest.mark.parametrize("char", CONTROLS)
@pytest.mark.parametrize("where", ["gpu name", "gpu reason", "agent_version", "gpu_error"])
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_a_control_character_is_judged_as_the_full_schema_judges_it(
    char: str, where: str, ensure_ascii: bool
) -> None:
    raw = with_text(where, f"a{char}b", ensure_ascii=ensure_ascii)
    assert may_hold_control(raw)  # so it takes the full schema's path
    result = same(NodeReport, raw)
    lines_allowed = where in ("gpu reason", "gpu_error") and char in "\n\t"
    assert (result[0] == "ok") is lines_allowed


def test_a_raw_control_byte_is_invalid_json_either_way() -> None:
    raw = with_text("gpu name", "ab").replace(b'"ab"', b'"a\x1bb"')
    assert same(NodeReport, raw)[0] == "refused"


@pytest.mark.parametrize(
    "text", ["plain", "caf\u00e9", 'a "quoted" name', "back\\slash", "\\n is text", "\u00a0\u00bf"]
)
def test_text_without_controls_is_taken_by_either_path(text: str) -> None:
    raw = with_text("gpu name", text)
    assert same(NodeReport, raw)[0] == "ok"


def test_every_other_rule_still_holds_on_the_lean_path() -> None:
    body = report_body()
    body["gpus"][1]["uuid"] = body["gpus"][0]["uuid"]  # a repeated GPU
    for broken in (
        {**report_body(), "interval_s": "5"},  # no coercion
        {**report_body(), "node": "a..b"},  # the node-name pattern
        {**report_body(), "address": "10.0.0.256"},  # the address check
        {**report_body(), "extra": 1},  # unknown fields
        body,
    ):
        raw = json.dumps(broken).encode()
        assert not may_hold_control(raw)
        assert same(NodeReport, raw)[0] == "refused"


def test_a_gateway_status_key_with_a_control_character_is_refused() -> None:
    raw = json.dumps({"name": "gw", "in_flight": {"r-1\u001b[2J": 1}}).encode()
    assert same(GatewayStatus, raw)[0] == "refused"
    assert (
        same(GatewayStatus, json.dumps({"name": "gw", "in_flight": {"r-1": 1}}).encode())[0] == "ok"
    )


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=12), ensure_ascii=st.booleans())
def test_any_text_is_judged_alike(text: str, ensure_ascii: bool) -> None:
    for where in ("gpu name", "gpu reason"):
        same(NodeReport, with_text(where, text, ensure_ascii=ensure_ascii))
