"""The warm tier (issue 32): an idle replica of a model whose spec asks for it sleeps
instead of stopping, and wakes, the same replica, when its model's requests come.

Who calls: `Reconciler.steps`, once a pass, after `demand.scale` and before reclaim and
the shortfall step, which then place only what waking cannot serve (a sleeping replica
counts for its model, toward `max_replicas`, and serves nothing). A function of a
`FleetSnapshot` returning a `Plan`; nothing is remembered between passes.

A replica's state says what the controller decided (`sleeping`, `waking`). Going to
sleep is a stop's handshake: the replica leaves routing at once (a `stopping` endpoint),
and only once every live gateway has let go of it (`FleetSnapshot.stop_now`: applied,
nothing in flight) is it `asleep_since` now, and its assignment carries the sleep level
to its agent, the only caller of the engine's sleep endpoints: no request is sent to an
engine on its way to sleep. It is out of routing until it is ready again. The engines' reports say what became of it: asleep (`ReplicaStatus.asleep`),
awake again (`outcomes.record_transitions` makes it ready), or unable to sleep
(`sleep_error`: awake and in routing again, it stops as without sleep when demand falls).

Requests held for a model with no replica at all, on a fleet with no room for one,
make room (`_make_room`): an idle awake replica of a model that sleeps goes to sleep
at once, not after its `sleep_after_s`, and the model waits for room
(`Decisions.making_room`: its requests held, not refused as unplaceable) until the
card is free and the shortfall step places it there.
"""

from __future__ import annotations

import enum
import math
from dataclasses import replace

from llmgw.controller.core.records import LeaveReason, ReplicaRecord
from llmgw.controller.loop.faults import fault_under
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot, ModelReplicas
from llmgw.controller.loop.placing import placed_words, record_from, stoppable
from llmgw.controller.loop.plans import MakingRoom, Plan, Planner
from llmgw.controller.state.replicas import ReplicaStatus
from llmgw.scheduler import Placement, place
from llmgw.wire import EventReason, ModelSpec, ReplicaState, SleepFailure, fit_together

__all__ = ["sleep_and_wake"]

_AWAKE = (ReplicaState.READY, ReplicaState.STARTING, ReplicaState.WAKING)
# An idle replica of a higher priority than the model waking on its cards makes way
# once nothing has asked it anything for this long (or its `sleep_after_s`, if
# shorter), or once the other's requests have waited this long: a popular model is not
# put to sleep between two of its requests, and the other's wait stays bounded (without
# the bound, bench_density's neighbours of a model asked every 4 s waited up to 85 s).
OUTRANKING_IDLE_S = 5.0


def sleep_and_wake(snap: FleetSnapshot) -> Plan:
    """Per model: replicas that could not sleep stop; sleeping ones wake for the
    requests held or in flight that the awake ones cannot take; idle ones sleep."""
    plan = Planner(snap.records)
    # The longest held first: two models asleep on one card take the room a sleep makes
    # there in the order their requests came, not by name.
    for name, spec in sorted(snap.models.items(), key=lambda kv: (-snap.held_age(kv[0]), kv[0])):
        mine = snap.replicas_of(name)
        _could_not_sleep(snap, plan, mine)
        if not _wake(snap, plan, spec, mine):
            _let_go(snap, plan, mine)
            _stop_long_asleep(snap, plan, spec, mine)
            if spec.sleeps:
                _sleep(snap, plan, spec, mine)
    _make_room(snap, plan)
    return plan.plan()


def _stop_long_asleep(
    snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas
) -> None:
    """Asleep for `stop_asleep_after_s`: stopped, the longest asleep first, but never
    below what the model should have (its minimum, its desired count), which would
    only place a cold replica in its stead."""
    limit = spec.stop_asleep_after_s
    if limit is None:
        return
    room = len(mine.standing) - max(spec.min_replicas, snap.desired.get(spec.name, 0))
    long_asleep = sorted(
        (
            s.record
            for s in mine.standing
            if s.record.state is ReplicaState.SLEEPING
            and s.record.asleep_since is not None
            and snap.wall - s.record.asleep_since >= limit
        ),
        key=lambda r: (r.asleep_since, r.id),
    )[: max(room, 0)]
    if not long_asleep:
        return
    plan.remove(r.id for r in long_asleep)  # out of routing since it was let go
    for rec in long_asleep:
        asleep_s = snap.wall - (rec.asleep_since or snap.wall)
        plan.event(
            f"model/{spec.name}",
            EventReason.SCALED_DOWN,
            f"{rec.id} stopped after {asleep_s:.0f}s asleep (stop_asleep_after_s {limit:g})",
        )


