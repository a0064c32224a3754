"""`GET /v1/nodes?since=CURSOR`: only the rows that changed, every node's age.

A row left out of a delta must be the row the operator already has: every
kind of change to a row shows up, and nothing else does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fleet_factories import FakeClock, gpu, location, make_fleet, report
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.client import AdminClient
from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.nodes import Changed, NodeEntry
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.keys import term_of
from llmgw.controller.term import Term
from llmgw.controller.views.node_rows import NodeRows
from llmgw.controller.views.row_json import RowEncodings
from llmgw.errors import BadCursor
from llmgw.wire import AdminFlag, ModelSpec, NodeReport, NodeRow, NodesDelta, ReplicaState

ClientFactory = Callable[..., Awaitable[TestClient]]
AGENT, READ = "agent-secret", "read-secret"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(tmp_path: Path, clock: FakeClock) -> Term:
    f = make_fleet(tmp_path, clock)
    for name in ("a", "b", "c"):
        f.ingest(report(name, n_gpus=4))
    return f


def names(delta: NodesDelta) -> list[str]:
    return [r.name for r in delta.nodes]


def caught_up(fleet: Term) -> str:
    """A cursor that has seen everything so far."""
    return fleet.rows.nodes_since("").cursor


def replica(rid: str, node: str, gpus: list[str]) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid,
        model="m",
        state=ReplicaState.STARTING,
        shards=(ShardRecord(node, 0, tuple(gpus)),),
        created_at=0.0,
    )


# -- the fleet ------------------------------------------------------------------------


def test_the_first_answer_is_full_with_every_row_and_age(fleet: Term, clock: FakeClock) -> None:
    clock.advance(2.25)
    delta = fleet.rows.nodes_since("")
    assert delta.full
    assert names(delta) == ["a", "b", "c"]
    assert delta.nodes == fleet.rows.rows()
    assert delta.removed == []
    assert delta.report_ages == {"a": 2.2, "b": 2.2, "c": 2.2}  # rounded as in the rows
    assert delta.cursor.startswith(f"{fleet.run}.")


def test_nothing_changed_sends_no_rows_but_every_age(fleet: Term, clock: FakeClock) -> None:
    cursor = caught_up(fleet)
    clock.advance(3)
    delta = fleet.rows.nodes_since(cursor)
    assert not delta.full
    assert delta.nodes == []
    assert delta.cursor == cursor
    assert delta.report_ages == {"a": 3.0, "b": 3.0, "c": 3.0}
    clock.advance(1.5)
    assert fleet.rows.nodes_since(delta.cursor).report_ages == {"a": 4.5, "b": 4.5, "c": 4.5}


def test_a_report_that_changes_only_the_time_sends_no_row(fleet: Term, clock: FakeClock) -> None:
    cursor = caught_up(fleet)
    clock.advance(4)
    fleet.ingest(report("b", n_gpus=4))
    delta = fleet.rows.nodes_since(cursor)
    assert delta.nodes == []
    assert delta.report_ages == {"a": 4.0, "b": 0.0, "c": 4.0}


REPORT_CHANGES: dict[str, NodeReport] = {
    "gpu in use": report("b", gpus=[gpu("b", 0, in_use=True)] + [gpu("b", i) for i in (1, 2, 3)]),
    "gpu unhealthy": report(
        "b",
        gpus=[gpu("b", 0, health="unhealthy", reason="Xid 79")] + [gpu("b", i) for i in (1, 2, 3)],
    ),
    "gpu health unknown": report(
        "b", gpus=[gpu("b", 0, health="unknown")] + [gpu("b", i) for i in (1, 2, 3)]
    ),
    "a card lost": report("b", n_gpus=3),
    "another class": report("b", gpus=[gpu("b", i, cls="A100-SXM-40GB") for i in range(4)]),
    "weights appear": report("b", n_gpus=4, storage=[location("/models", ["org/llama"])]),
    "fabric": report("b", n_gpus=4, fabrics=["ib-b"]),
    "gpu error": report("b", n_gpus=4).model_copy(update={"gpu_error": "GPU 4 fell off the bus"}),
    "no gpus": report("b", gpus=[]).model_copy(update={"gpu_error": "NVML: driver not loaded"}),
}


@pytest.mark.parametrize("changed", list(REPORT_CHANGES.values()), ids=list(REPORT_CHANGES))
def test_a_report_that_changes_the_row_sends_that_row_only(
    fleet: Term, clock: FakeClock, changed: NodeReport
) -> None:
    cursor = caught_up(fleet)
    before = fleet.rows.row("b")
    clock.advance(1)
    fleet.ingest(changed)
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["b"]
    assert delta.nodes[0] == fleet.rows.row("b")
    assert delta.nodes[0] != before
    assert delta.cursor != cursor
    assert fleet.rows.nodes_since(delta.cursor).nodes == []  # and only once


@pytest.mark.parametrize(
    ("flag", "state"),
    [(AdminFlag.CORDONED, "cordoned"), (AdminFlag.DRAINING, "draining")],
)
def test_cordon_drain_and_uncordon_send_that_row(fleet: Term, flag: AdminFlag, state: str) -> None:
    cursor = caught_up(fleet)
    fleet.facts.set_flag("c", flag, "PSU swap", "alice")
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["c"]
    assert (delta.nodes[0].state, delta.nodes[0].admin.reason) == (state, "PSU swap")
    fleet.facts.set_flag("c", AdminFlag.NONE, None, "alice")
    delta = fleet.rows.nodes_since(delta.cursor)
    assert names(delta) == ["c"]
    assert delta.nodes[0].state == "ready"


def test_an_admin_change_that_keeps_the_state_is_sent(fleet: Term, clock: FakeClock) -> None:
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan", "alice")
    cursor = caught_up(fleet)
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan and PSU", "bob")  # still cordoned
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["a"]
    assert (delta.nodes[0].admin.reason, delta.nodes[0].admin.by) == ("fan and PSU", "bob")
    clock.advance(60)  # everything unreachable: liveness wins, the flag shows beside it
    cursor = fleet.rows.nodes_since(delta.cursor).cursor
    fleet.facts.set_flag("b", AdminFlag.DRAINING, "BIOS", "alice")
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["b"]
    assert (delta.nodes[0].state, delta.nodes[0].admin.flag) == ("unreachable", "draining")


def test_a_finished_drain_sends_the_row(fleet: Term) -> None:
    fleet.facts.set_flag("a", AdminFlag.DRAINING, "BIOS", "alice")
    cursor = caught_up(fleet)
    fleet.facts.mark_drained("a")
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["a"]
    assert delta.nodes[0].admin.drained


def test_a_node_turning_unreachable_with_time_alone_is_sent(
    tmp_path: Path, clock: FakeClock
) -> None:
    fleet = make_fleet(tmp_path, clock)
    fleet.ingest(report("fast", interval_s=5))  # unreachable after 3 x 5 + 5 s
    fleet.ingest(report("slow", interval_s=60))
    cursor = caught_up(fleet)
    clock.advance(19)
    delta = fleet.rows.nodes_since(cursor)
    assert delta.nodes == []
    clock.advance(2)  # no request touches either node
    delta = fleet.rows.nodes_since(delta.cursor)
    assert names(delta) == ["fast"]
    assert delta.nodes[0].state == "unreachable"
    assert delta.report_ages == {"fast": 21.0, "slow": 21.0}
    fleet.ingest(report("fast", interval_s=5))
    delta = fleet.rows.nodes_since(delta.cursor)
    assert names(delta) == ["fast"]
    assert delta.nodes[0].state == "ready"


def test_a_replica_assignment_sends_the_rows_it_touches(fleet: Term) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    cursor = caught_up(fleet)
    fleet.facts.put_replicas([replica("r1", "a", ["GPU-a-0"])])
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["a"]
    assert (delta.nodes[0].replicas, delta.nodes[0].gpus_used) == (1, 1)
    fleet.facts.remove_replicas(["r1"])
    delta = fleet.rows.nodes_since(delta.cursor)
    assert names(delta) == ["a"]
    assert (delta.nodes[0].replicas, delta.nodes[0].gpus_used) == (0, 0)


def test_a_replica_count_change_alone_is_sent(fleet: Term) -> None:
    """A replica holding no card on this node still changes the count."""
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    cursor = caught_up(fleet)
    fleet.facts.put_replicas([replica("r1", "b", [])])
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["b"]
    assert (delta.nodes[0].replicas, delta.nodes[0].gpus_used) == (1, 0)


def test_why_a_drain_waits_is_sent(fleet: Term) -> None:
    fleet.facts.set_flag("b", AdminFlag.DRAINING, "BIOS", "alice")
    cursor = caught_up(fleet)
    fleet.facts.decisions.set_drain_blocked(
        "b", "waiting for a stand-in for r1"
    )  # as the reconcile loop does
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["b"]
    assert delta.nodes[0].drain_blocked == "waiting for a stand-in for r1"
    fleet.facts.decisions.set_drain_blocked("b", None)
    assert names(fleet.rows.nodes_since(delta.cursor)) == ["b"]


def test_a_new_node_is_sent_to_every_older_cursor(fleet: Term) -> None:
    cursor = caught_up(fleet)
    fleet.ingest(report("d"))
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["d"]
    assert set(delta.report_ages) == {"a", "b", "c", "d"}


def test_two_consumers_each_get_what_changed_since_their_own_cursor(
    fleet: Term, clock: FakeClock
) -> None:
    first = caught_up(fleet)
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan", "alice")
    second = fleet.rows.nodes_since(first).cursor  # this consumer has seen a's cordon
    fleet.ingest(report("b", n_gpus=2))
    clock.advance(1)
    assert names(fleet.rows.nodes_since(first)) == ["a", "b"]
    assert names(fleet.rows.nodes_since(second)) == ["b"]
    fleet.facts.set_flag("c", AdminFlag.CORDONED, "fan", "alice")
    assert names(fleet.rows.nodes_since(first)) == ["a", "b", "c"]
    assert names(fleet.rows.nodes_since(second)) == ["b", "c"]


def test_a_forgotten_node_is_reported_removed_to_older_cursors(fleet: Term) -> None:
    older = caught_up(fleet)
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan", "alice")
    newer = fleet.rows.nodes_since(older).cursor
    fleet.facts.forget_node("b", "ops")
    delta = fleet.rows.nodes_since(older)
    assert (names(delta), delta.removed) == (["a"], ["b"])
    assert set(delta.report_ages) == {"a", "c"}
    assert fleet.rows.nodes_since(newer).removed == ["b"]
    assert fleet.rows.nodes_since(delta.cursor).removed == []
    full = fleet.rows.nodes_since("")
    assert (names(full), full.removed) == (["a", "c"], [])
    for cursor in (older, newer, "", delta.cursor):  # what the endpoint sends says the same
        assert (
            fleet.rows.nodes_since_json(cursor)
            == fleet.rows.nodes_since(cursor).model_dump_json().encode()
        )


def test_a_cursor_older_than_the_tombstones_kept_gets_a_full_answer(
    fleet: Term, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("llmgw.controller.views.node_rows.REMOVALS_KEPT", 1)
    older = caught_up(fleet)
    fleet.facts.forget_node("a", "ops")
    middle = fleet.rows.nodes_since(older).cursor
    fleet.facts.forget_node("b", "ops")  # a's change is dropped to keep one
    newest = fleet.rows.nodes_since(middle)
    assert newest.removed == ["b"]
    delta = fleet.rows.nodes_since(older)
    assert delta.full
    assert names(delta) == ["c"]
    assert fleet.rows.nodes_since(middle).removed == ["b"]


class RowWithVersion(NodeRow):
    agent_version: str | None = None


def test_a_field_added_to_the_row_is_sent_without_anything_else_to_change(
    fleet: Term, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a row shows, `?since=` carries its change: the fingerprint is the
    row's own content. Add a field (here the agent's version, which no other
    part of the row depends on) the way a developer would: kept by the node's
    entry, which says when a report changed what it keeps, and shown in the row."""
    content = NodeRows._content_of
    update = NodeEntry.update

    def with_version(self: NodeRows, name: str, now: float) -> dict[str, Any]:
        return {**content(self, name, now), "agent_version": versions.get(name)}

    versions: dict[str, str | None] = {}

    def keep_version(self: NodeEntry, report: NodeReport, *args: Any) -> Changed:
        changed = versions.get(self.name) != report.agent_version
        versions[self.name] = report.agent_version
        moved = update(self, report, *args)
        return moved._replace(facts=moved.facts or changed)

    monkeypatch.setattr(NodeRows, "_content_of", with_version)
    monkeypatch.setattr(NodeEntry, "update", keep_version)
    monkeypatch.setattr("llmgw.controller.views.node_rows.NodeRow", RowWithVersion)
    cursor = caught_up(fleet)
    clock.advance(1)
    fleet.ingest(report("b", n_gpus=4).model_copy(update={"agent_version": "2.0"}))
    delta = fleet.rows.nodes_since(cursor)
    assert names(delta) == ["b"]
    assert isinstance(delta.nodes[0], RowWithVersion)
    assert delta.nodes[0].agent_version == "2.0"
    clock.advance(1)
    fleet.ingest(report("b", n_gpus=4).model_copy(update={"agent_version": "2.0"}))
    assert fleet.rows.nodes_since(delta.cursor).nodes == []  # and only once


