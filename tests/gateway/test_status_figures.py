"""A gateway's status figures as changes only (issue 36, the status feed): the
gateway's StatusFigures and the controller's Gateways, exchanged in process through
the wire types, with answers lost, statuses lost and controllers restarted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.controller.views.endpoints import Gateways
from llmgw.gateway.status_figures import StatusFigures
from llmgw.wire import GatewayStatus, GatewayStatusReply, ModelSpec
from tests.gateway.test_endpoints import Sim

MODEL = ModelSpec(name="small", source="org/small", min_replicas=6, gpus_per_shard=1)


def serving(tmp_path: Path) -> tuple[Sim, list[str]]:
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    rids = sorted(sim.fleet.facts.records)
    assert len(rids) == 6
    return sim, rids


def post(gateways: Gateways, figures: StatusFigures, in_flight: dict[str, int],
         requests: dict[str, int], answer: bool = True) -> dict[str, object]:  # fmt: skip
    """One status through the wire types, as the handler takes it; `answer=False`:
    the controller took it but its answer was lost on the way back."""
    body = {"name": "gw", **figures.body(dict(in_flight), dict(requests))}
    status = GatewayStatus.model_validate_json(json.dumps(body))
    took = gateways.report(status)
    if answer:
        figures.answered(GatewayStatusReply(full=not took).model_dump_json().encode())
    return body


def held(gateways: Gateways) -> tuple[dict[str, int], dict[str, int]]:
    g = gateways.seen["gw"]
    return dict(g.said_in_flight), dict(g.requests)


def test_whole_first_then_only_what_changed(tmp_path: Path) -> None:
    sim, rids = serving(tmp_path)
    figures = StatusFigures()
    in_flight = dict.fromkeys(rids, 0)
    requests = dict.fromkeys(rids, 10)
    first = post(sim.gateways, figures, in_flight, requests)
    assert "stream" not in first and first["in_flight"] == in_flight  # as to any controller
    second = post(sim.gateways, figures, in_flight, requests)  # it said it takes changes
    assert second["seq"] == 1 and "base" not in second and second["requests"] == requests
    in_flight[rids[0]] = 3
    requests[rids[0]] = 11
    third = post(sim.gateways, figures, in_flight, requests)
    assert third["base"] == 1 and third["seq"] == 2
    assert third["in_flight"] == {rids[0]: 3} and third["requests"] == {rids[0]: 11}
    assert held(sim.gateways) == (in_flight, requests)
    assert sim.gateways.in_flight(sim.clock())[rids[0]] == 3
    quiet = post(sim.gateways, figures, in_flight, requests)
    assert quiet["in_flight"] == {} and quiet["requests"] == {} and "gone" not in quiet
    del in_flight[rids[1]], requests[rids[1]]  # a replica the gateway no longer routes to
    dropped = post(sim.gateways, figures, in_flight, requests)
    assert dropped["gone"] == [rids[1]]
    assert held(sim.gateways) == (in_flight, requests)


def test_changes_on_a_base_it_does_not_hold_are_refused_and_the_next_is_whole(
    tmp_path: Path,
) -> None:
    sim, rids = serving(tmp_path)
    figures = StatusFigures()
    in_flight, requests = {rids[0]: 2}, {rids[0]: 5}
    for _ in range(3):
        post(sim.gateways, figures, in_flight, requests)
    before = held(sim.gateways)
    restarted = Gateways(sim.fleet.facts, sim.fleet.run)  # a new leader knows nothing
    in_flight[rids[0]] = 4
    refused = post(restarted, figures, in_flight, requests)
    assert "base" in refused and restarted.seen["gw"].said_in_flight == {}  # nothing made up
    whole = post(restarted, figures, in_flight, requests)
    assert "base" not in whole and whole["in_flight"] == in_flight
    assert held(restarted) == (in_flight, requests)
    assert before == ({rids[0]: 2}, {rids[0]: 5})


def test_new_requests_in_changes_count_for_idleness(tmp_path: Path) -> None:
    sim, rids = serving(tmp_path)
    figures = StatusFigures()
    in_flight, requests = dict.fromkeys(rids, 0), dict.fromkeys(rids, 5)
    for _ in range(3):
        post(sim.gateways, figures, in_flight, requests)
    sim.clock.advance(60.0)
    idle_before = {v.id: v.idle_seconds for v in sim.fleet.replica_views()}
    requests[rids[2]] = 6
    body = post(sim.gateways, figures, in_flight, requests)
    assert body["requests"] == {rids[2]: 6}
    idle = {v.id: v.idle_seconds for v in sim.fleet.replica_views()}
    assert idle[rids[2]] == 0.0
    assert all(idle[r] == idle_before[r] for r in rids if r != rids[2])


def test_an_older_controller_gets_whole_figures_always() -> None:
    figures = StatusFigures()
    for _ in range(3):
        body = figures.body({"r1": 1}, {"r1": 2})
        assert body == {"in_flight": {"r1": 1}, "requests": {"r1": 2}}
        assert figures.answered(b"") is False  # 204, no body


@pytest.mark.parametrize(
    "body",
    [
        {"stream": "abc"},
        {"seq": 2},
        {"stream": "abc", "seq": 2, "base": 2},
        {"gone": ["r1"]},
        {"stream": "a-b", "seq": 1},
    ],
)
def test_changes_without_their_frame_are_400(body: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GatewayStatus.model_validate_json(json.dumps({"name": "gw", **body}))


figure_maps = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e", "f", "ghost"]), st.integers(0, 5), max_size=7
)
steps = st.lists(
    st.tuples(
        figure_maps,
        figure_maps,
        st.sampled_from(["answered", "answered", "answered", "lost answer", "lost", "restart"]),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps)
def test_the_controller_holds_what_the_gateway_said_whatever_is_lost(
    tmp_path: Path, steps: list[tuple[dict[str, int], dict[str, int], str]]
) -> None:
    """After every answered status that the controller took whole or applied, it holds
    exactly the gateway's figures for the replicas that exist; nothing is lost for
    good by a lost status, a lost answer or a restart."""
    sim, rids = serving(tmp_path / str(len(list(tmp_path.iterdir()))))
    name = dict(zip("abcdef", rids, strict=True))
    gateways = sim.gateways
    figures = StatusFigures()
    for in_flight, requests, fate in steps:
        in_flight = {name.get(k, k): n for k, n in in_flight.items()}
        requests = {name.get(k, k): n for k, n in requests.items()}
        if fate == "restart":
            gateways = Gateways(sim.fleet.facts, sim.fleet.run)
        if fate == "lost":
            figures.body(in_flight, requests)  # made, never reached the controller
            continue
        post(gateways, figures, in_flight, requests, answer=fate != "lost answer")
        if fate == "lost answer":
            continue
        g = gateways.seen["gw"]
        if g.taken is None and figures.deltas:
            continue  # refused: the next is whole
        exists = {k: n for k, n in in_flight.items() if k != "ghost"}
        assert dict(g.said_in_flight) == exists
        assert dict(g.requests) == {k: n for k, n in requests.items() if k != "ghost"}
    # Two quiet exchanges always converge.
    for _ in range(2):
        post(gateways, figures, in_flight, requests)
    assert held(gateways) == (
        {k: n for k, n in in_flight.items() if k != "ghost"},
        {k: n for k, n in requests.items() if k != "ghost"},
    )
