"""Every removal path leaves nothing behind (issue 20): forgetting a node, removing
replicas, deleting a model. One test per structure the facts and their views keep,
so a structure added without its removal fails by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fleet_factories import FakeClock, make_fleet, report

from llmgw.controller.core.changes import ChangeKind
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.term import Term
from llmgw.controller.views.follow import Follower
from llmgw.wire import AdminFlag, GatewayStatus, ModelSpec, ReplicaState

NODE, OTHER = "gpu1", "gpu2"
MODEL = ModelSpec(name="m", source="org/m", min_replicas=0, gpus_per_shard=1)
REPLICA = "m-1"


def _followers_holding(*keys: str) -> Callable[[Term], object]:
    """The views following the log (each with its own cache) that hold any of `keys`."""
    return lambda t: [name for name, f in t.followers.items() if any(map(f.holds, keys))]


# What each structure still holds of NODE or REPLICA (truthy: something left behind).
TRACES: dict[str, Callable[[Term], object]] = {
    "node entry": lambda t: NODE in t.facts.nodes,
    "admin flag": lambda t: NODE in t.facts.admin,
    "approval awaited": lambda t: NODE in t.facts.approvals.pending,
    "why a drain waits": lambda t: NODE in t.facts.decisions.drain_blocked,
    "replicas by node": lambda t: t.facts.replicas_on(NODE),
    "replica record": lambda t: REPLICA in t.facts.records,
    "stopping mark": lambda t: REPLICA in t.facts.stopping,
    "gateway activity": lambda t: REPLICA in t.facts.gateway_activity,
    "ready since": lambda t: REPLICA in t.facts.ready_since,
    "retiring model": lambda t: "m" in t.facts.retiring,
    "change log index": lambda t: [k for k in ChangeKind if t.facts.log.latest(k, NODE)],
    "replica statuses": lambda t: REPLICA in t.replica_statuses(),
    "followers of the log": _followers_holding(NODE, REPLICA),
    "followers of the log, of the replica": _followers_holding(REPLICA),
}


def _record(node: str) -> ReplicaRecord:
    return ReplicaRecord(
        id=REPLICA,
        model="m",
        state=ReplicaState.READY,
        shards=(ShardRecord(node, 0, (f"GPU-{node}-0",)),),
        created_at=0.0,
    )


def _everything_on_the_node(tmp_path: Path) -> Term:
    """NODE with something in every structure: reported, flagged, awaiting approval,
    a drain waiting, a replica stopping that a gateway saw, its model deleted."""
    clock = FakeClock()
    term = make_fleet(tmp_path, clock)
    term.ingest_json(report(NODE, n_gpus=2))
    term.ingest_json(report(OTHER, n_gpus=2))
    facts = term.facts
    facts.put_models([MODEL])
    facts.put_replicas([_record(NODE)])
    facts.set_flag(NODE, AdminFlag.DRAINING, "swap", "ops")
    facts.decisions.set_drain_blocked(NODE, "waiting for a stand-in")
    facts.approvals.await_approval(NODE, 1.0)
    facts.mark_stopping(REPLICA)
    term.gateways.report(GatewayStatus(name="gw", cursor="", requests={REPLICA: 1}))
    term.gateways.report(
        GatewayStatus(
            name="gw",
            cursor="",
            in_flight={REPLICA: 1},
            requests={REPLICA: 2},
            rejected={REPLICA: "its engine answered 404"},
        )
    )
    facts.delete_model("m")
    term.summary()
    term.rows.rows_json()
    term.rows.nodes_since_json("")
    term.ingest_json(report(NODE, n_gpus=2))
    return term


def _caught_up(term: Term) -> Term:
    """Every view reads the log once more, as its next reader would make it."""
    for follower in term.followers.values():
        follower.catch_up()
    return term


def test_the_setup_puts_something_in_every_structure(tmp_path: Path) -> None:
    term = _everything_on_the_node(tmp_path)
    empty = [name for name, trace in TRACES.items() if not trace(term)]
    empty += [n for n, f in term.followers.items() if not (f.holds(NODE) or f.holds(REPLICA))]
    assert empty == [], "the setup must fill every structure, or the tests below prove nothing"


def test_the_term_lists_every_view_that_follows_the_log(tmp_path: Path) -> None:
    """A view the term does not list escapes the tests above."""
    term = make_fleet(tmp_path, FakeClock())
    views = {name for name, value in vars(term).items() if isinstance(value, Follower)}
    assert views == set(term.followers) == {"rows", "totals", "replies", "gateways"}


@pytest.mark.parametrize("structure", sorted(TRACES))
def test_forgetting_a_node_leaves_nothing_of_it(tmp_path: Path, structure: str) -> None:
    term = _everything_on_the_node(tmp_path)
    term.facts.forget_node(NODE, "ops")
    assert not TRACES[structure](_caught_up(term))


REPLICA_STRUCTURES = [
    "replica record",
    "stopping mark",
    "gateway activity",
    "followers of the log, of the replica",
    "retiring model",
    "replicas by node",
    "replica statuses",
]


@pytest.mark.parametrize("structure", REPLICA_STRUCTURES)
def test_removing_a_replica_leaves_nothing_of_it(tmp_path: Path, structure: str) -> None:
    """The stop handshake's end: the deleted model's last replica is removed."""
    term = _everything_on_the_node(tmp_path)
    term.facts.remove_replicas([REPLICA])
    assert not TRACES[structure](_caught_up(term))


def test_a_forgotten_node_is_no_longer_in_the_summary_or_rows(tmp_path: Path) -> None:
    term = _everything_on_the_node(tmp_path)
    term.facts.forget_node(NODE, "ops")
    assert term.summary().nodes.total == 1
    assert [r.name for r in term.rows.rows()] == [OTHER]
    assert sum(g.total for g in term.summary().gpus) == 2


def test_forgetting_a_node_seen_but_not_yet_saved_leaves_no_sighting_to_save(
    tmp_path: Path,
) -> None:
    term = make_fleet(tmp_path, FakeClock())
    term.ingest(report(NODE))
    assert NODE in term.facts._unsaved_nodes
    term.facts.forget_node(NODE, "ops")
    assert NODE not in term.facts._unsaved_nodes
    term.facts.flush()
    assert NODE not in term.facts.store.known_nodes()


def test_deleting_a_model_drops_the_requests_gateways_hold_for_it(tmp_path: Path) -> None:
    """A sleeping model's held requests (what wakes it) go with the model, at the
    next read rather than the gateway's next status."""
    term = make_fleet(tmp_path, FakeClock())
    term.facts.put_models([MODEL])
    term.gateways.report(GatewayStatus(name="gw", cursor="", held={"m": 3}))
    assert term.gateways.held(term.facts.clock()) == {"m": 3}
    term.facts.delete_model("m")
    assert term.gateways.held(term.facts.clock()) == {}
    assert term.gateways.seen["gw"].held == {}