def test_a_cursor_from_another_run_gets_a_full_answer(tmp_path: Path, clock: FakeClock) -> None:
    first = make_fleet(tmp_path, clock)
    for name in ("a", "b"):
        first.ingest(report(name))
    cursor = caught_up(first)
    first.facts.flush()
    first.facts.close()
    restarted = make_fleet(tmp_path, clock)  # the same store: a controller restart
    assert restarted.run != first.run
    delta = restarted.rows.nodes_since(cursor)
    assert delta.full
    assert names(delta) == ["a", "b"]
    assert delta.report_ages == {"a": None, "b": None}  # no report this run yet
    assert delta.cursor.startswith(f"{restarted.run}.")
    assert restarted.rows.nodes_since(delta.cursor).nodes == []


def test_a_cursor_not_yet_issued_gets_a_full_answer(fleet: Term) -> None:
    cursor = caught_up(fleet)
    epoch, rev = cursor.split(".")
    delta = fleet.rows.nodes_since(f"{epoch}.{int(rev) + 5}")
    assert delta.full
    assert names(delta) == ["a", "b", "c"]
    assert delta.cursor == cursor


@pytest.mark.parametrize(
    "bad",
    ["abc", "zz.1", "1f.", ".1", "1f.-1", "1f.2.3", "1f.x", " 1f.1", "1f.1 ", "1f." + "9" * 80],
)
def test_a_malformed_cursor_is_refused(fleet: Term, bad: str) -> None:
    cursor = caught_up(fleet)
    with pytest.raises(BadCursor, match="since"):
        fleet.rows.nodes_since(bad)
    assert fleet.rows.nodes_since(cursor).cursor == cursor


