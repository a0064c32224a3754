"""What a reconcile step decided: a `Plan`, an ordered list of typed actions.

A step (`outcomes`, `drains`, `faults`, `rolling`, `demand`, `shortfalls`) reads a
`FleetSnapshot` and returns a plan; `llmgw.controller.loop.apply.apply` carries it out
through `Facts`, action by action in the order decided (an event follows what it
reports; a replica marked stopping is then removed), as kopf accumulates a patch
that is applied once. Nothing here writes.

A step builds its plan with a `Planner`, which also keeps the replicas as the
plan leaves them so far (`Planner.records`), for a step that decides in several
moves (a drain places stand-ins for one node after stopping another's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from llmgw.controller.core.autoscale import Decision
from llmgw.controller.core.decisions import Note
from llmgw.controller.core.records import ReplicaRecord
from llmgw.wire import EventReason, StartKind

__all__ = [
    "Action",
    "BackOff",
    "ClearBackoff",
    "Cordon",
    "DrainBlocked",
    "DropAdapter",
    "Event",
    "ForceDrain",
    "ForgetScaling",
    "HandingOver",
    "HoldAdapter",
    "MakingRoom",
    "MarkDrained",
    "Plan",
    "Planner",
    "Put",
    "ReleaseAdapter",
    "Remove",
    "RolloutNote",
    "Scaling",
    "Started",
    "Stopping",
    "Unplaceable",
]


@dataclass(frozen=True)
class Put:
    """Replicas written as they are here: placed, or changed (ready, draining, leaving)."""

    records: tuple[ReplicaRecord, ...]


@dataclass(frozen=True)
class Remove:
    """Replicas removed: their agents stop them."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class Stopping:
    """Replicas that must stop, out of routing (the gateway handshake); the plan
    removes, in a `Remove` after this, those the gateways have let go of."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class Event:
    obj: str
    reason: EventReason
    message: str


@dataclass(frozen=True)
class RolloutNote:
    model: str
    note: Note | None  # None: the rollout neither waits nor stalled


@dataclass(frozen=True)
class BackOff:
    """A replica of `model` failed: its placement backs off."""

    model: str
    why: str
    at: float  # wall time of the failure seen


@dataclass(frozen=True)
class ClearBackoff:
    model: str


@dataclass(frozen=True)
class Unplaceable:
    model: str
    why: str | None  # None: it can be placed, or needs nothing


@dataclass(frozen=True)
class Started:
    """A replica reached ready: counted per model, kind and sleep level."""

    model: str
    kind: StartKind
    level: int  # the sleep level it woke from (hot); 0 for an engine start
    seconds: float | None  # how long it took (None: not known)


@dataclass(frozen=True)
class MakingRoom:
    model: str
    how: str | None  # None: no room is being made for it


@dataclass(frozen=True)
class HandingOver:
    """A replica that must stop stays in routing until its adapters load elsewhere."""

    replica_id: str
    since: tuple[float, float] | None  # (since, last asked); None: it waits no more


@dataclass(frozen=True)
class Scaling:
    model: str
    decision: Decision


@dataclass(frozen=True)
class ForgetScaling:
    """Scaling answers of models not in `keep` go."""

    keep: frozenset[str]


@dataclass(frozen=True)
class DrainBlocked:
    node: str
    why: str | None


@dataclass(frozen=True)
class MarkDrained:
    node: str


@dataclass(frozen=True)
class ForceDrain:
    node: str
    why: str


@dataclass(frozen=True)
class HoldAdapter:
    """A replica's engine is told to load a LoRA adapter (routed there once loaded)."""

    replica_id: str
    name: str


@dataclass(frozen=True)
class ReleaseAdapter:
    """Out of routing on that replica; unloaded once the gateways let go (`DropAdapter`)."""

    replica_id: str
    name: str


@dataclass(frozen=True)
class DropAdapter:
    """The engine is told to unload it (or the replica is gone)."""

    replica_id: str
    name: str


@dataclass(frozen=True)
class Cordon:
    """A node cordoned by llmgw (a failed card)."""

    node: str
    reason: str


Action = (
    Put
    | Remove
    | Stopping
    | Event
    | RolloutNote
    | BackOff
    | ClearBackoff
    | Unplaceable
    | MakingRoom
    | HandingOver
    | Started
    | Scaling
    | ForgetScaling
    | DrainBlocked
    | MarkDrained
    | ForceDrain
    | Cordon
    | HoldAdapter
    | ReleaseAdapter
    | DropAdapter
)


A = TypeVar("A", bound=Action)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.actions)

    def __add__(self, other: Plan) -> Plan:
        return Plan(self.actions + other.actions)

    # What tests and logs ask of a plan, by kind.

    @property
    def put(self) -> list[ReplicaRecord]:
        return [r for a in self.actions if isinstance(a, Put) for r in a.records]

    @property
    def removed(self) -> list[str]:
        return [i for a in self.actions if isinstance(a, Remove) for i in a.ids]

    @property
    def stopping(self) -> list[str]:
        return [i for a in self.actions if isinstance(a, Stopping) for i in a.ids]

    @property
    def events(self) -> list[Event]:
        return [a for a in self.actions if isinstance(a, Event)]

    def of(self, kind: type[A]) -> list[A]:
        return [a for a in self.actions if isinstance(a, kind)]


class Planner:
    """Builds one step's plan. `records`: the replicas as the plan leaves them so far."""

    def __init__(self, records: Mapping[str, ReplicaRecord]) -> None:
        self.records = dict(records)
        self._actions: list[Action] = []

    def plan(self) -> Plan:
        return Plan(tuple(self._actions))

    def add(self, action: Action) -> None:
        self._actions.append(action)

    def put(self, records: Iterable[ReplicaRecord]) -> None:
        records = tuple(records)
        if records:
            self._actions.append(Put(records))
            self.records.update((r.id, r) for r in records)

    def remove(self, ids: Iterable[str]) -> None:
        ids = tuple(i for i in ids if i in self.records)
        if ids:
            self._actions.append(Remove(ids))
            for i in ids:
                del self.records[i]

    def stopping(self, ids: Iterable[str]) -> None:
        ids = tuple(ids)
        if ids:
            self._actions.append(Stopping(ids))

    def event(self, obj: str, reason: EventReason, message: str) -> None:
        self._actions.append(Event(obj, reason, message))
