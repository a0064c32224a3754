"""The endpoint feed and the stop gate, against a simulated fleet (no processes)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from llmgw.controller.loop.reconcile import Reconciler
from llmgw.controller.term import Term
from llmgw.controller.views.endpoints import Gateways
from llmgw.present import Meaning, model_words
from llmgw.wire import AdminFlag, FleetSummary, GatewayStatus, ModelSpec, Unserved, UnservedKind
from tests.controller.fleet_factories import FakeClock, make_fleet, report

MODEL = ModelSpec(name="llama", source="meta/llama", min_replicas=1, gpus_per_shard=8)


class Sim:
    def __init__(self, tmp_path: Path, **settings: float) -> None:
        self.clock = FakeClock()
        self.fleet: Term = make_fleet(tmp_path, self.clock, **settings)
        self.reconciler = Reconciler(self.fleet, self.fleet.stop_gate)
        self.nodes = ["gpu1", "gpu2"]
        self.down: set[str] = set()
        self.idle_s = 0.0  # what every engine says of its idleness
        self.traffic: dict[str, object] | None = None  # what every rank 0 says it served
        self.port_shift = 0  # engines restarted in place listen on new ports

    @property
    def gateways(self) -> Gateways:
        return self.fleet.gateways

    def step(self) -> None:
        self.clock.advance(1.0)
        for i, node in enumerate(self.nodes):
            if node in self.down:
                continue
            shards = [
                {
                    "id": a.replica_id,
                    "model": a.model,
                    "rank": a.rank,
                    "state": "ready",
                    "gpus": a.gpus,
                    "port": 8000 + i + self.port_shift,
                    "idle_seconds": self.idle_s,
                    **({"traffic": self.traffic} if self.traffic and a.rank == 0 else {}),
                }
                for a in self.fleet.assignments_for(node)
            ]
            rep = report(node, replicas=shards).model_copy(update={"address": f"10.0.0.{i + 1}"})
            self.fleet.ingest(rep)
        self.reconciler.tick()

    def summary(self) -> FleetSummary:
        """The summary as the controller serves it: with the gateways' in-flight counts."""
        return self.fleet.summary(self.gateways.in_flight(self.clock()))

    def gateway(self, name: str, cursor: str, in_flight: dict[str, int] | None = None) -> None:
        self.gateways.report(GatewayStatus(name=name, cursor=cursor, in_flight=in_flight or {}))


def test_feed_gives_urls_then_only_changes(tmp_path: Path) -> None:
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    assert sim.fleet.endpoints_since("").endpoints == []  # starting: not in routing
    assert sim.fleet.endpoints_since("").unserved == {"llama": "1 replica starting"}
    assert sim.fleet.endpoints_since("").unserved_reasons == {
        "llama": Unserved(kind=UnservedKind.NOT_READY, message="1 replica starting")
    }
    sim.step()
    full = sim.fleet.endpoints_since("")
    assert full.full and full.unserved == {} and full.unserved_reasons == {}
    (ep,) = full.endpoints
    assert ep.state == "serving" and ep.url.startswith("http://10.0.0.") and ep.fabric == "ib-a"
    quiet = sim.fleet.endpoints_since(full.cursor)
    assert not quiet.full and quiet.endpoints == [] and quiet.removed == []
    # A node turning unreachable leaves routing at once (not after replace_after_s).
    sim.down.add(ep.node)
    for _ in range(30):
        sim.step()
    gone = sim.fleet.endpoints_since(quiet.cursor)
    assert ep.replica_id in gone.removed


def test_a_new_port_for_the_same_replica_is_in_the_feed(tmp_path: Path) -> None:
    """An engine restarted in place keeps its replica id and listens on a new port:
    the feed must say so, or gateways route to the old port for ever (issue 21)."""
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    full = sim.fleet.endpoints_since("")
    (ep,) = full.endpoints
    sim.port_shift = 100
    sim.step()
    delta = sim.fleet.endpoints_since(full.cursor)
    assert [(e.replica_id, e.url) for e in delta.endpoints] == [
        (ep.replica_id, ep.url.rsplit(":", 1)[0] + f":{int(ep.url.rsplit(':', 1)[1]) + 100}")
    ]
    quiet = sim.fleet.endpoints_since(delta.cursor)
    assert quiet.endpoints == [] and quiet.removed == []


