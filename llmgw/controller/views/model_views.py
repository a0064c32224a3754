"""Replicas and models as the API shows them: views read from the facts when asked.

Replica states derive from the durable record and what the agents report
(replicas.py); every view counts them with `replicas.count_by_model`, so the
summary, `ctl models`, the unserved reasons and the reconcile loop cannot disagree.
These views keep nothing: a replica's state moves with every report, so there is
nothing worth keeping between two asks.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping
from types import MappingProxyType

from llmgw.controller.core.nodes import ShardDigest
from llmgw.controller.core.reclaim import reclaimed_words
from llmgw.controller.core.records import LeaveReason
from llmgw.controller.state.facts import Facts
from llmgw.controller.state.replicas import (
    ReplicaStatus,
    answering,
    count_by_model,
    replica_status,
    replica_view,
    serving,
)
from llmgw.present import timestamp
from llmgw.wire import (
    ModelSpec,
    ModelView,
    ReplicaState,
    ReplicaView,
    RolloutState,
    RolloutView,
    WakingModel,
)


def replica_statuses(facts: Facts, last_known: bool = True) -> dict[str, ReplicaStatus]:
    """Every replica's state now; idleness counts a gateway's requests as well as
    the engines' own counters, whichever is later. `last_known`: a replica whose
    nodes have not reported since this controller began to lead keeps its stored
    state, unconfirmed (what every view shows); the loop decides on what the nodes
    said (False): until they report, such a replica counts as starting there."""
    reported: dict[tuple[str, int], ShardDigest] = {}
    nodes = facts.nodes
    for node in facts.by_node:
        entry = nodes.get(node)
        if entry is not None:
            for shard in entry.shards:
                reported[(shard.replica_id, shard.rank)] = shard
    unheard = unheard_nodes(facts) if last_known else None
    out = {rid: replica_status(rec, reported, unheard) for rid, rec in facts.records.items()}
    for rid, seen in facts.gateway_activity.items():
        status = out.get(rid)
        if status is not None and (status.idle_since is None or seen > status.idle_since):
            out[rid] = dataclasses.replace(status, idle_since=seen)
    return out


def unheard_nodes(facts: Facts) -> dict[str, float]:
    """Nodes under replicas not heard from since this controller began to lead and
    not unreachable yet, and when each turns unreachable unless it reports."""
    now, nodes, out = facts.clock(), facts.nodes, {}
    for node in facts.by_node:
        entry = nodes.get(node)
        if entry is None or entry.received_at is not None:
            continue
        until = facts.liveness.unreachable_at(entry)
        if until >= now:
            out[node] = until
    return out


def replica_views(facts: Facts) -> list[ReplicaView]:
    now = facts.clock()
    return [replica_view(s, now) for s in replica_statuses(facts).values()]


def unplaceable_reasons(facts: Facts) -> Mapping[str, str]:
    """Why each model short of its minimum gets no new replica: the scheduler's
    reason, else the failure its replicas keep ending with (an engine no node
    has, say). The one wording every view shows: ctl models, ctl status, the
    console, the gateway's 503."""
    reasons = dict(facts.decisions.unplaceable)
    wall = facts.wall()
    for name, backoff in facts.backoffs.items():
        if name in reasons or not backoff.last_failure:
            continue
        why = failure_reason(backoff.last_failure)
        if backoff.retry_at > wall:
            why += f" (failure {backoff.failures}; next try at {timestamp(backoff.retry_at)})"
        reasons[name] = why
    return MappingProxyType(reasons)


def failure_reason(error: str) -> str:
    """Why a model whose replicas fail is short: one wording, whether the loop has
    backed it off yet or a replica failed since its last pass."""
    return f"its replicas fail: {error}"


def waking(facts: Facts, now: float) -> list[WakingModel]:
    """Models woken from zero by a request, still without a ready replica."""
    return [
        WakingModel(model=name, seconds=round(now - d.woke_at, 1), held=d.held)
        for name, d in sorted(facts.decisions.scalings.items())
        if d.woke_at is not None
    ]


def leave_words(
    reason: LeaveReason, reclaimed_for: str | None, desired: int, specs: Mapping[str, ModelSpec]
) -> str:
    """Why replicas of a model leave, in a model's view: from the reason, never its text."""
    if reason is LeaveReason.SCALE_DOWN:
        return f"scale down to {desired}"
    spec = specs.get(reclaimed_for or "")
    if spec is None:  # deleted since
        return f"reclaimed for {reclaimed_for}"
    return reclaimed_words(spec.name, spec.priority)


