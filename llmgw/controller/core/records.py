"""The controller's durable records, as the store keeps them and the controller reads
them: replicas with their shards, per-model failure backoff, and a whole-state dump
(what `llmgw controller migrate` copies). Plain values: no I/O here."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from llmgw.wire import (
    AdapterSpec,
    AdminEvent,
    AdminInfo,
    EventView,
    ModelRevision,
    ModelSpec,
    ReplicaState,
    StartKind,
)

__all__ = [
    "Backoff",
    "EnrollToken",
    "IssuedCredential",
    "LeaveReason",
    "ReplicaRecord",
    "ShardRecord",
    "StartCount",
    "StateDump",
]


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
class IssuedCredential:
    """A node's credential as enrollment issued it: the secret is kept only as a
    SHA-256. `pending`: awaiting an admin's approval; `token`: the enrollment
    token's id it came with (None: none, or issued before tokens were counted);
    `reported_at`: when its node first reported with it (None: not yet)."""

    node: str
    digest: str
    issued_at: float
    by: str
    pending: bool = False
    token: str | None = None
    reported_at: float | None = None


@dataclass(frozen=True)
class ShardRecord:
    node: str
    rank: int
    gpus: tuple[str, ...]


class LeaveReason(enum.Enum):
    """Why the reconcile loop itself takes a replica out of routing to stop it: kept
    beside the human `ReplicaRecord.leaving` text, which no code reads back. A drain,
    a failed card or a rollout is not one: each is read from what owns it (the node's
    flag, the card's health, the replica's revision), so it is never stored twice."""

    SCALE_DOWN = "scale-down"  # demand fell (`demand.scale`): taken back if it rises again
    RECLAIM = "reclaim"  # room for a higher-priority model (`ReplicaRecord.reclaimed_for`)


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
    # Out of routing by the loop's own decision, to stop once the gateways let go:
    # why, for a person (`leaving`) and for code (`leave_reason`, and the model a
    # reclaim makes room for); all None for every other replica. A drain, a fault
    # or a rollout is read from the node, the card or the revision instead.
    leaving: str | None = None
    leave_reason: LeaveReason | None = None
    reclaimed_for: str | None = None
    # Sleeping (the warm tier): when its engines were told to sleep (wall time); None
    # while the gateways are still letting go of it, as before a stop.
    asleep_since: float | None = None
    # How it started (warm: its weights were on its nodes; cold: not), decided at
    # placement; None for a replica placed before it was kept.
    start: StartKind | None = None
    # The key its engines ask for (`VLLM_API_KEY`): made with the replica, so a
    # replacement (a new id) has a new one; only its agent and the gateways are told
    # it. None: placed before keys (its engines ask for none). Kept out of repr.
    engine_key: str | None = field(default=None, repr=False)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shards)

    def with_state(self, state: ReplicaState, error: str | None = None) -> ReplicaRecord:
        """In another state; out of sleep, its engines are told to wake."""
        asleep_since = self.asleep_since if state is ReplicaState.SLEEPING else None
        error = error if error is not None else self.error
        return replace(self, state=state, error=error, asleep_since=asleep_since)

    def leaves(
        self, reason: LeaveReason, why: str, reclaimed_for: str | None = None
    ) -> ReplicaRecord:
        """This replica out of routing by the loop's own decision, to stop."""
        return replace(
            self,
            state=ReplicaState.DRAINING,
            leaving=why,
            error=why,
            leave_reason=reason,
            reclaimed_for=reclaimed_for,
            asleep_since=None,
        )

    def stays(self) -> ReplicaRecord:
        """A leaving replica wanted again: back in routing."""
        return replace(
            self,
            state=ReplicaState.READY,
            leaving=None,
            error=None,
            leave_reason=None,
            reclaimed_for=None,
            asleep_since=None,
        )


@dataclass(frozen=True)
class ClientKey:
    """A tenant's client key (`ctl keys create`): its id is public, the key is kept
    only as a SHA-256 (llmgw.tenant_keys). `models`: the patterns it allows."""

    id: str
    tenant: str
    digest: str
    models: tuple[str, ...]
    created_at: float
    by: str
    expires_at: float | None = None  # None: never
    last_used: float | None = None  # as the gateways reported it (to the minute)


