"""Popular models off each other's cards (issue 32): a sleeping replica moves to a
quieter card, make-before-break.

A sleeping replica stays on the card it was first placed on, chosen before anything
was known of its model's popularity. Two popular models on one card switch each other
out (`loop.warm`) at nearly every request, and each request waits for the other model
to make way: a sleep and a wake at best, a chain of them at worst (bench_density: the
p99 of a request that found its model asleep, 4.9-6 s against 2.9 s on a free card).
So when a card has seen `CONTENDED` switches in the last `WINDOW_S`
(`core.contention`), the replica of the model there that woke least, while it sleeps,
gets a stand-in on the quietest card where nothing is awake (a card nobody holds, or
one whose replicas all sleep with room beside them: `fleet_snapshot.free_cards`).
Once the stand-in is ready the original stops, and the stand-in is an ordinary replica
(it sleeps after its `sleep_after_s`, as any other). The spread never delays a
request: a move is called off (the stand-in removed, its engine stopped) as soon as
its model's requests are held (the original, still asleep where it was, wakes in a
second; the stand-in's start would take tens) or requests are held for a model asleep
on the stand-in's card (its start holds that card awake).

One move at a time on the fleet; a model moved, or whose move was called off, stays
for `WINDOW_S`. Only replicas of one card (one shard of one GPU): the common case of
the models a fleet keeps more of than it has cards.

Who calls: `Reconciler.steps`, once a pass, before `warm.sleep_and_wake`, so that a
move called off for its model's requests leaves the original to wake in the same pass.
A function of a `FleetSnapshot` returning a `Plan`; what it remembers is the switches
and moves the plans note (`Switched`, `MoveSettled`), kept in `Decisions.contention`.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.controller.core.contention import WINDOW_S, Card
from llmgw.controller.core.records import ReplicaRecord
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.placing import record_from, report_moved, stoppable
from llmgw.controller.loop.plans import MoveSettled, Plan, Planner
from llmgw.scheduler import NodeCapacity, Placement, place
from llmgw.wire import EventReason, ReplicaState

__all__ = ["CONTENDED", "spread"]

# Switches on one card within `WINDOW_S` that make it a card to move a model off.
CONTENDED = 4
# A card a stand-in may go to has seen at most this many switches in the window.
QUIET = 1


def spread(snap: FleetSnapshot) -> Plan:
    """Moves under way followed (finished, or called off); else one begun, when a card
    keeps switching."""
    plan = Planner(snap.records)
    if not snap.settings.spread:
        return plan.plan()
    # A stand-in whose original is gone (stopped by a rollout, a drain, a lost node) is
    # an ordinary replica: as a stand-in it could neither be scaled down nor switched out.
    plan.put(
        replace(r, replaces=None)
        for r in snap.records.values()
        if r.replaces is not None and r.replaces not in snap.records
    )
    moves = _moves(snap)
    for stand_in, original in moves:
        _follow(snap, plan, stand_in, original)
    if not moves:
        _begin(snap, plan)
    return plan.plan()


def _moves(snap: FleetSnapshot) -> list[tuple[ReplicaRecord, ReplicaRecord]]:
    """(stand-in, original) of each move under way: a stand-in for a sleeping replica
    (a drain's or a failed card's stand in for one that serves)."""
    out = []
    for rec in snap.records.values():
        original = snap.records.get(rec.replaces or "")
        if original is not None and original.state is ReplicaState.SLEEPING:
            out.append((rec, original))
    return out


def _follow(
    snap: FleetSnapshot, plan: Planner, stand_in: ReplicaRecord, original: ReplicaRecord
) -> None:
    model = original.model
    card = _card(stand_in)
    if stand_in.state is ReplicaState.READY:
        done = stoppable(snap, plan, [original.id])  # asleep: out of routing already
        plan.remove(done)
        if done:
            plan.put([replace(stand_in, replaces=None)])
            report_moved(
                plan, done, {original.id: stand_in}, "off a card where models kept switching"
            )
            plan.add(MoveSettled(model))
        return
    waiting = sorted(
        {
            o.model
            for o in plan.records.values()
            if o.id != stand_in.id and card is not None and _card(o) == card
        }
        | {model}
    )
    held = [m for m in waiting if snap.held_for(m) > 0]
    if not held and stand_in.state is not ReplicaState.FAILED:
        return
    plan.remove([stand_in.id])  # starting: nothing routes to it
    plan.add(MoveSettled(model))
    why = (
        "it failed to start"
        if stand_in.state is ReplicaState.FAILED and not held
        else f"requests held for {', '.join(held)}"
    )
    plan.event(
        f"replica/{original.id}",
        EventReason.MOVE_CALLED_OFF,
        f"{model}: move to {_where(stand_in)} called off ({why}); {original.id} stays "
        f"asleep on {_where(original)}",
    )


def _begin(snap: FleetSnapshot, plan: Planner) -> None:
    """One move, off the card that switched most lately, if one switched enough."""
    busy = sorted(
        ((len(seen), card) for card, seen in snap.switches.items() if len(seen) >= CONTENDED),
        reverse=True,
    )
    for count, card in busy:
        for original in _movable(snap, card):
            placed = _stand_in(snap, plan, original, card)
            if placed is None:
                continue
            seen = snap.switches[card]
            others = sorted(({s.out for s in seen} | {s.woken for s in seen}) - {original.model})
            plan.put([placed])
            plan.event(
                f"model/{original.model}",
                EventReason.STAND_IN,
                f"{placed.id} placed on {_where(placed)} to stand in for {original.id}, asleep "
                f"on {_where(original)}, where {original.model} and {', '.join(others)} "
                f"switched {count} times in {WINDOW_S:g}s",
            )
            return


def _movable(snap: FleetSnapshot, card: Card) -> list[ReplicaRecord]:
    """Sleeping one-card replicas on `card` that may move, the model that woke there
    least first (the other is the one its requests keep coming for)."""
    woke: dict[str, int] = {}
    for s in snap.switches[card]:
        woke[s.woken] = woke.get(s.woken, 0) + 1
    out = []
    for rec in snap.records.values():
        spec = snap.models.get(rec.model)
        status = snap.statuses.get(rec.id)
        if (
            _card(rec) != card
            or spec is None
            or status is None
            or rec.state is not ReplicaState.SLEEPING
            or rec.asleep_since is None
            or not status.asleep
            or rec.replaces is not None
            or rec.leave_reason is not None
            or not snap.up_to_date(rec)
            or rec.model in snap.moved_lately
            or snap.held_for(rec.model) > 0
            or snap.backing_off(rec.model)
        ):
            continue
        out.append(rec)
    return sorted(out, key=lambda r: (woke.get(r.model, 0), r.model))


def _stand_in(
    snap: FleetSnapshot, plan: Planner, original: ReplicaRecord, card: Card
) -> ReplicaRecord | None:
    """A stand-in for `original` on the quietest card (off `card`) where nothing is
    awake and no request is held for what sleeps there; None when there is none."""
    spec = snap.models[original.model]
    holders: dict[Card, list[str]] = {}
    for rec in plan.records.values():
        where = _card(rec)
        if where is not None:
            holders.setdefault(where, []).append(rec.model)
    choices: list[tuple[tuple[int, int, str, str], NodeCapacity, str, str]] = []
    for cap in snap.capacity(records=plan.records):
        if not cap.schedulable:
            continue
        for cls, uuids in cap.free.items():
            for uuid in uuids:
                there = (cap.name, uuid)
                switched = len(snap.switches.get(there, ()))
                models = holders.get(there, [])
                if (
                    there == card
                    or switched > QUIET
                    or original.model in models
                    or any(snap.held_for(m) > 0 for m in models)
                ):
                    continue
                choices.append(((switched, len(models), cap.name, uuid), cap, cls, uuid))
    for _, cap, cls, uuid in sorted(choices, key=lambda c: c[0]):
        only = replace(cap, free={cls: (uuid,)}, shared=cap.shared & {uuid})
        placed = place(spec, [only], snap.wanted_classes)
        if isinstance(placed, Placement):
            return record_from(placed, snap.wall, snap.revisions[spec.name], replaces=original.id)
    return None


def _card(rec: ReplicaRecord) -> Card | None:
    """The one card of a one-card replica (None for any other)."""
    if len(rec.shards) != 1 or len(rec.shards[0].gpus) != 1:
        return None
    return rec.shards[0].node, rec.shards[0].gpus[0]


def _where(rec: ReplicaRecord) -> str:
    card = _card(rec)
    if card is None:
        return ",".join(rec.nodes)
    return f"{card[0]} card {card[1][:12]}"
