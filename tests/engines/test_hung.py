"""Hung means work and no tokens, whatever /health says; a slow /health on a busy node
is not hung (issue 24, findings 1 and 2). Real fake-engine processes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable

import aiohttp

from llmgw.agent.engines import EngineSupervisor
from llmgw.agent.telemetry import _supervisor_metrics
from llmgw.wire import ReplicaReport, ShardState

from .conftest import SupervisorFactory, assignment, pid_alive, wait_for


def only(sup: EngineSupervisor) -> ReplicaReport:
    (rep,) = sup.reports()
    return rep


def state_of(sup: EngineSupervisor) -> ShardState | None:
    reps = sup.reports()
    return reps[0].state if reps else None


def pid_of(sup: EngineSupervisor) -> int:
    (entry,) = sup.debug_state().values()
    pid = entry["pid"]
    assert isinstance(pid, int)
    return pid


async def _health_status(port: int | None) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
        return r.status


async def _get(port: int | None, path: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return await r.text()


async def _metrics(port: int | None) -> str:
    return await _get(port, "/metrics")


async def _load(port: int | None) -> int:
    return int(json.loads(await _get(port, "/load"))["server_load"])


async def wait_for_async(
    value: Callable[[], Awaitable[int]], want: int, what: str, within_s: float = 5.0
) -> None:
    deadline = time.monotonic() + within_s
    while await value() != want:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_engine_with_work_and_no_tokens_is_hung_though_health_answers(
    make_supervisor: SupervisorFactory,
) -> None:
    # As a vLLM whose EngineCore is SIGSTOPped: /health 200, /metrics answers, nothing moves.
    sup = make_supervisor(templates={"fake": {"hung_after_s": 1.0}})
    await sup.apply([assignment(engine_args=["--load-seconds", "0", "--stall-after", "0"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    port, pid = only(sup).port, pid_of(sup)
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/v1/completions"
        stuck = asyncio.create_task(s.post(url, json={"prompt": "hi", "max_tokens": 2}))
        try:
            assert await _health_status(port) == 200, "the fake must keep /health at 200"
            # As vLLM's: the gauges never count a request the stopped core did not see;
            # only the server's own count (/load) does.
            await wait_for_async(lambda: _load(port), 1, "the request held")
            assert 'vllm:num_requests_running{model_name="org/m"} 0.0' in await _metrics(port)
            await wait_for(lambda: state_of(sup) is ShardState.FAILED, 10, "declared hung")
        finally:
            stuck.cancel()
            with contextlib.suppress(BaseException):
                await stuck
    rep = only(sup)
    assert rep.error is not None
    assert rep.error.startswith("engine hung: 1 request(s) in it and no token for"), rep.error
    assert sup.kills["hung"] == 1
    await wait_for(lambda: not pid_alive(pid), what="the hung engine killed")
    # Counted by reason in the agent's /metrics.
    (kills, _late) = _supervisor_metrics(sup)
    counted = {s.labels["reason"]: s.value for s in kills.samples if s.name.endswith("_total")}
    assert counted == {
        "hung": 1,
        "unhealthy": 0,
        "start_timeout": 0,
        "start_stalled": 0,
        "wake_failed": 0,
    }


async def test_a_request_a_stopped_core_holds_is_in_flight_not_idle(
    make_supervisor: SupervisorFactory,
) -> None:
    # A vLLM whose engine core is stopped keeps its gauges at 0; its HTTP server's
    # /load (the template turns it on) still counts the request: in flight, not idle.
    sup = make_supervisor(templates={"fake": {"hung_after_s": 600.0}})
    await sup.apply([assignment(engine_args=["--load-seconds", "0", "--stall-after", "0"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    port = only(sup).port
    await wait_for(lambda: only(sup).traffic is not None, what="scraped twice")
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/v1/completions"
        stuck = asyncio.create_task(s.post(url, json={"prompt": "hi", "max_tokens": 2}))
        try:
            await wait_for_async(lambda: _load(port), 1, "the request held")
            assert 'vllm:num_requests_running{model_name="org/m"} 0.0' in await _metrics(port)

            def held_in_flight() -> bool:
                traffic = only(sup).traffic
                return traffic is not None and traffic.in_flight == 1

            await wait_for(held_in_flight, what="in flight from /load")
            await asyncio.sleep(1.0)  # ten scrapes of a core that does nothing
            rep = only(sup)
            assert rep.traffic is not None and rep.traffic.in_flight == 1
            assert rep.idle_seconds is not None and rep.idle_seconds < 0.5, rep.idle_seconds
            assert rep.state is ShardState.READY  # not hung yet: 600 s allowed
        finally:
            stuck.cancel()
            with contextlib.suppress(BaseException):
                await stuck


async def test_idle_engine_is_never_hung(make_supervisor: SupervisorFactory) -> None:
    # No work, no tokens: idle, not hung (the stall only shows with a request in it).
    sup = make_supervisor(templates={"fake": {"hung_after_s": 0.3}})
    await sup.apply([assignment(engine_args=["--load-seconds", "0", "--stall-after", "0"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    await asyncio.sleep(1.5)
    assert state_of(sup) is ShardState.READY
    assert sup.kills["hung"] == 0


async def _ready_then_slow_health(sup: EngineSupervisor, *extra: str) -> None:
    """Ready with a patient check, then checks that time out before /health answers."""
    args = ["--load-seconds", "0", "--health-delay", "0.8", *extra]
    await sup.apply([assignment(engine_args=args)], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, 10, "ready")
    # The settings are frozen: the probes (which alone read this one) get shorter ones.
    sup.probes.settings = dataclasses.replace(sup.settings, health_timeout_s=0.3)


async def test_slow_health_of_an_engine_making_progress_is_not_a_failure(
    make_supervisor: SupervisorFactory,
) -> None:
    # A busy node: /health answers after its timeout, but tokens keep coming.
    sup = make_supervisor(health_timeout_s=2.0, unhealthy_after=2)
    await _ready_then_slow_health(sup, "--traffic", "40", "--seed", "1")
    await asyncio.sleep(3.0)
    assert state_of(sup) is ShardState.READY, only(sup).error
    assert sup.kills["unhealthy"] == 0


async def test_slow_health_while_the_agent_runs_late_is_not_a_failure(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(health_timeout_s=2.0, unhealthy_after=2)
    await _ready_then_slow_health(sup)

    async def overloaded_node() -> None:  # the agent's loop blocked, as on a loaded node
        while True:
            time.sleep(0.4)  # noqa: ASYNC251 (blocking on purpose: a late loop)
            await asyncio.sleep(0.05)

    hog = asyncio.create_task(overloaded_node())
    try:
        await asyncio.sleep(4.0)
        assert sup.loop_lag.worst_s() >= 0.3, "the monitor measures its own lateness"
    finally:
        hog.cancel()
    assert state_of(sup) is ShardState.READY, only(sup).error
    assert sup.kills["unhealthy"] == 0


async def test_slow_health_of_an_idle_engine_on_time_still_fails(
    make_supervisor: SupervisorFactory,
) -> None:
    # The control: no lateness, no progress, no answer in time: that is a failure.
    sup = make_supervisor(health_timeout_s=2.0, unhealthy_after=2)
    await _ready_then_slow_health(sup)
    pid = pid_of(sup)
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, 10, "unhealthy")
    assert "stopped answering /health: no answer within 0.3s" in (only(sup).error or "")
    assert sup.kills["unhealthy"] == 1
    await wait_for(lambda: not pid_alive(pid), what="killed")
