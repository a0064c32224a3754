"""The loop step that decides which ready replicas of a base hold which LoRA
adapters (issue 33), within the base's `--max-cpu-loras`.

- By demand: an adapter with requests held at the gateways (loaded nowhere) or in
  flight gets a holder; a busy one gets more, one per `target_in_flight` of its
  base's spec, up to every ready replica of the base.
- Room: a replica holds at most its base's slots, counting adapters on their way
  out. A full replica makes room by letting go of an adapter with nothing in flight,
  the least asked for lately first, then the least recently used, and one asked for
  more than the new one only once the new one has waited `PATIENCE_S`; the new one is
  told once that slot is free (a pass or two later).
- Idle: an adapter nothing asked for `adapter_idle_s` leaves every replica.
- Leaving is a handshake, as a replica's stop is: out of routing first (the feed),
  unloaded once every live gateway's routing follows that and none has a request for
  it there in flight (`GateView.adapter_let_go`), or the stop grace passed.
- A replica that drains, is rolled out or must stop otherwise no longer counts as a
  holder, so another is told to load before it goes; it keeps serving, in routing,
  until that load is seen (`placing.stoppable`, `Decisions.handing_over`).
- A load the engine refused (`AdapterLoadFailed`, with its words) is not tried on
  that replica again for `FAILED_BACKOFF_S`.

What the step remembers across passes is the term's `AdapterMemory` (core.adapter_use),
which the adapters' view reads too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llmgw.controller.core.adapter_specs import adapter_slots
from llmgw.controller.core.adapter_use import FAILED_BACKOFF_S, AdapterMemory
from llmgw.controller.core.records import AdapterHold
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.plans import (
    DropAdapter,
    HandingOver,
    HoldAdapter,
    Plan,
    Planner,
    ReleaseAdapter,
)
from llmgw.wire import EventReason, ReplicaState

_SERVING = (ReplicaState.READY, ReplicaState.DRAINING)
MIN_HELD_S = 3.0  # an adapter is not pushed out sooner after it was told to load
# Its requests held this long (the gateways' `held_age`), an adapter takes a slot from
# one asked for more than it: it does not push out a hot one between two of its
# requests, nor wait behind hot ones for good (`_victim`).
PATIENCE_S = 3.0
HANDING_OVER_KEPT_S = 10.0  # a replica's wait to stop, not asked again for this long, is over


def plan_adapters(snap: FleetSnapshot, memory: AdapterMemory) -> Plan:
    p = Planner(snap.records)
    gate = snap.gate
    now = snap.now
    in_flight = dict(gate.adapter_in_flight) if gate else {}
    held_at_gateways = {n: c for n, c in (gate.held if gate else {}).items() if n in snap.adapters}
    busy = {n: in_flight.get(n, 0) + held_at_gateways.get(n, 0) for n in snap.adapters}
    memory.observe(now, snap.adapters, busy, gate.adapter_requests if gate else {})
    holds = {rid: dict(held) for rid, held in snap.adapter_holds.items()}

    def forget(rid: str, name: str) -> None:
        holds[rid].pop(name, None)
        memory.dropped.add((rid, name))

    # What became of each hold: gone, refused, loaded, or let go of by the gateways.
    for rid, held in snap.adapter_holds.items():
        status = snap.statuses.get(rid)
        shard = status.shards[0] if status is not None and status.shards else None
        serving = status is not None and status.state in _SERVING
        for name, hold in held.items():
            if name not in snap.adapters or not serving:
                p.add(DropAdapter(rid, name))
                forget(rid, name)
                memory.announced.discard((rid, name))
                continue
            failure = (
                next((f for f in shard.adapter_failures if f[0] == name), None) if shard else None
            )
            if failure is not None:
                _, status_code, message = failure
                said = f"the engine answered {status_code}" if status_code else "no answer"
                why = f"replica {rid}: {said}: {message}"
                p.add(DropAdapter(rid, name))
                p.event(f"adapter/{name}", EventReason.ADAPTER_LOAD_FAILED, why)
                forget(rid, name)
                memory.failed[(rid, name)] = now
                memory.last_failure[name] = why
                continue
            if hold.leaving is not None:
                revision, at = hold.leaving
                if (
                    gate is None
                    or gate.adapter_let_go(rid, name, revision)
                    or now - at >= gate.grace_s
                ):
                    p.add(DropAdapter(rid, name))
                    forget(rid, name)
                    memory.announced.discard((rid, name))
                    idle = memory.idle_for(name, now)
                    p.event(
                        f"adapter/{name}",
                        EventReason.ADAPTER_UNLOADED,
                        f"unloaded from replica {rid}"
                        + (f" (unused for {idle:.0f}s)" if idle is not None else ""),
                    )
                continue
            if shard is not None and name in shard.adapters and (rid, name) not in memory.announced:
                memory.announced.add((rid, name))
                p.event(
                    f"adapter/{name}",
                    EventReason.ADAPTER_LOADED,
                    f"loaded on replica {rid} in {now - hold.told_at:.1f}s",
                )

    # What an engine holds that no hold names, and this term did not drop, a term before
    # it asked for (a restart, a takeover): adopted, not unloaded and loaded again.
    for rid, status in snap.statuses.items():
        shard = status.shards[0] if status.shards else None
        if shard is None or status.state not in _SERVING:
            continue
        for name in sorted(shard.adapters):
            taken, dropped = name in holds.get(rid, {}), (rid, name) in memory.dropped
            if name in snap.adapters and not taken and not dropped:
                p.add(HoldAdapter(rid, name))
                holds.setdefault(rid, {})[name] = AdapterHold(now)
                memory.announced.add((rid, name))
    memory.dropped &= {(rid, n) for rid in snap.statuses for n in snap.adapters}

    # Replicas that stopped asking to hand adapters over (their stop was called off,
    # or they went) wait no more.
    for rid, (_, asked) in snap.handing_over.items():
        if rid not in snap.records or now - asked > HANDING_OVER_KEPT_S:
            p.add(HandingOver(rid, None))
    # Replicas a base's adapters may be told to load on: ready, standing, in routing,
    # not waiting to stop (`placing.stoppable`: so another loads what it holds).
    stopping = gate.stopping if gate else {}
    pool: dict[str, list[str]] = {}
    for model, sets in snap.by_model.items():
        pool[model] = [
            s.record.id
            for s in sets.standing
            if s.state is ReplicaState.READY
            and s.record.id not in stopping
            and s.record.id not in snap.handing_over
        ]

    def routed(rid: str, name: str) -> bool:
        hold = holds.get(rid, {}).get(name)
        return hold is not None and hold.leaving is None

    def release(rid: str, name: str) -> None:
        p.add(ReleaseAdapter(rid, name))
        holds[rid][name] = AdapterHold(holds[rid][name].told_at, (snap.revision, now))

    # Idle ones leave everywhere.
    for name in sorted(snap.adapters):
        idle = memory.idle_for(name, now)
        if not busy[name] and (idle is None or idle >= snap.settings.adapter_idle_s):
            for rid in sorted(holds):
                if routed(rid, name):
                    release(rid, name)

    # The busiest first: a cold adapter with held requests takes a free slot first.
    for name in sorted(snap.adapters, key=lambda n: (-busy[n], n)):
        spec = snap.adapters[name]
        base = snap.models.get(spec.base)
        idle = memory.idle_for(name, now)
        if base is None or (
            not busy[name] and (idle is None or idle >= snap.settings.adapter_idle_s)
        ):
            continue
        replicas = pool.get(spec.base, [])
        slots = adapter_slots(base)
        need = min(len(replicas), max(1, math.ceil(busy[name] / base.target_in_flight)))
        have = sum(1 for rid in replicas if routed(rid, name))
        while have < need:
            candidates = [
                rid
                for rid in replicas
                if name not in holds.get(rid, {})
                and now - memory.failed.get((rid, name), -math.inf) >= FAILED_BACKOFF_S
            ]
            free = [rid for rid in candidates if len(holds.get(rid, {})) < slots]
            if free:
                rid = min(free, key=lambda r: (len(holds.get(r, {})), r))
                p.add(HoldAdapter(rid, name))
                holds.setdefault(rid, {})[name] = AdapterHold(now)
                have += 1
                continue
            victim = _victim(name, snap.held_age(name), candidates, holds, busy, memory, now)
            if victim is not None:
                release(*victim)
            break
    return p.plan()


def _victim(
    wanting: str,
    waited: float,
    candidates: list[str],
    holds: Mapping[str, Mapping[str, AdapterHold]],
    busy: Mapping[str, int],
    memory: AdapterMemory,
    now: float,
) -> tuple[str, str] | None:
    """The routed adapter with nothing in flight to let go of on one of `candidates`, to
    make room for `wanting` (its requests held for `waited` seconds): the least asked
    for lately, then the one used longest ago.
    (Recency alone, read at the gateways' one-second grain, let one client walking
    through cold adapters push out one asking a hot adapter without pause, as a scan
    does an LRU.) One asked for more than `wanting` is let go of only once `wanting`
    has waited `PATIENCE_S`: "nothing in flight", read at that grain, catches a hot
    adapter between two requests, and pushing it out for a cold one only moves the
    wait to the hot one's many clients (seen in bench_adapters: a hot adapter pushed
    out while the walker's last three could not be yet, being just loaded)."""
    patient = waited >= PATIENCE_S
    wanted = memory.rate.get(wanting, 0.0)
    best: tuple[float, float, str, str] | None = None
    for rid in candidates:
        for name, hold in holds.get(rid, {}).items():
            # Nothing in flight, and in long enough to have been asked: no ping-pong.
            if hold.leaving is not None or busy.get(name) or now - hold.told_at < MIN_HELD_S:
                continue
            if not patient and memory.rate.get(name, 0.0) > wanted:
                continue
            idle = memory.idle_for(name, now)
            key = (memory.rate.get(name, 0.0), -(math.inf if idle is None else idle), rid, name)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2], best[3])