@dataclass(frozen=True)
class TenantLimit:
    """A tenant's limits (`ctl limits set`), on all its models (`model` None) or one;
    a kind left None is not limited. `budget` tokens per `per` ("day" | "month")."""

    tenant: str
    model: str | None
    rpm: int | None
    tpm: int | None
    budget: int | None
    per: str | None
    by: str
    at: float

    @property
    def scope(self) -> tuple[str, str | None]:
        return self.tenant, self.model


@dataclass(frozen=True)
class UsageCount:
    """What one tenant's requests to one model cost in one hour (its first second),
    summed over every gateway."""

    hour: float
    tenant: str
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    rate_limited: int = 0


@dataclass(frozen=True)
class Backoff:
    model: str
    failures: int
    retry_at: float  # unix time
    last_failure: str | None


@dataclass
class AdapterHold:
    """The controller's wish that one replica's engine hold one adapter (soft state)."""

    told_at: float  # monotonic: when the agent was first told to load it
    # Out of routing since (revision, monotonic time): the engine lets it go once every
    # gateway has applied that revision (or the stop grace passed). None: routed.
    leaving: tuple[int, float] | None = None


@dataclass(frozen=True)
class StartCount:
    """Starts of one model that reached ready, of one kind and sleep level (0 but for
    hot), and how long the last took (`wire.ModelStarts`)."""

    model: str
    kind: StartKind
    level: int
    count: int
    last_s: float | None
    last_at: float | None


@dataclass
class StateDump:
    """Everything durable, in a form either backend can load (for `migrate`): a
    controller started on the copy goes on where the original was. Secrets are in
    it only as the store keeps them (SHA-256 digests)."""

    nodes: dict[str, float] = field(default_factory=dict)
    admin: dict[str, AdminInfo] = field(default_factory=dict)
    events: list[AdminEvent] = field(default_factory=list)  # oldest first
    models: dict[str, tuple[ModelSpec, float]] = field(default_factory=dict)
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    backoffs: dict[str, Backoff] = field(default_factory=dict)
    revisions: dict[str, list[ModelRevision]] = field(default_factory=dict)  # oldest first
    # What the controller decided by itself (`GET /v1/events`), oldest first, ids kept.
    decisions: list[EventView] = field(default_factory=list)
    credentials: dict[str, IssuedCredential] = field(default_factory=dict)
    enroll_tokens: list[EnrollToken] = field(default_factory=list)
    enroll_allowed: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> (by, at)
    client_keys: list[ClientKey] = field(default_factory=list)  # digests, never a key
    adapters: dict[str, tuple[AdapterSpec, float]] = field(default_factory=dict)
    limits: list[TenantLimit] = field(default_factory=list)
    usage: list[UsageCount] = field(default_factory=list)  # by hour, tenant, model
    starts: list[StartCount] = field(default_factory=list)  # per model, kind and level

    def sizes(self) -> list[tuple[int, str]]:
        """How many of each thing the dump holds, named (never a digest)."""
        return [
            (len(self.nodes), "nodes"),
            (len(self.admin), "admin flags"),
            (len(self.events), "history events"),
            (len(self.models), "models"),
            (sum(map(len, self.revisions.values())), "model revisions"),
            (len(self.replicas), "replicas"),
            (len(self.backoffs), "backoffs"),
            (len(self.decisions), "decision events"),
            (len(self.credentials), "node credentials"),
            (len(self.enroll_tokens), "enrollment tokens"),
            (len(self.enroll_allowed), "enrollment allowances"),
            (len(self.client_keys), "client keys"),
            (len(self.adapters), "adapters"),
            (len(self.limits), "tenant limits"),
            (len(self.usage), "hourly usage counts"),
            (len(self.starts), "start counts"),
        ]

    def empty(self) -> bool:
        return not any(n for n, _ in self.sizes())

    def counts(self) -> str:
        """What the dump holds, counted (for `migrate`'s report)."""
        return ", ".join(f"{n} {what}" for n, what in self.sizes())


def gpus_on(node: str, records: Iterable[ReplicaRecord]) -> frozenset[str]:
    """The cards the shards of `records` hold on `node` (a replica may span nodes)."""
    return frozenset(
        gpu for rec in records for shard in rec.shards if shard.node == node for gpu in shard.gpus
    )