def _let_go(snap: FleetSnapshot, plan: Planner, mine: ModelReplicas) -> None:
    """Replicas going to sleep that every gateway has let go of: told to sleep now."""
    going = [s.record for s in mine.standing if _falling_asleep(s)]
    if not going:
        return
    # Marked again (a no-op but after a restart, whose facts forgot the mark).
    done = set(stoppable(snap, plan, [r.id for r in going]))
    plan.put(replace(r, asleep_since=snap.wall) for r in going if r.id in done)


def _falling_asleep(s: ReplicaStatus) -> bool:
    return s.record.state is ReplicaState.SLEEPING and s.record.asleep_since is None


def _could_not_sleep(snap: FleetSnapshot, plan: Planner, mine: ModelReplicas) -> None:
    """Found out at the first try (its engines say so from then on): it is awake, so
    back in routing, never asked again, and stopped as a replica of a model that does
    not sleep is (`demand` scales it down)."""
    for s in mine.standing:
        error = s.sleep_error
        if s.record.state is not ReplicaState.SLEEPING or error is None:
            continue
        rec = s.record
        plan.put([replace(rec, state=ReplicaState.READY, asleep_since=None)])
        what = (
            "slept without freeing its memory, so it was woken again"
            if s.sleep_failure is SleepFailure.MEMORY_KEPT
            else "could not sleep"
        )
        plan.event(
            f"replica/{rec.id}",
            EventReason.SLEEP_FAILED,
            f"{rec.model}: {what} ({error.splitlines()[0]}); it stays awake and "
            "stops when demand falls, as without sleep",
        )


def _wanted_awake(snap: FleetSnapshot, spec: ModelSpec, awake: list[ReplicaStatus]) -> int:
    """Awake replicas the model's requests ask for now: its requests in flight and
    held at the gateways over its target, and one for any held request."""
    held = snap.held_for(spec.name)
    in_flight = sum(s.in_flight(snap.gateway_in_flight) or 0 for s in awake) + held
    wanted = math.ceil(in_flight / spec.target_in_flight)
    return max(wanted, 1) if held else wanted


def _wake(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas) -> bool:
    """Wake what the requests ask for; True when any replica wakes (or will)."""
    awake = [s for s in mine.standing if s.state in _AWAKE]
    # Not told to sleep yet: back in routing at once, as a scale-down taken back.
    # Told: woken once its engines say they sleep (one still on its way to sleep would
    # read ready from its last report, and be routed to while it falls asleep).
    going = [s for s in mine.standing if _falling_asleep(s) and not _touched(plan, s)]
    asleep = [
        s
        for s in mine.standing
        if s.record.state is ReplicaState.SLEEPING
        and s.record.asleep_since is not None
        and s.asleep
        and not _touched(plan, s)
    ]
    # Not one whose cards a higher-priority model's sleeping replica waits to wake on:
    # woken (or taken back), it would be switched out again for it at once, pass after
    # pass, and neither would serve; its requests wait, as the other's did.
    candidates = [
        s
        for s in [*going, *sorted(asleep, key=lambda s: (s.record.created_at, s.record.id))]
        if not _yielding(snap, plan, spec, s)
    ]
    count = min(len(candidates), _wanted_awake(snap, spec, awake) - len(awake))
    if count <= 0:
        return any(s.state is ReplicaState.WAKING for s in awake)
    picked: list[ReplicaStatus] = []
    pending = False  # a switch under way: a replica on its cards goes to sleep first
    for s in candidates:
        if len(picked) >= count:
            break
        room = _room_to_wake(snap, plan, spec, s)
        if room is _Room.FREE:
            picked.append(s)
        elif room in (_Room.SWITCHING, _Room.WAITING):
            pending, count = True, count - 1
    plan.put(
        replace(
            s.record,
            state=ReplicaState.READY if _falling_asleep(s) else ReplicaState.WAKING,
            asleep_since=None,
        )
        for s in picked
    )
    for s in picked:
        plan.event(
            f"replica/{s.record.id}",
            EventReason.WOKE,
            f"{spec.name}: waking for its requests ({len(awake)} replica(s) awake)",
        )
    return bool(picked) or pending


