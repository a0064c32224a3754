"""Sleep and wake: bring each engine to what its assignment asks, one turn at a time.
The engine's state is the lifecycle's to write (`mark_sleeping`, `mark_waking`,
`mark_ready`, `kill_failed`); this module decides when and asks the engine.

ready --assignment asks for sleep, POST /sleep answered 200--> sleeping
ready --it cannot sleep (no sleep mode in its template, /sleep 404 or refused)-->
    ready, with the reason in its reports (`sleep_error`): never tried again
ready --/sleep answered 200 but its processes still hold the memory on a card
    (llmgw.agent.sleep_check)--> waking --> ready, reported as above (`memory_kept`)
sleeping --assignment awake, no awake engine on its cards it does not fit beside--> waking
    --POST /wake_up answered 200--> ready
waking --the wake failed--> failed (killed)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.agent import sleep_level
from llmgw.agent.engine_http import EngineHttp
from llmgw.agent.engine_lifecycle import EngineLifecycle
from llmgw.agent.engine_shard import Engine, Kill, KillReason
from llmgw.agent.metrics import IdleTracker
from llmgw.agent.sleep_check import CardMemory, held_by_group, judge, judgeable
from llmgw.wire import ShardState, SleepFailure, fit_together

log = logging.getLogger(__name__)


class EngineSleep:
    """Owns the sleeps and wakes under way (each engine's `turning` task) and the
    sleep fields of each engine (sleep_error, sleep_failure, slept_level); moves
    engines between ready, sleeping and waking, and kills through the lifecycle
    an engine that did not wake. card_memory: what each process holds on each card
    (GpuSource.processes), a sleep is checked against it (llmgw.agent.sleep_check); None:
    sleeps taken at their word. host_memory: bytes available now (`sleep_level: auto`)."""

    def __init__(
        self,
        lifecycle: EngineLifecycle,
        http: EngineHttp,
        *,
        card_memory: CardMemory | None = None,
        host_memory: Callable[[], int | None] = sleep_level.available_bytes,
    ) -> None:
        self.lifecycle = lifecycle
        self.http = http
        self.card_memory = card_memory
        self.host_memory = host_memory
        self.turned: Callable[[], None] = lambda: None  # told as each sleep or wake ends
        self._settle_s = lifecycle.settings.sleep_settle_s
        self._unjudged_logged = False

    def steer(self) -> None:
        """Begin the sleep or wake an engine's assignment asks for (one at a time each)."""
        for eng in self.lifecycle.engines.values():
            if eng.turning is not None and not eng.turning.done():
                continue
            asleep_wanted = eng.assignment.sleep_level is not None
            if eng.state is ShardState.READY and asleep_wanted and eng.sleep_error is None:
                eng.turning = asyncio.create_task(self._sleep(eng))
            elif eng.state is ShardState.SLEEPING and not asleep_wanted:
                if self._awake_beside(eng):
                    continue  # it wakes once they sleep or stop
                self.lifecycle.mark_waking(eng)
                eng.turning = asyncio.create_task(self._wake(eng))
            else:
                continue
            eng.turning.add_done_callback(lambda _: self.turned())

    def cancel(self) -> None:
        """End every sleep or wake under way (the supervisor is closing)."""
        for eng in self.lifecycle.engines.values():
            if eng.turning is not None:
                eng.turning.cancel()

    def turning(self, eng: Engine) -> bool:
        return eng.turning is not None and not eng.turning.done()

    def _awake_beside(self, eng: Engine) -> bool:
        """Another engine awake (or starting, waking, stopping) on a card of `eng` that
        it does not fit beside (`wire.fit_together`: each says its share of the card and
        they add up to at most 1; issue 32). The controller wakes a sleeping replica only
        once there is room; this holds whatever it says, across a controller's crash or
        restart, on the node that runs them."""
        on_card: dict[str, list[float | None]] = {
            card: [eng.assignment.gpu_memory_share] for card in eng.assignment.gpus
        }
        for other in self.lifecycle.engines.values():
            if other is eng or other.state in (ShardState.SLEEPING, ShardState.FAILED):
                continue
            for card in other.assignment.gpus:
                if card in on_card:
                    on_card[card].append(other.assignment.gpu_memory_share)
        return not all(fit_together(shares) for shares in on_card.values())

    async def _sleep(self, eng: Engine) -> None:
        a, mode = eng.assignment, eng.template.sleep if eng.template else None
        level = a.sleep_level or 1
        no_sleep_mode = self.lifecycle.no_sleep_mode
        if mode is None or not a.sleep_mode or a.engine in no_sleep_mode:
            refused = no_sleep_mode.get(a.engine)
            why = (
                "its template has no sleep mode"
                if mode is None
                else f"it refused to start able to on this node ({refused})"
                if refused
                else "started unable to"
            )
            self._cannot_sleep(
                eng, SleepFailure.NO_SLEEP_MODE, f"engine {a.engine!r} cannot sleep: {why}"
            )
            return
        if not eng.serves_http:  # a multi-node worker: its leader's engine sleeps it
            self.lifecycle.mark_sleeping(eng, None)
            return
        if a.sleep_auto:
            level = await self._auto_level(eng)
        awake = await self._held(eng)
        answer = await self.http.post(eng, f"{mode.sleep_path}?level={level}")
        if eng.state is not ShardState.READY:
            return  # it exited or was unassigned meanwhile
        if answer is None:
            kept = await self._memory_kept(eng, awake, mode.min_freed)
            if eng.state is not ShardState.READY:
                return
            if kept is not None:  # awake again and whole: nothing goes on its cards
                eng.slept_level = level
                self._cannot_sleep(eng, SleepFailure.MEMORY_KEPT, kept)
                self.lifecycle.mark_waking(eng)
                await self._wake(eng)
                return
            self.lifecycle.mark_sleeping(eng, level)
        elif answer.status == 404:
            self._cannot_sleep(
                eng,
                SleepFailure.NO_ENDPOINTS,
                f"engine {a.engine!r} cannot sleep: POST {mode.sleep_path} answered 404 "
                "(no sleep endpoints: a version without sleep mode, or no development mode)",
            )
        else:
            self._cannot_sleep(
                eng, SleepFailure.REFUSED, f"engine {a.engine!r} did not sleep: {answer.message}"
            )

    async def _auto_level(self, eng: Engine) -> int:
        """`sleep_level: auto`: 1 when this node's host memory holds the weights."""
        weights = await asyncio.to_thread(sleep_level.weights_bytes, eng.weights_path)
        level, why = sleep_level.choose(weights, eng.assignment.nnodes, self.host_memory())
        log.info("engine %s/%d sleeps at %s", *eng.key, why)
        return level

    async def _held(self, eng: Engine) -> dict[str, int]:
        """MiB the engine's processes hold on each of its cards now ({}: not measured)."""
        if self.card_memory is None or eng.ref is None:
            return {}
        try:
            processes = await asyncio.to_thread(self.card_memory)
        except Exception:  # a broken reading must not stop the sleep
            log.exception("cannot read the memory processes hold on the cards")
            return {}
        return held_by_group(processes, eng.ref.pid, eng.assignment.gpus)

    async def _memory_kept(
        self, eng: Engine, awake: dict[str, int], min_freed: float
    ) -> str | None:
        """Why the sleep freed too little (figures), after up to the sleep settle time
        for the memory to go; None: it freed enough, or cannot be judged (said once)."""
        if not judgeable(awake):
            if self.card_memory is not None and not self._unjudged_logged:
                self._unjudged_logged = True
                log.warning(
                    "engine %s/%d: none of its processes are seen on its cards, so its "
                    "sleeps are taken at their word (a PID namespace NVML does not see?)",
                    *eng.key,
                )
            return None
        deadline = time.monotonic() + self._settle_s
        while True:
            kept = judge(awake, await self._held(eng), min_freed)
            if kept is None:
                return None
            if time.monotonic() >= deadline or eng.state is not ShardState.READY:
                return kept.message
            await asyncio.sleep(min(0.25, self._settle_s))

    def _cannot_sleep(self, eng: Engine, kind: SleepFailure, why: str) -> None:
        eng.sleep_error, eng.sleep_failure = why, kind
        log.warning("engine %s/%d: %s", *eng.key, why)

    async def _wake(self, eng: Engine) -> None:
        mode = eng.template.sleep if eng.template else None
        began = time.monotonic()
        calls: list[tuple[str, dict[str, str] | None]] = []
        if mode is not None and eng.serves_http:
            calls.append((mode.wake_path, None))
            if eng.slept_level == 2:  # the weights were dropped: load them again
                if mode.reload_path:
                    calls.append((mode.reload_path, {"method": "reload_weights"}))
                if mode.reset_cache_path:
                    calls.append((mode.reset_cache_path, None))
        for path, body in calls:
            failed = await self.http.post(eng, path, body)
            if eng.state is not ShardState.WAKING:
                return
            if failed is not None:
                why = f"did not wake: {failed.message}"
                self.lifecycle.kill_failed(eng, Kill(KillReason.WAKE_FAILED, why))
                return
        eng.tracker = IdleTracker()  # idleness is counted afresh from the wake
        eng.last_wake = (eng.slept_level or 1, round(time.monotonic() - began, 3))
        self.lifecycle.mark_ready(eng)
