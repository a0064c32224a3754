"""Is an engine up, and is it working? The supervisor's probes: a starting engine's
/health (ready), its start deadline and stall (no output, no CPU), and a ready
engine's periodic check (the /metrics scrape for idleness and progress, the hung
rule, /health in a row).

Probes decide and do not act: each returns a verdict (ready, or a `Kill`) that the
supervisor applies through the lifecycle (agent/engines.py). They write only their
own readings on the engine (health_failures, tracker, progress, start_watch, meter).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

import aiohttp

from llmgw.agent.engine_http import EngineHttp
from llmgw.agent.engine_proc import cpu_by_group
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Engine, Kill, KillReason
from llmgw.agent.loop_lag import LoopLag
from llmgw.agent.metrics import scrape, server_load
from llmgw.agent.progress import START_CPU_S
from llmgw.wire import ShardState

log = logging.getLogger(__name__)


class HealthFailure(StrEnum):
    """How an engine's /health check failed: what the supervisor acts on."""

    NO_ANSWER = "no_answer"  # nothing within the timeout: a busy engine or agent, or a hang
    ANSWERED = "answered"  # it answered, not 200
    UNREACHABLE = "unreachable"  # refused, reset, or any other connection error


class Unhealthy(NamedTuple):
    """A failed /health check: its kind, and the words logs and errors quote."""

    kind: HealthFailure
    message: str  # "no answer within 5s"; "answered 503"; "Connection refused"


def _size(path: Path | None) -> int | None:
    try:
        return None if path is None else path.stat().st_size
    except OSError:
        return None