def _touched(plan: Planner, s: ReplicaStatus) -> bool:
    """Changed by this pass already (a switch put it to sleep for another model)."""
    return plan.records.get(s.record.id) is not s.record


def _yielding(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, s: ReplicaStatus) -> bool:
    """Whether a sleeping replica on `s`'s cards waits to wake for requests of a model
    of higher priority than `spec`: `s` goes to sleep for it."""
    return any(
        o.state is ReplicaState.SLEEPING
        and (other := snap.models.get(o.model)) is not None
        and other.priority > spec.priority
        and snap.held_for(o.model) > 0
        for o in _sharing(snap, plan, s.record)
    )


class _Room(enum.Enum):
    FREE = "free"  # no awake engine on its cards that it does not fit beside: it wakes now
    SWITCHING = "switching"  # awake ones there go to sleep (or stop) first
    WAITING = "waiting"  # busy ones there, and no room elsewhere: it waits for them
    NONE = "none"  # busy ones there: it stops, and a replica is placed elsewhere


def _room_to_wake(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, s: ReplicaStatus) -> _Room:
    """Whether a sleeping replica may wake on its cards. A card shared with a replica
    placed there while it slept (`fleet_snapshot.free_cards`) holds one awake engine,
    or several whose models' `gpu_memory_share`s add up to at most 1 (`_fits_beside`):
    it wakes now when it fits beside those awake there. Else awake ones there that
    serve nothing and whose model has no request held switch out (sleep, or stop for a
    model that does not sleep, never below its minimum), the longest idle first and as
    few as leave it room, and it wakes once they sleep: two models alternating on one
    card each wait one sleep and one wake. So do busy ones of a model of lower priority,
    once what they serve is done, and idle ones of a higher priority once idle or
    waited for `OUTRANKING_IDLE_S`. Other busy ones stay, and it makes way: stopped (it is
    out of routing and asleep), its model's requests go to a replica placed afresh,
    when one fits elsewhere; else it waits for them to serve nothing."""
    rec = s.record
    if not _falling_asleep(s):
        others = [o for o in _sharing(snap, plan, rec) if not _asleep(snap, o)]
    else:
        others = []  # never left its cards: nothing was placed on them
    if _fits_beside(snap, rec, others):
        return _Room.FREE  # none there, or their shares of the cards leave room for it
    # On their way to sleep, or out: the wake waits for them.
    switching = [
        o for o in others if o.state is ReplicaState.SLEEPING or o.leave_reason is not None
    ]
    staying = [o for o in others if o not in switching]
    switchable = [o for o in staying if _switchable(snap, o, spec)]
    blocked = [o for o in staying if o not in switchable]
    making_way = _fewest_out(snap, rec, staying, switchable)
    if making_way is not None:
        for other in making_way:
            _switch_out(snap, plan, other, spec)
        return _Room.SWITCHING
    # Room only once busy ones (`blocked`, never empty here) serve nothing.
    if all(_makes_way_soon(snap, o, spec) for o in blocked):
        return _Room.WAITING  # seconds: never an engine start elsewhere for that
    busy = sorted({o.model for o in blocked})
    placed = _placed_elsewhere(snap, plan, spec, rec)
    if placed is None:
        return _Room.WAITING  # nowhere else: it wakes here once they serve nothing
    # Placed in this plan, not left to the shortfall step: a wake decided later in
    # this pass must not take the cards it was counted on (it then waited for
    # nothing, and its model read unplaceable).
    plan.remove([rec.id])
    plan.put([placed])
    plan.event(
        f"replica/{rec.id}",
        EventReason.NO_ROOM_TO_WAKE,
        f"{spec.name}: stopped instead of woken, its cards hold {', '.join(busy)} awake "
        f"and busy; {placed.id} is placed afresh for its requests",
    )
    plan.event(f"model/{spec.name}", EventReason.PLACED, placed_words([placed]))
    return _Room.NONE


