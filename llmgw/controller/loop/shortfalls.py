"""The last step of a pass: place what models miss, a slice at a time.

Who calls: `Reconciler.steps`, last in every pass (`fill_shortfalls`, a
generator that yields between slices). It decides on a `FleetSnapshot` (which
models miss what: `shortfalls`) and on its picture (a slice's placements), and
applies each slice's `Plan` (replicas, why a model cannot be placed, events)
before it yields, as every step's plan is applied; across passes it keeps in
the loop's memory (`LoopMemory`) the models that did not fit, where to start
next, and the picture it placed on.

A filling goes through named steps, over and over while models are short and
attempts, time and the pass's budget last:

1. *picture*: while there is none (or it was found wrong), build one: the
   snapshot, then the scheduler's index, a step of nodes at a time
   (`llmgw.controller.loop.picture`). One picture serves the whole pass, and the
   next while nothing has moved: rebuilding it whenever a report moved
   capacity during a yield would cost a fleet-wide scan per slice.
2. *place a slice*: up to `attempts_per_slice` placement attempts, or
   `slice_s` seconds, on the picture. Once the picture is stale (something
   else moved capacity), each placement is checked against the fleet as it is
   (a cordoned node, a card taken meanwhile); one that no longer fits throws
   the picture away.
3. *settle*: commit the slice's placements and what each model it reached
   came to (placed, or why it does not fit), then yield.
4. *notice moves*: after each yield, when capacity moved under the pass, the
   picture is stale and the list of short models is read again.

The work of a pass is bounded whatever the specs say (a spec may ask for
10,000 replicas): a model that did not fit is tried again only once the
fleet's capacity has moved or its spec has changed, and then once, not once
per missing replica; a pass makes at most `attempts_per_pass` attempts; the
next pass starts with the models this one did not reach.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Generator, Iterator
from typing import NamedTuple

from llmgw.controller.core.records import ReplicaRecord
from llmgw.controller.loop.apply import apply, take_snapshot
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.loop_memory import Look, LoopMemory, Picture
from llmgw.controller.loop.picture import picture_in_steps
from llmgw.controller.loop.placing import placed_words, record_from
from llmgw.controller.loop.plans import Plan, Planner, Unplaceable
from llmgw.controller.term import Term
from llmgw.wire import EventReason, ModelSpec

__all__ = ["Limits", "fill_shortfalls", "shortfalls"]

log = logging.getLogger("llmgw.reconcile")


class Limits(NamedTuple):
    """What one pass may spend placing (see `llmgw.controller.loop.reconcile`)."""

    attempts_per_pass: int
    attempts_per_slice: int
    slice_s: float


class _Want(NamedTuple):
    spec: ModelSpec
    missing: int


def fill_shortfalls(
    term: Term, memory: LoopMemory, limits: Limits, place_until: float
) -> Iterator[None]:
    """Place what models miss, a slice at a time, each slice committing what it
    placed before yielding. Past `place_until` (`time.perf_counter()`) the pass
    stops at the next slice (having done at least one); the next pass goes on
    from there, with the same picture when nothing has moved meanwhile."""
    yield from _Filling(term, memory, limits, place_until).run()


class _Filling:
    """One pass's filling: what it has done so far. Forgotten when the pass
    ends; what the next pass needs goes to the loop's memory (`_leave`)."""

    def __init__(self, term: Term, memory: LoopMemory, limits: Limits, place_until: float) -> None:
        self.term, self.memory, self.limits = term, memory, limits
        self.place_until = place_until
        self.attempts_left = limits.attempts_per_pass
        self.done: set[str] = set()  # models dealt with in this pass
        self.started: set[str] = set()  # models that got a replica in this pass
        self.sliced = False  # a slice has been placed (a pass always places one)
        self.seen_version = term.capacity_version
        self.picture: Picture | None = None
        self.wants: deque[_Want] = deque()
        self._snap: FleetSnapshot | None = None  # the facts as this filling last read them

    def snap(self) -> FleetSnapshot:
        """The snapshot to decide on: taken again once capacity moved (`_notice_moves`)."""
        if self._snap is None:
            self._snap = take_snapshot(self.term, None)
        return self._snap

    def _look(self) -> None:
        """Which models miss what, on the fleet as it is now."""
        self._snap = None
        self.wants, plan = shortfalls(self.snap(), self.memory, self.done)
        apply(self.term.facts, plan)

    def run(self) -> Iterator[None]:
        memory = self.memory
        memory.note_capacity_seen(self.seen_version)  # reports, admin, the steps before
        self.picture = memory.take_picture(self.seen_version)
        self._look()
        while (
            self.wants
            and self.attempts_left
            and not (self.sliced and time.perf_counter() > self.place_until)
        ):
            if self.picture is None:
                pictured = yield from self._picture()
                if not pictured:
                    break  # out of time: what was read is kept for the next pass
            else:
                placed, settled = self._place_slice(self.picture)
                self._settle(placed, settled)
                yield
            self._notice_moves()
        self._leave()

    def _picture(self) -> Generator[None, None, bool]:
        """Step 1: a fresh picture, of the fleet as it is now. A picture built is
        used for at least as long as its index took: on a busy fleet, where each
        pass needs a new one, passes still get on (the rest of their time is
        never less than the build's)."""
        built = yield from picture_in_steps(
            self.term, self.memory, self.seen_version, self.place_until
        )
        if built is None:
            return False
        self.picture, took = built
        self.place_until = max(self.place_until, time.perf_counter() + took)
        return True

    def _place_slice(
        self, picture: Picture
    ) -> tuple[list[ReplicaRecord], list[tuple[str, str | None]]]:
        """Step 2: a slice of placement attempts on `picture`, the models in turn.
        Answers the replicas placed and, per model reached, why it does not fit
        (None: it fits)."""
        memory, snap = self.memory, self.snap()
        self.sliced = True
        wall = self.term.facts.wall()  # when the replicas are placed
        placed: list[ReplicaRecord] = []
        settled: list[tuple[str, str | None]] = []
        slice_left = self.limits.attempts_per_slice
        slice_end = time.perf_counter() + self.limits.slice_s
        wants = self.wants
        while wants and slice_left and self.attempts_left and time.perf_counter() < slice_end:
            spec, missing = wants[0]
            fill = picture.place_up_to(spec, min(missing, slice_left, self.attempts_left))
            used = len(fill.placed) + (fill.unplaceable is not None)
            slice_left, self.attempts_left = slice_left - used, self.attempts_left - used
            good = [p for p in fill.placed if not picture.stale or snap.still_free(p)]
            revision = snap.revisions[spec.name]
            placed.extend(record_from(p, wall, revision) for p in good)
            if good:
                self.started.add(spec.name)
            if len(good) < len(fill.placed):
                # The picture is wrong where it matters: a fresh one.
                wants[0] = _Want(spec, missing - len(good))
                self.picture = None
                break
            if fill.unplaceable is not None:
                wants.popleft()
                self.done.add(spec.name)
                settled.append((spec.name, fill.unplaceable.reason))
                memory.note_did_not_fit(spec, picture.basis)
            elif len(fill.placed) == missing:
                wants.popleft()
                self.done.add(spec.name)
                settled.append((spec.name, None))
                memory.note_fits(spec.name)
            else:  # out of attempts for the slice or pass: it fits, the rest later
                wants[0] = _Want(spec, missing - len(fill.placed))
                settled.append((spec.name, None))
        return placed, settled

    def _settle(self, placed: list[ReplicaRecord], settled: list[tuple[str, str | None]]) -> None:
        """Step 3: commit a slice: its replicas, their events, each model's reason."""
        term = self.term
        apply(term.facts, settle(placed, settled))
        if placed:
            log.info("placed %d replica(s): %s", len(placed), ", ".join(r.id for r in placed))
        if self.picture is not None:  # the placer took what was just committed
            self.picture.committed(term.capacity_version)
        self.seen_version = term.capacity_version
        self.memory.note_committed(self.seen_version)

    def _notice_moves(self) -> None:
        """Step 4: after a yield, capacity moved by something else makes the
        picture stale, and the short models are read again."""
        term = self.term
        term.facts.advance_time()
        if term.capacity_version != self.seen_version:  # moved by something else meanwhile
            self.seen_version = term.capacity_version
            if self.picture is not None:
                self.picture.moved_under()
            self.memory.note_capacity_seen(self.seen_version)
            self._look()

    def _leave(self) -> None:
        """The pass is over: where the next starts, and the picture if it still matches."""
        if self.wants:  # out of attempts or time: the next pass begins with the models not reached
            head = self.wants[0].spec.name
            self.memory.resume_at(head, head in self.started)
        else:
            self.memory.resume_at(None)
        self.memory.keep_picture(self.picture, self.term.capacity_version)