class EngineProbes:
    """Owns when the probes last ran (the scrape and start-look schedules) and how
    late the monitor's own timers fire (`loop_lag`, which the monitor records and
    the health rule reads); reads the settings."""

    def __init__(self, settings: SupervisorSettings, http: EngineHttp) -> None:
        self.settings = settings
        self.http = http
        # How late the monitor's own sleeps wake, over the last few checks.
        self.loop_lag = LoopLag(window_s=max(1.0, 2 * settings.scrape_interval_s))
        self._last_scrape = float("-inf")
        self._last_start_look = float("-inf")

    # -- starting engines ----------------------------------------------------------

    def overdue(self, eng: Engine, now: float) -> Kill | None:
        """A starting engine past the start timeout."""
        limit = self.settings.start_timeout_s
        if now - eng.started_mono < limit:
            return None
        return Kill(
            KillReason.START_TIMEOUT,
            f"was not healthy {limit:g}s after starting (start timeout)",
        )

    def stall_limit(self, eng: Engine) -> float:
        """How long `eng` may start with no sign of progress (0: for ever)."""
        own = eng.template.start_stall_s if eng.template is not None else None
        return self.settings.start_stall_s if own is None else own

    async def stalls(self, starting: list[Engine], now: float) -> list[tuple[Engine, Kill]]:
        """Starting engines that have shown no progress for their stall limit, looked
        looked at once every `start_look_s`."""
        watched = [e for e in starting if self.stall_limit(e)]
        if not watched or now - self._last_start_look < self.settings.start_look_s:
            return []
        self._last_start_look = now
        # Engines lead their own process group. The pass over /proc grows with the
        # node's processes, so it runs off the loop (bench_start_watch.py).
        cpu = await asyncio.to_thread(cpu_by_group)
        out = []
        for eng in watched:
            if eng.ref is None or eng.state is not ShardState.STARTING:
                continue
            eng.start_watch.observe(_size(eng.log_path), cpu.get(eng.ref.pid))
            quiet = eng.start_watch.quiet_s()
            if quiet >= self.stall_limit(eng):
                why = (
                    f"wrote nothing to its log and used under {START_CPU_S:g}s of CPU for "
                    f"{quiet:.0f}s while starting (stalled)"
                )
                out.append((eng, Kill(KillReason.START_STALLED, why)))
        return out

    async def started(self, eng: Engine, now: float) -> bool:
        """Whether a starting engine is ready now: /health answers 200, or a rank
        that serves no HTTP has stayed up for the worker settle time."""
        if eng.template is None:
            return False  # adopted, but its template is gone: keep what we knew
        if not eng.serves_http:
            return now - eng.started_mono >= self.settings.worker_settle_s
        return await self.health(eng) is None and eng.state is ShardState.STARTING

    # -- ready engines ---------------------------------------------------------------

    def scrape_due(self, now: float) -> bool:
        """Whether ready engines are checked on this tick (once a scrape interval)."""
        if now - self._last_scrape < self.settings.scrape_interval_s:
            return False
        self._last_scrape = now
        return True

    async def check_ready(self, eng: Engine) -> Kill | None:
        """A ready engine's periodic check: metrics (idleness, progress), then health."""
        checked = time.monotonic()
        await self.scrape(eng)
        if eng.state is not ShardState.READY:
            return None
        assert eng.template is not None
        stalled = eng.progress.stalled_s()
        if stalled >= eng.template.hung_after_s:
            return Kill(
                KillReason.HUNG,
                f"hung: {eng.progress.work} request(s) in it and no token for {stalled:.0f}s "
                f"(hung_after_s {eng.template.hung_after_s:g})",
            )
        failed = await self.health(eng)
        if eng.state is not ShardState.READY:
            return None  # it changed while we waited (exited, or was unassigned)
        if failed is None:
            eng.health_failures = 0
            return None
        why = failed.message
        if failed.kind is HealthFailure.NO_ANSWER:
            late = self.loop_lag.worst_s()
            if late >= self.settings.health_timeout_s / 4 or eng.progress.moved_since(checked):
                # The agent's loop ran late, or the engine is working: load, not a hang.
                log.info(
                    "engine %s/%d /health %s while busy (agent loop %.2fs late); not counted",
                    *eng.key, why, late,
                )  # fmt: skip
                return None
        eng.health_failures += 1
        log.warning(
            "engine %s/%d /health %s (%d of %d)", *eng.key, why, eng.health_failures,
            self.settings.unhealthy_after,
        )  # fmt: skip
        if eng.health_failures < self.settings.unhealthy_after:
            return None
        return Kill(
            KillReason.UNHEALTHY,
            f"stopped answering /health: {why}, {eng.health_failures} checks in a row",
            exit_first=True,
        )

    async def health(self, eng: Engine) -> Unhealthy | None:
        """None when /health answers 200; otherwise what went wrong."""
        assert eng.template is not None
        timeout_s = self.settings.health_timeout_s
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self.http.session.get(
                self.http.url(eng, eng.template.health_path),
                timeout=timeout,
                headers=self.http.headers(eng),
            ) as resp:
                if resp.status == 200:
                    return None
                return Unhealthy(HealthFailure.ANSWERED, f"answered {resp.status}")
        except TimeoutError:
            return Unhealthy(HealthFailure.NO_ANSWER, f"no answer within {timeout_s:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return Unhealthy(HealthFailure.UNREACHABLE, str(exc) or type(exc).__name__)

    async def scrape(self, eng: Engine) -> None:
        """Feed the engine's /metrics (and its server load, where its template says)
        to its idleness, traffic and progress readings."""
        assert eng.template is not None
        timeout_s = self.settings.health_timeout_s
        session = self.http.session
        url = self.http.url
        headers = self.http.headers(eng)
        metrics_url = url(eng, eng.template.metrics_path)
        sample = await scrape(session, metrics_url, timeout_s=timeout_s, headers=headers)
        if sample is not None and eng.template.load_path is not None:
            # Idleness, in flight and the hung rule all read it: a stopped engine core
            # leaves its gauges at 0 while its server holds requests.
            load_url = url(eng, eng.template.load_path)
            held = await server_load(session, load_url, timeout_s=timeout_s, headers=headers)
            sample = dataclasses.replace(sample, server_load=held)
        if sample is not None and eng.state is ShardState.READY:
            eng.tracker.observe(sample)
            eng.meter.observe(sample)
            eng.progress.observe(sample)
