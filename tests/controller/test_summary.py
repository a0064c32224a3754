"""Each rule of the fleet summary (DESIGN.md, issue 2) has a test here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fleet_factories import FakeClock, gpu, location, make_fleet, report
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw import render
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.term import Term
from llmgw.wire import AdminFlag, FleetSummary, ModelSpec, ReplicaState


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(tmp_path: Path, clock: FakeClock) -> Term:
    return make_fleet(tmp_path, clock)


def by_class(summary: FleetSummary) -> dict[str, dict[str, int]]:
    return {g.gpu_class: g.model_dump(exclude={"gpu_class"}) for g in summary.gpus}


def by_fabric(summary: FleetSummary) -> dict[str, dict[str, object]]:
    return {f.fabric: f.model_dump(exclude={"fabric"}) for f in summary.fabrics}


# -- nodes --------------------------------------------------------------------------


def test_node_counts_by_state_sum_to_total(fleet: Term, clock: FakeClock) -> None:
    for name in ["a", "b", "c", "d", "e"]:
        fleet.ingest(report(name))
    fleet.facts.set_flag("b", AdminFlag.CORDONED, "fan", "ops")
    fleet.facts.set_flag("c", AdminFlag.DRAINING, "bios", "ops")
    clock.advance(10)
    for name in ["a", "b", "c", "d"]:
        fleet.ingest(report(name))
    clock.advance(15)  # e last reported 25 s ago: past 3 x 5 s + 5 s
    n = fleet.summary().nodes
    assert (n.ready, n.cordoned, n.draining, n.unreachable) == (2, 1, 1, 1)
    assert n.total == n.ready + n.cordoned + n.draining + n.unreachable == 5


def test_one_missed_report_never_flips_a_node(fleet: Term, clock: FakeClock) -> None:
    fleet.ingest(report("a", interval_s=5))
    clock.advance(11)  # two reports missed
    assert fleet.summary().nodes.ready == 1
    clock.advance(8.9)  # 19.9 s: still inside 3 intervals + 5 s
    assert fleet.summary().nodes.ready == 1
    clock.advance(0.2)
    assert fleet.summary().nodes.unreachable == 1


def test_grace_scales_with_the_node_interval(fleet: Term, clock: FakeClock) -> None:
    fleet.ingest(report("slow", interval_s=30))
    clock.advance(60)
    assert fleet.summary().nodes.ready == 1


def test_liveness_wins_but_the_admin_flag_is_kept(fleet: Term, clock: FakeClock) -> None:
    fleet.ingest(report("a"))
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "disk", "ops")
    clock.advance(60)
    row = fleet.rows.row("a")
    assert row.state == "unreachable"
    assert row.admin.flag is AdminFlag.CORDONED and row.admin.reason == "disk"
    assert fleet.summary().nodes.unreachable == 1
    fleet.ingest(report("a"))
    assert fleet.rows.row("a").state == "cordoned"


def test_a_node_that_comes_back_is_ready_again(fleet: Term, clock: FakeClock) -> None:
    fleet.ingest(report("a"))
    clock.advance(100)
    assert fleet.summary().nodes.unreachable == 1
    fleet.ingest(report("a"))
    assert fleet.summary().nodes.ready == 1


# -- GPUs -----------------------------------------------------------------------------


def test_gpus_are_counted_per_card_by_class(fleet: Term) -> None:
    mixed = [
        gpu("m", 0, "H100-SXM-80GB"),
        gpu("m", 1, "H100-SXM-80GB"),
        gpu("m", 2, "A100-SXM-40GB"),
    ]
    fleet.ingest(report("m", gpus=mixed))
    fleet.ingest(report("h", n_gpus=8))
    classes = by_class(fleet.summary())
    assert classes["H100-SXM-80GB"]["total"] == 10
    assert classes["A100-SXM-40GB"]["total"] == 1
    assert [g.gpu_class for g in fleet.summary().gpus] == ["A100-SXM-40GB", "H100-SXM-80GB"]


def test_free_is_total_minus_used_minus_unhealthy(fleet: Term) -> None:
    cards = [
        gpu("a", 0, in_use=True),
        gpu("a", 1, health="unhealthy", reason="Xid 79"),
        gpu("a", 2, health="unhealthy", in_use=True),  # broken beats busy: counted once
        gpu("a", 3),
        gpu("a", 4),
    ]
    fleet.ingest(report("a", gpus=cards))
    c = by_class(fleet.summary())["H100-SXM-80GB"]
    assert (c["total"], c["used"], c["unhealthy"], c["free"]) == (5, 1, 2, 2)
    assert c["free"] == c["total"] - c["used"] - c["unhealthy"]


def test_unknown_health_is_never_free(fleet: Term) -> None:
    fleet.ingest(report("a", gpus=[gpu("a", 0, health="unknown"), gpu("a", 1)]))
    c = by_class(fleet.summary())["H100-SXM-80GB"]
    assert (c["unknown"], c["free"]) == (1, 1)


def test_cards_on_nodes_that_take_no_work_are_unschedulable_not_free(
    fleet: Term, clock: FakeClock
) -> None:
    for name in ["ready", "cordoned", "draining", "gone"]:
        fleet.ingest(report(name, n_gpus=2))
    fleet.facts.set_flag("cordoned", AdminFlag.CORDONED, "x", "ops")
    fleet.facts.set_flag("draining", AdminFlag.DRAINING, "x", "ops")
    clock.advance(15)
    for name in ["ready", "cordoned", "draining"]:
        fleet.ingest(report(name, n_gpus=2))
    clock.advance(10)
    c = by_class(fleet.summary())["H100-SXM-80GB"]
    assert (c["total"], c["free"], c["unschedulable"]) == (8, 2, 6)
    assert c["total"] == c["used"] + c["unhealthy"] + c["unknown"] + c["unschedulable"] + c["free"]


def test_cards_assigned_to_replicas_are_used(fleet: Term) -> None:
    fleet.ingest(report("a", n_gpus=4))
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", gpus_per_shard=2)])
    fleet.facts.put_replicas([replica("r1", "m", [("a", ["GPU-a-0", "GPU-a-1"])])])
    c = by_class(fleet.summary())["H100-SXM-80GB"]
    assert (c["used"], c["free"]) == (2, 2)


def test_a_card_a_replica_holds_is_used_once_and_moving_it_reads_no_report(
    fleet: Term, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: an idle card and one of unknown health turn used, a busy one stays used
    once, a broken one stays broken. The node's digest is its report's: a replica
    placed or removed changes what the views join (`NodeDigest.counted`), not it."""
    cards = [
        gpu("a", 0),
        gpu("a", 1, health="unknown"),
        gpu("a", 2, in_use=True),
        gpu("a", 3, health="unhealthy", reason="Xid 79"),
        gpu("a", 4),
    ]
    fleet.ingest(report("a", gpus=cards))
    fleet.ingest(report("b", n_gpus=1))
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", gpus_per_shard=4)])
    digest = fleet.facts.nodes["a"].digest
    assert by_fabric(fleet.summary())["ib-a"]["largest_free_block"] == 1  # b

    def read() -> tuple[object, ...]:
        c = by_class(fleet.summary())["H100-SXM-80GB"]
        row = fleet.rows.row("a")
        return (
            (c["used"], c["unknown"], c["unhealthy"], c["free"]),
            (row.gpus_used, row.gpus_unknown, row.gpus_unhealthy),
            by_fabric(fleet.summary())["ib-a"]["largest_free_block"],
        )

    def no_report_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("a report was parsed again")

    monkeypatch.setattr(type(fleet.facts.nodes["a"]), "report", property(no_report_read))
    on_a = [f"GPU-a-{i}" for i in range(4)]
    fleet.facts.put_replicas([replica("r1", "m", [("a", on_a), ("b", ["GPU-b-0"])])])
    assert read() == ((4, 0, 1, 1), (3, 0, 1), 0)
    fleet.facts.remove_replicas(["r1"])
    assert read() == ((1, 1, 1, 3), (1, 1, 1), 1)
    assert fleet.facts.nodes["a"].digest is digest


