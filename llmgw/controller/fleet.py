"""`FleetState`: the one owner of the controller's fleet state.

Durable records (through the store) and soft agent reports live here, and only
here. Every change goes through a method of `FleetState`, which writes what is
durable and appends what changed to the change log (`changes.ChangeLog`).
Everything incremental derives from that one place: node-row revisions for
`?since=`, cached report replies, the summary's running totals, long polls.

Other modules read the state through read-only mappings (`nodes`, `admin`,
`models`, `records`, `backoffs`, `unplaceable_reasons`, `drain_blocked`).

Every view the API serves (summary, node rows, node detail, replicas, models)
is derived from the same facts, so no two answers can disagree.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import re
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from llmgw.controller.autoscale import Decision
from llmgw.controller.changes import Change, ChangeKind, ChangeLog, HistoryLost
from llmgw.controller.events import KEEP as EVENTS_KEPT
from llmgw.controller.events import KEEP_S as EVENTS_KEPT_S
from llmgw.controller.events import Events
from llmgw.controller.nodes import NodeEntry, ShardDigest, digest_report, node_state
from llmgw.controller.replicas import ReplicaStatus, replica_status, replica_view
from llmgw.controller.revisions import (
    ENGINE_FIELDS,
    SEEDED,
    Revisions,
    describe_change,
    same_engine,
)
from llmgw.controller.row_json import RowEncodings, delta_json, json_list
from llmgw.controller.settings import ControllerSettings
from llmgw.controller.store import Backoff, ReplicaRecord
from llmgw.controller.stores.base import StateStore
from llmgw.controller.summary import FleetTotals, NodeFacts, build_summary
from llmgw.errors import AwaitsApproval, BadCursor, BadRequest, UnknownModel, UnknownNode
from llmgw.present import timestamp
from llmgw.wire import (
    AdminFlag,
    AdminInfo,
    EventList,
    EventReason,
    FleetSummary,
    ModelRevision,
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
    RolloutState,
    RolloutView,
    ShardAssignment,
    ShardState,
    WakingModel,
)

_CURSOR = re.compile(r"([0-9A-Fa-f]{1,32})\.([0-9]{1,64})")

# A node row's content: every `NodeRow` field except the report age.
RowContent = dict[str, Any]
# Who the admin history names for what llmgw decides by itself (a drain done or
# forced, a cordon for a failed card), never an operator's name.
BY_LLMGW = "llmgw"
AWAITING_APPROVAL = "awaiting approval: llmgw ctl credentials approve NODE"
_NO_ADMIN = AdminInfo()  # shared, never mutated: built once, not once per report
_CAPACITY_VERSIONS = itertools.count(1)


class FleetState:
    def __init__(
        self,
        store: StateStore,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.started_at = clock()
        self._log = ChangeLog()
        # Cursors are "EPOCH.REVISION". The epoch is new every run, so a cursor
        # from an earlier controller gets a full answer.
        self.epoch = secrets.token_hex(4)
        self._entries: dict[str, NodeEntry] = {
            name: NodeEntry(name, first_seen) for name, first_seen in store.known_nodes().items()
        }
        self._admin: dict[str, AdminInfo] = store.admin()
        self._models: dict[str, ModelSpec] = store.models()
        self._records: dict[str, ReplicaRecord] = store.replicas()
        self._backoffs: dict[str, Backoff] = store.backoffs()
        self._revisions = Revisions(store.revisions())
        self._events = Events(store.events(EVENTS_KEPT))
        # Nodes enrolled that await an admin's approval (--enroll-approval): shown as
        # cordoned by llmgw, so nothing is placed there, until `ctl credentials approve`.
        self._pending: dict[str, AdminInfo] = {
            name: _awaiting(at) for name, at in store.pending_credentials().items()
        }
        # Decided by the reconcile loop: a rollout that waits or stalled, and why.
        self._rollout_notes: dict[str, tuple[RolloutState, str]] = {}
        # Decided by the reconcile loop: each autoscaled model's desired replicas,
        # its requests in flight as the autoscaler read them, and why.
        self._scaling: dict[str, Decision] = {}
        # Decided by the reconcile loop: why a model cannot be placed, why a drain waits.
        self._unplaceable: dict[str, str] = {}
        self._drain_blocked: dict[str, str] = {}
        # Replicas out of routing before their stop: id -> (revision, monotonic time)
        # of the change that marked them (the gateway handshake, endpoints.py).
        self._stopping: dict[str, tuple[int, float]] = {}
        # Replica id -> when a gateway last saw a request for it (monotonic): idleness
        # counts these as well as the engines' own counters, whichever is later.
        self._gateway_activity: dict[str, float] = {}
        # Specs of deleted models whose replicas are still stopping (the gateway
        # handshake): their engines keep their assignments until the stop.
        self._retiring: dict[str, ModelSpec] = {}
        self._by_node: dict[str, list[ReplicaRecord]] = {}
        self._index_records()
        # Each node's last row content (the fingerprint the NODE changes come
        # from) and its last reply, keyed by the revisions it was built at.
        self._rows: dict[str, RowContent] = {}
        self._row_json = RowEncodings()  # the same rows, encoded for GET /v1/nodes
        self._replies: dict[str, tuple[tuple[int, int], bytes]] = {}
        # Running sums for the summary, and what each node last put into them.
        self.totals = FleetTotals()
        self._facts: dict[str, NodeFacts] = {}
        # Moves whenever something placement reads may have changed (see `capacity_version`).
        # From one counter for the whole process, so that a version is never seen
        # twice, even by a reconcile loop that outlives this state (a reload).
        self._capacity_version = next(_CAPACITY_VERSIONS)
        self._capacity_at: dict[str, int] = {}  # node -> the version of its last such change
        # (moment a node turns unreachable, node): popped lazily as time passes.
        self._deadlines: list[tuple[float, str]] = []
        # Times a node turned unreachable, for /metrics: a node that drops out
        # and comes back within minutes never shows in a sampled gauge.
        self.turned_unreachable = 0
        # First sightings are written in batches: one fsync per node would stall
        # the loop when a whole fleet registers at once.
        self._unsaved_nodes: dict[str, float] = {}
        now = clock()
        for name in self._entries:
            self._watch(name, now)

    def reload(self) -> None:
        """Start again from the durable state, as a restart does: a new leader's
        term (another controller may have written the store since this one led)."""
        # Counters never go back in one process.
        turned, counts = self.turned_unreachable, self._events.counts
        self.flush_events()  # this term's last, before the next term reads them
        FleetState.__init__(self, self._store, self.settings, clock=self.clock, wall=self.wall)
        self.turned_unreachable = turned
        self._events.counts = counts

    # -- read-only views of the state ------------------------------------------------

    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        return MappingProxyType(self._entries)

    @property
    def admin(self) -> Mapping[str, AdminInfo]:
        return MappingProxyType(self._admin)

    @property
    def pending(self) -> Mapping[str, AdminInfo]:
        """Nodes enrolled and awaiting approval (what their rows show)."""
        return MappingProxyType(self._pending)

    @property
    def models(self) -> Mapping[str, ModelSpec]:
        return MappingProxyType(self._models)

    @property
    def records(self) -> Mapping[str, ReplicaRecord]:
        return MappingProxyType(self._records)

    @property
    def backoffs(self) -> Mapping[str, Backoff]:
        return MappingProxyType(self._backoffs)

    @property
    def unplaceable_reasons(self) -> Mapping[str, str]:
        """Why each model short of its minimum gets no new replica: the
        scheduler's reason, else the failure its replicas keep ending with
        (an engine no node has, say). The one wording every view shows:
        ctl models, ctl status, the console, the gateway's 503."""
        reasons = dict(self._unplaceable)
        wall = self.wall()
        for name, backoff in self._backoffs.items():
            if name in reasons or not backoff.last_failure:
                continue
            why = f"its replicas fail: {backoff.last_failure}"
            if backoff.retry_at > wall:
                why += f" (failure {backoff.failures}; next try at {timestamp(backoff.retry_at)})"
            reasons[name] = why
        return MappingProxyType(reasons)

    @property
    def drain_blocked(self) -> Mapping[str, str]:
        return MappingProxyType(self._drain_blocked)

    @property
    def stopping(self) -> Mapping[str, tuple[int, float]]:
        return MappingProxyType(self._stopping)

    def replicas_on(self, node: str) -> list[ReplicaRecord]:
        return list(self._by_node.get(node, ()))

    def mark_stopping(self, replica_id: str) -> tuple[int, float]:
        """Take a replica out of routing before it is stopped; returns (revision, when)."""
        mark = self._stopping.get(replica_id)
        if mark is None and replica_id in self._records:
            revision = self._log.append(ChangeKind.REPLICA, replica_id)
            mark = self._stopping[replica_id] = (revision, self.clock())
        return mark or (self._log.revision, self.clock())

    def note_requests(self, replica_ids: Iterable[str], now: float) -> None:
        """A gateway saw new requests for these replicas (soft state, like reports)."""
        for rid in replica_ids:
            if rid in self._records:
                self._gateway_activity[rid] = now

    @property
    def capacity_version(self) -> int:
        """Moves whenever something placement reads may have changed: a node's facts
        (state, cards, fabrics, weights held), a node forgotten, replicas placed or
        removed, model specs. The reconcile loop tries a model that cannot be placed
        again only once this has moved, not on every pass."""
        return self._capacity_version

    def capacity_changed_at(self, name: str) -> int:
        """The `capacity_version` of the last change to what placement reads of this
        node: its facts, its cards, the cards assigned on it (0: none this run)."""
        return self._capacity_at.get(name, 0)

    def _capacity_moved(self, node: str) -> None:
        self._capacity_version = next(_CAPACITY_VERSIONS)
        self._capacity_at[node] = self._capacity_version

    # -- the change log ----------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._log.revision

    def changes_since(self, revision: int) -> list[Change]:
        """Every change after `revision`; `HistoryLost` when it is too old (or not yet
        issued): the caller then gives a full answer."""
        return self._log.since(revision)

    async def wait_changed(self, after_revision: int, timeout_s: float) -> int:
        """For long polls: the revision, once past `after_revision` or after `timeout_s`."""
        return await self._log.wait_changed(after_revision, timeout_s)

    # -- nodes: rows, totals and liveness ---------------------------------------------

    def unreachable_at(self, entry: NodeEntry) -> float:
        """The moment (monotonic) this node turns unreachable unless it reports."""
        return entry.last_heard(self.started_at) + self.grace_s(entry)

    def grace_s(self, entry: NodeEntry) -> float:
        return entry.grace_s(self.settings.grace_intervals, self.settings.grace_extra_s)

    def state_of(self, name: str, now: float | None = None) -> NodeState:
        entry = self._entries[name]
        now = self.clock() if now is None else now
        return node_state(entry, self.admin_info(name), now, self.grace_s(entry), self.started_at)

    def _watch(self, name: str, now: float) -> None:
        """Note when a node's liveness next changes, and bring it up to date."""
        heapq.heappush(self._deadlines, (self.unreachable_at(self._entries[name]), name))
        self._refresh(name, now)

    def _refresh(self, name: str, now: float | None = None) -> None:
        """The one place a node's change is noticed: its row content (built by
        the code that builds the row) against the last one, appending a NODE
        change when it differs, and its contribution to the summary's totals."""
        now = self.clock() if now is None else now
        content = self._row_content(name, now)
        if content != self._rows.get(name):
            self._rows[name] = content
            self._row_json.drop(name)
            self._log.append(ChangeKind.NODE, name)
        d = self._entries[name].digest
        facts = NodeFacts(
            state=content["state"],
            fabrics=d.fabrics,
            classes=d.classes,
            entirely_free=d.entirely_free,
            models=d.models,
            copies=d.copies,
            engines=d.engines,
        )
        old = self._facts.get(name)
        if old != facts:
            if (
                facts.state == NodeState.UNREACHABLE
                and old is not None
                and old.state != NodeState.UNREACHABLE
            ):
                self.turned_unreachable += 1
            self._capacity_moved(name)
            if old is not None:
                self.totals.remove(old)
            self.totals.add(facts)
            self._facts[name] = facts

    def advance_time(self, now: float | None = None) -> None:
        """Nodes whose grace ran out since the last look become unreachable.

        Called by every reader that shows liveness and by the reconcile loop
        each pass, so time-driven changes reach the log within a pass."""
        now = self.clock() if now is None else now
        heap = self._deadlines
        while heap and heap[0][0] < now:
            deadline, name = heapq.heappop(heap)
            entry = self._entries.get(name)
            if entry is not None and deadline == self.unreachable_at(entry):  # else superseded
                self._refresh(name, now)

    def flush(self) -> None:
        """Write first sightings of nodes and the events since the last flush
        (called every second and at shutdown)."""
        if self._unsaved_nodes:
            self._store.add_nodes(self._unsaved_nodes.items())
            self._unsaved_nodes.clear()
        self.flush_events()

    # -- events: what the controller decided by itself ----------------------------------------

    def event(self, obj: str, reason: EventReason, message: str) -> None:
        """Record a decision the controller took by itself (`llmgw.controller.events`)."""
        self._events.add(self.wall(), obj, reason, message)

    def events(self, after: int = 0, obj: str | None = None) -> EventList:
        found = self._events.since(after, obj)
        return EventList(events=found, cursor=found[-1].id if found else after)

    @property
    def event_counts(self) -> Mapping[EventReason, int]:
        return self._events.counts

    def flush_events(self) -> None:
        unsaved = self._events.unsaved()
        if not unsaved:
            return
        oldest = self.wall() - EVENTS_KEPT_S
        try:
            self._store.add_events(
                unsaved, keep_after_id=unsaved[-1].id - EVENTS_KEPT, keep_after=oldest
            )
        except Exception:
            self._events.put_back(unsaved)
            raise
        self._events.forget_before(oldest)

    def close(self) -> None:
        """The final save, then the store is closed."""
        self.flush()
        self._store.close()

    def _index_records(self) -> None:
        by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in self._records.values():
            for shard in rec.shards:
                by_node[shard.node].append(rec)
        self._by_node = dict(by_node)

    def assigned_gpus(self, node: str) -> frozenset[str]:
        return frozenset(
            gpu
            for rec in self._by_node.get(node, ())
            for shard in rec.shards
            if shard.node == node
            for gpu in shard.gpus
        )

    # -- agent reports ----------------------------------------------------------------

    def ingest(self, report: NodeReport, raw: bytes | None = None) -> ReportReply:
        """Take a node's report; `raw` is the body as received, kept for the detail view."""
        return self.reply(report.node, self._take(report, raw))

    def ingest_json(self, report: NodeReport, raw: bytes | None = None) -> bytes:
        """`ingest`, with the reply serialised. Most replies repeat the node's
        last one word for word, so each is kept until the node's row (its state
        and admin flag) or its assignments change."""
        node = report.node
        now = self._take(report, raw)
        key = (
            self._log.latest(ChangeKind.NODE, node),
            self._log.latest(ChangeKind.ASSIGNMENTS, node),
        )
        cached = self._replies.get(node)
        if cached is not None and cached[0] == key:
            return cached[1]
        body = self.reply(node, now).model_dump_json().encode()
        self._replies[node] = (key, body)
        return body

    def _take(self, report: NodeReport, raw: bytes | None) -> float:
        now = self.clock()
        entry = self._entries.get(report.node)
        if entry is None:
            entry = self._entries[report.node] = NodeEntry(report.node, self.wall())
            self._unsaved_nodes[report.node] = entry.first_seen
        if report.address != entry.address:
            # A leader's address is in its followers' assignments.
            self._assignments_changed(
                n
                for rec in self._by_node.get(report.node, ())
                if rec.shards[0].node == report.node
                for n in rec.nodes
            )
        digest = digest_report(report, now, self.assigned_gpus(report.node))
        cards = entry.cards
        listening = _listening(entry)
        entry.update(report, raw or report.model_dump_json().encode(), now, digest)
        if _listening(entry) != listening:  # an engine restarted on a new port: same id
            self._log.append(ChangeKind.LISTENING, report.node)
        if entry.cards is not cards:  # kept when equal: a new object is a change
            self._capacity_moved(report.node)
        self._watch(report.node, now)
        self.advance_time(now)
        return now

    def _assignments_changed(self, nodes: Iterable[str]) -> None:
        for node in sorted(set(nodes)):
            self._log.append(ChangeKind.ASSIGNMENTS, node)

    def reply(self, node: str, now: float) -> ReportReply:
        return ReportReply(
            node=node,
            admin_flag=self.admin_info(node).flag,
            state=self.state_of(node, now),
            assignments=self.assignments_for(node),
        )

    def _refresh_digest(self, node: str) -> None:
        """Re-derive a node's digest after its replica assignments changed."""
        entry = self._entries.get(node)
        if entry is None:
            return
        report = entry.report
        if report is not None and entry.received_at is not None:
            digest = digest_report(report, entry.received_at, self.assigned_gpus(node))
            if digest != entry.digest:  # keep the old object when equal, as NodeEntry.update does
                entry.digest = digest
        self._refresh(node)

    def assignments_for(self, node: str) -> list[ShardAssignment]:
        out = []
        for rec in self._by_node.get(node, ()):
            spec = self.spec_of(rec)
            if spec is None or rec.state is ReplicaState.FAILED:
                continue
            leader = rec.shards[0].node
            leader_entry = self._entries.get(leader)
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

    # -- admin flags ----------------------------------------------------------------------

    def admin_info(self, name: str) -> AdminInfo:
        """The node's admin flag; else, awaiting approval, a cordon by llmgw saying so."""
        return self._admin.get(name) or self._pending.get(name) or _NO_ADMIN

    # -- approval of enrolled nodes ---------------------------------------------------------

    def await_approval(self, name: str, enrolled_at: float) -> None:
        """A node enrolled (its credential stored as pending): no work until approved."""
        self._pending[name] = _awaiting(enrolled_at)
        self._admin_changed(name)
        self.event(
            f"node/{name}",
            EventReason.AWAITING_APPROVAL,
            f"enrolled; gets no replicas until an admin approves it "
            f"(llmgw ctl credentials approve {name})",
        )

    def approve(self, name: str, by: str) -> bool:
        """An admin approved the node: it may take replicas (False: nothing awaited)."""
        if name not in self._pending:
            return False
        self._store.approve_credential(name, by=by, at=self.wall())
        del self._pending[name]
        self._admin_changed(name)
        return True

    def drop_approval(self, name: str) -> None:
        """The node enrolled again without needing approval: it awaits nothing any more."""
        if self._pending.pop(name, None) is not None:
            self._admin_changed(name)

    def _admin_changed(self, name: str) -> None:
        if name in self._entries:
            self._log.append(ChangeKind.ADMIN, name)
            self._refresh(name)

    def require(self, name: str) -> NodeEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownNode(name)
        return entry

    def set_flag(
        self,
        name: str,
        flag: AdminFlag,
        reason: str | None,
        by: str,
        *,
        force: bool = False,
        force_after_s: float | None = None,
    ) -> NodeRow:
        """Cordon, drain or uncordon a node. A drain with `force_after_s` is
        forced by the reconcile loop that many seconds from now unless done."""
        self.require(name)
        if flag is AdminFlag.NONE and name in self._pending and name not in self._admin:
            raise AwaitsApproval(name)
        at = self.wall()
        force_at = (
            at + force_after_s
            if flag is AdminFlag.DRAINING and force_after_s is not None and not force
            else None
        )
        info = (
            AdminInfo(flag=flag, reason=reason, by=by, at=at, force=force, force_at=force_at)
            if flag is not AdminFlag.NONE
            else AdminInfo()
        )
        action = {
            AdminFlag.NONE: "uncordon",
            AdminFlag.CORDONED: "cordon",
            AdminFlag.DRAINING: "drain",
        }[flag]
        self._set_admin(name, info, action=action, by=by, at=at)
        return self.row(name)

    def mark_drained(self, name: str) -> None:
        """A drain finished: the node stays cordoned, marked as drained."""
        old = self.admin_info(name)
        info = AdminInfo(
            flag=AdminFlag.CORDONED, reason=old.reason, by=old.by, at=old.at, drained=True
        )
        self._set_admin(name, info, action="drained", by=BY_LLMGW, at=self.wall())
        self.event(f"node/{name}", EventReason.DRAINED, "every replica moved: cordoned, drained")

    def force_drain(self, name: str, why: str) -> None:
        """A drain's deadline passed: stop its replicas now (the reconcile loop does)."""
        old = self.admin_info(name)
        if old.flag is not AdminFlag.DRAINING or old.force:
            return
        info = old.model_copy(update={"force": True})
        self._set_admin(name, info, action=f"drain forced ({why})", by=BY_LLMGW, at=self.wall())
        self.event(
            f"node/{name}",
            EventReason.DRAIN_FORCED,
            f"drain forced ({why}): its replicas stop without waiting for stand-ins",
        )

    def due_drains(self, wall: float) -> list[str]:
        """Draining nodes whose deadline has passed and that are not forced yet."""
        return sorted(
            name
            for name, info in self._admin.items()
            if info.flag is AdminFlag.DRAINING
            and not info.force
            and info.force_at is not None
            and wall >= info.force_at
        )

    def _set_admin(self, name: str, info: AdminInfo, *, action: str, by: str, at: float) -> None:
        # A node seen but not yet saved is saved with its flag: a cordon
        # acknowledged is never a cordon of a node unknown after a crash.
        first_seen = self._unsaved_nodes.get(name)
        self._store.set_admin(name, info, action=action, by=by, at=at, first_seen=first_seen)
        self._unsaved_nodes.pop(name, None)
        if info.flag is AdminFlag.NONE:
            self._admin.pop(name, None)
        else:
            self._admin[name] = info
        self._drain_blocked.pop(name, None)
        self._log.append(ChangeKind.ADMIN, name)
        self._refresh(name)

    def set_drain_blocked(self, node: str, why: str | None) -> None:
        """Why a drain of `node` is not progressing (None: it is, or it is over)."""
        if self._drain_blocked.get(node) == (why or None) or node not in self._entries:
            return
        if why:
            self._drain_blocked[node] = why
        else:
            self._drain_blocked.pop(node, None)
        self._refresh(node)

    def forget_node(self, name: str, by: str) -> None:
        """Forget a node for good: its row, admin flag and replicas go, durably.

        Replicas with a shard on it go whole (a replica cannot run without one
        of its shards); the reconcile loop places them again elsewhere."""
        self.require(name)
        doomed = [r.id for r in self._by_node.get(name, ())]
        self._store.forget_node(name, doomed, by=by, at=self.wall())
        self._unsaved_nodes.pop(name, None)
        touched = self._drop_replicas(doomed) - {name}
        self._index_records()
        if self._admin.pop(name, None) is not None:
            self._log.append(ChangeKind.ADMIN, name)
        self._drain_blocked.pop(name, None)
        self._pending.pop(name, None)
        del self._entries[name]
        self._capacity_version = next(_CAPACITY_VERSIONS)
        self._capacity_at.pop(name, None)
        self._rows.pop(name, None)
        self._row_json.forget(name)
        self._replies.pop(name, None)
        old = self._facts.pop(name, None)
        if old is not None:
            self.totals.remove(old)
        self._log.append(ChangeKind.NODE, name)
        self._log.forget_key(ChangeKind.NODE, name)
        self._log.forget_key(ChangeKind.ASSIGNMENTS, name)
        self._assignments_changed(touched)
        for node in touched:
            self._refresh_digest(node)

    # -- models, backoffs, unplaceable reasons ---------------------------------------------

    # -- revisions: what each replica's engine runs ------------------------------------------

    def model_revision(self, model: str) -> int:
        """The model's current revision (0: declared before revisions, never changed since)."""
        return self._revisions.current(model)

    def model_revisions(self, model: str) -> list[ModelRevision]:
        if model not in self._models:
            raise UnknownModel(model)
        return self._revisions.history(model)

    def spec_of(self, rec: ReplicaRecord) -> ModelSpec | None:
        """The spec a replica's engine was started with: its revision's (a replica from
        before revisions runs revision 1, the spec as it was then), else the model's."""
        kept = self._revisions.spec(rec.model, rec.revision or 1)
        return kept or self._models.get(rec.model) or self._retiring.get(rec.model)

    def up_to_date(self, rec: ReplicaRecord) -> bool:
        """Whether the replica runs what its model's spec asks the engine for now."""
        spec, running = self._models.get(rec.model), self.spec_of(rec)
        return spec is None or running is None or same_engine(spec, running)

    def rollout_note(self, model: str) -> tuple[RolloutState, str] | None:
        return self._rollout_notes.get(model)

    def set_rollout_note(self, model: str, note: tuple[RolloutState, str] | None) -> None:
        """Why a rollout waits or stalled (None: it does neither); the reconcile loop's."""
        if self._rollout_notes.get(model) == note:
            return
        if note is None:
            self._rollout_notes.pop(model, None)
        else:
            self._rollout_notes[model] = note
        self._log.append(ChangeKind.MODEL, model)

    def desired_replicas(self, model: str) -> int:
        """How many replicas `model` should have now: what demand asked for, within
        its spec's bounds (which may have moved since), else its minimum."""
        spec = self._models[model]
        scaling = self._scaling.get(model)
        if scaling is None:
            return spec.min_replicas
        return min(max(scaling.desired, spec.min_replicas), spec.most_replicas)

    def scaling(self, model: str) -> Decision | None:
        return self._scaling.get(model)

    def set_scaling(self, model: str, decision: Decision) -> None:
        """The autoscaler's answer for `model` (the reconcile loop's, each pass);
        a change of the desired count is a change of the model's view."""
        old = self._scaling.get(model)
        self._scaling[model] = decision
        if old is None or old.desired != decision.desired:
            self._log.append(ChangeKind.MODEL, model)

    def forget_scaling(self, keep: Iterable[str]) -> None:
        for model in self._scaling.keys() - set(keep):
            del self._scaling[model]

    def _new_revisions(self, specs: list[ModelSpec], by: str, at: float) -> list[ModelRevision]:
        """The revisions applying `specs` creates: one per spec whose engine fields
        change (and a first one for a new model). A model declared before revisions
        were kept first gets revision 1 for the spec it had, which its replicas run."""
        out = []
        for spec in specs:
            old = self._models.get(spec.name)
            current = self._revisions.current(spec.name)
            if old is not None and current == 0:
                out.append(ModelRevision(revision=1, at=at, by=BY_LLMGW, change=SEEDED, spec=old))
                current = 1
            if old is None or current == 0 or not same_engine(old, spec):
                change = describe_change(old, spec)
                out.append(
                    ModelRevision(revision=current + 1, at=at, by=by, change=change, spec=spec)
                )
        return out

    def undo(self, model: str, to_revision: int | None, by: str) -> None:
        """Apply again what an earlier revision's engines ran (`ctl rollout undo`):
        the current spec with that revision's engine fields, as a new revision.
        Counts and policy stay as they are now, as `kubectl rollout undo` keeps
        the replica count."""
        spec = self._models.get(model)
        if spec is None:
            raise UnknownModel(model)
        current = self._revisions.current(model)
        kept = [r for r in self._revisions.history(model) if r.revision < current]
        if to_revision is None:
            if not kept:
                raise BadRequest(f"{model} has no earlier revision to go back to")
            target = kept[-1]
        else:
            found = [r for r in kept if r.revision == to_revision]
            if not found:
                have = ", ".join(str(r.revision) for r in kept) or "none"
                raise BadRequest(
                    f"revision {to_revision} of {model} is not an earlier revision kept "
                    f"(current {current}; earlier kept: {have})"
                )
            target = found[0]
        fields = {f: getattr(target.spec, f) for f in ENGINE_FIELDS}
        back = spec.model_copy(update=fields)
        if same_engine(back, spec):
            raise BadRequest(
                f"{model} already runs what revision {target.revision} ran: nothing to undo"
            )
        self.put_models([back], by, why=f"undo to revision {target.revision}")

    def put_models(
        self, specs: Iterable[ModelSpec], by: str = BY_LLMGW, *, why: str | None = None
    ) -> None:
        """Declare specs. `why`: said before each new revision's change (an undo)."""
        specs = list(specs)
        at = self.wall()
        revisions = self._new_revisions(specs, by, at)
        if why is not None:
            revisions = [
                r.model_copy(update={"change": f"{why}: {r.change}"}) if r.change != SEEDED else r
                for r in revisions
            ]
        self._store.put_models(specs, at, revisions)
        self._revisions.add(revisions)
        for rev in revisions:
            self._rollout_notes.pop(rev.spec.name, None)  # a new revision: a new rollout
        for spec in specs:
            self._models[spec.name] = spec
            self._log.append(ChangeKind.MODEL, spec.name)
            if self._retiring.pop(spec.name, None) is not None:
                self._keep_retiring_replicas(spec.name)
        self._capacity_version = next(_CAPACITY_VERSIONS)
        # Source, engine and arguments in assignments come from the specs.
        names = {s.name for s in specs}
        self._assignments_changed(
            n for rec in self._records.values() if rec.model in names for n in rec.nodes
        )

    def delete_model(self, name: str) -> None:
        if name not in self._models:
            raise UnknownModel(name)
        self._store.delete_model(name)  # its backoff and revisions go with it
        spec = self._models.pop(name)
        self._revisions.forget(name)
        self._rollout_notes.pop(name, None)
        self._log.append(ChangeKind.MODEL, name)
        self._capacity_version = next(_CAPACITY_VERSIONS)
        if self._backoffs.pop(name, None) is not None:
            self._log.append(ChangeKind.BACKOFF, name)
        self.set_unplaceable(name, None)
        # Its replicas go with it, but through the stop handshake: the reconcile
        # loop stops them (`retired_replicas`) once the gateways have let go.
        if any(r.model == name for r in self._records.values()):
            self._retiring[name] = spec

    def _keep_retiring_replicas(self, model: str) -> None:
        """Declared again before its replicas stopped: they serve again."""
        for rec in self._records.values():
            if rec.model == model and self._stopping.pop(rec.id, None) is not None:
                self._log.append(ChangeKind.REPLICA, rec.id)

    def retired_replicas(self) -> list[str]:
        """Replicas of models no longer declared: to stop."""
        return [r.id for r in self._records.values() if r.model not in self._models]

    def backing_off(self, model: str, wall: float) -> bool:
        backoff = self._backoffs.get(model)
        return backoff is not None and wall < backoff.retry_at

    def back_off(self, model: str, why: str, wall: float) -> Backoff:
        """A replica of `model` failed: wait base * 2^(failures-1), up to the cap."""
        settings = self.settings
        old = self._backoffs.get(model)
        failures = (old.failures if old else 0) + 1
        delay = min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** (failures - 1))
        backoff = Backoff(model, failures, wall + delay, why)
        self._store.put_backoff(backoff)
        self._backoffs[model] = backoff
        self._log.append(ChangeKind.BACKOFF, model)
        self.event(
            f"model/{model}",
            EventReason.BACK_OFF,
            f"a replica failed (failure {failures}): next placement in {delay:g}s: "
            + why.strip().split("\n", 1)[0],
        )
        return backoff

    def clear_backoff(self, model: str) -> None:
        if model in self._backoffs:
            self._store.clear_backoff(model)
            del self._backoffs[model]
            self._log.append(ChangeKind.BACKOFF, model)

    def set_unplaceable(self, model: str, reason: str | None) -> None:
        """Why `model` cannot be placed (None: it can, or needs nothing)."""
        if self._unplaceable.get(model) == reason:
            return
        if reason is not None and model not in self._unplaceable:  # not each new number
            self.event(f"model/{model}", EventReason.UNPLACEABLE, reason)
        if reason is None:
            del self._unplaceable[model]
        else:
            self._unplaceable[model] = reason
        self._log.append(ChangeKind.UNPLACEABLE, model)

    # -- replicas -----------------------------------------------------------------------------

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        records = list(records)
        if not records:
            return
        self._store.put_replicas(records)
        touched: set[str] = set()
        for rec in records:
            old = self._records.get(rec.id)
            touched.update(old.nodes if old else ())
            touched.update(rec.nodes)
            self._records[rec.id] = rec
            if rec.state is ReplicaState.READY:
                self._stopping.pop(rec.id, None)  # a cancelled drain: back in routing
            self._log.append(ChangeKind.REPLICA, rec.id)
        self._replicas_moved(touched)

    def remove_replicas(self, ids: Iterable[str]) -> None:
        ids = [i for i in ids if i in self._records]
        if not ids:
            return
        self._store.delete_replicas(ids)
        self._replicas_moved(self._drop_replicas(ids))

    def _drop_replicas(self, ids: list[str]) -> set[str]:
        """Every removal's memory side (the store has dropped them): what is kept
        of a replica anywhere here goes with it. Returns the nodes they were on."""
        touched: set[str] = set()
        for i in ids:
            touched.update(self._records.pop(i).nodes)
            self._stopping.pop(i, None)
            self._gateway_activity.pop(i, None)
            self._log.append(ChangeKind.REPLICA, i)
        live = {r.model for r in self._records.values()}
        for model in [m for m in self._retiring if m not in live]:
            del self._retiring[model]
        return touched

    def _replicas_moved(self, touched: set[str]) -> None:
        self._capacity_version = next(_CAPACITY_VERSIONS)
        for node in touched:  # which cards are assigned: not always visible in the facts
            self._capacity_moved(node)
        self._index_records()
        self._assignments_changed(touched)
        for node in touched:
            self._refresh_digest(node)

    def replica_statuses(self) -> dict[str, ReplicaStatus]:
        reported: dict[tuple[str, int], ShardDigest] = {}
        for node in self._by_node:
            entry = self._entries.get(node)
            if entry is None:
                continue
            for shard in entry.shards:
                reported[(shard.replica_id, shard.rank)] = shard
        out = {rid: replica_status(rec, reported) for rid, rec in self._records.items()}
        for rid, seen in self._gateway_activity.items():
            status = out.get(rid)
            if status is not None and (status.idle_since is None or seen > status.idle_since):
                out[rid] = dataclasses.replace(status, idle_since=seen)
        return out

    # -- views ------------------------------------------------------------------------------------

    def summary(self, gateway_in_flight: Mapping[str, int] | None = None) -> FleetSummary:
        """`gateway_in_flight`: requests the gateways hold per replica (`Gateways.in_flight`)."""
        now = self.clock()
        self.advance_time(now)
        return build_summary(
            self.totals,
            {**self._pending, **self._admin} if self._pending else self._admin,
            self._entries,
            self.replica_statuses(),
            self._models,
            self.unplaceable_reasons,
            now,
            self.wall(),
            gateway_in_flight,
            self._waking(now),
        )

    def _waking(self, now: float) -> list[WakingModel]:
        return [
            WakingModel(model=name, seconds=round(now - d.woke_at, 1), held=d.held)
            for name, d in sorted(self._scaling.items())
            if d.woke_at is not None
        ]

    def _row_content(self, name: str, now: float) -> RowContent:
        """Everything a node's row shows except the report age. The row is built
        from this, and its changes are noticed by comparing it: a field added
        here is sent by `?since=` without anything else to remember."""
        entry = self._entries[name]
        d = entry.digest
        return {
            "name": name,
            "state": self.state_of(name, now),
            "admin": self.admin_info(name),
            "classes": {cls: c.total for cls, c in d.classes},
            "gpus_total": d.gpus_total,
            "gpus_used": sum(c.used for _, c in d.classes),
            "gpus_unhealthy": sum(c.unhealthy for _, c in d.classes),
            "gpus_unknown": sum(c.unknown for _, c in d.classes),
            "fabrics": list(d.fabrics),
            "models": sorted(d.models),
            "replicas": len(self._by_node.get(name, ())),
            "gpu_error": entry.gpu_error,
            "drain_blocked": self._drain_blocked.get(name),
        }

    def row(self, name: str, now: float | None = None) -> NodeRow:
        entry = self.require(name)
        now = self.clock() if now is None else now
        return NodeRow.model_validate(
            {**self._row_content(name, now), "report_age_s": _age(entry, now)}
        )

    def rows(self) -> list[NodeRow]:
        now = self.clock()
        return [self.row(name, now) for name in sorted(self._entries)]

    def rows_json(self) -> bytes:
        """`rows()` as `GET /v1/nodes` sends it: each row's JSON is kept from
        when it last changed (row_json), so an answer only writes the ages."""
        now = self.clock()
        self.advance_time(now)
        return json_list(self._row_json.rows(sorted(self._entries.items()), self._rows, now))

    def nodes_since(self, since: str) -> NodesDelta:
        """The node rows that changed after cursor `since` ("" for all); see `NodesDelta`.

        Raises `BadCursor` when `since` is neither empty nor EPOCH.REVISION.
        """
        cursor, full, names, removed, now = self._delta(since)
        return NodesDelta(
            cursor=cursor,
            full=full,
            nodes=[self.row(name, now) for name in names],
            removed=removed,
            # By name, like `rows`; the same rounding as `row`.
            report_ages={name: _age(e, now) for name, e in sorted(self._entries.items())},
        )

    def nodes_since_json(self, since: str) -> bytes:
        """`nodes_since(since)` as `GET /v1/nodes?since=` sends it (see `rows_json`)."""
        cursor, full, names, removed, now = self._delta(since)
        encodings = self._row_json
        rows = encodings.rows(((n, self._entries[n]) for n in names), self._rows, now)
        ages = encodings.ages(sorted(self._entries.items()), now)
        return delta_json(cursor, full, rows, removed, ages)

    def _delta(self, since: str) -> tuple[str, bool, list[str], list[str], float]:
        """(cursor, full, the rows to send by name, names removed, now) after `since`."""
        after: int | None = None  # None: a full answer
        if since:
            m = _CURSOR.fullmatch(since)
            if m is None:
                raise BadCursor(since)
            epoch, rev = m.group(1).lower(), int(m.group(2))
            if epoch == self.epoch:
                after = rev
        now = self.clock()
        self.advance_time(now)
        changes: list[Change] | None = None
        if after is not None:
            try:
                changes = self._log.since(after)
            except HistoryLost:  # not issued by this run, or older than the history kept
                changes = None
        cursor = f"{self.epoch}.{self._log.revision}"
        if changes is None:
            return cursor, True, sorted(self._entries), [], now
        changed = {c.key for c in changes if c.kind is ChangeKind.NODE}
        names = sorted(changed.intersection(self._entries))
        return cursor, False, names, sorted(changed.difference(self._entries)), now

    def detail(self, name: str) -> NodeDetail:
        entry = self.require(name)
        report = entry.report
        return NodeDetail(
            row=self.row(name),
            gpus=list(report.gpus) if report else [],
            storage_configured=report.storage_configured if report else False,
            storage=list(report.storage) if report else [],
            replicas=list(report.replicas) if report else [],
            history=self._store.history(name),
            agent_version=report.agent_version if report else None,
            address=report.address if report else None,
        )

    def replica_views(self) -> list[ReplicaView]:
        now = self.clock()
        return [replica_view(s, now) for s in self.replica_statuses().values()]

    def model_views(self) -> list[ModelView]:
        reasons = self.unplaceable_reasons
        states: dict[str, Counter[ReplicaState]] = defaultdict(Counter)
        serving_on: dict[str, set[str]] = defaultdict(set)  # nodes under serving replicas
        updated: Counter[str] = Counter()  # ready replicas of the current revision
        outdated: Counter[str] = Counter()  # live replicas of an older one
        leaving: dict[str, Counter[str]] = defaultdict(Counter)  # why the loop stops them
        for status in self.replica_statuses().values():
            rec = status.record
            if rec.leaving is not None:
                leaving[rec.model][rec.leaving.split(":", 1)[0]] += 1
            states[rec.model][status.state] += 1
            if status.state in (ReplicaState.READY, ReplicaState.DRAINING):
                serving_on[rec.model].update(rec.nodes)
            if status.state is not ReplicaState.FAILED and not self.up_to_date(rec):
                outdated[rec.model] += 1
            elif status.state is ReplicaState.READY:
                updated[rec.model] += 1
        views = []
        for name, spec in sorted(self._models.items()):
            mine = states[name]
            # A draining replica still answers until its stand-in is ready.
            ready = mine[ReplicaState.READY] + mine[ReplicaState.DRAINING]
            backoff = self._backoffs.get(name)
            desired = self.desired_replicas(name)
            scaling = self._scaling.get(name)
            why = scaling.why if scaling is not None and spec.autoscaled else None
            live = ready + mine[ReplicaState.STARTING]
            if why is not None and desired > live and ready >= spec.min_replicas:
                waits = reasons.get(name)
                if waits is not None:
                    why = f"{why}; scale-up waits: {waits}"
            going = "; ".join(f"{n} leaving ({what})" for what, n in sorted(leaving[name].items()))
            if going:
                why = f"{why}; {going}" if why else going
            views.append(
                ModelView(
                    spec=spec,
                    ready=ready,
                    starting=mine[ReplicaState.STARTING],
                    failed=mine[ReplicaState.FAILED],
                    satisfied=ready >= spec.min_replicas,
                    nodes=len(serving_on[name]),
                    unplaceable_reason=None if ready >= spec.min_replicas else reasons.get(name),
                    last_failure=backoff.last_failure if backoff else None,
                    rollout=self._rollout_view(spec, updated[name], outdated[name]),
                    desired=desired,
                    in_flight=round(scaling.in_flight, 2) if scaling is not None else 0.0,
                    scaling=why,
                )
            )
        return views

    def _rollout_view(self, spec: ModelSpec, updated: int, outdated: int) -> RolloutView:
        desired = self.desired_replicas(spec.name)
        note = self._rollout_notes.get(spec.name)
        if outdated == 0 and updated >= desired:
            state, message = RolloutState.COMPLETE, None
        elif note is not None:
            state, message = note
        else:
            state, message = RolloutState.PROGRESSING, None
        return RolloutView(
            revision=self.model_revision(spec.name),
            state=state,
            desired=desired,
            updated=updated,
            outdated=outdated,
            message=message,
        )


def _listening(entry: NodeEntry) -> tuple[object, ...]:
    """What the endpoint feed builds URLs from: the address and each rank 0's port."""
    ports = sorted(
        (s.replica_id, s.port or 0, s.state is ShardState.FAILED)
        for s in entry.shards
        if s.rank == 0
    )
    return (entry.address, *ports)


def rendezvous_port(replica_id: str) -> int:
    """A stable port for a multi-node replica's leader, derived from its id."""
    return 29500 + sum(replica_id.encode()) % 500


def _awaiting(enrolled_at: float) -> AdminInfo:
    """What a node awaiting approval shows: one reason for all, so that `ctl status`
    lists them as one group, as `sinfo -R` does."""
    return AdminInfo(
        flag=AdminFlag.CORDONED,
        reason=AWAITING_APPROVAL,
        by=BY_LLMGW,
        at=enrolled_at,
        awaiting_approval=True,
    )


def _age(entry: NodeEntry, now: float) -> float | None:
    """A row's report age, to a tenth of a second; None: no report this run."""
    return None if entry.received_at is None else round(now - entry.received_at, 1)
