"""The adapters' share of the facts (issue 33), owned by `Facts` as `facts.loras`:
declared adapters (durable: the store first) and which replicas should hold which
(soft: a new term starts with none and loads again by demand). Every change goes
to the one change log: a replica's holds are its endpoint's (REPLICA) and its
rank-0 node's assignments (ASSIGNMENTS); a declared adapter is a MODEL change."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from llmgw.controller.core.changes import ChangeKind, ChangeLog
from llmgw.controller.core.records import AdapterHold, ReplicaRecord
from llmgw.controller.store.base import StateStore
from llmgw.errors import UnknownModel
from llmgw.wire import AdapterSpec


class AdapterFacts:
    def __init__(
        self,
        store: StateStore,
        log: ChangeLog,
        clock: Callable[[], float],
        records: Mapping[str, ReplicaRecord],
        assignments_changed: Callable[[Iterable[str]], None],
    ) -> None:
        self._store, self._log, self._clock = store, log, clock
        self._records = records  # the facts' own, read only
        self._assignments_changed = assignments_changed
        self._adapters: dict[str, AdapterSpec] = store.adapters()
        self._holds: dict[str, dict[str, AdapterHold]] = {}

    @property
    def adapters(self) -> Mapping[str, AdapterSpec]:
        return MappingProxyType(self._adapters)

    @property
    def holds(self) -> Mapping[str, dict[str, AdapterHold]]:
        return MappingProxyType(self._holds)

    def put(self, specs: Iterable[AdapterSpec], at: float) -> None:
        """Declare adapters (checked against the models by the caller)."""
        specs = list(specs)
        self._store.put_adapters(specs, at)
        for spec in specs:
            old = self._adapters.get(spec.name)
            self._adapters[spec.name] = spec
            self._log.append(ChangeKind.MODEL, spec.name)
            if old is not None and old != spec:  # another base or files: loaded again
                for rid in [r for r, held in self._holds.items() if spec.name in held]:
                    self.drop(rid, spec.name)

    def delete(self, name: str) -> None:
        if name not in self._adapters:
            raise UnknownModel(name)
        self._store.delete_adapter(name)
        del self._adapters[name]
        for rid in [r for r, held in self._holds.items() if name in held]:
            self.drop(rid, name)
        self._log.append(ChangeKind.MODEL, name)

    def hold(self, replica_id: str, name: str) -> None:
        """Tell the replica's engine to load `name`; it is routed there once loaded."""
        rec = self._records.get(replica_id)
        if rec is None or name not in self._adapters:
            return
        held = self._holds.setdefault(replica_id, {})
        if name in held and held[name].leaving is None:
            return
        held[name] = AdapterHold(told_at=self._clock())
        self._log.append(ChangeKind.REPLICA, replica_id)
        self._assignments_changed(rec.nodes[:1])

    def release(self, replica_id: str, name: str) -> None:
        """Out of routing first: the engine lets it go once the gateways have."""
        hold = self._holds.get(replica_id, {}).get(name)
        if hold is not None and hold.leaving is None:
            revision = self._log.append(ChangeKind.REPLICA, replica_id)
            hold.leaving = (revision, self._clock())

    def drop(self, replica_id: str, name: str) -> None:
        """The engine unloads it (the next reply to its agent says so)."""
        held = self._holds.get(replica_id)
        if held is None or held.pop(name, None) is None:
            return
        if not held:
            del self._holds[replica_id]
        self._log.append(ChangeKind.REPLICA, replica_id)
        rec = self._records.get(replica_id)
        if rec is not None:
            self._assignments_changed(rec.nodes[:1])

    def replica_gone(self, replica_id: str) -> None:
        """A removed replica's holds go with it (its removal is logged by the caller)."""
        self._holds.pop(replica_id, None)
