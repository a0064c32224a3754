"""`Facts`: the one writer of the controller's state, for one leadership term.

Durable facts (through the store) and soft ones (agent reports, the reconcile
loop's decisions) live here and only here. Each mutator writes the store, then
memory, then appends what changed to the change log (`changes.ChangeLog`), and
does nothing else: no JSON, no caches, no views. What is derived (node rows,
`?since=` answers, the summary's totals, report replies, capacity, the endpoint
feed, model views) follows the log from its own module (see term.py).

Others read through read-only mappings and the lookups below.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from llmgw.controller.core import admin_flags
from llmgw.controller.core.admin_flags import BY_LLMGW, NO_ADMIN
from llmgw.controller.core.autoscale import desired_count
from llmgw.controller.core.changes import Change, ChangeKind, ChangeLog
from llmgw.controller.core.decisions import Decisions
from llmgw.controller.core.nodes import NodeEntry, node_state
from llmgw.controller.core.records import AdapterHold, Backoff, ReplicaRecord, gpus_on
from llmgw.controller.core.revisions import Revisions, same_engine, undone
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.state.adapter_facts import AdapterFacts
from llmgw.controller.state.approvals import Approvals
from llmgw.controller.state.events import KEEP as EVENTS_KEPT
from llmgw.controller.state.events import Events
from llmgw.controller.state.liveness import Liveness
from llmgw.controller.state.starts import Starts
from llmgw.controller.store.base import StateStore
from llmgw.errors import AwaitsApproval, UnknownModel, UnknownNode
from llmgw.wire import (
    AdapterSpec,
    AdminEvent,
    AdminFlag,
    AdminInfo,
    EventList,
    EventReason,
    ModelRevision,
    ModelSpec,
    NodeReport,
    NodeState,
    ReplicaState,
    StartKind,
)

log = logging.getLogger(__name__)

V = TypeVar("V")


class ReadOnly(Generic[V]):
    """What others may read of a private mapping of `Facts`: a read-only view of it."""

    def __init__(self, attr: str) -> None:
        self._attr = attr

    def __get__(self, facts: Any, owner: type | None = None) -> Mapping[str, V]:
        return MappingProxyType(getattr(facts, self._attr))


class Facts:
    """Built from the store at the start of a term (`term.Term.begin`), never reset."""

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
        self.liveness = Liveness(settings, started_at=clock())
        self.log = ChangeLog()  # appended here only; everything derived reads it
        self._entries = {n: NodeEntry(n, seen) for n, seen in store.known_nodes().items()}
        self._admin: dict[str, AdminInfo] = store.admin()
        self._models: dict[str, ModelSpec] = store.models()
        self._records: dict[str, ReplicaRecord] = store.replicas()
        self._backoffs: dict[str, Backoff] = store.backoffs()
        self.revisions = Revisions(store.revisions())  # read-only outside this class
        self._events = Events(store.events(EVENTS_KEPT))
        self.decisions = Decisions(self.log, self.event)  # the reconcile loop's, soft
        self.starts = Starts(store)  # read-only outside this class: `count_start`
        self.approvals = Approvals(store, self.log, self.event, self._entries.__contains__)
        # LoRA adapters: declared (durable) and which replicas should hold them (soft).
        self.loras = AdapterFacts(
            store, self.log, self.clock, self._records, self._assignments_changed
        )
        # Replicas out of routing before their stop: id -> (revision, monotonic time)
        # of the change that marked them (the gateway handshake, endpoints.py).
        self._stopping: dict[str, tuple[int, float]] = {}
        # Replica id -> when a gateway last saw a request for it (monotonic).
        self._gateway_activity: dict[str, float] = {}
        # Replica id -> since when it has been ready (monotonic; those ready at the
        # term's start: from then). Its model's backoff ends once one has been ready a
        # while (`ControllerSettings.backoff_reset_s`), not at its first ready.
        self._ready_since: dict[str, float] = {
            rid: clock() for rid, rec in self._records.items() if rec.state is ReplicaState.READY
        }
        # Specs of deleted models whose replicas are still stopping (the handshake).
        self._retiring: dict[str, ModelSpec] = {}
        self._by_node: dict[str, list[ReplicaRecord]] = {}
        self._index_records()
        # Times a node turned unreachable, for /metrics: counted at the moment,
        # since a node back within minutes never shows in a sampled gauge.
        self.turned_unreachable = 0
        # First sightings are written in batches: one fsync per node would stall
        # the loop when a whole fleet registers at once.
        self._unsaved_nodes: dict[str, float] = {}
        self.liveness.watch(self._entries.values())

    # -- what others may read: read-only views of the facts -------------------------------------

    nodes: ReadOnly[NodeEntry] = ReadOnly("_entries")
    admin: ReadOnly[AdminInfo] = ReadOnly("_admin")
    models: ReadOnly[ModelSpec] = ReadOnly("_models")
    records: ReadOnly[ReplicaRecord] = ReadOnly("_records")
    backoffs: ReadOnly[Backoff] = ReadOnly("_backoffs")
    stopping: ReadOnly[tuple[int, float]] = ReadOnly("_stopping")
    gateway_activity: ReadOnly[float] = ReadOnly("_gateway_activity")
    ready_since: ReadOnly[float] = ReadOnly("_ready_since")
    retiring: ReadOnly[ModelSpec] = ReadOnly("_retiring")  # deleted, replicas still stopping

    @property
    def adapters(self) -> Mapping[str, AdapterSpec]:
        return self.loras.adapters

    @property
    def adapter_holds(self) -> Mapping[str, dict[str, AdapterHold]]:
        return self.loras.holds

    by_node: ReadOnly[list[ReplicaRecord]] = ReadOnly("_by_node")  # nodes with replicas

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def revision(self) -> int:
        return self.log.revision

    def changes_since(self, revision: int) -> list[Change]:
        """Every change after `revision`; `HistoryLost` when it is too old (or not yet
        issued): the caller then gives a full answer."""
        return self.log.since(revision)

    async def wait_changed(self, after_revision: int, timeout_s: float) -> int:
        """For long polls: the revision, once past `after_revision` or after `timeout_s`."""
        return await self.log.wait_changed(after_revision, timeout_s)

    def replicas_on(self, node: str) -> list[ReplicaRecord]:
        return list(self._by_node.get(node, ()))

    def assigned_gpus(self, node: str) -> frozenset[str]:
        """The cards replica shards on `node` were given (in use from the moment
        they are, whatever its last report says)."""
        return gpus_on(node, self._by_node.get(node, ()))

    def require(self, name: str) -> NodeEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownNode(name)
        return entry

    def admin_info(self, name: str) -> AdminInfo:
        """The node's admin flag; else, awaiting approval, a cordon by llmgw saying so."""
        return self._admin.get(name) or self.approvals.pending.get(name) or NO_ADMIN

    def state_of(self, name: str, now: float | None = None) -> NodeState:
        entry = self._entries[name]
        now = self.clock() if now is None else now
        live = self.liveness
        return node_state(entry, self.admin_info(name), now, live.grace_s(entry), live.started_at)

    def model_revision(self, model: str) -> int:
        """The model's current revision (0: declared before revisions, never changed since)."""
        return self.revisions.current(model)

    def model_revisions(self, model: str) -> list[ModelRevision]:
        if model not in self._models:
            raise UnknownModel(model)
        return self.revisions.history(model)

    def spec_of(self, rec: ReplicaRecord) -> ModelSpec | None:
        """The spec a replica's engine was started with: its revision's (a replica from
        before revisions runs revision 1, the spec as it was then), else the model's."""
        kept = self.revisions.spec(rec.model, rec.revision or 1)
        return kept or self._models.get(rec.model) or self._retiring.get(rec.model)

    def up_to_date(self, rec: ReplicaRecord) -> bool:
        """Whether the replica runs what its model's spec asks the engine for now."""
        spec, running = self._models.get(rec.model), self.spec_of(rec)
        return spec is None or running is None or same_engine(spec, running)

    def desired_replicas(self, model: str) -> int:
        """How many replicas `model` should have now: what demand asked for, within
        its spec's bounds (which may have moved since), else its minimum."""
        return desired_count(self._models[model], self.decisions.scaling(model))

    def backing_off(self, model: str, wall: float) -> bool:
        backoff = self._backoffs.get(model)
        return backoff is not None and wall < backoff.retry_at

    # -- agent reports and liveness -----------------------------------------------------------

    def ingest(self, report: NodeReport, raw: bytes | None = None) -> tuple[float, bool]:
        """Take a node's report (`raw`: the body as received, kept for the detail
        view); returns the moment it was taken, and whether one of its engines came,
        went or changed state (news the loop acts on at once)."""
        now = self.clock()
        node = report.node
        entry = self._entries.get(node)
        changed = entry is None or now > self.liveness.unreachable_at(entry)  # new, or back
        if entry is None:
            entry = self._entries[node] = NodeEntry(node, self.wall())
            self._unsaved_nodes[node] = entry.first_seen
        elif report.address != entry.address:  # a leader's address is in its followers'
            self._assignments_changed(
                n
                for rec in self._by_node.get(node, ())
                if rec.shards[0].node == node
                for n in rec.nodes
            )
        moved = entry.update(report, raw or report.model_dump_json().encode(), now)
        if moved.listening:  # an engine restarted on a new port: the same id
            self.log.append(ChangeKind.LISTENING, node)
        if moved.facts or changed:
            self.log.append(ChangeKind.NODE, node)
        self.liveness.watch((entry,))
        self.advance_time(now)
        return now, moved.engines

    def advance_time(self, now: float | None = None) -> None:
        """Nodes whose grace ran out since the last look turn unreachable: a NODE change.

        Called by every reader that shows liveness and by the reconcile loop
        each pass, so time-driven changes reach the log within a pass."""
        now = self.clock() if now is None else now
        for name in self.liveness.turned(now, self._entries):
            self.turned_unreachable += 1
            self.log.append(ChangeKind.NODE, name)

    def mark_stopping(self, replica_id: str) -> tuple[int, float]:
        """Take a replica out of routing before it is stopped; returns (revision, when)."""
        mark = self._stopping.get(replica_id)
        if mark is None and replica_id in self._records:
            revision = self.log.append(ChangeKind.REPLICA, replica_id)
            mark = self._stopping[replica_id] = (revision, self.clock())
        return mark or (self.log.revision, self.clock())

    def note_requests(self, replica_ids: Iterable[str], now: float) -> None:
        """A gateway saw new requests for these replicas (soft state, like reports)."""
        for rid in replica_ids:
            if rid in self._records:
                self._gateway_activity[rid] = now

    # -- saving and events ----------------------------------------------------------------------

    def flush(self) -> None:
        """Write first sightings of nodes and the events since the last flush
        (called every second and at shutdown)."""
        if self._unsaved_nodes:
            self._store.add_nodes(self._unsaved_nodes.items())
            self._unsaved_nodes.clear()
        self.flush_events()

    def event(self, obj: str, reason: EventReason, message: str) -> None:
        """Record a decision the controller took by itself (`llmgw.controller.state.events`);
        logged too at debug, each one as it is taken (the store folds repeats)."""
        self._events.add(self.wall(), obj, reason, message)
        log.debug("event %s %s: %s", reason.value, obj, message)

    def events(self, after: int = 0, obj: str | None = None) -> EventList:
        found = self._events.since(after, obj)
        return EventList(events=found, cursor=found[-1].id if found else after)

    @property
    def event_counts(self) -> Mapping[EventReason, int]:
        return self._events.counts

    def carry_counts(self, before: Facts) -> None:
        """A new term's counters go on from the last term's: never back in one process."""
        self.turned_unreachable = before.turned_unreachable
        self._events.counts = before.event_counts  # type: ignore[assignment]

    def flush_events(self) -> None:
        self._events.save(self._store, self.wall())

    def history(self, name: str) -> list[AdminEvent]:
        return self._store.history(name)

    # -- admin flags ----------------------------------------------------------------

    def set_flag(
        self,
        name: str,
        flag: AdminFlag,
        reason: str | None,
        by: str,
        *,
        force: bool = False,
        force_after_s: float | None = None,
    ) -> None:
        """Cordon, drain or uncordon a node (see `admin_flags.flag_info`)."""
        self.require(name)
        if flag is AdminFlag.NONE and name in self.approvals.pending and name not in self._admin:
            raise AwaitsApproval(name)
        at = self.wall()
        info = admin_flags.flag_info(flag, reason, by, at, force=force, force_after_s=force_after_s)
        self._set_admin(name, info, action=admin_flags.ACTIONS[flag], by=by, at=at)

    def mark_drained(self, name: str) -> None:
        """A drain finished: the node stays cordoned, marked as drained."""
        info = admin_flags.drained(self.admin_info(name))
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

    def _set_admin(self, name: str, info: AdminInfo, *, action: str, by: str, at: float) -> None:
        # A node seen but not yet saved is saved with its flag: a cordon
        # acknowledged is never a cordon of a node unknown after a crash.
        first_seen = self._unsaved_nodes.get(name)
        self._store.set_admin(name, info, action=action, by=by, at=at, first_seen=first_seen)
        self._unsaved_nodes.pop(name, None)  # only once stored: a failed write keeps it queued
        if info.flag is AdminFlag.NONE:
            self._admin.pop(name, None)
        else:
            self._admin[name] = info
        self.decisions.node_flagged(name)
        self.log.append(ChangeKind.ADMIN, name)

    def forget_node(self, name: str, by: str) -> None:
        """Forget a node for good: its row, admin flag and replicas go, durably.

        Replicas with a shard on it go whole (a replica cannot run without one
        of its shards); the reconcile loop places them again elsewhere."""
        self.require(name)
        doomed = [r.id for r in self._by_node.get(name, ())]
        self._store.forget_node(name, doomed, by=by, at=self.wall())
        self._unsaved_nodes.pop(name, None)
        self.approvals.drop(name)  # before the entry goes: an ADMIN change of its row
        del self._entries[name]
        flagged = self._admin.pop(name, None) is not None
        if self.decisions.node_flagged(name) or flagged:
            self.log.append(ChangeKind.ADMIN, name)
        self.log.append(ChangeKind.NODE, name)
        self._replicas_moved(self._drop_replicas(doomed) - {name})
        self.log.forget_key(name)

    # -- models, revisions, backoffs ---------------------------------------

    def put_models(
        self, specs: Iterable[ModelSpec], by: str = BY_LLMGW, *, why: str | None = None
    ) -> None:
        """Declare specs. `why`: said before each new revision's change (an undo)."""
        specs = list(specs)
        at = self.wall()
        revisions = self.revisions.created_by(self._models, specs, by, at, why)
        self._store.put_models(specs, at, revisions)
        self.revisions.add(revisions)
        for rev in revisions:
            self.decisions.new_rollout(rev.spec.name)
        names = set()
        for spec in specs:
            names.add(spec.name)
            self._models[spec.name] = spec
            self.log.append(ChangeKind.MODEL, spec.name)
            if self._retiring.pop(spec.name, None) is not None:  # declared again: serve again
                for rec in self._records.values():
                    if rec.model == spec.name and self._stopping.pop(rec.id, None) is not None:
                        self.log.append(ChangeKind.REPLICA, rec.id)
        # Source, engine and arguments in assignments come from the specs.
        self._assignments_changed(
            n for r in self._records.values() if r.model in names for n in r.nodes
        )

    def undo(self, model: str, to_revision: int | None, by: str) -> None:
        """Apply again what an earlier revision's engines ran (`ctl rollout undo`)."""
        spec = self._models.get(model)
        if spec is None:
            raise UnknownModel(model)
        back, revision = undone(self.revisions, spec, to_revision)
        self.put_models([back], by, why=f"undo to revision {revision}")

    def delete_model(self, name: str) -> None:
        if name not in self._models:
            raise UnknownModel(name)
        self._store.delete_model(name)  # its backoff and revisions go with it
        spec = self._models.pop(name)
        self.revisions.forget(name)
        self.log.append(ChangeKind.MODEL, name)
        if self._backoffs.pop(name, None) is not None:
            self.log.append(ChangeKind.BACKOFF, name)
        self.decisions.model_deleted(name)
        self.starts.forget(name)
        # Its replicas go with it, but through the stop handshake: the reconcile
        # loop stops them (`retired_replicas`) once the gateways have let go.
        if any(r.model == name for r in self._records.values()):
            self._retiring[name] = spec

    def count_start(
        self, model: str, kind: StartKind, level: int, seconds: float | None, wall: float
    ) -> None:
        """A replica of `model` reached ready: by a wake from `level` (hot) or an
        engine start (warm, cold) that took `seconds`."""
        self.starts.count(model, kind, level, seconds, at=wall)
        self.log.append(ChangeKind.MODEL, model)

    def back_off(self, model: str, why: str, wall: float) -> Backoff:
        """A replica of `model` failed: wait base * 2^(failures-1), up to the cap."""
        settings = self.settings
        old = self._backoffs.get(model)
        failures = (old.failures if old else 0) + 1
        delay = min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** (failures - 1))
        backoff = Backoff(model, failures, wall + delay, why)
        self._store.put_backoff(backoff)
        self._backoffs[model] = backoff
        self.log.append(ChangeKind.BACKOFF, model)
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
            self.log.append(ChangeKind.BACKOFF, model)

    # -- replicas -------------------------------------------------------------------------------

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
                self._ready_since.setdefault(rec.id, self.clock())
            else:
                self._ready_since.pop(rec.id, None)
            if rec.state is ReplicaState.WAKING:
                # A gateway's last request for it came before its sleep: read as its
                # idleness once awake, it put a replica woken for held requests back to
                # sleep as they were sent on (its agent counts afresh from the wake).
                self._gateway_activity.pop(rec.id, None)
            self.log.append(ChangeKind.REPLICA, rec.id)
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
            self._ready_since.pop(i, None)
            self.loras.replica_gone(i)
            self.log.append(ChangeKind.REPLICA, i)
        live = {r.model for r in self._records.values()}
        for model in [m for m in self._retiring if m not in live]:
            del self._retiring[model]
        return touched

    def _replicas_moved(self, touched: set[str]) -> None:
        """Assignments changed on `touched`: re-index; the views that count cards in
        use join them again (`NodeDigest.counted`) as the log says."""
        self._index_records()
        self._assignments_changed(touched)

    def _assignments_changed(self, nodes: Iterable[str]) -> None:
        for node in sorted(set(nodes)):
            self.log.append(ChangeKind.ASSIGNMENTS, node)

    def _index_records(self) -> None:
        by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in self._records.values():
            for shard in rec.shards:
                by_node[shard.node].append(rec)
        self._by_node = dict(by_node)

    def close(self) -> None:
        """The final save, then the store is closed."""
        self.flush()
        self._store.close()