def test_a_drain_waits_for_every_live_gateway(tmp_path: Path) -> None:
    sim = Sim(tmp_path, stop_grace_s=30.0)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (old,) = sim.fleet.endpoints_since("").endpoints
    sim.gateway("gw-a", sim.fleet.endpoints_since("").cursor)
    sim.fleet.facts.set_flag(old.node, AdminFlag.DRAINING, "bios", "ops")
    for _ in range(4):
        sim.step()
    view = {e.replica_id: e.state for e in sim.fleet.endpoints_since("").endpoints}
    assert view[old.replica_id] == "stopping" and list(view.values()).count("serving") == 1
    # The gateway has not applied the change yet: the old replica keeps running.
    sim.step()
    assert old.replica_id in sim.fleet.facts.records
    # Applied, but a request is still in flight to it: still running.
    cursor = sim.fleet.endpoints_since("").cursor
    sim.gateway("gw-a", cursor, {old.replica_id: 1})
    sim.step()
    assert old.replica_id in sim.fleet.facts.records
    sim.gateway("gw-a", cursor, {old.replica_id: 0})
    sim.step()
    assert old.replica_id not in sim.fleet.facts.records
    assert sim.fleet.rows.row(old.node).admin.drained


def test_a_drain_waits_for_the_replicas_release_not_another_models_change(
    tmp_path: Path,
) -> None:
    """A gateway whose cursor a slow change of another model holds back (up to about
    35 s) reports the stopping replicas its SMG no longer routes to: a stop waits for
    that, and for nothing in flight, not for the cursor (issue 36)."""
    sim = Sim(tmp_path, stop_grace_s=60.0)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (old,) = sim.fleet.endpoints_since("").endpoints
    before = sim.fleet.endpoints_since("").cursor  # the cursor it stays at
    sim.gateway("gw-a", before)
    sim.fleet.facts.set_flag(old.node, AdminFlag.DRAINING, "bios", "ops")
    for _ in range(4):
        sim.step()
        sim.gateway("gw-a", before)
    assert old.replica_id in sim.fleet.facts.records, "neither applied nor released"
    status = GatewayStatus(name="gw-a", cursor=before, released=[old.replica_id, "gone"])
    sim.gateways.report(status.model_copy(update={"in_flight": {old.replica_id: 1}}))
    sim.step()
    assert old.replica_id in sim.fleet.facts.records, "released, a request still running"
    sim.gateways.report(status)
    (seen,) = sim.gateways.seen.values()
    assert seen.released == {old.replica_id}, "only replicas that exist are kept"
    sim.step()
    assert old.replica_id not in sim.fleet.facts.records
    assert sim.gateways.seen["gw-a"].released == frozenset(), "the log removed it"


def test_a_status_says_where_its_adapter_routing_is_and_what_it_has_in_flight(
    tmp_path: Path,
) -> None:
    """The gateway's explainer routes adapters by the feed as it comes, ahead of SMG:
    the gate reads that cursor (`adapters_at`) and the (replica, adapter) pairs with
    requests in flight; pairs of replicas that do not exist are not kept."""
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (ep,) = sim.fleet.endpoints_since("").endpoints
    slow = sim.fleet.endpoints_since("").cursor
    sim.step()  # a later revision
    later = sim.fleet.endpoints_since("").cursor
    status = GatewayStatus(
        name="gw-a",
        cursor=slow,
        adapters_at=later,
        adapter_busy={ep.replica_id: ["sql"], "gone": ["sql"]},
    )
    sim.gateways.report(status)
    (live,) = sim.fleet.stop_gate.view(sim.clock()).live
    assert live.adapters_follow is not None and live.applied is not None
    assert live.adapters_follow >= live.applied
    assert live.adapter_busy == {(ep.replica_id, "sql")}
    # One that says nothing of them: its applied cursor stands for both, nothing busy.
    sim.gateways.report(GatewayStatus(name="gw-a", cursor=slow))
    (live,) = sim.fleet.stop_gate.view(sim.clock()).live
    assert live.adapters_follow == live.applied and live.adapter_busy == frozenset()