def _fewest_out(
    snap: FleetSnapshot,
    rec: ReplicaRecord,
    staying: list[ReplicaRecord],
    switchable: list[ReplicaRecord],
) -> list[ReplicaRecord] | None:
    """The switchable replicas that make room for `rec` by going to sleep, the longest
    idle first, as few as leave it room (None: even all of them would not). Without
    shares of the cards (`gpu_memory_share`), every awake one there."""
    out: list[ReplicaRecord] = []
    longest_idle = iter(sorted(switchable, key=lambda o: (_idle_since(snap, o), o.id)))
    while not _fits_beside(snap, rec, [o for o in staying if o not in out]):
        other = next(longest_idle, None)
        if other is None:
            return None
        out.append(other)
    return out


def _idle_since(snap: FleetSnapshot, rec: ReplicaRecord) -> float:
    """Since when `rec` serves nothing (now when unknown): the longest idle sort first."""
    status = snap.statuses.get(rec.id)
    since = status.idle_since if status is not None else None
    return snap.now if since is None else since


def _share(snap: FleetSnapshot, rec: ReplicaRecord) -> float | None:
    """The share of each card `rec`'s engine takes awake: its spec's `gpu_memory_share`
    when it runs its model's spec as it is now (its agent was told that one), else the
    whole card (None), which is never wrong."""
    spec = snap.models.get(rec.model)
    return spec.gpu_memory_share if spec is not None and snap.up_to_date(rec) else None


def _fits_beside(snap: FleetSnapshot, rec: ReplicaRecord, awake: list[ReplicaRecord]) -> bool:
    """Whether `rec` may be awake beside `awake` on every card it shares with them
    (`wire.fit_together`, the rule its agent holds to)."""
    mine = _share(snap, rec)
    for node, gpu in {(sh.node, g) for sh in rec.shards for g in sh.gpus}:
        beside = [
            _share(snap, o)
            for o in awake
            if any(sh.node == node and gpu in sh.gpus for sh in o.shards)
        ]
        if beside and not fit_together([mine, *beside]):
            return False
    return True


def _placed_elsewhere(
    snap: FleetSnapshot, plan: Planner, spec: ModelSpec, rec: ReplicaRecord
) -> ReplicaRecord | None:
    """A replica of `spec` placed afresh with `rec` gone, if one fits on cards nobody
    holds (a scan of the fleet, for a wake blocked by busy engines only). Not beside
    sleeping replicas: an engine start there (tens of seconds) would cost more than
    the wait for the busy engines here (seconds, as a rule), and take the room the
    sleeping ones wake into."""
    records = {rid: r for rid, r in plan.records.items() if rid != rec.id}
    placed = place(spec, snap.capacity(records=records), snap.wanted_classes)
    if not isinstance(placed, Placement):
        return None
    held = {(sh.node, g) for r in records.values() for sh in r.shards for g in sh.gpus}
    if any((sh.node, g) in held for sh in placed.shards for g in sh.gpus):
        return None
    return record_from(placed, snap.wall, snap.revisions[spec.name])


def _sharing(snap: FleetSnapshot, plan: Planner, rec: ReplicaRecord) -> list[ReplicaRecord]:
    """Other replicas (as the plan leaves them) holding a card of `rec`."""
    cards = {(sh.node, gpu) for sh in rec.shards for gpu in sh.gpus}
    return [
        o
        for o in plan.records.values()
        if o.id != rec.id and any((sh.node, g) in cards for sh in o.shards for g in sh.gpus)
    ]


def _asleep(snap: FleetSnapshot, rec: ReplicaRecord) -> bool:
    status = snap.statuses.get(rec.id)
    return (
        rec.state is ReplicaState.SLEEPING
        and rec.asleep_since is not None
        and status is not None
        and status.asleep
    )


