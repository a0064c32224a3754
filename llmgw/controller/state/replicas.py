"""Replica state, derived from the durable record and what the agents report."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.controller.core.nodes import ShardDigest
from llmgw.controller.core.records import ReplicaRecord
from llmgw.wire import ReplicaState, ReplicaView, ShardState, ShardView, SleepFailure


@dataclass(frozen=True)
class ReplicaStatus:
    record: ReplicaRecord
    state: ReplicaState
    shards: tuple[ShardDigest | None, ...]  # by rank; None: not reported (yet)
    idle_since: float | None  # most recent activity over the shards that know
    # Shown in its last known state: nodes of it have not reported since this
    # controller began to lead (a restart, a takeover). The moment (monotonic) the
    # first of them turns unreachable unless it reports; None: confirmed.
    unconfirmed_until: float | None = None

    @property
    def asleep(self) -> bool:
        """Every engine of it says it sleeps (not merely asked to)."""
        return all(s is not None and s.state is ShardState.SLEEPING for s in self.shards)

    @property
    def sleep_error(self) -> str | None:
        """Asked to sleep, an engine of it could not: why."""
        return next((s.sleep_error for s in self.shards if s and s.sleep_error), None)

    @property
    def sleep_failure(self) -> SleepFailure | None:
        """Its kind; REFUSED for an older agent that said only why."""
        shard = next((s for s in self.shards if s and s.sleep_error), None)
        if shard is None:
            return None
        return shard.sleep_failure or SleepFailure.REFUSED

    @property
    def last_wake(self) -> tuple[int, float] | None:
        """(level, seconds) of its last wake: the slowest of its engines' (each timed
        by its agent); None while one of them has not said."""
        wakes = [s.last_wake if s is not None else None for s in self.shards]
        if not wakes or any(w is None for w in wakes):
            return None
        return max(w for w in wakes if w is not None)

    @property
    def error(self) -> str | None:
        errors = [s.error for s in self.shards if s is not None and s.error]
        return errors[0] if errors else self.record.error

    @property
    def engine_in_flight(self) -> int | None:
        """Its engine's own count (rank 0's: running and waiting). None: not known."""
        lead = self.shards[0] if self.shards else None
        return lead.traffic.in_flight if lead is not None and lead.traffic is not None else None

    def in_flight(self, gateway_in_flight: Mapping[str, int]) -> int | None:
        """Requests in flight on this replica: its engine's own count, or the
        gateways' when higher. None: neither knows."""
        engine = self.engine_in_flight
        gateways = gateway_in_flight.get(self.record.id)
        if engine is None and gateways is None:
            return None
        return max(engine or 0, gateways or 0)


def model_in_flight(
    replicas: Iterable[ReplicaStatus], gateway_in_flight: Mapping[str, int], held: int = 0
) -> int:
    """A model's requests in flight over `replicas`: the engines' sum or the
    gateways' sum (`held` included: what the gateways hold for the model while it
    wakes), whichever is higher. Not the sum of each replica's higher count: the
    engines' counts are scraped at other moments than the gateways', and as
    requests move between replicas the higher of two readings per replica adds up
    to more than was ever in flight at once (12.8 in flight read as 16+). Nor the
    higher count plus `held`: a held request sent on to a woken replica is in the
    engine's count from its next scrape, and a gateway status read before the send
    still says it is held (issue 35: the woken model's figure doubled). Each sum
    alone is one source's reading of the whole model at one moment, so it is at
    most what was in flight, and the higher one still sees requests only one
    source sees (sent to an engine directly, held, or stuck in a stalled engine)."""
    engines = gateways = 0
    for r in replicas:
        engines += r.engine_in_flight or 0
        gateways += gateway_in_flight.get(r.record.id, 0)
    return max(engines, gateways + held)