def test_how_long_requests_have_been_held_reaches_the_loop(tmp_path: Path) -> None:
    """`held_age`: the longest over the live gateways, aged by the time since each said
    it; only for models it says it holds requests for."""
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.gateways.report(
        GatewayStatus(name="gw-a", held={"llama": 2}, held_age={"llama": 3.0, "ghost": 9.0})
    )
    sim.gateways.report(GatewayStatus(name="gw-b", held={"llama": 1}, held_age={"llama": 1.0}))
    sim.clock.advance(0.5)
    gate = sim.fleet.stop_gate.view(sim.clock())
    assert gate.held_age == {"llama": 3.5}


def test_a_models_view_says_what_the_gateways_hold_for_it_and_how_long(tmp_path: Path) -> None:
    """`ctl models` and the console: requests held for a model (it has no replica awake
    to take them), summed over the live gateways, and the longest wait."""
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.gateways.report(GatewayStatus(name="gw-a", held={"llama": 2}, held_age={"llama": 3.0}))
    sim.gateways.report(GatewayStatus(name="gw-b", held={"llama": 1}, held_age={"llama": 1.0}))
    sim.clock.advance(0.5)
    [view] = sim.fleet.model_views()
    assert (view.held, view.held_s) == (3, 3.5)
    asleep = view.model_copy(update={"ready": 0, "sleeping": 1, "satisfied": True})
    words, meaning = model_words(asleep)
    assert words == "asleep: 1 replica(s) sleeping; 3 request(s) held for 3.5s, waiting to wake"
    assert meaning is Meaning.ATTENTION, "not the quiet grey of a model asleep with no one waiting"
    sim.gateways.report(GatewayStatus(name="gw-a"))
    sim.gateways.report(GatewayStatus(name="gw-b"))
    [view] = sim.fleet.model_views()
    assert (view.held, view.held_s) == (0, None)


def test_stop_grace_bounds_the_wait_and_no_gateway_means_no_wait(tmp_path: Path) -> None:
    sim = Sim(tmp_path, stop_grace_s=5.0)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (old,) = sim.fleet.endpoints_since("").endpoints
    sim.gateway("stuck", "")  # reports, never applies anything
    sim.fleet.facts.set_flag(old.node, AdminFlag.DRAINING, "bios", "ops")
    for _ in range(4):
        sim.step()
        sim.gateway("stuck", "")
    assert old.replica_id in sim.fleet.facts.records
    for _ in range(5):
        sim.step()
        sim.gateway("stuck", "")
    assert old.replica_id not in sim.fleet.facts.records

    sim2 = Sim(tmp_path / "b")
    sim2.fleet.facts.put_models([MODEL])
    sim2.step()
    sim2.step()
    (ep,) = sim2.fleet.endpoints_since("").endpoints
    sim2.fleet.facts.set_flag(ep.node, AdminFlag.DRAINING, "bios", "ops", force=True)
    sim2.step()
    assert ep.replica_id not in sim2.fleet.facts.records  # as before gateways existed


def test_requests_seen_by_a_gateway_count_for_idleness(tmp_path: Path) -> None:
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.idle_s = 900.0  # the engine's counters say: nothing for 15 minutes
    sim.step()
    (view,) = sim.fleet.replica_views()
    assert view.idle_seconds == 900.0
    rid = view.id
    sim.gateways.report(GatewayStatus(name="gw", requests={rid: 5}))  # a first status: a base
    assert sim.fleet.replica_views()[0].idle_seconds == 900.0
    sim.clock.advance(2.0)
    sim.gateways.report(GatewayStatus(name="gw", requests={rid: 6}))
    sim.clock.advance(3.0)
    assert sim.fleet.replica_views()[0].idle_seconds == 3.0
    assert sim.fleet.summary().idle_replicas == []