def model_views(
    facts: Facts, held: Mapping[str, int] | None = None, held_age: Mapping[str, float] | None = None
) -> list[ModelView]:
    """Every model's view; `held`, `held_age`: the live gateways' requests held per
    model and how long (`Gateways.held`, `Gateways.held_age`)."""
    held, held_age = held or {}, held_age or {}
    now = facts.clock()
    reasons = unplaceable_reasons(facts)
    statuses = replica_statuses(facts)
    counts = count_by_model(statuses.values())
    serving_on: dict[str, set[str]] = defaultdict(set)  # nodes under serving replicas
    updated: Counter[str] = Counter()  # ready replicas of the current revision
    outdated: Counter[str] = Counter()  # live replicas of an older one
    # Why the loop stops them: (reason, the model a reclaim makes room for).
    leaving: dict[str, Counter[tuple[LeaveReason, str | None]]] = defaultdict(Counter)
    # A replica failed since the loop's last pass: its error is the reason until the
    # pass backs the model off in the same words (else "no reason" for that moment).
    failed_with: dict[str, str] = {}
    unconfirmed: Counter[str] = Counter()
    unconfirmed_until: dict[str, float] = {}  # the latest moment each model's last ends
    for status in statuses.values():
        rec = status.record
        if status.unconfirmed_until is not None:
            unconfirmed[rec.model] += 1
            until = unconfirmed_until.get(rec.model, status.unconfirmed_until)
            unconfirmed_until[rec.model] = max(until, status.unconfirmed_until)
        if status.state is ReplicaState.FAILED and status.error:
            failed_with.setdefault(rec.model, status.error)
        if rec.leave_reason is not None:
            leaving[rec.model][rec.leave_reason, rec.reclaimed_for] += 1
        if status.state in (ReplicaState.READY, ReplicaState.DRAINING):
            serving_on[rec.model].update(rec.nodes)
        if status.state is not ReplicaState.FAILED and not facts.up_to_date(rec):
            outdated[rec.model] += 1
        elif status.state is ReplicaState.READY:
            updated[rec.model] += 1
    views = []
    for name, spec in sorted(facts.models.items()):
        mine = counts[name]
        ready = serving(mine)
        satisfied = answering(mine) >= spec.min_replicas
        backoff = facts.backoffs.get(name)
        desired = facts.desired_replicas(name)
        scaling = facts.decisions.scaling(name)
        autoscaled = scaling if scaling is not None and spec.autoscaled else None
        why = autoscaled.why if autoscaled is not None else None
        live = ready + mine[ReplicaState.STARTING]
        if why is not None and desired > live and ready >= spec.min_replicas:
            waits = reasons.get(name)
            if waits is not None:
                why = f"{why}; scale-up waits: {waits}"
        going = "; ".join(
            f"{n} leaving ({leave_words(reason, reclaimed_for, desired, facts.models)})"
            for (reason, reclaimed_for), n in sorted(
                leaving[name].items(), key=lambda kv: (kv[0][0].value, kv[0][1] or "")
            )
        )
        if going:
            why = f"{why}; {going}" if why else going
        views.append(
            ModelView(
                spec=spec,
                ready=ready,
                starting=mine[ReplicaState.STARTING],
                failed=mine[ReplicaState.FAILED],
                satisfied=satisfied,
                nodes=len(serving_on[name]),
                unplaceable_reason=None
                if satisfied
                else reasons.get(name) or _failed_now(failed_with.get(name)),
                last_failure=backoff.last_failure if backoff else None,
                rollout=_rollout_view(facts, spec, updated[name], outdated[name]),
                desired=desired,
                in_flight=round(scaling.in_flight, 2) if scaling is not None else 0.0,
                scaling=why,
                scaling_state=autoscaled.state if autoscaled is not None else None,
                sleeping=mine[ReplicaState.SLEEPING],
                waking=mine[ReplicaState.WAKING],
                held=held.get(name, 0),
                held_s=round(held_age[name], 1) if name in held_age else None,
                unconfirmed=unconfirmed[name],
                unconfirmed_s=round(max(0.0, unconfirmed_until[name] - now), 1)
                if name in unconfirmed_until
                else None,
                starts=facts.starts.of(name),
            )
        )
    return views


def _rollout_view(facts: Facts, spec: ModelSpec, updated: int, outdated: int) -> RolloutView:
    desired = facts.desired_replicas(spec.name)
    note = facts.decisions.rollout_note(spec.name)
    if outdated == 0 and updated >= desired:
        state, message = RolloutState.COMPLETE, None
    elif note is not None:
        state, message = note
    else:
        state, message = RolloutState.PROGRESSING, None
    return RolloutView(
        revision=facts.model_revision(spec.name),
        state=state,
        desired=desired,
        updated=updated,
        outdated=outdated,
        message=message,
    )


def _failed_now(error: str | None) -> str | None:
    return failure_reason(error) if error else None