# -- fabrics ------------------------------------------------------------------------------


def test_fabrics_sorted_and_node_in_two_fabrics_counts_in_both(fleet: Term) -> None:
    fleet.ingest(report("a", fabrics=["ib-b"]))
    fleet.ingest(report("b", fabrics=["ib-a", "ib-b"]))
    fleet.ingest(report("c", fabrics=[]))
    summary = fleet.summary()
    assert [f.fabric for f in summary.fabrics] == ["ib-a", "ib-b"]
    fabrics = by_fabric(summary)
    assert fabrics["ib-a"]["nodes"] == 1 and fabrics["ib-b"]["nodes"] == 2
    assert fabrics["ib-b"]["largest_free_block"] == 2


def test_largest_free_block_counts_only_entirely_free_ready_nodes(
    fleet: Term, clock: FakeClock
) -> None:
    fleet.ingest(report("free1"))
    fleet.ingest(report("free2"))
    fleet.ingest(
        report("one-busy", gpus=[gpu("x", 0, in_use=True)] + [gpu("x", i) for i in range(1, 8)])
    )
    fleet.ingest(
        report(
            "one-broken",
            gpus=[gpu("y", 0, health="unhealthy")] + [gpu("y", i) for i in range(1, 8)],
        )
    )
    fleet.ingest(report("one-unknown", gpus=[gpu("z", 0, health="unknown"), gpu("z", 1)]))
    fleet.ingest(report("no-gpus", gpus=[]))
    fleet.ingest(report("cordoned"))
    fleet.facts.set_flag("cordoned", AdminFlag.CORDONED, "x", "ops")
    assert by_fabric(fleet.summary())["ib-a"]["largest_free_block"] == 2
    clock.advance(25)
    fleet.ingest(report("free1"))  # free2 is now unreachable
    assert by_fabric(fleet.summary())["ib-a"]["largest_free_block"] == 1


