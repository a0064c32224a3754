"""Which controller leads, and what leading means here.

With SQLite there is one controller and it always leads. With PostgreSQL any
number share the store and one leads, through the lease in the store's writer
row (`PgLease`): renewed every TTL/4, good for the TTL, taken by a follower
once it expired. Each taking bumps the epoch, and every durable write is
fenced by it in the store itself (postgres.py), so a deposed leader that is
still running cannot write even before it notices.

A term of leadership (epoch N) is: the store's fence set to N, a new `Term`
built from the store (another controller may have written it since, and a
fresh load gives every known node one grace period to report, as a restart
does), its reconcile loop and its first-sighting saves running. A term ends
when the lease is lost (taken by another, or not renewed within the TTL, or a
write came back fenced); the controller then follows: it answers 503 naming
the leader, and keeps trying to take the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.loop.reconcile import Reconciler
from llmgw.controller.metrics import ControllerMetrics
from llmgw.controller.state.facts import Facts
from llmgw.controller.store import StoreUnavailable
from llmgw.controller.store.base import StateStore
from llmgw.controller.term import Term

if TYPE_CHECKING:
    from llmgw.controller.store.postgres import PgLease

log = logging.getLogger("llmgw.controller.leadership")


class Leadership:
    def __init__(
        self,
        settings: ControllerSettings,
        store: StateStore,
        metrics: ControllerMetrics,
        lease: PgLease | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.store = store
        # What the API serves: the term this controller leads, else the one it
        # loaded at start or led last (a follower answers only /healthz and /metrics).
        self.term = Term.begin(store, settings)
        self.metrics = metrics
        self.lease = lease
        self.clock = clock
        self.epoch = 0  # ours while leading; else the leader's, as last read
        self.leader_url: str | None = None
        self._leading = False
        self._valid_until = 0.0  # monotonic: past it, our lease may have expired
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._lease_failing = False
        self._expires_in = 0.0  # the leader's lease, as a follower last read it
        self._stopped = False

    # -- what the API asks ------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        # The clock as well as the flag: a loop too busy to step down in time
        # still stops answering as leader once the lease may have run out.
        return self._leading and (self.lease is None or self.clock() < self._valid_until)

    @property
    def role(self) -> str:
        return "leader" if self.is_leader else "follower"

    def health(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "epoch": self.epoch,
            "leader": self.settings.url if self.is_leader else self.leader_url,
        }

    # -- life cycle ---------------------------------------------------------------------

    @property
    def ttl_s(self) -> float:
        return self.settings.lease_ttl_s

    async def start(self) -> None:
        """SQLite: lead at once. PostgreSQL: one try now (a lone controller leads from
        its first answer), then keep renewing or trying in the background."""
        if self.lease is None:
            self._begin(self.store.epoch, reload=False)
            return
        self.store.on_fenced = self._fenced  # type: ignore[attr-defined]
        self.metrics.leader.set(0)
        await self._campaign()
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """At shutdown: the last saves, then the lease goes, so a follower leads at once.
        The app calls it as its shutdown begins, before it waits for requests under
        way (a long poll would otherwise keep this controller deciding for up to 30 s
        with its port closed), and again at its cleanup: twice is once."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        leading, epoch = self.is_leader, self.epoch
        await self._cancel_tasks()
        if leading:
            await _final_save(self.term.facts)
        self._end("this controller is stopping", quiet=True)
        if self.lease is not None:
            if leading:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.lease.release, epoch)
            self.lease.close()

    # -- the lease loop (PostgreSQL) ----------------------------------------------------

    async def _run(self) -> None:
        renew_every = self.ttl_s / 4
        campaign_every = min(1.0, renew_every)
        while True:
            if self._leading:
                await asyncio.sleep(renew_every)
                await self._renew()
            else:
                # Try again when the leader's lease runs out, or every second or so
                # (a lease renewed meanwhile is simply read again).
                await asyncio.sleep(min(campaign_every, self._expires_in + 0.02))
                await self._campaign()

    async def _renew(self) -> None:
        assert self.lease is not None
        sent = self.clock()
        try:
            ours = await asyncio.to_thread(self.lease.renew, self.epoch)
        except Exception as exc:  # psycopg's errors: PostgreSQL away; the TTL decides
            self._lease_error(exc)
            if self._leading and self.clock() >= self._valid_until:
                self._end(f"the lease could not be renewed within its TTL ({self.ttl_s:g} s)")
            return
        self._lease_ok()
        if not self._leading:  # stepped down meanwhile (a fenced write)
            return
        if ours:
            self._valid_until = sent + self._margin()
        else:
            self._end("another controller took the lease")

    async def _campaign(self) -> None:
        assert self.lease is not None
        sent = self.clock()
        try:
            epoch = await asyncio.to_thread(self.lease.acquire)
            if epoch is None:
                self.epoch, self.leader_url, left = await asyncio.to_thread(self.lease.leader)
                self._expires_in = left
                self.metrics.epoch.set(self.epoch)
        except Exception as exc:
            self._lease_error(exc)
            return
        self._lease_ok()
        if epoch is not None:
            self._valid_until = sent + self._margin()
            try:
                self._begin(epoch, reload=True)
            except StoreUnavailable as exc:  # could not load the state: try again later
                log.error("took the lease (epoch %d) but cannot load the state: %s", epoch, exc)
                self._leading = False
                self.store.epoch = 0

    def _margin(self) -> float:
        """How long a renewal sent now keeps us leader: the TTL, less a safety margin
        (the server counts the TTL from when it ran the renewal, after we sent it)."""
        return self.ttl_s - min(1.0, self.ttl_s / 5)

    def _lease_error(self, exc: Exception) -> None:
        if not self._lease_failing:
            self._lease_failing = True
            log.error("the leader's lease cannot be read or renewed: PostgreSQL: %s", exc)

    def _lease_ok(self) -> None:
        if self._lease_failing:
            self._lease_failing = False
            log.warning("the leader's lease is reachable again")

    def _fenced(self) -> None:
        if self._leading:
            self._end("a write was refused by the fence: another controller holds the lease")

    # -- terms --------------------------------------------------------------------------

    def _begin(self, epoch: int, *, reload: bool) -> None:
        self.store.epoch = epoch
        if reload:
            self.term = self.term.next_term()
        term = self.term
        self.epoch = epoch
        self.leader_url = self.settings.url
        self._leading = True
        self.metrics.term = term
        self.metrics.leader.set(1)
        if self.lease is not None:
            self.metrics.epoch.set(epoch)
            log.warning(
                "leading (epoch %d): state loaded from the store; every node has one grace "
                "period to report",
                epoch,
            )
        reconciler = Reconciler(term, term.stop_gate, on_pass=self.metrics.observe_reconcile)
        self._tasks = [
            asyncio.create_task(reconciler.run(self.settings.reconcile_interval_s)),
            asyncio.create_task(_flush_every_second(term.facts)),
        ]

    def _end(self, why: str, *, quiet: bool = False) -> None:
        """Stop acting as leader at once (synchronous: a fenced write calls it)."""
        if not self._leading:
            return
        self._leading = False
        self.store.epoch = 0
        if self.leader_url == self.settings.url:
            self.leader_url = None  # not us; who leads now is read at the next campaign
        for task in self._tasks:
            task.cancel()
        # Long polls of this term (agents' assignments, gateways' feeds) end now rather
        # than at their wait: a follower's answer sends them to the new leader.
        self.term.facts.log.close()
        self.metrics.term = None
        self.metrics.leader.set(0)
        if not quiet:
            log.warning("no longer the leader (epoch %d): %s; following", self.epoch, why)

    async def _cancel_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _flush_every_second(fleet: Facts) -> None:
    # Unsaved sightings stay queued until a save works; the store logs an
    # outage once, so this loop neither dies nor floods the log.
    while True:
        await asyncio.sleep(1.0)
        with contextlib.suppress(StoreUnavailable):
            fleet.flush()


async def _final_save(fleet: Facts, tries: int = 5) -> None:
    """At shutdown: save what is queued, retrying briefly; a failure is logged, never
    a crash (the nodes concerned are known again at their next report)."""
    for attempt in range(tries):
        try:
            fleet.flush()
            return
        except StoreUnavailable as exc:
            if attempt == tries - 1:
                log.error("final save failed, first sightings of some nodes not stored: %s", exc)
                return
            await asyncio.sleep(0.2)