@pytest.mark.parametrize("age", [0.0, 0.1, 2.25, 59.96, 600.0, 12345.6, 86400.5, 1e9 + 0.3, -0.4])
def test_an_age_is_encoded_as_pydantic_writes_it(fleet: Term, age: float) -> None:
    content = fleet.rows.row("a").model_dump(exclude={"report_age_s"})
    entry = NodeEntry("a", 0.0)
    entry.received_at = 5000.0
    (encoded,) = RowEncodings().rows([("a", entry)], {"a": content}, 5000.0 + age)
    row = NodeRow.model_validate({**content, "report_age_s": round(age, 1)})
    assert encoded == row.model_dump_json().encode()


def test_a_row_whose_text_looks_like_the_age_field_is_encoded_whole(fleet: Term) -> None:
    fleet.facts.set_flag("a", AdminFlag.CORDONED, '"report_age_s":null', "alice")
    assert fleet.rows.rows_json() == pydantic_list(fleet.rows.rows())


# -- over HTTP -------------------------------------------------------------------------------


def tokens() -> Tokens:
    return Tokens(((AGENT, "agent", Role.AGENT), (READ, "reader", Role.READ)))


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    c = await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens())))
    for name in ("gpu01", "gpu02"):
        resp = await c.post(
            "/v1/agent/report",
            data=report(name).model_dump_json(),
            headers={"Authorization": f"Bearer {AGENT}"},
        )
        assert resp.status == 200
    return c