def test_a_deleted_model_stops_only_after_the_gateways_let_go(tmp_path: Path) -> None:
    sim = Sim(tmp_path, stop_grace_s=30.0)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (ep,) = sim.fleet.endpoints_since("").endpoints
    sim.gateway("gw-a", sim.fleet.endpoints_since("").cursor)
    sim.fleet.facts.delete_model("llama")
    sim.step()
    # Out of routing at once, but its engine keeps its assignment: the gateway
    # has not applied the change yet and may still send it a request.
    delta = sim.fleet.endpoints_since("")
    assert [(e.replica_id, e.state) for e in delta.endpoints] == [(ep.replica_id, "stopping")]
    assert [a.replica_id for a in sim.fleet.assignments_for(ep.node)] == [ep.replica_id]
    sim.gateway("gw-a", delta.cursor, {ep.replica_id: 2})
    sim.step()
    assert ep.replica_id in sim.fleet.facts.records  # requests still in flight
    sim.gateway("gw-a", delta.cursor, {ep.replica_id: 0})
    sim.step()
    assert ep.replica_id not in sim.fleet.facts.records
    assert sim.fleet.assignments_for(ep.node) == []
    assert ep.replica_id in sim.fleet.endpoints_since(delta.cursor).removed
    # Declared again: placed afresh, nothing left over from the old one.
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    assert [r.id for r in sim.fleet.facts.records.values()] != [ep.replica_id]


def test_a_model_declared_again_while_stopping_keeps_serving(tmp_path: Path) -> None:
    sim = Sim(tmp_path, stop_grace_s=30.0)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    (ep,) = sim.fleet.endpoints_since("").endpoints
    sim.gateway("gw-a", "")  # live, never applies: the stop waits
    sim.fleet.facts.delete_model("llama")
    sim.step()
    assert sim.fleet.endpoints_since("").endpoints[0].state == "stopping"
    sim.fleet.facts.put_models([MODEL])
    sim.gateway("gw-a", "")
    sim.step()
    (again,) = sim.fleet.endpoints_since("").endpoints
    assert (again.replica_id, again.state) == (ep.replica_id, "serving")
    assert len(sim.fleet.facts.records) == 1  # nothing placed twice


def test_traffic_per_model_from_engines_and_gateways(tmp_path: Path) -> None:
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 2})])
    sim.step()
    sim.traffic = {
        "requests_per_s": 3.0,
        "in_flight": 1,
        "p50_latency_s": 0.2,
        "prefix_hit_rate": 0.5,
    }
    sim.step()
    (traffic,) = sim.summary().traffic
    assert (traffic.model, traffic.replicas, traffic.requests_per_s) == ("llama", 2, 6.0)
    assert traffic.in_flight == 2 and traffic.p50_latency_s == 0.2
    assert traffic.prefix_hit_rate == 0.5
    # A gateway that holds more requests in flight than the engine reports wins.
    ids = sorted(sim.fleet.facts.records)
    sim.gateways.report(GatewayStatus(name="gw", cursor="", in_flight={ids[0]: 7}))
    (traffic,) = sim.summary().traffic
    assert traffic.in_flight == 7 + 1
    # ... until it stops reporting.
    sim.clock.advance(11.0)
    (traffic,) = sim.summary().traffic
    assert traffic.in_flight == 2


def test_ctl_status_names_each_endpoint_a_gateway_leaves_out() -> None:
    from llmgw.render import gateways
    from llmgw.wire import GatewayView

    view = GatewayView(
        name="gw-a",
        cursor="x.1",
        age_s=0.4,
        in_flight=0,
        requests=3,
        rejected={"bad-1": "the host must be a host name or an IP literal"},
    )
    text = gateways([view])
    assert "gateway/gw-a leaves out replica bad-1: the host must be" in text


