"""The controller's durable records, as the store keeps them and the controller reads
them: replicas with their shards, per-model failure backoff, and a whole-state dump
(what `llmgw controller migrate` copies). Plain values: no I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llmgw.wire import AdminEvent, AdminInfo, ModelRevision, ModelSpec, ReplicaState

__all__ = ["Backoff", "EnrollToken", "ReplicaRecord", "ShardRecord", "StateDump"]


@dataclass(frozen=True)
class EnrollToken:
    """An enrollment token made by an admin (`ctl credentials token create`): its id is
    public, its secret is kept only as a SHA-256. None: no expiry, no use limit."""

    id: str
    digest: str
    created_at: float
    by: str
    expires_at: float | None = None
    uses: int | None = None
    used: int = 0
    description: str | None = None


@dataclass(frozen=True)
class ShardRecord:
    node: str
    rank: int
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class ReplicaRecord:
    id: str
    model: str
    state: ReplicaState
    shards: tuple[ShardRecord, ...]
    created_at: float
    error: str | None = None
    replaces: str | None = None  # drain: the replica this one stands in for
    revision: int = 0  # the model's revision it was placed at (0: from before revisions)
    # Out of routing by the loop's own decision (a scale-down: the why), to stop
    # once the gateways let go; None for every other replica. A drain, a fault or
    # a rollout is read from the node, the card or the revision instead.
    leaving: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shards)

    def with_state(self, state: ReplicaState, error: str | None = None) -> ReplicaRecord:
        return replace(self, state=state, error=error if error is not None else self.error)


@dataclass(frozen=True)
class Backoff:
    model: str
    failures: int
    retry_at: float  # unix time
    last_failure: str | None


@dataclass
class StateDump:
    """Everything durable, in a form either backend can load (for `migrate`)."""

    nodes: dict[str, float] = field(default_factory=dict)
    admin: dict[str, AdminInfo] = field(default_factory=dict)
    events: list[AdminEvent] = field(default_factory=list)  # oldest first
    models: dict[str, tuple[ModelSpec, float]] = field(default_factory=dict)
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    backoffs: dict[str, Backoff] = field(default_factory=dict)
    revisions: dict[str, list[ModelRevision]] = field(default_factory=dict)  # oldest first

    def empty(self) -> bool:
        return not (
            self.nodes
            or self.admin
            or self.events
            or self.models
            or self.replicas
            or self.backoffs
            or self.revisions
        )