async def test_since_needs_a_token_and_a_read_token_will_do(client: TestClient) -> None:
    assert (await client.get("/v1/nodes", params={"since": ""})).status == 401
    resp = await client.get(
        "/v1/nodes", params={"since": ""}, headers={"Authorization": f"Bearer {READ}"}
    )
    assert resp.status == 200
    delta = NodesDelta.model_validate(await resp.json())
    assert delta.full
    assert names(delta) == ["gpu01", "gpu02"]


async def test_without_since_the_answer_is_the_plain_list(client: TestClient) -> None:
    resp = await client.get("/v1/nodes", headers={"Authorization": f"Bearer {READ}"})
    body = await resp.json()
    assert isinstance(body, list)
    assert [n["name"] for n in body] == ["gpu01", "gpu02"]


@pytest.mark.parametrize("bad", ["nonsense", "1f.", "1f.-3", "9" * 100])
async def test_a_malformed_cursor_is_a_400_that_names_since_and_changes_nothing(
    client: TestClient, bad: str
) -> None:
    headers = {"Authorization": f"Bearer {READ}"}
    first = await (await client.get("/v1/nodes", params={"since": ""}, headers=headers)).json()
    resp = await client.get("/v1/nodes", params={"since": bad}, headers=headers)
    assert resp.status == 400
    message = (await resp.json())["error"]
    assert "since" in message and "cursor" in message
    again = await client.get("/v1/nodes", params={"since": first["cursor"]}, headers=headers)
    after = await again.json()
    assert (after["cursor"], after["nodes"], after["full"]) == (first["cursor"], [], False)


