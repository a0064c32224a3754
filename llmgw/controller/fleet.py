"""The controller's state: durable records (via the store) plus soft reports.

Every view the API serves (summary, node rows, node detail, replicas, models)
is derived here from one set of facts, so no two answers can disagree.
"""

from __future__ import annotations

import heapq
import re
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from llmgw.controller.nodes import NodeEntry, ShardDigest, digest_report, node_state
from llmgw.controller.replicas import ReplicaStatus, replica_status, replica_view
from llmgw.controller.settings import ControllerSettings
from llmgw.controller.store import Backoff, ReplicaRecord, Store
from llmgw.controller.summary import FleetTotals, NodeFacts, build_summary
from llmgw.wire import (
    AdminFlag,
    AdminInfo,
    FleetSummary,
    ModelSpec,
    ModelView,
    NodeDetail,
    NodeReport,
    NodeRow,
    NodesDelta,
    NodeState,
    ReplicaState,
    ReplicaView,
    ReportReply,
    ShardAssignment,
)


class UnknownNode(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no node named {name!r} has ever reported to this controller")
        self.name = name


class UnknownModel(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no model named {name!r} is declared")
        self.name = name


class BadCursor(ValueError):
    def __init__(self, cursor: str) -> None:
        shown = cursor if len(cursor) <= 40 else cursor[:40] + "…"
        super().__init__(
            "`since` must be the cursor from an earlier answer (EPOCH.REVISION, e.g."
            f" 9f2c01ab.42), or empty for every node; got {shown!r}"
        )
        self.cursor = cursor


_CURSOR = re.compile(r"([0-9A-Fa-f]{1,32})\.([0-9]{1,64})")
# Forgotten nodes remembered for `removed`; a cursor older than the last one
# dropped from this list gets a full answer instead.
TOMBSTONES_KEPT = 10_000


class Fleet:
    def __init__(
        self,
        store: Store,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.started_at = clock()
        self.entries: dict[str, NodeEntry] = {
            name: NodeEntry(name, first_seen) for name, first_seen in store.known_nodes().items()
        }
        self.admin: dict[str, AdminInfo] = store.admin()
        self.models: dict[str, ModelSpec] = store.models()
        self.records: dict[str, ReplicaRecord] = store.replicas()
        self.backoffs: dict[str, Backoff] = store.backoffs()
        # Written by the reconcile loop: why a model cannot be placed, why a drain waits.
        self.unplaceable_reasons: dict[str, str] = {}
        self.drain_blocked: dict[str, str] = {}
        self._by_node: dict[str, list[ReplicaRecord]] = {}
        # Bumped whenever any node's assignments may have changed.
        self._assignments_version = 0
        self._replies: dict[str, tuple[tuple[object, ...], bytes]] = {}
        self._index_records()
        # Running sums for the summary, and what each node last put into them.
        self.totals = FleetTotals()
        self._facts: dict[str, NodeFacts] = {}
        # (moment a node turns unreachable, node): popped lazily as time passes.
        self._deadlines: list[tuple[float, str]] = []
        # First sightings are written in batches: one fsync per node would stall
        # the loop when a whole fleet registers at once.
        self._unsaved_nodes: dict[str, float] = {}
        for name in self.entries:
            self._watch(name)
        # `nodes_since`: cursors are "EPOCH.REVISION". The epoch is new every run,
        # so a cursor from an earlier controller gets a full answer.
        self.epoch = secrets.token_hex(4)
        self.revision = 0
        # node -> (fingerprint of its row less the report age, revision it last changed at)
        self._row_marks: dict[str, tuple[tuple[object, ...], int]] = {}
        self._tombstones: dict[str, int] = {}  # forgotten node -> revision it went at
        self._tombstones_dropped_at = 0  # cursors older than this get a full answer

    # -- running totals -------------------------------------------------------

    def unreachable_at(self, entry: NodeEntry) -> float:
        """The moment (monotonic) this node turns unreachable unless it reports."""
        return entry.last_heard(self.started_at) + self.grace_s(entry)

    def _watch(self, name: str, now: float | None = None) -> None:
        """Bring a node's contribution to the totals up to date, and note when
        its liveness will next change."""
        entry = self.entries[name]
        heapq.heappush(self._deadlines, (self.unreachable_at(entry), name))
        self._settle(name, now)

    def _settle(self, name: str, now: float | None = None) -> None:
        entry = self.entries[name]
        d = entry.digest
        facts = NodeFacts(
            state=self.state_of(name, now),
            fabrics=d.fabrics,
            classes=d.classes,
            entirely_free=d.entirely_free,
            models=d.models,
            copies=d.copies,
        )
        old = self._facts.get(name)
        if old == facts:
            return
        if old is not None:
            self.totals.remove(old)
        self.totals.add(facts)
        self._facts[name] = facts

    def _expire(self, now: float) -> None:
        """Nodes whose grace ran out since the last look become unreachable."""
        heap = self._deadlines
        while heap and heap[0][0] < now:
            deadline, name = heapq.heappop(heap)
            if deadline == self.unreachable_at(self.entries[name]):  # else superseded by a report
                self._settle(name, now)

    def flush(self) -> None:
        """Write first sightings of nodes (called every second and at shutdown)."""
        if self._unsaved_nodes:
            self.store.add_nodes(self._unsaved_nodes.items())
            self._unsaved_nodes.clear()

    def _index_records(self) -> None:
        by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in self.records.values():
            for shard in rec.shards:
                by_node[shard.node].append(rec)
        self._by_node = dict(by_node)
        self._assignments_version += 1

    def assigned_gpus(self, node: str) -> frozenset[str]:
        return frozenset(
            gpu
            for rec in self._by_node.get(node, ())
            for shard in rec.shards
            if shard.node == node
            for gpu in shard.gpus
        )

    # -- agent reports ----------------------------------------------------------

    def grace_s(self, entry: NodeEntry) -> float:
        return entry.grace_s(self.settings.grace_intervals, self.settings.grace_extra_s)

    def state_of(self, name: str, now: float | None = None) -> NodeState:
        entry = self.entries[name]
        now = self.clock() if now is None else now
        return node_state(entry, self.admin.get(name), now, self.grace_s(entry), self.started_at)

    def ingest(self, report: NodeReport, raw: bytes | None = None) -> ReportReply:
        """Take a node's report; `raw` is the body as received, kept for the detail view."""
        return self.reply(report.node, self._take(report, raw))

    def ingest_json(self, report: NodeReport, raw: bytes | None = None) -> bytes:
        """`ingest`, with the reply serialised. Most replies repeat the node's
        last one word for word, so each node's is kept until its state or the
        assignments change."""
        node = report.node
        now = self._take(report, raw)
        key = (self.admin_info(node).flag, self.state_of(node, now), self._assignments_version)
        cached = self._replies.get(node)
        if cached is not None and cached[0] == key:
            return cached[1]
        body = self.reply(node, now).model_dump_json().encode()
        self._replies[node] = (key, body)
        return body

    def _take(self, report: NodeReport, raw: bytes | None) -> float:
        now = self.clock()
        entry = self.entries.get(report.node)
        if entry is None:
            entry = self.entries[report.node] = NodeEntry(report.node, self.wall())
            self._unsaved_nodes[report.node] = entry.first_seen
        if report.address != entry.address and self._by_node.get(report.node):
            # A leader's address is in its followers' assignments. Only a node
            # holding replicas can lead one: a new node's first report must not
            # throw away every node's cached reply.
            self._assignments_version += 1
        digest = digest_report(report, now, self.assigned_gpus(report.node))
        entry.update(report, raw or report.model_dump_json().encode(), now, digest)
        self._watch(report.node, now)
        self._expire(now)
        return now

    def reply(self, node: str, now: float) -> ReportReply:
        return ReportReply(
            node=node,
            admin_flag=self.admin_info(node).flag,
            state=self.state_of(node, now),
            assignments=self.assignments_for(node),
        )

    def refresh_digest(self, node: str) -> None:
        """Re-derive a node's digest after its replica assignments changed."""
        entry = self.entries.get(node)
        report = entry.report if entry else None
        if entry is None or report is None or entry.received_at is None:
            return
        digest = digest_report(report, entry.received_at, self.assigned_gpus(node))
        if digest != entry.digest:  # keep the old object when equal, as NodeEntry.update does
            entry.digest = digest
        self._settle(node)

    def set_drain_blocked(self, node: str, why: str | None) -> None:
        """Why a drain of `node` is not progressing (None: it is, or it is over)."""
        if why:
            self.drain_blocked[node] = why
        else:
            self.drain_blocked.pop(node, None)

    def assignments_for(self, node: str) -> list[ShardAssignment]:
        out = []
        for rec in self._by_node.get(node, ()):
            spec = self.models.get(rec.model)
            if spec is None or rec.state is ReplicaState.FAILED:
                continue
            leader = rec.shards[0].node
            leader_entry = self.entries.get(leader)
            leader_address = leader_entry.address if leader_entry else None
            for shard in rec.shards:
                if shard.node != node:
                    continue
                out.append(
                    ShardAssignment(
                        replica_id=rec.id,
                        model=rec.model,
                        source=spec.source,
                        engine=spec.engine,
                        engine_args=list(spec.engine_args),
                        gpus=list(shard.gpus),
                        rank=shard.rank,
                        nnodes=len(rec.shards),
                        leader_node=leader,
                        leader_address=leader_address,
                        port=rendezvous_port(rec.id) if len(rec.shards) > 1 else None,
                    )
                )
        return out

    # -- admin flags -------------------------------------------------------------

    def admin_info(self, name: str) -> AdminInfo:
        return self.admin.get(name) or AdminInfo()

    def require(self, name: str) -> NodeEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise UnknownNode(name)
        return entry

    def set_flag(
        self, name: str, flag: AdminFlag, reason: str | None, by: str, *, force: bool = False
    ) -> NodeRow:
        self.require(name)
        at = self.wall()
        info = (
            AdminInfo(flag=flag, reason=reason, by=by, at=at, force=force)
            if flag is not AdminFlag.NONE
            else AdminInfo()
        )
        action = {
            AdminFlag.NONE: "uncordon",
            AdminFlag.CORDONED: "cordon",
            AdminFlag.DRAINING: "drain",
        }[flag]
        self.store.set_admin(name, info, action=action, by=by, at=at)
        if flag is AdminFlag.NONE:
            self.admin.pop(name, None)
        else:
            self.admin[name] = info
        self.drain_blocked.pop(name, None)
        self._settle(name)
        return self.row(name)

    def mark_drained(self, name: str) -> None:
        """A drain finished: the node stays cordoned, marked as drained."""
        old = self.admin_info(name)
        at = self.wall()
        info = AdminInfo(
            flag=AdminFlag.CORDONED, reason=old.reason, by=old.by, at=old.at, drained=True
        )
        self.store.set_admin(name, info, action="drained", by="controller", at=at)
        self.admin[name] = info
        self.drain_blocked.pop(name, None)
        self._settle(name)

    # -- models and replicas ------------------------------------------------------

    def put_models(self, specs: Iterable[ModelSpec]) -> None:
        specs = list(specs)
        self.store.put_models(specs, self.wall())
        for spec in specs:
            self.models[spec.name] = spec
        self._assignments_version += 1  # source, engine and arguments come from specs

    def delete_model(self, name: str) -> None:
        if name not in self.models:
            raise UnknownModel(name)
        self.store.delete_model(name)
        del self.models[name]
        self._assignments_version += 1
        self.backoffs.pop(name, None)
        self.unplaceable_reasons.pop(name, None)
        # Its replicas go with it: the agents stop engines no longer assigned.
        self.remove_replicas([r.id for r in self.records.values() if r.model == name])

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        records = list(records)
        if not records:
            return
        self.store.put_replicas(records)
        touched: set[str] = set()
        for rec in records:
            old = self.records.get(rec.id)
            touched.update(old.nodes if old else ())
            touched.update(rec.nodes)
            self.records[rec.id] = rec
        self._index_records()
        for node in touched:
            self.refresh_digest(node)

    def remove_replicas(self, ids: Iterable[str]) -> None:
        ids = [i for i in ids if i in self.records]
        if not ids:
            return
        self.store.delete_replicas(ids)
        touched: set[str] = set()
        for i in ids:
            touched.update(self.records.pop(i).nodes)
        self._index_records()
        for node in touched:
            self.refresh_digest(node)

    def replica_statuses(self) -> dict[str, ReplicaStatus]:
        reported: dict[tuple[str, int], ShardDigest] = {}
        for node in self._by_node:
            entry = self.entries.get(node)
            if entry is None:
                continue
            for shard in entry.shards:
                reported[(shard.replica_id, shard.rank)] = shard
        return {rid: replica_status(rec, reported) for rid, rec in self.records.items()}

    # -- views ----------------------------------------------------------------------

    def summary(self) -> FleetSummary:
        now = self.clock()
        self._expire(now)
        return build_summary(
            self.totals,
            self.admin,
            self.entries,
            self.replica_statuses(),
            self.models,
            self.unplaceable_reasons,
            now,
            self.wall(),
        )

    def row(self, name: str, now: float | None = None) -> NodeRow:
        entry = self.require(name)
        now = self.clock() if now is None else now
        d = entry.digest
        return NodeRow(
            name=name,
            state=self.state_of(name, now),
            admin=self.admin_info(name),
            report_age_s=None if entry.received_at is None else round(now - entry.received_at, 1),
            classes={cls: c.total for cls, c in d.classes},
            gpus_total=d.gpus_total,
            gpus_used=sum(c.used for _, c in d.classes),
            gpus_unhealthy=sum(c.unhealthy for _, c in d.classes),
            gpus_unknown=sum(c.unknown for _, c in d.classes),
            fabrics=list(d.fabrics),
            models=sorted(d.models),
            replicas=len(self._by_node.get(name, ())),
            gpu_error=entry.gpu_error,
            drain_blocked=self.drain_blocked.get(name),
        )

    def rows(self) -> list[NodeRow]:
        now = self.clock()
        return [self.row(name, now) for name in sorted(self.entries)]

    def _mark_changes(self, now: float) -> None:
        """Bring each node's last-changed revision up to date: nodes whose row
        changed since the last look, and nodes forgotten since, get the next revision.

        A node's fingerprint is everything `row` shows except the report age,
        taken without building the row: state, admin flag, digest (cards,
        fabrics, models), replica count, GPU error, why a drain waits. Any new
        field of `NodeRow` must be added here, or changes to it are never sent.
        The objects are mostly the very ones of the last look (a digest is kept
        while it is unchanged), so comparing them is cheap.
        """
        marks, entries = self._row_marks, self.entries
        admin, by_node, blocked = self.admin.get, self._by_node.get, self.drain_blocked.get
        rev = self.revision + 1
        changed = False
        for name, entry in entries.items():
            fp = (
                self.state_of(name, now),
                admin(name),
                entry.digest,
                len(by_node(name, ())),
                entry.gpu_error,
                blocked(name),
            )
            old = marks.get(name)
            if old is None or old[0] != fp:
                marks[name] = (fp, rev)
                self._tombstones.pop(name, None)
                changed = True
        if len(marks) > len(entries):  # every entry has a mark: the rest are gone
            for name in [n for n in marks if n not in entries]:
                del marks[name]
                self._tombstones[name] = rev
                changed = True
            while len(self._tombstones) > TOMBSTONES_KEPT:
                oldest = next(iter(self._tombstones))
                self._tombstones_dropped_at = self._tombstones.pop(oldest)
        if changed:
            self.revision = rev

    def nodes_since(self, since: str) -> NodesDelta:
        """The node rows that changed after cursor `since` ("" for all); see `NodesDelta`.

        Raises `BadCursor` when `since` is neither empty nor EPOCH.REVISION.
        """
        after: int | None = None  # None: a full answer
        if since:
            m = _CURSOR.fullmatch(since)
            if m is None:
                raise BadCursor(since)
            epoch, rev = m.group(1).lower(), int(m.group(2))
            if epoch == self.epoch:
                after = rev
        now = self.clock()
        self._mark_changes(now)
        if after is not None and not (self._tombstones_dropped_at <= after <= self.revision):
            after = None  # not issued by this run, or older than the tombstones kept
        # By name, like `rows`; the same rounding as `row`.
        ages = {
            name: None if (received := entry.received_at) is None else round(now - received, 1)
            for name, entry in sorted(self.entries.items())
        }
        if after is None:
            rows = [self.row(name, now) for name in ages]
            removed: list[str] = []
        else:
            marks = self._row_marks
            rows = [self.row(name, now) for name in ages if marks[name][1] > after]
            removed = sorted(n for n, gone_at in self._tombstones.items() if gone_at > after)
        return NodesDelta(
            cursor=f"{self.epoch}.{self.revision}",
            full=after is None,
            nodes=rows,
            removed=removed,
            report_ages=ages,
        )

    def detail(self, name: str) -> NodeDetail:
        entry = self.require(name)
        report = entry.report
        return NodeDetail(
            row=self.row(name),
            gpus=list(report.gpus) if report else [],
            storage_configured=report.storage_configured if report else False,
            storage=list(report.storage) if report else [],
            replicas=list(report.replicas) if report else [],
            history=self.store.history(name),
            agent_version=report.agent_version if report else None,
            address=report.address if report else None,
        )

    def replica_views(self) -> list[ReplicaView]:
        now = self.clock()
        return [replica_view(s, now) for s in self.replica_statuses().values()]

    def model_views(self) -> list[ModelView]:
        states: dict[str, Counter[ReplicaState]] = defaultdict(Counter)
        for status in self.replica_statuses().values():
            states[status.record.model][status.state] += 1
        views = []
        for name, spec in sorted(self.models.items()):
            mine = states[name]
            # A draining replica still answers until its stand-in is ready.
            ready = mine[ReplicaState.READY] + mine[ReplicaState.DRAINING]
            backoff = self.backoffs.get(name)
            views.append(
                ModelView(
                    spec=spec,
                    ready=ready,
                    starting=mine[ReplicaState.STARTING],
                    failed=mine[ReplicaState.FAILED],
                    satisfied=ready >= spec.min_replicas,
                    unplaceable_reason=self.unplaceable_reasons.get(name),
                    last_failure=backoff.last_failure if backoff else None,
                )
            )
        return views


def rendezvous_port(replica_id: str) -> int:
    """A stable port for a multi-node replica's leader, derived from its id."""
    return 29500 + sum(replica_id.encode()) % 500