def test_one_shared_filer_on_twenty_nodes_is_one_model(fleet: Term) -> None:
    filer = location(
        "/mnt/models", ["meta/llama-70b"], scope="shared", source="filer1:/export/models"
    )
    for i in range(20):
        fleet.ingest(report(f"n{i:02d}", storage=[filer]))
    fabric = fleet.summary().fabrics[0]
    assert fabric.models_present == 1
    assert fabric.nodes_with_weights == 20
    copies = fabric.copies[0]
    assert (copies.model, copies.shared_copies, copies.local_copies, copies.nodes) == (
        "meta/llama-70b",
        1,
        0,
        20,
    )


def test_nodes_with_weights_and_models_present(fleet: Term) -> None:
    fleet.ingest(report("looks-not", storage=None))  # not configured
    fleet.ingest(report("found-nothing", storage=[location("/models", [])]))
    fleet.ingest(report("one", storage=[location("/models", ["a/x"])]))
    fleet.ingest(report("two", storage=[location("/models", ["a/x", "b/y"])]))
    fleet.ingest(report("other-fabric", fabrics=["ib-b"], storage=[location("/m", ["c/z"])]))
    fabrics = by_fabric(fleet.summary())
    assert fabrics["ib-a"]["nodes"] == 4
    assert fabrics["ib-a"]["nodes_with_weights"] == 2
    assert fabrics["ib-a"]["models_present"] == 2
    # weights in one fabric are not weights in another
    assert fabrics["ib-b"]["models_present"] == 1


def test_a_node_told_nothing_ranks_like_one_that_found_nothing(fleet: Term) -> None:
    fleet.ingest(report("a", storage=None))
    first = by_fabric(fleet.summary())["ib-a"]
    fleet.ingest(report("a", storage=[location("/models", [])]))
    assert by_fabric(fleet.summary())["ib-a"] == first


# -- replicas and models --------------------------------------------------------------------


def replica(
    rid: str, model: str, shards: list[tuple[str, list[str]]], state: str = "starting"
) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid,
        model=model,
        state=ReplicaState(state),
        shards=tuple(ShardRecord(node, rank, tuple(g)) for rank, (node, g) in enumerate(shards)),
        created_at=0.0,
    )


def shard(
    rid: str, state: str, gpus: list[str], rank: int = 0, idle: float | None = None
) -> dict[str, object]:
    return {
        "id": rid,
        "model": "m",
        "rank": rank,
        "state": state,
        "gpus": gpus,
        "idle_seconds": idle,
    }


