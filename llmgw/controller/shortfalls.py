"""The last step of a pass: place what models miss, a slice at a time.

Who calls: `Reconciler.steps`, last in every pass (`fill_shortfalls`, a
generator that yields between slices). What it may touch: replicas, why a model
cannot be placed and events, through `Term.facts`; across passes it keeps in
the loop's memory (`LoopMemory`) the models that did not fit, where to start
next, and the picture it placed on.

A filling goes through named steps, over and over while models are short and
attempts, time and the pass's budget last:

1. *picture*: while there is none (or it was found wrong), build one: the
   snapshot, then the scheduler's index, a step of nodes at a time
   (`llmgw.controller.picture`). One picture serves the whole pass, and the
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

from llmgw.controller.loop_memory import Look, LoopMemory, Picture
from llmgw.controller.picture import picture_in_steps, still_free
from llmgw.controller.placing import placed_words, record_from
from llmgw.controller.replicas import count_by_model
from llmgw.controller.store import ReplicaRecord
from llmgw.controller.term import Term
from llmgw.wire import EventReason, ModelSpec, ReplicaState

__all__ = ["Limits", "fill_shortfalls", "shortfalls"]

log = logging.getLogger("llmgw.reconcile")


class Limits(NamedTuple):
    """What one pass may spend placing (see `llmgw.controller.reconcile`)."""

    attempts_per_pass: int
    attempts_per_slice: int
    slice_s: float


class _Want(NamedTuple):
    spec: ModelSpec
    missing: int


def fill_shortfalls(
    fleet: Term, memory: LoopMemory, limits: Limits, place_until: float
) -> Iterator[None]:
    """Place what models miss, a slice at a time, each slice committing what it
    placed before yielding. Past `place_until` (`time.perf_counter()`) the pass
    stops at the next slice (having done at least one); the next pass goes on
    from there, with the same picture when nothing has moved meanwhile."""
    yield from _Filling(fleet, memory, limits, place_until).run()


class _Filling:
    """One pass's filling: what it has done so far. Forgotten when the pass
    ends; what the next pass needs goes to the loop's memory (`_leave`)."""

    def __init__(self, fleet: Term, memory: LoopMemory, limits: Limits, place_until: float) -> None:
        self.fleet, self.memory, self.limits = fleet, memory, limits
        self.place_until = place_until
        self.attempts_left = limits.attempts_per_pass
        self.done: set[str] = set()  # models dealt with in this pass
        self.started: set[str] = set()  # models that got a replica in this pass
        self.sliced = False  # a slice has been placed (a pass always places one)
        self.seen_version = fleet.capacity_version
        self.picture: Picture | None = None
        self.wants: deque[_Want] = deque()

    def run(self) -> Iterator[None]:
        fleet, memory = self.fleet, self.memory
        memory.note_capacity_seen(self.seen_version)  # reports, admin, the steps before
        self.picture = memory.take_picture(self.seen_version)
        self.wants = shortfalls(fleet, memory, fleet.facts.wall(), self.done)
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
            self.fleet, self.memory, self.seen_version, self.place_until
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
        fleet, memory = self.fleet, self.memory
        self.sliced = True
        now, wall = fleet.facts.clock(), fleet.facts.wall()
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
            good = [p for p in fill.placed if not picture.stale or still_free(fleet, p, now)]
            revision = fleet.facts.model_revision(spec.name)
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
        fleet = self.fleet
        fleet.facts.put_replicas(placed)
        by_model: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in placed:
            by_model[rec.model].append(rec)
        for name, recs in by_model.items():
            fleet.facts.event(f"model/{name}", EventReason.PLACED, placed_words(recs))
        for name, why in settled:
            fleet.facts.decisions.set_unplaceable(name, why)
        if placed:
            log.info("placed %d replica(s): %s", len(placed), ", ".join(r.id for r in placed))
        if self.picture is not None:  # the placer took what was just committed
            self.picture.committed(fleet.capacity_version)
        self.seen_version = fleet.capacity_version
        self.memory.note_committed(self.seen_version)

    def _notice_moves(self) -> None:
        """Step 4: after a yield, capacity moved by something else makes the
        picture stale, and the short models are read again."""
        fleet = self.fleet
        fleet.facts.advance_time()
        if fleet.capacity_version != self.seen_version:  # moved by something else meanwhile
            self.seen_version = fleet.capacity_version
            if self.picture is not None:
                self.picture.moved_under()
            self.memory.note_capacity_seen(self.seen_version)
            self.wants = shortfalls(fleet, self.memory, fleet.facts.wall(), self.done)

    def _leave(self) -> None:
        """The pass is over: where the next starts, and the picture if it still matches."""
        fleet = self.fleet
        if self.wants:  # out of attempts or time: the next pass begins with the models not reached
            head = self.wants[0].spec.name
            self.memory.resume_at(head, head in self.started)
        else:
            self.memory.resume_at(None)
        self.memory.keep_picture(self.picture, fleet.capacity_version)


def shortfalls(fleet: Term, memory: LoopMemory, wall: float, done: set[str]) -> deque[_Want]:
    """The models to try now, in name order from where the last pass stopped;
    last, those that did not fit and that only this loop's placements have
    touched since (they still do not fit; their reasons' numbers may change).

    Satisfied models lose their reason; models backing off, and those that
    did not fit with the same spec at the same capacity, are not tried."""
    replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
    # A draining replica and its stand-in are one replica between them; one leaving
    # for a scale-down is gone already (`demand.scale` takes it back first).
    counts = count_by_model(
        s
        for s in fleet.replica_statuses().values()
        if s.record.id not in replaced and s.record.leaving is None
    )
    active = {m: c.total() - c[ReplicaState.FAILED] for m, c in counts.items()}
    memory.forget_models(fleet.facts.models.keys())
    # While a model is short and cannot be placed, lower-priority models do
    # not grow above their minimum: the room reclaimed for it goes to it.
    starving = max(
        (
            spec.priority
            for name, spec in fleet.facts.models.items()
            if active.get(name, 0) < spec.min_replicas and name in fleet.unplaceable_reasons
        ),
        default=None,
    )
    version = fleet.capacity_version
    wants: deque[_Want] = deque()
    last: list[_Want] = []  # did not fit, and only this loop has moved capacity since
    for name in memory.in_turn(sorted(fleet.facts.models)):
        if name in done:
            continue
        spec = fleet.facts.models[name]
        missing = fleet.facts.desired_replicas(name) - active.get(name, 0)
        if starving is not None and spec.priority < starving:
            missing = min(missing, spec.min_replicas - active.get(name, 0))
        if missing <= 0:
            fleet.facts.decisions.set_unplaceable(name, None)
            memory.note_fits(name)
        elif fleet.facts.backing_off(name, wall):
            continue
        elif (look := memory.look_again(spec, version)) is Look.NOW:
            wants.append(_Want(spec, missing))
        elif look is Look.LAST:
            last.append(_Want(spec, missing))  # still does not fit
    wants.extend(last)
    return wants
