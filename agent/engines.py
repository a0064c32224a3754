"""The engine supervisor: runs the shards the controller assigns to this node.

`apply()` takes the desired set (from the reply to each report) and starts what
is missing and stops what is no longer assigned; `reports()` says what runs.
A background task, started by the first `apply()`, notices exits, escalates
slow stops to SIGKILL, polls `/health` of starting engines, and checks
`/health` and scrapes `/metrics` of ready ones (for idleness and progress).

Lifecycles, per (replica id, rank):

    starting --/health 200--> ready
    starting|ready --process exits--> failed (exit code + the log's cause);
        stays failed while assigned, so the controller's backoff decides on restarts
    starting --not healthy within the start timeout--> failed (killed)
    starting --nothing written to its log and under a second of CPU for the
        start stall time--> failed (killed, "stalled"): a start that will not finish
    ready --requests in it and token counters still for the template's
        `hung_after_s`--> failed (killed, "hung"): whatever /health says, since
        vLLM's API server answers it for an engine core that does nothing
    ready --/health fails `unhealthy_after` checks in a row--> failed (killed):
        a check that timed out while the agent's own loop ran late, or while
        the engine's token counters moved, is load, not a failure
    any --unassigned--> stopping --exit--> gone   (SIGTERM, grace, SIGKILL)
    ready <--> sleeping, through waking: agent/engine_sleep.py

Engines run in their own session, outside the agent's process group, and are
recorded in state_dir/engines.json: an agent restart (or `close()`) leaves them
running, and the next supervisor on that state_dir adopts them again.

The supervisor composes its parts, each the one owner of its state: the settings
(agent/engine_settings.py), the lifecycle (start, stop, exits, kills, adopt, the
state file: agent/engine_lifecycle.py), the probes (health, ready, stall, hung,
the /metrics scrape: agent/engine_probes.py, which decide and never act), sleep
and wake (agent/engine_sleep.py), and the one HTTP session (agent/engine_http.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from llmgw.agent import engine_adapters, sleep_level
from llmgw.agent.engine_http import EngineHttp
from llmgw.agent.engine_lifecycle import EngineLifecycle
from llmgw.agent.engine_probes import EngineProbes
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Engine, Key, Kill
from llmgw.agent.engine_sleep import EngineSleep
from llmgw.agent.engine_templates import EngineTemplate
from llmgw.agent.loop_lag import LoopLag
from llmgw.agent.sleep_check import CardMemory
from llmgw.wire import ReplicaReport, ShardAssignment, ShardState

log = logging.getLogger(__name__)


class EngineSupervisor:
    """Runs this node's engines. One per agent per state_dir (a lock enforces it).

    Owns the monitor task (one tick a poll interval: exits, probes, their verdicts
    applied through the lifecycle, sleep and wake, adapters), the adapters' local
    directories and `report_soon`; everything else is its parts'. card_memory and
    host_memory are what sleeps are measured with (agent/engine_sleep.py)."""

    def __init__(
        self,
        settings: SupervisorSettings,
        *,
        card_memory: CardMemory | None = None,
        host_memory: Callable[[], int | None] = sleep_level.available_bytes,
    ) -> None:
        self.settings = settings
        self.http = EngineHttp(settings)
        self.lifecycle = EngineLifecycle(settings)  # takes the lock, adopts
        self.probes = EngineProbes(settings, self.http)
        self.sleep_wake = EngineSleep(
            self.lifecycle, self.http, card_memory=card_memory, host_memory=host_memory
        )
        self.local_adapters: Mapping[str, str] = {}  # adapter source -> local directory
        # Set when what a report would say changed (an adapter loaded or unloaded): the
        # agent reports then rather than at its interval, so routing follows at once.
        self.report_soon = asyncio.Event()
        self._states: dict[Key, tuple[ShardState, bool]] = {}  # as `_news` last saw them
        self.sleep_wake.turned = self._news
        self._monitor: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def templates(self) -> Mapping[str, EngineTemplate]:
        return self.settings.templates

    @property
    def kills(self) -> dict[str, int]:
        """Engines killed, by reason (KILL_REASONS): the agent's /metrics."""
        return self.lifecycle.kills

    @property
    def loop_lag(self) -> LoopLag:
        """How late the monitor's timers fire: the agent's /metrics."""
        return self.probes.loop_lag

    # -- public interface ------------------------------------------------------

    async def apply(
        self,
        assignments: Sequence[ShardAssignment],
        local_weights: Mapping[str, str],
        local_adapters: Mapping[str, str] | None = None,
    ) -> None:
        """Make the running set match `assignments`: start missing, stop unassigned."""
        if self._closed:
            raise RuntimeError("the engine supervisor is closed")
        self._ensure_monitor()
        if local_adapters is not None:
            self.local_adapters = local_adapters
        self.lifecycle.converge(assignments, local_weights)
        # Now, not at the monitor's next tick: a request waits on each.
        self.sleep_wake.steer()
        self._steer_adapters()
        self._news()

    def reports(self) -> list[ReplicaReport]:
        return self.lifecycle.reports()

    async def close(self) -> None:
        """Stop supervising. Engines keep running: the next agent adopts them."""
        if self._closed:
            return
        self._closed = True
        self.sleep_wake.cancel()  # a sleep or wake under way ends with us
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        await self.http.close()
        self.lifecycle.release()

    def debug_state(self) -> dict[str, Any]:
        """What the supervisor holds, for logs and tests."""
        return self.lifecycle.debug_state()

    # -- the monitor -------------------------------------------------------------

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.create_task(self._run_monitor(), name="engine-monitor")

    async def _run_monitor(self) -> None:
        interval = self.settings.poll_interval_s
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad tick must not end supervision
                log.exception("engine monitor tick failed")
            slept = time.monotonic()
            await asyncio.sleep(interval)
            self.probes.loop_lag.record(time.monotonic() - slept - interval)

    async def _tick(self) -> None:
        life, probes = self.lifecycle, self.probes
        life.poll_exits()
        now = time.monotonic()
        starting = life.in_state(ShardState.STARTING)
        for eng in starting:
            if (kill := probes.overdue(eng, now)) is not None:
                life.kill_failed(eng, kill)
        starting = [e for e in starting if e.state is ShardState.STARTING]
        for eng, kill in await probes.stalls(starting, now):
            life.kill_failed(eng, kill)
        starting = [e for e in starting if e.state is ShardState.STARTING]
        if starting:
            await asyncio.gather(*(self._probe_start(e, now) for e in starting))
        ready = [e for e in life.in_state(ShardState.READY) if e.serves_http]
        if probes.scrape_due(now):
            if ready:
                await asyncio.gather(*(self._check_ready(e) for e in ready))
        elif busy := [e for e in ready if e.meter.busy]:
            # Scraped again each tick until it is seen empty: the controller reads a
            # replica's requests in flight from here too, and a count up to a scrape
            # interval old kept an idle engine from making way for a waiting model
            # (bench_density). Idle engines are scraped once an interval, as before.
            await asyncio.gather(*(probes.scrape(e) for e in busy))
        self.sleep_wake.steer()
        self._steer_adapters()
        self._news()

    def _news(self) -> None:
        """Report now when an engine's state changed (ready, asleep, awake, exited) or
        it turned idle: the controller's next step (a switch waits for the awake
        engine on a card to serve nothing), and a request held for it, wait on that."""
        states = {key: (eng.state, eng.meter.busy) for key, eng in self.lifecycle.engines.items()}
        if states != self._states:
            self._states = states
            self.report_soon.set()

    async def _probe_start(self, eng: Engine, now: float) -> None:
        if await self.probes.started(eng, now):
            self.lifecycle.mark_ready(eng)
            self._news()

    async def _check_ready(self, eng: Engine) -> None:
        kill = await self.probes.check_ready(eng)
        if kill is not None:
            await self._apply_kill(eng, kill)

    async def _apply_kill(self, eng: Engine, kill: Kill) -> None:
        if kill.exit_first:
            # An engine on its way out closes its port first: let its exit speak for it.
            await asyncio.sleep(min(1.0, 4 * self.settings.poll_interval_s))
            self.lifecycle.poll_exits()
            if eng.state is not ShardState.READY:
                return
        self.lifecycle.kill_failed(eng, kill)

    # -- LoRA adapters -------------------------------------------------------------

    def _steer_adapters(self) -> None:
        """Begin loading and unloading what a ready engine's assignment asks for."""
        for eng in self.lifecycle.engines.values():
            busy = eng.adapting is not None and not eng.adapting.done()
            if busy or eng.state is not ShardState.READY or not eng.serves_http:
                continue
            if self.sleep_wake.turning(eng):
                continue
            if eng.adapters.due(eng.assignment.adapters):
                eng.adapting = asyncio.create_task(self._sync_adapters(eng))

    async def _sync_adapters(self, eng: Engine) -> None:
        before = (set(eng.adapters.loaded or ()), dict(eng.adapters.failures))
        try:
            await engine_adapters.sync(
                self.http.session,
                self.http.url(eng, "").rstrip("/"),
                eng.adapters,
                eng.assignment.adapters,
                self.local_adapters,
                headers=self.http.headers(eng),
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("engine %s/%d: adapters: %s", *eng.key, exc)
        if (set(eng.adapters.loaded or ()), eng.adapters.failures) != before:
            self.report_soon.set()