def test_replica_counts_and_model_satisfaction(fleet: Term) -> None:
    fleet.facts.put_models(
        [
            ModelSpec(name="ok", source="s", min_replicas=1),
            ModelSpec(name="starting-up", source="s", min_replicas=1),
            ModelSpec(name="zz-stuck", source="s", min_replicas=2),
            ModelSpec(name="aa-stuck", source="s", min_replicas=1),
        ]
    )
    fleet.facts.put_replicas(
        [
            replica("r-ok", "ok", [("a", ["GPU-a-0"])]),
            replica("r-start", "starting-up", [("a", ["GPU-a-1"])]),
            replica("r-fail", "zz-stuck", [("a", ["GPU-a-2"])]),
            replica("r-drain", "zz-stuck", [("a", ["GPU-a-3"])], state="draining"),
        ]
    )
    fleet.ingest(
        report(
            "a",
            replicas=[
                shard("r-ok", "ready", ["GPU-a-0"]),
                shard("r-start", "starting", ["GPU-a-1"]),
                shard("r-fail", "failed", ["GPU-a-2"]),
                shard("r-drain", "ready", ["GPU-a-3"]),
            ],
        )
    )
    s = fleet.summary()
    assert s.replicas.model_dump() == {
        "ready": 1,
        "starting": 1,
        "draining": 1,
        "failed": 1,
        "sleeping": 0,
        "waking": 0,
    }
    assert (s.models.total, s.models.satisfied, s.models.short) == (4, 1, 3)
    # short with no replica starting, sorted
    assert s.unplaceable == ["aa-stuck", "zz-stuck"]


def test_idle_replicas_most_idle_first_with_gpus_over_all_shards(
    fleet: Term, clock: FakeClock
) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="s")])
    fleet.facts.put_replicas(
        [
            replica(
                "two-node", "m", [("a", ["GPU-a-0", "GPU-a-1"]), ("b", ["GPU-b-0", "GPU-b-1"])]
            ),
            replica("older", "m", [("a", ["GPU-a-2"])]),
            replica("busy", "m", [("a", ["GPU-a-3"])]),
            replica("unknown", "m", [("a", ["GPU-a-4"])]),
        ]
    )
    fleet.ingest(
        report(
            "a",
            replicas=[
                shard("two-node", "ready", ["GPU-a-0", "GPU-a-1"], idle=700),
                shard("older", "ready", ["GPU-a-2"], idle=3600),
                shard("busy", "ready", ["GPU-a-3"], idle=30),
                shard("unknown", "ready", ["GPU-a-4"], idle=None),
            ],
        )
    )
    fleet.ingest(report("b", replicas=[shard("two-node", "ready", ["GPU-b-0", "GPU-b-1"], rank=1)]))
    idle = fleet.summary().idle_replicas
    assert [(r.id, r.gpus) for r in idle] == [("older", 1), ("two-node", 4)]
    assert idle[0].idle_seconds == pytest.approx(3600)
    # Time passing makes the busy one idle too, with no new report.
    clock.advance(580)
    fleet.ingest(report("b", replicas=[shard("two-node", "ready", ["GPU-b-0", "GPU-b-1"], rank=1)]))
    ids = [r.id for r in fleet.summary().idle_replicas]
    assert ids == ["older", "two-node", "busy"]
    assert "unknown" not in ids


def test_activity_takes_a_replica_off_the_idle_list(fleet: Term, clock: FakeClock) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="s")])
    fleet.facts.put_replicas([replica("r", "m", [("a", ["GPU-a-0"])])])
    fleet.ingest(report("a", replicas=[shard("r", "ready", ["GPU-a-0"], idle=900)]))
    assert [r.id for r in fleet.summary().idle_replicas] == ["r"]
    clock.advance(5)
    fleet.ingest(report("a", replicas=[shard("r", "ready", ["GPU-a-0"], idle=1)]))
    assert fleet.summary().idle_replicas == []


# -- consistency --------------------------------------------------------------------------------


def test_a_cordon_shows_at_once_despite_the_cache(fleet: Term) -> None:
    fleet.ingest(report("a"))
    assert fleet.summary().nodes.ready == 1
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "x", "ops")
    assert fleet.summary().nodes.cordoned == 1


def test_reason_groups_list_nodes_like_sinfo_r(fleet: Term) -> None:
    for name in ["g1", "g2", "g3"]:
        fleet.ingest(report(name))
    fleet.facts.set_flag("g1", AdminFlag.CORDONED, "PSU swap", "alice")
    fleet.facts.set_flag("g3", AdminFlag.CORDONED, "PSU swap", "alice")
    fleet.facts.set_flag("g2", AdminFlag.DRAINING, "BIOS update", "bob")
    groups = [(g.reason, g.flag, g.by, g.nodes) for g in fleet.summary().reasons]
    assert groups == [
        ("BIOS update", AdminFlag.DRAINING, "bob", ["g2"]),
        ("PSU swap", AdminFlag.CORDONED, "alice", ["g1", "g3"]),
    ]


