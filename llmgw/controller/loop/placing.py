"""How the reconcile loop starts and stops replicas: new records, stand-ins, the stop gate.

Who calls: the steps of a pass (`llmgw.controller.loop.outcomes`, `drains`,
`rolling`, `demand`, `shortfalls`). `stoppable`, `place_stand_ins` and
`report_moved` add to the step's plan (`plans.Planner`); the rest build values.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.plans import HandingOver, Planner
from llmgw.scheduler import Placement, place_many
from llmgw.wire import EventReason, ReplicaState, StartKind

__all__ = [
    "new_engine_key",
    "new_replica_id",
    "place_stand_ins",
    "placed_words",
    "record_from",
    "report_moved",
    "stoppable",
]


def new_replica_id(model: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")[:40] or "replica"
    return f"{stem}-{secrets.token_hex(3)}"


def new_engine_key() -> str:
    """A replica's engine key: 32 random bytes, URL-safe (an HTTP header value)."""
    return secrets.token_urlsafe(32)


def record_from(
    placement: Placement, created_at: float, revision: int, replaces: str | None = None
) -> ReplicaRecord:
    return ReplicaRecord(
        id=new_replica_id(placement.model),
        model=placement.model,
        state=ReplicaState.STARTING,
        shards=tuple(ShardRecord(s.node, s.rank, s.gpus) for s in placement.shards),
        created_at=created_at,
        replaces=replaces,
        revision=revision,
        start=StartKind.WARM if placement.weights_local else StartKind.COLD,
        engine_key=new_engine_key(),
    )


def placed_words(records: list[ReplicaRecord]) -> str:
    """`placed 2 replica(s): a-1f on gpu1, a-2e on gpu2,gpu3`, at most ten named."""
    named = ", ".join(f"{r.id} on {','.join(r.nodes)}" for r in records[:10])
    more = f" and {len(records) - 10} more" if len(records) > 10 else ""
    return f"placed {len(records)} replica(s): {named}{more}"


def stoppable(
    snap: FleetSnapshot, plan: Planner, ids: list[str], *, force: bool = False
) -> list[str]:
    """Replicas that must stop go out of routing (in `plan`); answers those the
    gateways have let go of (all, without a gate), for the step to remove.

    One that holds adapters no other replica of its base has loaded stays in
    routing until one has (the adapter step tells another to load them), at most
    the stop grace: its adapters' requests never wait for a load (issue 33). A
    forced stop does not wait."""
    if not force:
        ids = _handed_over(snap, plan, ids)
    if snap.gate is not None:
        plan.stopping(ids)
    return snap.stop_now(ids, force=force)


def _handed_over(snap: FleetSnapshot, plan: Planner, ids: list[str]) -> list[str]:
    """Of `ids`, those free to leave routing now (see `stoppable`)."""
    if not snap.adapter_holds and not snap.handing_over:
        return ids
    marked = snap.gate.stopping if snap.gate is not None else {}
    out = []
    for rid in ids:
        waiting = [] if rid in marked else snap.adapters_only_on(rid, ids)
        known = snap.handing_over.get(rid)
        if not waiting:
            if known is not None:
                plan.add(HandingOver(rid, None))
            out.append(rid)
            continue
        since = known[0] if known is not None else snap.now
        names = ", ".join(waiting)
        obj = f"model/{snap.records[rid].model}"
        if snap.now - since >= snap.settings.stop_grace_s:
            plan.add(HandingOver(rid, None))
            plan.event(
                obj,
                EventReason.ADAPTERS_NOT_HANDED_OVER,
                f"{rid} stops with adapter(s) {names} loaded on no other replica after "
                f"{snap.settings.stop_grace_s:g}s (the stop grace): their requests wait for "
                "a load",
            )
            out.append(rid)
            continue
        plan.add(HandingOver(rid, (since, snap.now)))
        if known is None:
            plan.event(
                obj,
                EventReason.HANDING_OVER_ADAPTERS,
                f"{rid} stays in routing until adapter(s) {names} load on another replica",
            )
    return out


def place_stand_ins(
    snap: FleetSnapshot,
    plan: Planner,
    originals: list[ReplicaRecord],
    excluded: list[str],
    cause: str,
) -> str | None:
    """Place a stand-in for each original, off the `excluded` nodes, on the
    fleet as `plan` leaves it so far; say why when one cannot be placed."""
    if not originals:
        return None
    results = place_many(
        [snap.models[r.model] for r in originals],
        snap.capacity(excluded, plan.records),
        snap.wanted_classes,
    )
    placed, reasons = [], []
    for original, result in zip(originals, results, strict=True):
        if isinstance(result, Placement):
            revision = snap.revisions[original.model]
            stand_in = record_from(result, snap.wall, revision, replaces=original.id)
            placed.append(stand_in)
            plan.event(
                f"model/{original.model}",
                EventReason.STAND_IN,
                f"{stand_in.id} placed on {', '.join(stand_in.nodes)} to stand in for "
                f"{original.id} ({cause})",
            )
        else:
            reasons.append(f"{original.model}: {result.reason}")
    plan.put(placed)
    return "; ".join(reasons) or None


def report_moved(
    plan: Planner, done: list[str], by_replaced: Mapping[str, ReplicaRecord], why: str
) -> None:
    """Events: originals stopped once their stand-ins served."""
    for rid in done:
        stand_in = by_replaced[rid]
        plan.event(
            f"model/{stand_in.model}",
            EventReason.MOVED,
            f"{rid} stopped ({why}): {stand_in.id} serves in its place",
        )