def _switchable(snap: FleetSnapshot, rec: ReplicaRecord, waking: ModelSpec | None = None) -> bool:
    """An awake replica that may make way on its cards: ready, not a stand-in, (for a
    model that does not sleep) above its minimum, and serving nothing with its model's
    requests not held, unless its model's priority is below `waking`'s: then what it
    serves finishes first, out of routing (the stop handshake), and its model's new
    requests wait for a card as the other's did."""
    status = snap.statuses.get(rec.id)
    spec = snap.models.get(rec.model)
    if status is None or spec is None or rec.state is not ReplicaState.READY:
        return False
    if rec.replaces is not None:
        return False
    outranked = waking is not None and spec.priority < waking.priority
    if _busy(snap, status) and not outranked:
        return False
    if waking is not None and _outranks_for_now(snap, spec, status, waking):
        return False
    if _can_sleep(snap, spec, status):
        return True
    keep = max(spec.min_replicas, snap.desired.get(rec.model, 0))
    return len(snap.replicas_of(rec.model).standing) > keep


def _outranks_for_now(
    snap: FleetSnapshot, spec: ModelSpec, status: ReplicaStatus, waking: ModelSpec
) -> bool:
    """Of a higher priority than `waking`, asked something under `OUTRANKING_IDLE_S`
    ago (or its `sleep_after_s`, if shorter), while `waking`'s requests have waited
    less than that: it makes way in seconds, not now."""
    if spec.priority <= waking.priority or status.idle_since is None:
        return False
    grace = min(spec.sleep_after_s or OUTRANKING_IDLE_S, OUTRANKING_IDLE_S)
    recent = snap.now - status.idle_since < grace
    return recent and snap.held_age(waking.name) < OUTRANKING_IDLE_S


def _makes_way_soon(snap: FleetSnapshot, rec: ReplicaRecord, waking: ModelSpec) -> bool:
    """Idle, and held back from a switch only by `_outranks_for_now`."""
    status, spec = snap.statuses.get(rec.id), snap.models.get(rec.model)
    if status is None or spec is None or _busy(snap, status):
        return False
    return _outranks_for_now(snap, spec, status, waking)


def _busy(snap: FleetSnapshot, status: ReplicaStatus) -> int:
    """Requests it serves, or its model's held at the gateways (0: serving nothing)."""
    return (status.in_flight(snap.gateway_in_flight) or 0) + snap.held_for(status.record.model)


def _can_sleep(snap: FleetSnapshot, spec: ModelSpec, status: ReplicaStatus) -> bool:
    return spec.sleeps and snap.up_to_date(status.record) and status.sleep_error is None


def _switch_out(snap: FleetSnapshot, plan: Planner, rec: ReplicaRecord, waking: ModelSpec) -> None:
    """Make way for `waking`'s sleeping replica: asleep (through the stop handshake,
    as `_sleep`) or, for a model that does not sleep, out of routing to stop."""
    spec, status = snap.models[rec.model], snap.statuses[rec.id]
    why = f"switch: its cards are wanted by {waking.name}, whose requests wait"
    if spec.priority < waking.priority and _busy(snap, status):
        busy = status.in_flight(snap.gateway_in_flight) or 0
        why += (
            f"; priority {waking.priority} over {spec.priority}, its {busy} request(s) in "
            "flight finish first"
        )
    if _can_sleep(snap, spec, status):
        let_go = stoppable(snap, plan, [rec.id])
        asleep_since = snap.wall if let_go else None
        plan.put([replace(rec, state=ReplicaState.SLEEPING, asleep_since=asleep_since)])
        plan.event(f"replica/{rec.id}", EventReason.SLEPT, f"{rec.model}: asleep ({why})")
        return
    plan.put([rec.leaves(LeaveReason.SCALE_DOWN, why)])
    plan.event(f"model/{rec.model}", EventReason.SCALED_DOWN, f"{rec.id} out of routing ({why})")
    if stoppable(snap, plan, [rec.id]):
        plan.remove([rec.id])


def _sleep(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas) -> None:
    """A ready replica nobody asked anything of for `sleep_after_s` sleeps."""
    after = spec.sleep_after_s
    assert after is not None
    held = snap.held_for(spec.name)
    if held:
        return
    for s in mine.standing:
        rec = s.record
        if (
            rec.state is ReplicaState.READY
            and not _touched(plan, s)
            and s.state is ReplicaState.READY
            and rec.replaces is None  # a stand-in serves in another's place
            and snap.up_to_date(rec)  # started able to sleep (`sleeps` is an engine field)
            and s.idle_since is not None
            and snap.now - s.idle_since >= after
            and not s.in_flight(snap.gateway_in_flight)
            and fault_under(rec, snap.faults) is None
            and s.sleep_error is None  # it cannot: found out once
        ):
            let_go = stoppable(snap, plan, [rec.id])  # out of routing, as before a stop
            asleep_since = snap.wall if let_go else None
            plan.put([replace(rec, state=ReplicaState.SLEEPING, asleep_since=asleep_since)])
            idle = snap.now - s.idle_since
            plan.event(
                f"replica/{rec.id}",
                EventReason.SLEPT,
                f"{spec.name}: asleep, idle for {idle:.0f}s (sleep_after_s {after:g})",
            )