def settle(placed: list[ReplicaRecord], settled: list[tuple[str, str | None]]) -> Plan:
    """A slice's plan: the replicas it placed, an event per model, and what each
    model it reached came to (why it does not fit; None: it fits)."""
    plan = Planner({})
    plan.put(placed)
    by_model: dict[str, list[ReplicaRecord]] = defaultdict(list)
    for rec in placed:
        by_model[rec.model].append(rec)
    for name, recs in by_model.items():
        plan.event(f"model/{name}", EventReason.PLACED, placed_words(recs))
    for name, why in settled:
        plan.add(Unplaceable(name, why))
    return plan.plan()


def shortfalls(
    snap: FleetSnapshot, memory: LoopMemory, done: set[str]
) -> tuple[deque[_Want], Plan]:
    """The models to try now, in name order from where the last pass stopped;
    last, those that did not fit and that only this loop's placements have
    touched since (they still do not fit; their reasons' numbers may change).

    Satisfied models lose their reason (the plan); models backing off, and
    those that did not fit with the same spec at the same capacity, are not
    tried. A model counts its standing replicas (`ModelReplicas.standing`): a
    draining one and its stand-in are one replica between them; one leaving
    by the loop's decision is gone already (`demand.scale` takes it back first)."""
    plan = Planner({})
    active = {name: len(m.standing) for name, m in snap.by_model.items()}
    memory.forget_models(snap.models.keys())
    # While a model is short and cannot be placed, lower-priority models do
    # not grow above their minimum: the room reclaimed for it goes to it.
    starving = max(
        (
            spec.priority
            for name, spec in snap.models.items()
            if active.get(name, 0) < spec.min_replicas and name in snap.unplaceable
        ),
        default=None,
    )
    version = snap.capacity_version
    wants: deque[_Want] = deque()
    last: list[_Want] = []  # did not fit, and only this loop has moved capacity since
    for name in memory.in_turn(sorted(snap.models)):
        if name in done:
            continue
        spec = snap.models[name]
        missing = snap.desired[name] - active.get(name, 0)
        if starving is not None and spec.priority < starving:
            missing = min(missing, spec.min_replicas - active.get(name, 0))
        if missing <= 0:
            if name in snap.placement_reasons:
                plan.add(Unplaceable(name, None))
            memory.note_fits(name)
        elif snap.backing_off(name):
            continue
        elif (look := memory.look_again(spec, version)) is Look.NOW:
            wants.append(_Want(spec, missing))
        elif look is Look.LAST:
            last.append(_Want(spec, missing))  # still does not fit
    wants.extend(last)
    return wants, plan.plan()
