"""LoRA adapters in the controller (issue 33): specs refused with a clear 400 and
nothing written, the adapter step's decisions on hand-built snapshots (load by
demand within --max-cpu-loras, spread by in-flight, idle ones unloaded, least
recently used out first, a refused load reported with the engine's words), the
assignment and endpoint they lead to."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from fleet_factories import location, report
from test_api import ADMIN, AGENT, ClientFactory, auth, tokens
from test_steps import replica, snapshot

from llmgw.controller.core.adapter_specs import adapter_slots, check_adapters
from llmgw.controller.core.adapter_use import AdapterMemory
from llmgw.controller.core.nodes import ShardDigest
from llmgw.controller.core.records import AdapterHold, ReplicaRecord
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.loop.adapter_loads import PATIENCE_S, plan_adapters
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.placing import stoppable
from llmgw.controller.loop.plans import (
    DropAdapter,
    HandingOver,
    HoldAdapter,
    Planner,
    ReleaseAdapter,
    Stopping,
)
from llmgw.controller.state.replicas import replica_status
from llmgw.controller.views.endpoints import GateView, LiveGateway
from llmgw.errors import BadRequest
from llmgw.wire import AdapterSpec, EventReason, ModelSpec, ShardState

BASE = ModelSpec(
    name="chat",
    source="org/chat",
    engine_args=["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2"],
    target_in_flight=4,
)
PLAIN = ModelSpec(name="plain", source="org/plain")
NOW = 100.0


def adapter(name: str, base: str = "chat") -> AdapterSpec:
    return AdapterSpec(name=name, base=base, source=f"acme/{name}")


# -- specs ---------------------------------------------------------------------------------


def test_slots_follow_the_engine_arguments_as_vllm_reads_them() -> None:
    assert adapter_slots(BASE) == 2
    assert adapter_slots(BASE.model_copy(update={"engine_args": ["--enable-lora"]})) == 1
    args = ["--enable-lora", "--max-loras=3"]
    assert adapter_slots(BASE.model_copy(update={"engine_args": args})) == 3
    args = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras=8"]
    assert adapter_slots(BASE.model_copy(update={"engine_args": args})) == 8


@pytest.mark.parametrize(
    ("models", "adapters", "words"),
    [
        ({}, {"a": adapter("a", "nope")}, "no model named 'nope'"),
        ({"plain": PLAIN}, {"a": adapter("a", "plain")}, "cannot load adapters: add --enable-lora"),
        ({"chat": BASE}, {"chat": adapter("chat")}, "names both a model and an adapter"),
    ],
)
def test_bad_adapter_specs_are_refused_saying_why(
    models: dict[str, ModelSpec], adapters: dict[str, AdapterSpec], words: str
) -> None:
    with pytest.raises(BadRequest, match=words):
        check_adapters(models, adapters, list(adapters))


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    app = create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens()))
    c = await aiohttp_client(app)
    resp = await c.post(
        "/v1/agent/report", data=report("gpu01").model_dump_json(), headers=auth(AGENT)
    )
    assert resp.status == 200
    return c


def _body(models: Iterable[ModelSpec], adapters: Iterable[AdapterSpec]) -> dict[str, Any]:
    return {
        "models": [m.model_dump(mode="json") for m in models],
        "adapters": [a.model_dump(mode="json") for a in adapters],
    }


async def test_apply_list_and_delete_an_adapter(client: TestClient) -> None:
    body = _body([BASE], [adapter("sql")])
    dry = await client.post("/v1/models?dry_run=true", json=body, headers=auth(ADMIN))
    assert dry.status == 200
    assert await (await client.get("/v1/adapters", headers=auth(ADMIN))).json() == []
    resp = await client.post("/v1/models", json=body, headers=auth(ADMIN))
    assert resp.status == 200, await resp.text()
    [view] = await (await client.get("/v1/adapters", headers=auth(ADMIN))).json()
    assert view["spec"] == {"name": "sql", "base": "chat", "source": "acme/sql"}
    assert view["loaded_on"] == [] and view["held"] == 0
    feed = await (await client.get("/v1/endpoints", headers=auth(ADMIN))).json()
    assert feed["adapters"] == {"sql": "chat"}
    # Its files are on no node: never served, the gateways refuse its requests as a
    # model's that cannot be placed (issue 33 item 1) ...
    assert feed["unserved_reasons"]["sql"]["kind"] == "unplaceable", feed
    assert "acme/sql is complete on no node" in feed["unserved_reasons"]["sql"]["message"]
    # ... until a node has them whole.
    found = {"name": "acme/sql", "path": "/models/acme/sql", "rank": 8}
    storage = [{**location("/models", []), "adapters": [found]}]
    resp = await client.post(
        "/v1/agent/report",
        data=report("gpu01", storage=storage).model_dump_json(),
        headers=auth(AGENT),
    )
    assert resp.status == 200
    feed = await (await client.get("/v1/endpoints", headers=auth(ADMIN))).json()
    assert "sql" not in feed["unserved_reasons"], feed
    # One given by a path is the engine's to find (vLLM's lora_path): not judged here.
    by_path = adapter("raw").model_copy(update={"source": "/srv/loras/raw"})
    resp = await client.post("/v1/models", json=_body([BASE], [by_path]), headers=auth(ADMIN))
    assert resp.status == 200, await resp.text()
    feed = await (await client.get("/v1/endpoints", headers=auth(ADMIN))).json()
    assert "raw" not in feed["unserved_reasons"], feed
    assert (await client.delete("/v1/models/raw", headers=auth(ADMIN))).status == 204
    summary = await (await client.get("/v1/summary", headers=auth(ADMIN))).json()
    assert [a["spec"]["name"] for a in summary["adapters"]] == ["sql"]
    events = await client.get("/v1/events?for=adapter/sql", headers=auth(ADMIN))
    assert events.status == 200
    # The base is not deleted from under its adapter; the adapter is.
    resp = await client.delete("/v1/models/chat", headers=auth(ADMIN))
    assert resp.status == 400
    assert "delete them first" in (await resp.json())["error"]
    assert (await client.delete("/v1/models/sql", headers=auth(ADMIN))).status == 204
    assert await (await client.get("/v1/adapters", headers=auth(ADMIN))).json() == []
    assert (await client.delete("/v1/models/chat", headers=auth(ADMIN))).status == 204


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_body([], [adapter("a", "nope")]), "no model named 'nope'"),
        (_body([PLAIN], [adapter("a", "plain")]), "cannot load adapters"),
        (_body([BASE], [adapter("chat")]), "repeated: chat"),
        (_body([BASE], [adapter("a"), adapter("a")]), "repeated: a"),
    ],
)
async def test_a_bad_file_is_a_400_and_changes_nothing(
    client: TestClient, body: dict[str, Any], words: str
) -> None:
    for dry in ("true", "false"):
        resp = await client.post(f"/v1/models?dry_run={dry}", json=body, headers=auth(ADMIN))
        assert resp.status == 400
        assert words in (await resp.json())["error"]
    assert await (await client.get("/v1/models", headers=auth(ADMIN))).json() == []
    assert await (await client.get("/v1/adapters", headers=auth(ADMIN))).json() == []


async def test_a_model_named_as_an_adapter_is_refused_later_too(client: TestClient) -> None:
    ok = await client.post("/v1/models", json=_body([BASE], [adapter("sql")]), headers=auth(ADMIN))
    assert ok.status == 200
    clash = ModelSpec(name="sql", source="org/sql")
    resp = await client.post("/v1/models", json=_body([clash], []), headers=auth(ADMIN))
    assert resp.status == 400
    assert "names both a model and an adapter" in (await resp.json())["error"]
    # And a base that can no longer load adapters.
    plain = BASE.model_copy(update={"engine_args": []})
    resp = await client.post("/v1/models", json=_body([plain], []), headers=auth(ADMIN))
    assert resp.status == 400


# -- the step --------------------------------------------------------------------------------


def _shard(rec: ReplicaRecord, adapters: Iterable[str] = (), failures: Any = ()) -> ShardDigest:
    return ShardDigest(
        rec.id, 0, ShardState.READY, None, None, 8000, None, None, frozenset(adapters), failures
    )


def fleet(
    replicas: list[ReplicaRecord],
    adapters: Iterable[AdapterSpec],
    holds: Mapping[str, Mapping[str, AdapterHold]] | None = None,
    loaded: Mapping[str, Iterable[str]] | None = None,
    failures: Mapping[str, Any] | None = None,
    in_flight: Mapping[str, int] | None = None,
    held: Mapping[str, int] | None = None,
    live: tuple[LiveGateway, ...] = (),
) -> FleetSnapshot:
    snap = snapshot(
        replicas,
        (BASE,),
        gate=GateView(
            now=NOW,
            grace_s=math.inf,
            live=live,
            held=dict(held or {}),
            adapter_in_flight=dict(in_flight or {}),
        ),
    )
    loaded, failures = loaded or {}, failures or {}
    statuses = {
        r.id: replica_status(
            r, {(r.id, 0): _shard(r, loaded.get(r.id, ()), failures.get(r.id, ()))}
        )
        for r in replicas
    }
    return replace(
        snap,
        statuses=statuses,
        adapters={a.name: a for a in adapters},
        adapter_holds={rid: dict(h) for rid, h in (holds or {}).items()},
    )


def _acts(plan: Any, kind: type) -> list[tuple[str, str]]:
    return [(a.replica_id, a.name) for a in plan.of(kind)]


R1, R2, R3 = replica("r1"), replica("r2", node="n2"), replica("r3", node="n3")


def test_nothing_asked_for_nothing_loaded() -> None:
    plan = plan_adapters(fleet([R1, R2], [adapter("a")]), AdapterMemory())
    assert not plan


def test_a_held_request_loads_the_adapter_on_the_emptiest_replica() -> None:
    holds = {"r1": {"x": AdapterHold(1.0)}}
    snap = fleet([R1, R2], [adapter("a"), adapter("x")], holds=holds, held={"a": 1})
    memory = AdapterMemory(last_used={"x": NOW})
    plan = plan_adapters(snap, memory)
    assert _acts(plan, HoldAdapter) == [("r2", "a")]


def test_busy_adapters_spread_one_replica_per_target_in_flight() -> None:
    snap = fleet([R1, R2, R3], [adapter("hot")], in_flight={"hot": 9})  # target 4: 3 replicas
    plan = plan_adapters(snap, AdapterMemory())
    assert sorted(_acts(plan, HoldAdapter)) == [("r1", "hot"), ("r2", "hot"), ("r3", "hot")]


def test_a_full_replica_lets_its_least_recently_used_idle_adapter_go() -> None:
    holds = {"r1": {"old": AdapterHold(1.0), "newer": AdapterHold(1.0)}}
    memory = AdapterMemory(last_used={"old": NOW - 50, "newer": NOW - 5})
    specs = [adapter("old"), adapter("newer"), adapter("cold")]
    plan = plan_adapters(fleet([R1], specs, holds=holds, held={"cold": 2}), memory)
    assert _acts(plan, ReleaseAdapter) == [("r1", "old")]
    assert _acts(plan, HoldAdapter) == []  # told once the slot is free


def test_idle_adapters_leave_through_the_gateways_then_unload() -> None:
    holds = {"r1": {"a": AdapterHold(1.0)}}
    memory = AdapterMemory(last_used={"a": NOW - 301})
    live = (LiveGateway(5, {}),)
    plan = plan_adapters(fleet([R1], [adapter("a")], holds=holds, live=live), memory)
    assert _acts(plan, ReleaseAdapter) == [("r1", "a")]
    assert _acts(plan, DropAdapter) == []
    # Out of routing at revision 7: unloaded once every gateway applied it.
    leaving = {"r1": {"a": AdapterHold(1.0, (7, NOW))}}
    plan = plan_adapters(fleet([R1], [adapter("a")], holds=leaving, live=live), memory)
    assert _acts(plan, DropAdapter) == []
    plan = plan_adapters(
        fleet([R1], [adapter("a")], holds=leaving, live=(LiveGateway(7, {}),)), memory
    )
    assert _acts(plan, DropAdapter) == [("r1", "a")]
    [event] = plan.events
    assert event.reason is EventReason.ADAPTER_UNLOADED and "unused for 301s" in event.message


def test_an_unload_waits_for_the_gateways_adapter_routing_not_for_smg() -> None:
    """Gateways route adapters through their explainer, which follows each change as it
    comes: an unload waits for that cursor (`adapters_at`) and for no request for it
    there in flight, not for SMG's seconds-long removal of some other worker (which
    held every unload, and the slots with them, 6-8 s in bench_adapters)."""
    memory = AdapterMemory(last_used={"a": NOW - 301})
    leaving = {"r1": {"a": AdapterHold(1.0, (7, NOW))}}

    def drops(gateway: LiveGateway) -> list[tuple[str, str]]:
        snap = fleet([R1], [adapter("a")], holds=leaving, live=(gateway,))
        return _acts(plan_adapters(snap, memory), DropAdapter)

    assert drops(LiveGateway(5, {})) == []  # SMG behind, routing not said: waits
    assert drops(LiveGateway(5, {}, adapters_follow=7)) == [("r1", "a")]
    busy = frozenset({("r1", "a")})
    assert drops(LiveGateway(5, {}, adapters_follow=7, adapter_busy=busy)) == []
    elsewhere = frozenset({("r2", "a"), ("r1", "b")})
    assert drops(LiveGateway(7, {}, adapter_busy=elsewhere)) == [("r1", "a")]


def test_a_load_seen_is_an_event_once_and_a_refused_one_backs_off() -> None:
    memory = AdapterMemory()
    holds = {"r1": {"a": AdapterHold(NOW - 0.5)}, "r2": {"b": AdapterHold(NOW)}}
    why = (("b", 400, "LoRA rank 32 is greater than max_lora_rank 16."),)
    snap = fleet(
        [R1, R2],
        [adapter("a"), adapter("b")],
        holds=holds,
        loaded={"r1": ["a"]},
        failures={"r2": why},
        in_flight={"a": 1, "b": 1},
    )
    plan = plan_adapters(snap, memory)
    reasons = [(e.obj, e.reason) for e in plan.events]
    assert ("adapter/a", EventReason.ADAPTER_LOADED) in reasons
    failed = [e for e in plan.events if e.reason is EventReason.ADAPTER_LOAD_FAILED]
    assert failed and "LoRA rank 32 is greater than max_lora_rank 16." in failed[0].message
    assert ("r2", "b") in _acts(plan, DropAdapter)
    # b goes to r1 (r2 refused it: not again there for a while).
    assert ("r1", "b") in _acts(plan, HoldAdapter)
    again = plan_adapters(snap, memory)
    assert not [e for e in again.events if e.reason is EventReason.ADAPTER_LOADED]


def test_a_draining_holder_gets_a_successor_before_it_goes() -> None:
    from llmgw.wire import ReplicaState

    draining = replica("r1", ReplicaState.DRAINING)
    holds = {"r1": {"a": AdapterHold(1.0)}}
    snap = fleet(
        [draining, R2], [adapter("a")], holds=holds, loaded={"r1": ["a"]}, in_flight={"a": 1}
    )
    plan = plan_adapters(snap, AdapterMemory())
    assert _acts(plan, HoldAdapter) == [("r2", "a")]
    assert _acts(plan, DropAdapter) == [] and _acts(plan, ReleaseAdapter) == []


def test_what_engines_hold_is_adopted_by_a_new_term_not_unloaded() -> None:
    """A controller restart or takeover starts with no holds: what the engines report
    holding is taken over, so nothing is unloaded and loaded again; a drop of this
    term is not taken back while the engine still says it holds it."""
    memory = AdapterMemory(last_used={"a": NOW})
    snap = fleet([R1], [adapter("a")], loaded={"r1": ["a"]})
    plan = plan_adapters(snap, memory)
    assert _acts(plan, HoldAdapter) == [("r1", "a")] and not plan.events
    memory.last_used["a"] = NOW - 400  # idle since: let go of
    leaving = {"r1": {"a": AdapterHold(1.0, (7, NOW))}}
    gone = plan_adapters(fleet([R1], [adapter("a")], holds=leaving, loaded={"r1": ["a"]}), memory)
    assert _acts(gone, DropAdapter) == [("r1", "a")]
    later = plan_adapters(fleet([R1], [adapter("a")], loaded={"r1": ["a"]}), memory)
    assert _acts(later, HoldAdapter) == []


def test_room_is_made_from_the_least_asked_for_not_only_the_least_recent() -> None:
    """A client walking through cold adapters uses each just now; one asking a hot
    adapter without pause, read at the gateways' grain, may look as recent: the rate
    decides first."""
    holds = {"r1": {"hot": AdapterHold(1.0), "walked": AdapterHold(1.0)}}
    memory = AdapterMemory(
        last_used={"hot": NOW - 1, "walked": NOW - 0.5},
        rate={"hot": 3.0, "walked": 0.2, "next": 0.3},  # next: held a pass or two
    )
    specs = [adapter("hot"), adapter("walked"), adapter("next")]
    plan = plan_adapters(fleet([R1], specs, holds=holds, held={"next": 1}), memory)
    assert _acts(plan, ReleaseAdapter) == [("r1", "walked")]


def test_a_cold_adapter_pushes_out_one_asked_for_more_only_once_it_has_waited() -> None:
    """Read at the gateways' grain a hot adapter has nothing in flight between two
    requests; pushed out for a cold one just asked for, its many clients would wait
    instead (bench_adapters: 7-9 s). The cold one waits for a colder slot, at most
    `PATIENCE_S` as the gateways count it (`held_age`), then takes the least asked for."""
    holds = {"r1": {"hot": AdapterHold(1.0), "hotter": AdapterHold(1.0)}}  # its 2 slots
    memory = AdapterMemory(
        last_used={"hot": NOW - 0.2, "hotter": NOW - 0.1}, rate={"hot": 3.0, "hotter": 5.0}
    )
    specs = [adapter("hot"), adapter("hotter"), adapter("cold")]
    snap = fleet([R1], specs, holds=holds, held={"cold": 1})
    plan = plan_adapters(snap, memory)
    assert _acts(plan, ReleaseAdapter) == [] and _acts(plan, HoldAdapter) == []
    assert snap.gate is not None
    waited = replace(snap, gate=replace(snap.gate, held_age={"cold": PATIENCE_S}))
    plan = plan_adapters(waited, memory)
    assert _acts(plan, ReleaseAdapter) == [("r1", "hot")]


# -- a holder that must stop hands its adapters over first -----------------------------------


def _stop(snap: FleetSnapshot, ids: list[str], force: bool = False) -> tuple[list[str], Any]:
    plan = Planner(snap.records)
    return stoppable(snap, plan, ids, force=force), plan.plan()


def test_a_holder_that_must_stop_stays_in_routing_until_another_has_loaded_its_adapters() -> None:
    """A scale-down, drain or rollout of the only replica serving an adapter left its
    requests waiting for a load on the next holder (issue 33 item 2). It now stays
    in routing, another is told to load, and it goes once that load is seen."""
    holds = {"r1": {"a": AdapterHold(1.0)}}
    memory = AdapterMemory(last_used={"a": NOW - 5})
    snap = fleet([R1, R2], [adapter("a")], holds=holds, loaded={"r1": ["a"]})
    stopped, plan = _stop(snap, ["r1"])
    assert stopped == [] and not plan.of(Stopping)  # still in routing
    assert plan.of(HandingOver) == [HandingOver("r1", (NOW, NOW))]
    [event] = plan.events
    assert event.reason is EventReason.HANDING_OVER_ADAPTERS and "adapter(s) a" in event.message
    # The adapter step no longer counts r1: r2 is told to load a (not busy, recently used).
    waiting = replace(snap, handing_over={"r1": (NOW, NOW)})
    assert _acts(plan_adapters(waiting, memory), HoldAdapter) == [("r2", "a")]
    # Told, not loaded yet: r1 still waits, and says so once only.
    told = replace(
        waiting,
        adapter_holds={"r1": {"a": AdapterHold(1.0)}, "r2": {"a": AdapterHold(NOW)}},
    )
    stopped, plan = _stop(told, ["r1"])
    assert stopped == [] and plan.of(HandingOver) == [HandingOver("r1", (NOW, NOW))]
    assert not plan.events
    # r2's engine says it holds a: r1 leaves routing and stops (no gateway to wait for).
    loaded = fleet(
        [R1, R2],
        [adapter("a")],
        holds=told.adapter_holds,
        loaded={"r1": ["a"], "r2": ["a"]},
    )
    stopped, plan = _stop(replace(loaded, handing_over={"r1": (NOW, NOW)}), ["r1"])
    assert stopped == ["r1"] and plan.of(HandingOver) == [HandingOver("r1", None)]


def test_a_hand_over_waits_at_most_the_stop_grace_and_never_for_a_forced_stop() -> None:
    holds = {"r1": {"a": AdapterHold(1.0)}}
    snap = fleet([R1, R2], [adapter("a")], holds=holds, loaded={"r1": ["a"]})
    stopped, plan = _stop(snap, ["r1"], force=True)
    assert stopped == ["r1"] and not plan.of(HandingOver) and not plan.events
    grace = snap.settings.stop_grace_s
    late = replace(snap, handing_over={"r1": (NOW - grace, NOW - 1)})
    stopped, plan = _stop(late, ["r1"])
    assert stopped == ["r1"] and plan.of(HandingOver) == [HandingOver("r1", None)]
    [event] = plan.events
    assert event.reason is EventReason.ADAPTERS_NOT_HANDED_OVER


def test_nothing_to_hand_over_or_nowhere_to_hand_it_stops_at_once() -> None:
    holds = {"r1": {"a": AdapterHold(1.0)}}
    alone = fleet([R1], [adapter("a")], holds=holds, loaded={"r1": ["a"]})
    assert _stop(alone, ["r1"])[0] == ["r1"]  # no other replica of the base
    both = fleet([R1, R2], [adapter("a")], holds=holds, loaded={"r1": ["a"]})
    assert _stop(both, ["r1", "r2"])[0] == ["r1", "r2"]  # both go: nowhere to hand over
    told = fleet([R1, R2], [adapter("a")], holds=holds)  # told, never loaded on r1
    assert _stop(told, ["r1"])[0] == ["r1"]


def test_a_wait_no_longer_asked_for_is_forgotten_by_the_adapter_step() -> None:
    snap = fleet([R1, R2], [adapter("a")])
    stale = replace(snap, handing_over={"r1": (NOW - 30, NOW - 11), "gone": (NOW, NOW)})
    plan = plan_adapters(stale, AdapterMemory())
    assert set(plan.of(HandingOver)) == {HandingOver("gone", None), HandingOver("r1", None)}