def _make_room(snap: FleetSnapshot, plan: Planner) -> None:
    """Models with requests held and no replica at all, that do not fit: room is made
    by putting an idle awake replica to sleep now (one per such model per pass, the
    highest priority first), and each waits for room (`MakingRoom`) meanwhile."""
    placed = {r.model for r in plan.records.values()}  # standing, or placed by this pass
    wanting = sorted(
        (
            spec
            for name, spec in snap.models.items()
            if snap.held_for(name) and name not in placed and not snap.backing_off(name)
        ),
        key=lambda spec: (-spec.priority, -snap.held_for(spec.name), spec.name),
    )
    claimed: set[str] = set()  # replicas going to sleep that one model counts on
    making = {}
    for spec in wanting:
        how = _room_for(snap, plan, spec, claimed)
        if how is not None:
            making[spec.name] = how
    for name in sorted(snap.making_room.keys() | making.keys()):
        if snap.making_room.get(name) != making.get(name):
            plan.add(MakingRoom(name, making.get(name)))


def _room_for(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, claimed: set[str]) -> str | None:
    """How room is made for one replica of `spec` (None: none is needed, or none can
    be made by sleep: the shortfall step says why it does not fit)."""
    if isinstance(place(spec, snap.capacity(records=plan.records), snap.wanted_classes), Placement):
        # It fits: the shortfall step places it in this pass; until it has, its
        # requests wait rather than read a reason the room made is out of date.
        return "room made: a replica is being placed" if spec.name in snap.making_room else None
    if spec.shards != 1:  # room across nodes: left to reclaim and the shortfall step
        return None
    shaped = [
        r for r in plan.records.values() if r.id not in claimed and _holds_room(snap, r, spec)
    ]
    going = [r for r in shaped if r.state is ReplicaState.SLEEPING and not _asleep(snap, r)]
    if going:
        claimed.add(going[0].id)
        return f"waits for room: {going[0].model} ({going[0].id}) goes to sleep"
    idle = sorted(
        (r for r in shaped if _may_sleep_for(snap, plan, r, spec)),
        key=lambda r: (_idle_since(snap, r), r.id),
    )
    if not idle:
        return None
    rec = idle[0]
    claimed.add(rec.id)
    _switch_out(snap, plan, rec, spec)
    return f"waits for room: {rec.model} ({rec.id}) goes to sleep"


def _holds_room(snap: FleetSnapshot, rec: ReplicaRecord, spec: ModelSpec) -> bool:
    """Whether `rec`'s cards, once it sleeps, hold a replica of one-shard `spec`."""
    if len(rec.shards) != 1 or len(rec.shards[0].gpus) < spec.gpus_per_shard:
        return False
    if spec.gpu_class is None:
        return True
    shard = rec.shards[0]
    entry = snap.nodes.get(shard.node)
    if entry is None:
        return False
    classes = {uuid: cls for uuid, cls, _ in entry.cards}
    return all(classes.get(gpu) == spec.gpu_class for gpu in shard.gpus)


def _may_sleep_for(snap: FleetSnapshot, plan: Planner, rec: ReplicaRecord, spec: ModelSpec) -> bool:
    """An idle awake replica that may sleep for `spec`'s requests: of a model that
    sleeps, of no higher priority, untouched by this pass."""
    other = snap.models.get(rec.model)
    status = snap.statuses.get(rec.id)
    return (
        other is not None
        and status is not None
        and other.priority <= spec.priority
        and snap.records.get(rec.id) is rec  # not changed by this pass
        and _switchable(snap, rec)
        and _can_sleep(snap, other, status)
    )