# -- end to end: full answer plus deltas == GET /v1/nodes ----------------------------------------

NODES = ["n0", "n1", "n2", "n3"]
node = st.sampled_from(NODES)
action = st.one_of(
    st.tuples(
        st.just("report"),
        node,
        st.integers(0, 2),  # cards in use
        st.integers(0, 1),  # unhealthy cards
        st.sampled_from([(), ("org/a",), ("org/a", "org/b")]),  # weights held
    ),
    st.tuples(st.just("same report"), node),
    st.tuples(
        st.just("admin"),
        node,
        st.sampled_from(["cordon", "drain", "uncordon"]),
        st.sampled_from(["fan", "PSU swap"]),
    ),
    st.tuples(st.just("time"), st.sampled_from([0.4, 3.0, 16.0, 30.0])),
    st.tuples(st.just("replica"), node),
    st.tuples(st.just("drain blocked"), node),
    st.tuples(st.just("poll"), st.integers(0, 1)),
)


def node_report(name: str, used: int, unhealthy: int, models: tuple[str, ...]) -> NodeReport:
    cards = [
        gpu(name, i, in_use=i < used, health="unhealthy" if i >= 4 - unhealthy else "healthy")
        for i in range(4)
    ]
    storage = [location("/models", list(models))] if models else None
    return report(name, gpus=cards, storage=storage)