def test_a_gateway_report_from_before_a_takeover_never_lets_a_replica_stop(
    tmp_path: Path,
) -> None:
    """A leader that loses and regains the lease within the gateways' live window
    starts a new term: a status posted before it (a revision of the old term) must
    not count as having applied a stop marked in the new one (issue 20 item 3)."""
    sim = Sim(tmp_path, stop_grace_s=30.0)
    sim.fleet.facts.put_models([MODEL])
    for _ in range(3):
        sim.step()
    for i in range(50):  # the old term's revisions run far ahead of the new one's
        sim.fleet.facts.set_flag("gpu2", AdminFlag.CORDONED, f"r{i}", "ops")
    (ep,) = sim.fleet.endpoints_since("").endpoints
    applied = sim.fleet.endpoints_since("").cursor  # all of the old term
    sim.gateway("gw-a", applied)
    sim.fleet.facts.set_flag("gpu2", AdminFlag.NONE, "", "ops")
    sim.fleet = sim.fleet.next_term()  # the takeover: a new term, its revisions from the start
    sim.gateway("gw-a", applied)  # its next status, before it read the new leader's feed
    gate = sim.fleet.stop_gate
    assert gate.ready_to_stop([ep.replica_id]) == [], "the old report applied nothing of this term"
    # Once the gateway reports in this term, the stop goes on as usual.
    sim.gateway("gw-a", sim.fleet.endpoints_since("").cursor)
    assert gate.ready_to_stop([ep.replica_id]) == [ep.replica_id]


def test_forgetting_a_node_leaves_nothing_of_its_replicas_behind(tmp_path: Path) -> None:
    """Every removal path cleans every structure a replica has (issue 20 item 1):
    forget_node as remove_replicas does."""
    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL])
    for _ in range(2):
        sim.step()
    (ep,) = sim.fleet.endpoints_since("").endpoints
    sim.gateways.report(
        GatewayStatus(name="gw", cursor="", in_flight={}, requests={ep.replica_id: 1})
    )
    sim.gateways.report(
        GatewayStatus(name="gw", cursor="", in_flight={}, requests={ep.replica_id: 5})
    )
    sim.fleet.facts.mark_stopping(ep.replica_id)
    sim.fleet.facts.delete_model("llama")  # its replica retires through the stop handshake
    fleet = sim.fleet
    assert fleet.facts.gateway_activity and fleet.facts.retiring and fleet.facts.stopping
    fleet.facts.forget_node(ep.node, "ops")
    assert ep.replica_id not in fleet.facts.records
    assert not fleet.facts.gateway_activity, "gateway activity of a forgotten replica"
    assert not fleet.facts.retiring, "a retiring model with no replica left"
    assert not fleet.facts.stopping


