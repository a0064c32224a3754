"""A gateway in front of an older controller (one that does not know some optional
fields of a gateway's status) leaves those fields out instead of failing every status,
and offers them again later. The refusals are the real controller's (its validation and
error answer, on the status model without the fields)."""

from __future__ import annotations

import json

from llmgw.gateway.status_fields import OFFER_AGAIN_S, OPTIONAL, StatusFields
from llmgw.wire import GatewayStatus
from tests.gateway.scripted import older_controller_answer

NEWER = frozenset({"held_age", "adapters_at", "adapter_busy"})


def status(**extra: object) -> dict[str, object]:
    return {"name": "gw-a", "cursor": "abc.3", "in_flight": {}, "requests": {}, **extra}


def test_the_refused_optional_fields_are_left_out_then_offered_again() -> None:
    fields = StatusFields()
    body = status(held={"chat": 2}, held_age={"chat": 1.5}, adapters_at="abc.4")
    code, answer = older_controller_answer(json.dumps(body).encode(), NEWER)
    assert code == 400
    assert fields.take_refusal(code, answer, body, now=100.0) == ["adapters_at", "held_age"]

    again = dict(body)
    fields.strip(again, now=101.0)
    assert again == status(held={"chat": 2}), "what the older one knows is still sent"
    assert older_controller_answer(json.dumps(again).encode(), NEWER)[0] == 200

    later = dict(body)
    fields.strip(later, now=100.0 + OFFER_AGAIN_S)
    assert later == body, "offered again: the controller may have been upgraded"
    assert fields.refused == frozenset()


def test_any_other_refusal_drops_nothing() -> None:
    fields = StatusFields()
    # A field it does not know, but one a status cannot go without.
    body = status(held_age={"chat": 1.0})
    code, answer = older_controller_answer(json.dumps(body).encode(), frozenset({"cursor"}))
    assert code == 400 and fields.take_refusal(code, answer, body, now=1.0) == []
    # An optional field refused for its value, not as unknown.
    bad = status(held_age={"chat": -1.0})
    code, answer = older_controller_answer(json.dumps(bad).encode(), frozenset({"held"}))
    assert code == 400 and fields.take_refusal(code, answer, bad, now=1.0) == []
    # Other answers.
    assert fields.take_refusal(503, b'{"error": "x"}', body, now=1.0) == []
    assert fields.take_refusal(400, b"not json", body, now=1.0) == []
    assert fields.refused == frozenset()


def test_every_optional_field_is_one_the_status_has() -> None:
    """A name the wire model does not have would never match a refusal."""
    assert GatewayStatus.model_fields.keys() >= OPTIONAL
    assert not OPTIONAL & {"name", "cursor", "in_flight", "requests"}