class Consumer:
    """What a console keeps: a table merged from one full answer and deltas."""

    def __init__(self) -> None:
        self.cursor = ""
        self.rows: dict[str, dict[str, Any]] = {}
        self.ages: dict[str, float | None] = {}

    def merge(self, delta: NodesDelta) -> None:
        if delta.full:
            self.rows.clear()
        for row in delta.nodes:
            self.rows[row.name] = row.model_dump(exclude={"report_age_s"})
        for name in delta.removed:
            self.rows.pop(name, None)
        self.ages = dict(delta.report_ages)
        self.cursor = delta.cursor


def plain(rows: list[NodeRow]) -> tuple[dict[str, dict[str, Any]], dict[str, float | None]]:
    return (
        {r.name: r.model_dump(exclude={"report_age_s"}) for r in rows},
        {r.name: r.report_age_s for r in rows},
    )


def pydantic_list(rows: list[NodeRow]) -> bytes:
    return b"[" + b",".join(r.model_dump_json(by_alias=True).encode() for r in rows) + b"]"


async def play(state_dir: Path, actions: list[tuple[Any, ...]]) -> None:
    app = create_app(
        ControllerSettings(state_dir=state_dir, reconcile_interval_s=3600, reconcile_on_news=False)
    )
    async with TestServer(app) as server:
        fleet = term_of(app)
        clock = FakeClock(fleet.facts.clock())
        fleet.facts.clock = clock  # ages then agree between two requests
        fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
        last: dict[str, NodeReport] = {}
        consumers = [Consumer(), Consumer()]
        async with AdminClient(str(server.make_url(""))) as admin:

            async def poll(consumer: Consumer) -> None:
                # The cached encodings (row_json) are byte for byte what the models write.
                listed = fleet.rows.rows_json()
                assert listed == pydantic_list(fleet.rows.rows())
                since = fleet.rows.nodes_since_json(consumer.cursor)
                assert since == fleet.rows.nodes_since(consumer.cursor).model_dump_json().encode()
                consumer.merge(await admin.nodes_since(consumer.cursor))
                assert (consumer.rows, consumer.ages) == plain(await admin.nodes())

            for act in actions:
                kind, *args = act
                name = args[0] if kind not in ("time", "poll") else ""
                known = name in fleet.facts.nodes
                if kind == "report":
                    last[name] = node_report(name, *args[1:])
                    fleet.ingest(last[name])
                elif kind == "same report" and name in last:
                    fleet.ingest(last[name])
                elif kind == "admin" and known:
                    if args[1] == "cordon":
                        await admin.cordon(name, args[2])
                    elif args[1] == "drain":
                        await admin.drain(name, args[2])
                    else:
                        await admin.uncordon(name)
                elif kind == "time":
                    clock.advance(args[0])
                elif kind == "replica" and known:
                    rid = f"r-{name}"
                    if rid in fleet.facts.records:
                        fleet.facts.remove_replicas([rid])
                    else:
                        fleet.facts.put_replicas([replica(rid, name, [f"GPU-{name}-3"])])
                elif kind == "drain blocked" and known:
                    blocked = fleet.facts.decisions.drain_blocked.get(name)
                    fleet.facts.decisions.set_drain_blocked(
                        name, None if blocked else "waiting for a stand-in"
                    )
                elif kind == "poll":
                    await poll(consumers[args[0]])
            for consumer in consumers:
                await poll(consumer)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=st.lists(action, max_size=30))
def test_a_full_answer_plus_deltas_is_the_node_list(
    tmp_path_factory: pytest.TempPathFactory, actions: list[tuple[Any, ...]]
) -> None:
    asyncio.run(play(tmp_path_factory.mktemp("state"), actions))