node_plan = st.lists(
    st.tuples(
        st.sampled_from(["ready", "cordoned", "draining"]),
        st.booleans(),  # stops reporting
        st.integers(0, 4),  # gpus
        st.integers(0, 3),  # unhealthy among them
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=node_plan)
def test_summary_never_disagrees_with_the_nodes_table(
    tmp_path_factory: pytest.TempPathFactory, plan: list
) -> None:
    clock = FakeClock()
    fleet = make_fleet(tmp_path_factory.mktemp("state"), clock)
    for i, (_, _, n, bad) in enumerate(plan):
        cards = [gpu(f"n{i}", j, health="unhealthy" if j < bad else "healthy") for j in range(n)]
        fleet.ingest(report(f"n{i}", gpus=cards))
    for i, (flag, _, _, _) in enumerate(plan):
        if flag != "ready":
            fleet.facts.set_flag(f"n{i}", AdminFlag(flag), "reason", "ops")
    clock.advance(15)
    for i, (_, stops, n, bad) in enumerate(plan):
        if not stops:
            cards = [
                gpu(f"n{i}", j, health="unhealthy" if j < bad else "healthy") for j in range(n)
            ]
            fleet.ingest(report(f"n{i}", gpus=cards))
    clock.advance(10)
    rows = fleet.rows.rows()
    summary = fleet.summary()
    states = Counter(r.state.value for r in rows)
    assert summary.nodes.model_dump() == {
        "total": len(rows),
        "ready": states["ready"],
        "cordoned": states["cordoned"],
        "draining": states["draining"],
        "unreachable": states["unreachable"],
    }
    assert sum(g.total for g in summary.gpus) == sum(r.gpus_total for r in rows)
    assert sum(g.unhealthy for g in summary.gpus) == sum(r.gpus_unhealthy for r in rows)
    free_nodes = sum(
        1
        for r in rows
        if r.state == "ready" and r.gpus_total and r.gpus_unhealthy == 0 and r.gpus_used == 0
    )
    assert sum(f.largest_free_block for f in summary.fabrics) == free_nodes


def test_every_turn_to_unreachable_is_counted(fleet: Term, clock: FakeClock) -> None:
    """A node that drops out and comes back between two scrapes shows in the
    counter, not in the sampled gauge (llmgw_nodes_turned_unreachable)."""
    fleet.ingest(report("a", interval_s=5))
    fleet.ingest(report("b", interval_s=5))
    assert fleet.facts.turned_unreachable == 0
    for turns in (1, 2):
        clock.advance(21)  # past 3 intervals + 5 s
        fleet.ingest(report("b", interval_s=5))  # b keeps reporting
        assert fleet.summary().nodes.unreachable == 1
        fleet.summary()  # looking again is not another turn
        assert fleet.facts.turned_unreachable == turns
        fleet.ingest(report("a", interval_s=5))  # back
        assert fleet.summary().nodes.unreachable == 0
    # A new leader's term (reload) keeps the count: it is a counter.
    fleet = fleet.next_term()
    assert fleet.facts.turned_unreachable == 2


def test_idle_means_what_idle_after_says(tmp_path: Path, clock: FakeClock) -> None:
    """`--idle-after`: the summary lists a replica idle that long, and says the threshold."""
    short = make_fleet(tmp_path, clock, idle_after_s=60.0)
    short.facts.put_models([ModelSpec(name="m", source="s")])
    short.facts.put_replicas([replica("r", "m", [("a", ["GPU-a-0"])])])
    short.ingest(report("a", replicas=[shard("r", "ready", ["GPU-a-0"], idle=90)]))
    s = short.summary()
    assert [r.id for r in s.idle_replicas] == ["r"]
    assert s.idle_after_s == 60.0
    assert "nothing asked for 1m+" in render.status(s, "http://c")


def test_idle_is_ten_minutes_by_default(fleet: Term) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="s")])
    fleet.facts.put_replicas(
        [replica("r", "m", [("a", ["GPU-a-0"])]), replica("q", "m", [("a", ["GPU-a-1"])])]
    )
    fleet.ingest(
        report(
            "a",
            replicas=[
                shard("r", "ready", ["GPU-a-0"], idle=90),
                shard("q", "ready", ["GPU-a-1"], idle=700),
            ],
        )
    )
    s = fleet.summary()
    assert ([r.id for r in s.idle_replicas], s.idle_after_s) == (["q"], 600.0)
    assert "nothing asked for 10m+" in render.status(s, "http://c")