def replica_status(
    record: ReplicaRecord,
    reported: Mapping[tuple[str, int], ShardDigest],
    unheard: Mapping[str, float] | None = None,
) -> ReplicaStatus:
    """`reported` maps (replica id, rank) to what the shard's node says of it;
    `unheard`, the nodes not heard from since this controller began to lead and
    not unreachable yet, to the moment each turns unreachable unless it reports.

    Failed is sticky. A replica is failed when one of its shards failed, even
    while draining: a crashed engine serves nothing and must not count as
    ready. Otherwise draining and sleeping are the controller's sticky decisions;
    else a replica is ready when every shard is, else waking (asked to) or starting.

    A shard whose node is unheard keeps its replica's last known state (ready, as
    stored), marked unconfirmed until the node reports or turns unreachable: a
    restart must not show every serving replica starting and every model short.
    """
    shards = tuple(reported.get((record.id, s.rank)) for s in record.shards)
    states = [s.state if s else None for s in shards]
    silent = [s.node for s, d in zip(record.shards, shards, strict=True) if d is None]
    waits = [unheard[n] for n in silent if n in unheard] if unheard else []
    until = min(waits) if silent and len(waits) == len(silent) else None
    state: ReplicaState
    if record.state is ReplicaState.FAILED or ShardState.FAILED in states:
        state = ReplicaState.FAILED
    elif record.state in (ReplicaState.DRAINING, ReplicaState.SLEEPING):
        state = record.state  # the controller's decision, whatever the engines say yet
    elif states and all(s is ShardState.READY for s in states):
        state = ReplicaState.READY  # a waking replica too, once every engine is awake
    elif until is not None and record.state is ReplicaState.READY:
        # Its unheard nodes' shards as they last were; the others say ready.
        ready = all(s in (ShardState.READY, None) for s in states)
        state = ReplicaState.READY if ready else ReplicaState.STARTING
    elif record.state is ReplicaState.WAKING:
        state = ReplicaState.WAKING
    else:
        state = ReplicaState.STARTING
    # Only rank 0 serves requests in most multi-node engines, so other ranks
    # report no idleness: take the latest activity among those that know.
    known = [s.idle_since for s in shards if s is not None and s.idle_since is not None]
    return ReplicaStatus(record, state, shards, max(known) if known else None, until)


def count_by_model(statuses: Iterable[ReplicaStatus]) -> dict[str, Counter[ReplicaState]]:
    """Each model's replicas by state: the one count every view and the reconcile
    loop read (summary, model views, unserved reasons, shortfalls)."""
    out: dict[str, Counter[ReplicaState]] = defaultdict(Counter)
    for status in statuses:
        out[status.record.model][status.state] += 1
    return out


def serving(counts: Mapping[ReplicaState, int]) -> int:
    """Replicas that answer: a draining one still does until its stand-in is ready."""
    return counts.get(ReplicaState.READY, 0) + counts.get(ReplicaState.DRAINING, 0)


def answering(counts: Mapping[ReplicaState, int]) -> int:
    """Replicas that answer a model's requests, now or after a wake (the warm tier):
    what its minimum counts, in the summary and the model views alike."""
    return (
        serving(counts) + counts.get(ReplicaState.SLEEPING, 0) + counts.get(ReplicaState.WAKING, 0)
    )


def replica_view(status: ReplicaStatus, now: float) -> ReplicaView:
    rec = status.record
    return ReplicaView(
        id=rec.id,
        model=rec.model,
        state=status.state,
        shards=[
            ShardView(
                node=s.node,
                rank=s.rank,
                gpus=list(s.gpus),
                state=d.state if d else None,
                idle_seconds=round(now - d.idle_since, 1)
                if d and d.idle_since is not None
                else None,
                error=d.error if d else None,
            )
            for s, d in zip(rec.shards, status.shards, strict=True)
        ],
        gpus=rec.gpu_count,
        idle_seconds=None if status.idle_since is None else round(now - status.idle_since, 1),
        created_at=rec.created_at,
        error=status.error,
        replaces=rec.replaces,
        revision=rec.revision or 1,
        unconfirmed_s=None
        if status.unconfirmed_until is None
        else round(max(0.0, status.unconfirmed_until - now), 1),
    )