async def test_an_apply_that_declares_a_model_waits_for_the_live_gateways(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35 item 1: the apply answers once each live gateway has applied the new
    model (its explainer routed), so none says 404 for it afterwards; one that never
    does holds it up for CATCH_UP_S at most, and is named."""
    sim = Sim(tmp_path)
    gateways = sim.gateways
    await gateways.caught_up(sim.fleet.facts.revision, "nothing live")  # no gateway: no wait
    sim.gateway("gw-a", sim.fleet.endpoints_since("").cursor)
    sim.gateway("gw-b", sim.fleet.endpoints_since("").cursor)
    sim.fleet.facts.put_models([MODEL])
    revision = sim.fleet.facts.revision
    waiting = asyncio.create_task(gateways.caught_up(revision, "model llama declared"))
    await asyncio.sleep(0.05)
    sim.gateway("gw-a", sim.fleet.endpoints_since("").cursor)
    await asyncio.sleep(0.05)
    assert not waiting.done()  # gw-b has not applied it yet
    sim.gateway("gw-b", "")  # reports, has applied nothing of this term
    await asyncio.sleep(0.05)
    assert not waiting.done()
    # gw-b routes to it while a removal is pending: that is enough for a new model.
    routed = sim.fleet.endpoints_since("").cursor
    sim.gateways.report(GatewayStatus(name="gw-b", cursor="", routed=routed))
    await asyncio.wait_for(waiting, 1)
    assert "have not applied" not in caplog.text

    sim.fleet.facts.put_models([MODEL.model_copy(update={"name": "other"})])
    caplog.set_level(logging.WARNING, logger="llmgw.controller")
    await gateways.caught_up(sim.fleet.facts.revision, "model other declared", timeout_s=0.1)
    assert "model other declared: gateway(s) gw-a, gw-b have not applied it" in caplog.text


def test_a_gateway_is_counted_up_to_what_it_admits(tmp_path: Path) -> None:
    """A gateway token posting `in_flight: 1000000` for one replica kept a model at its
    maximum (issue 36 item 1): what a gateway says in flight and held is counted up to
    the concurrency it admits (SMG's bound, which the status says), with an event."""
    from llmgw.wire import GATEWAY_IN_FLIGHT_BOUND, GATEWAY_IN_FLIGHT_DEFAULT, EventReason

    sim = Sim(tmp_path)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"name": "m2"}), MODEL])
    sim.step()
    sim.step()
    ids = sorted(sim.fleet.facts.records)

    def clamped() -> list[str]:
        return [
            e.message
            for e in sim.fleet.facts.events().events
            if e.reason is EventReason.GATEWAY_CLAMPED
        ]

    # At its limit exactly: counted as said, no event.
    sim.gateways.report(
        GatewayStatus(name="gw", in_flight={ids[0]: 60, ids[1]: 30}, max_in_flight=90)
    )
    assert sim.gateways.in_flight(sim.clock()) == {ids[0]: 60, ids[1]: 30} and clamped() == []
    # One past it: scaled down together, held requests included, to the limit in all.
    sim.gateways.report(
        GatewayStatus(name="gw", in_flight={ids[0]: 60, ids[1]: 30}, held={"llama": 10},
                      max_in_flight=99)
    )  # fmt: skip
    in_flight, held = sim.gateways.in_flight(sim.clock()), sim.gateways.held(sim.clock())
    assert in_flight == {ids[0]: 59, ids[1]: 29} and held == {"llama": 9}
    (said,) = clamped()
    assert "gateway gw said 100 requests" in said and "the 99 it admits" in said
    # The probe, at the wire's bound, from a gateway that does not say its limit.
    sim.clock.advance(1.0)
    sim.gateways.report(GatewayStatus(name="gw", in_flight={ids[0]: 1_000_000}))
    assert sim.gateways.in_flight(sim.clock()) == {ids[0]: GATEWAY_IN_FLIGHT_DEFAULT}
    assert len(clamped()) == 1  # the same run of clamped statuses: said once a minute
    sim.clock.advance(60.0)
    top = {ids[0]: 1_000_000, ids[1]: 1_000_000}
    sim.gateways.report(
        GatewayStatus(name="gw", in_flight=top, max_in_flight=GATEWAY_IN_FLIGHT_BOUND)
    )
    assert sum(sim.gateways.in_flight(sim.clock()).values()) == GATEWAY_IN_FLIGHT_BOUND
    assert len(clamped()) == 2
    # Back within its limit, then past it again: a new run, said at once.
    sim.gateways.report(GatewayStatus(name="gw", in_flight={ids[0]: 1}, max_in_flight=2))
    sim.gateways.report(GatewayStatus(name="gw", in_flight={ids[0]: 3}, max_in_flight=2))
    assert len(clamped()) == 3
    with pytest.raises(ValueError):
        GatewayStatus(name="gw", max_in_flight=GATEWAY_IN_FLIGHT_BOUND + 1)
    with pytest.raises(ValueError):
        GatewayStatus(name="gw", max_in_flight=0)
