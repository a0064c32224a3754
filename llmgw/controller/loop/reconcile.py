"""The reconcile loop: make the replicas that exist match what the specs ask for.

Every pass, the steps in order, each in the module named. Each decides on a
`FleetSnapshot` of the facts (`fleet_snapshot`; the stop gate in it as a value)
and the loop's memory, and returns a `Plan` (`plans`); `apply` (`apply`) carries
it out through `Facts` before the next step decides, on a fresh snapshot when
the plan changed the facts, as Kueue's scheduler nominates on a snapshot and
admits with writes:

1. What became of replicas (`outcomes`): a replica whose shards are all ready
   becomes ready; one whose engine failed is removed, and its model backs off
   exponentially, so a crash-looping engine cannot cause a placement storm.
   Replicas on a node unreachable for longer than `replace_after_s` are removed
   (and so replaced); when the node comes back, its agent stops the orphans.
   Replicas of deleted models stop.
2. Moves (`drains`): each replica on a draining node gets a replacement placed
   elsewhere first; when the replacement is ready the old one is stopped. A
   node with nothing left ends up cordoned and marked drained. A forced drain
   stops the replicas at once. A replica on a card that failed is replaced the
   same way, and the card's node is cordoned (`faults`).
3. Rollouts (`rolling`, as `rollout` plans them), then demand (`demand`): each
   model's desired count follows its requests in flight (`autoscale`); one
   replica above it at a time leaves through the stop handshake; a model short
   of its minimum may reclaim room from lower-priority models (`reclaim`).
4. Every model keeps ready + starting >= its desired count; what cannot be
   placed says why (`shortfalls`, on a picture of the fleet from `picture`).
   It places in slices and applies each slice's plan before it yields.

What the loop remembers from one pass to the next is one object,
`LoopMemory` (`loop_memory`), with its invariants. The work of a pass is
bounded whatever the specs say (`shortfalls`); `run` yields to the event loop
between slices of at most `attempts_per_slice` attempts or `slice_s` seconds,
for as long as the slice took, so reports and requests are served in between.

Placement itself is `llmgw.scheduler`, pure functions over a snapshot.
Everything a pass decides is written to the store before the next report's
reply carries it, so a controller killed at any moment resumes without
duplicating or losing a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from llmgw.controller.loop import drains
from llmgw.controller.loop.adapter_loads import plan_adapters
from llmgw.controller.loop.apply import apply, take_snapshot
from llmgw.controller.loop.demand import reclaim, scale
from llmgw.controller.loop.drains import cancel_called_off, drain, replace_faulted
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.loop_memory import LoopMemory
from llmgw.controller.loop.outcomes import record_transitions, replace_lost, retire_deleted
from llmgw.controller.loop.picture import snapshot
from llmgw.controller.loop.plans import Plan
from llmgw.controller.loop.rolling import roll
from llmgw.controller.loop.shortfalls import Limits, fill_shortfalls
from llmgw.controller.loop.warm import sleep_and_wake
from llmgw.controller.store import StoreUnavailable
from llmgw.controller.term import Term
from llmgw.controller.views.endpoints import StopGate
from llmgw.wire import DrainPlan

__all__ = ["Reconciler", "drain_plan", "snapshot"]

log = logging.getLogger("llmgw.reconcile")

# Placement attempts (one replica each) a pass may make, and per slice between
# two yields to the event loop. An attempt costs microseconds when it places and
# up to a scan of the fleet when it does not (the reason).
ATTEMPTS_PER_PASS = 256
ATTEMPTS_PER_SLICE = 32
SLICE_S = 0.002
# Wall time a pass (in `run`) spends placing before it leaves the rest to the
# next: a first look at many models, or a big change, is spread over seconds.
PASS_S = 0.05
# The least time between passes when they are asked for sooner (`Term.decide_soon`).
SOON_GAP_S = 0.05


def drain_plan(term: Term, nodes: list[str]) -> DrainPlan:
    """The drain pre-check (the admin API): what draining these nodes would do."""
    return drains.drain_plan(take_snapshot(term, None), nodes)


class Reconciler:
    """Runs the passes of one leadership term. Holds the term (whose facts every
    plan is applied through), the stop gate (None: stop at once) and the loop's
    memory (the term's); nothing else survives a pass."""

    def __init__(
        self,
        term: Term,
        gate: StopGate | None = None,
        on_pass: Callable[[float, bool], None] | None = None,
        *,
        attempts_per_pass: int = ATTEMPTS_PER_PASS,
        attempts_per_slice: int = ATTEMPTS_PER_SLICE,
        slice_s: float = SLICE_S,
        pass_s: float = PASS_S,
        memory: LoopMemory | None = None,
    ) -> None:
        if attempts_per_pass < 1 or attempts_per_slice < 1:
            raise ValueError("a pass and a slice must each allow at least one placement attempt")
        self.term = term
        self.gate = gate
        # Told each pass's time on the event loop and whether it failed (metrics).
        self.on_pass = on_pass
        self.attempts_per_pass = attempts_per_pass
        self.attempts_per_slice = attempts_per_slice
        self.slice_s = slice_s
        self.pass_s = pass_s
        # The loop's own memory, for this term only: a takeover builds a new
        # Reconciler with the new term (leadership.py), so none outlives its term.
        self.memory = LoopMemory() if memory is None else memory

    async def run(self, interval_s: float) -> None:
        """A pass every `interval_s`, or sooner when the term says something the loop
        waits on happened (`Term.decide_soon`), at most one a SOON_GAP_S."""
        soon = self.term.decide_soon
        if not self.term.facts.settings.reconcile_on_news:
            soon = asyncio.Event()  # never set
        while True:
            soon.clear()
            await self.run_pass()
            await asyncio.sleep(min(SOON_GAP_S, interval_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(soon.wait(), max(0.0, interval_s - SOON_GAP_S))

    async def run_pass(self) -> None:
        """One pass, letting the event loop run between its slices."""
        held, failed = 0.0, False
        t0 = time.perf_counter()
        try:
            for _ in self.steps(time.perf_counter() + self.pass_s):
                took = time.perf_counter() - t0
                held += took
                # As long again for everything else: a pass with much to do takes
                # at most half the loop. (A request needs several turns of the
                # loop; one `sleep(0)` per slice would give it one.)
                await asyncio.sleep(took)
                t0 = time.perf_counter()
        except StoreUnavailable:
            pass  # the store logs once per outage; the next pass tries again
        except Exception:  # one bad pass must not stop reconciling
            failed = True
            log.exception("reconcile tick failed")
        held += time.perf_counter() - t0
        if self.on_pass is not None:
            self.on_pass(held, failed)

    def tick(self) -> None:
        """One whole pass without yielding and without a time limit (tests and benches)."""
        for _ in self.steps():
            pass

    def steps(self, place_until: float = float("inf")) -> Iterator[None]:
        """One pass, in slices: it yields where other work may run in between.
        Past `place_until` (`time.perf_counter()`), placing stops at the next slice."""
        term, memory = self.term, self.memory
        term.facts.advance_time(term.facts.clock())
        snap = take_snapshot(term, self.gate)
        snap = self._apply(snap, record_transitions(snap))
        snap = self._apply(snap, replace_lost(snap))
        snap = self._apply(snap, retire_deleted(snap))
        snap = self._apply(snap, cancel_called_off(snap))
        snap = self._apply(snap, drain(snap))
        cordoned = snap.faults
        snap = self._apply(snap, memory.cordons.plan(snap))
        memory.cordons.acted(cordoned)
        snap = self._apply(snap, replace_faulted(snap, memory))
        snap = self._apply(snap, roll(snap))
        snap = self._apply(snap, scale(snap, memory))
        snap = self._apply(snap, sleep_and_wake(snap))
        snap = self._apply(snap, plan_adapters(snap, term.adapter_use))
        self._apply(snap, reclaim(snap, memory))
        yield
        limits = Limits(self.attempts_per_pass, self.attempts_per_slice, self.slice_s)
        yield from fill_shortfalls(term, memory, limits, place_until)

    def _apply(self, snap: FleetSnapshot, plan: Plan) -> FleetSnapshot:
        """Apply a step's plan; the snapshot for the next step (a fresh one when
        the plan changed the facts)."""
        facts = self.term.facts
        apply(facts, plan)
        if facts.revision == snap.revision:
            return snap
        return take_snapshot(self.term, self.gate)
