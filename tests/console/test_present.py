"""One vocabulary for ctl and the console (llmgw/present.py), and the test
that the two front ends really say the same thing for the same node."""

from __future__ import annotations

import io

from rich.console import Console, RenderableType

from llmgw import render
from llmgw.console.format import node_state_text
from llmgw.console.screens.detail import HistoryTable, title_text
from llmgw.console.widgets.summary import IdleTable
from llmgw.present import (
    NODE_STATE_WIDTH,
    clock_time,
    duration,
    force_at_words,
    node_state_words,
    style_of,
    timestamp,
)
from llmgw.wire import (
    AdminEvent,
    AdminFlag,
    AdminInfo,
    FleetSummary,
    IdleReplica,
    NodeDetail,
    NodeRow,
    NodeState,
    ReasonGroup,
)

AT = 1_767_000_000.0  # 2025-12-29 09:20:00 UTC


def row(
    state: NodeState, flag: AdminFlag, *, drained: bool = False, age: float | None = 95.0
) -> NodeRow:
    admin = AdminInfo(flag=flag, reason="PSU swap", by="carol", at=AT, drained=drained)
    return NodeRow(
        name="gpu-b04",
        state=state,
        admin=admin,
        report_age_s=age,
        classes={"A100-SXM-40GB": 8},
        gpus_total=8,
        gpus_used=0,
        gpus_unhealthy=0,
        gpus_unknown=0,
        fabrics=["ib-b"],
        models=[],
        replicas=0,
    )


def plain(renderable: RenderableType) -> str:
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(renderable)
    return out.getvalue()


def test_durations_one_style() -> None:
    assert [duration(s) for s in (None, 5, 65, 725, 7980, 2 * 86400 + 3600)] == [
        "-",
        "5s",
        "1m05s",
        "12m05s",
        "2h13m",
        "2d01h",
    ]


def test_timestamps_always_carry_their_zone() -> None:
    assert timestamp(AT) == "2025-12-29 09:20:00 UTC"
    assert timestamp(None) == "-"
    assert clock_time(AT + 45 * 60) == "10:05 UTC"
    assert force_at_words(AT + 45 * 60) == "force at 10:05 UTC"
    # Under an hour away: to the second (issue 23 item 3).
    assert force_at_words(AT + 45 * 60 + 20, now=AT) == "force at 10:05:20 UTC"
    assert force_at_words(AT + 2 * 3600 + 20, now=AT) == "force at 11:20 UTC"
    local = timestamp(AT, local=True)
    assert local[:10].startswith("2025-12-") and len(local.split()) == 3  # date, time, zone


def test_state_words_and_styles() -> None:
    assert node_state_words(row(NodeState.UNREACHABLE, AdminFlag.CORDONED)) == (
        "unreachable (cordoned)"
    )
    assert node_state_words(row(NodeState.CORDONED, AdminFlag.CORDONED, drained=True)) == (
        "cordoned (drained)"
    )
    assert node_state_words(row(NodeState.READY, AdminFlag.NONE)) == "ready"
    # Not heard from since the controller started: maybe dead, and said so
    # (in both front ends), until it reports or its grace runs out.
    unheard = row(NodeState.CORDONED, AdminFlag.CORDONED, age=None)
    assert node_state_words(unheard) == "cordoned (no report)"
    assert node_state_text(unheard).plain == "cordoned (no report)"
    assert "cordoned (no report)" in render.nodes_table([unheard]).format()
    assert node_state_words(unheard, 3.0) == "cordoned"  # the console's newer age
    assert node_state_words(row(NodeState.UNREACHABLE, AdminFlag.NONE, age=None)) == "unreachable"
    assert all(
        len(node_state_words(row(s, f, age=None))) <= NODE_STATE_WIDTH
        for s in NodeState
        for f in AdminFlag
    )
    assert style_of("unreachable") == style_of("failed") == "bold red"
    assert style_of("no such word") == ""


def test_ctl_and_console_say_the_same_for_the_same_node() -> None:
    node = row(NodeState.UNREACHABLE, AdminFlag.CORDONED, age=95.0)
    idle = IdleReplica(id="qwen-r3", model="Qwen/Qwen2.5-7B", idle_seconds=7980.0, gpus=1)
    summary = FleetSummary.model_validate(
        {
            "nodes": {"total": 1, "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 1},
            "gpus": [],
            "fabrics": [],
            "replicas": {"ready": 1, "starting": 0, "draining": 0, "failed": 0},
            "models": {"total": 1, "satisfied": 1, "short": 0},
            "unplaceable": [],
            "idle_replicas": [idle.model_dump()],
            "reasons": [
                ReasonGroup(
                    reason="PSU swap", flag=AdminFlag.CORDONED, by="carol", at=AT, nodes=["gpu-b04"]
                ).model_dump()
            ],
        }
    )
    ctl_nodes = render.nodes_table([node]).format()
    ctl_status = render.status(summary, "http://c")
    # State words.
    console_state = node_state_text(node).plain
    assert console_state == "unreachable (cordoned)"
    assert console_state in ctl_nodes
    # Durations: the report age (ctl AGE, console detail) and an idle time.
    detail = NodeDetail(
        row=node, gpus=[], storage_configured=False, storage=[], replicas=[], history=[]
    )
    console_title = title_text("gpu-b04", node, detail, None).plain
    assert "last report 1m35s ago" in console_title
    assert "1m35s" in ctl_nodes
    console_idle = IdleTable._row_cells(idle)[0].plain
    assert console_idle == "2h13m" and console_idle in ctl_status
    # Timestamps: when the reason was set, in the status's reason list and the detail.
    assert timestamp(AT) in ctl_status
    assert f"at {timestamp(AT)}" in console_title
    history = HistoryTable._row_cells(
        AdminEvent(node="gpu-b04", action="cordon", reason="PSU swap", by="carol", at=AT)
    )
    assert history[0].plain == timestamp(AT)


def test_card_counts_are_spelled_as_ctl_spells_them() -> None:
    from llmgw.console.format import classes_text

    one = {"H100-SXM-80GB": 8}
    assert classes_text(one).plain == render._classes(one) == "8xH100-SXM-80GB"


def test_an_answer_not_understood_is_said_without_a_class_name() -> None:
    import pytest
    from pydantic import ValidationError

    from llmgw.console.state import error_words

    with pytest.raises(ValidationError) as caught:
        NodeRow.model_validate({"name": "gpu-a01"})
    words = error_words(caught.value)
    assert words.startswith("the controller's answer was not understood (")
    assert "NodeRow" not in words and "validation error" not in words
