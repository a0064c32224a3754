"""The supervisor's probes against a scripted HTTP engine: no process, no monitor.
Each probe's verdict (ready, a kill and its reason, nothing) from what /health,
/metrics and /load answer, on injected clocks where time matters."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from llmgw.agent.engine_http import EngineHttp
from llmgw.agent.engine_probes import EngineProbes, HealthFailure
from llmgw.agent.engine_proc import ProcessRef
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Engine, KillReason
from llmgw.agent.engine_templates import EngineTemplate
from llmgw.agent.progress import ProgressWatch, StartWatch
from llmgw.wire import ShardAssignment, ShardState


@dataclass
class Script:
    """What the scripted engine answers now (tests change it between checks)."""

    health: int = 200
    health_delay_s: float = 0.0
    running: int = 0
    tokens: float = 0.0
    on_health: Callable[[], None] | None = None  # runs while /health is being answered


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def scripted_engine(aiohttp_server: AiohttpServer, script: Script) -> int:
    async def health(_: web.Request) -> web.Response:
        await asyncio.sleep(script.health_delay_s)
        if script.on_health is not None:
            script.on_health()
        return web.Response(status=script.health)

    async def metrics(_: web.Request) -> web.Response:
        body = (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running {script.running}\n"
            "# TYPE vllm:generation_tokens counter\n"
            f"vllm:generation_tokens_total {script.tokens}\n"
        )
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    return int(server.port)


def settings(tmp_path: Path, **kw: float) -> SupervisorSettings:
    opts: dict[str, Any] = {"health_timeout_s": 0.3, "unhealthy_after": 3, **kw}
    return SupervisorSettings(state_dir=tmp_path, node="n1", **opts)


def engine(
    port: int | None, state: ShardState = ShardState.READY, *, rank: int = 0, nnodes: int = 1
) -> Engine:
    a = ShardAssignment(
        replica_id="r1",
        model="org/m",
        source="org/m",
        engine="scripted",
        gpus=["GPU-a"],
        rank=rank,
        nnodes=nnodes,
        leader_address="127.0.0.1",
    )
    template = EngineTemplate(command="scripted --port {port}", hung_after_s=30.0)
    return Engine(assignment=a, template=template, state=state, port=port)


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[EngineHttp]:
    h = EngineHttp(settings(tmp_path))
    yield h
    await h.close()


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_health_says_how_it_failed(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script()
    probes = EngineProbes(settings(tmp_path), http)
    eng = engine(await scripted_engine(aiohttp_server, script))
    assert await probes.health(eng) is None
    script.health = 503
    failed = await probes.health(eng)
    assert failed is not None and failed.kind is HealthFailure.ANSWERED
    assert failed.message == "answered 503"
    script.health, script.health_delay_s = 200, 1.0
    failed = await probes.health(eng)
    assert failed is not None and failed.kind is HealthFailure.NO_ANSWER
    assert failed.message == "no answer within 0.3s"
    failed = await probes.health(engine(closed_port()))
    assert failed is not None and failed.kind is HealthFailure.UNREACHABLE


async def test_a_start_is_ready_on_health_200_or_a_worker_once_settled(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script(health=503)
    probes = EngineProbes(settings(tmp_path, worker_settle_s=2.0), http)
    eng = engine(await scripted_engine(aiohttp_server, script), ShardState.STARTING)
    assert not await probes.started(eng, eng.started_mono)
    script.health = 200
    assert await probes.started(eng, eng.started_mono)
    # Rank 1 of 2 serves no HTTP: ready by staying up, whatever answers on its port.
    worker = engine(closed_port(), ShardState.STARTING, rank=1, nnodes=2)
    assert not await probes.started(worker, worker.started_mono + 1.9)
    assert await probes.started(worker, worker.started_mono + 2.0)
    orphan = engine(None, ShardState.STARTING)
    orphan.template = None  # adopted, and this agent has no such template
    assert not await probes.started(orphan, orphan.started_mono + 1e6), "template gone"


def test_a_start_past_its_timeout_is_a_kill(tmp_path: Path) -> None:
    probes = EngineProbes(settings(tmp_path, start_timeout_s=60.0), EngineHttp(settings(tmp_path)))
    eng = engine(None, ShardState.STARTING)
    assert probes.overdue(eng, eng.started_mono + 59.9) is None
    kill = probes.overdue(eng, eng.started_mono + 60.0)
    assert kill is not None and kill.reason is KillReason.START_TIMEOUT
    assert kill.why == "was not healthy 60s after starting (start timeout)"


async def test_a_quiet_start_is_a_kill_at_its_stall_limit(tmp_path: Path) -> None:
    """No log growth and no CPU (a process group that does not exist has none) for
    the stall limit; a template's own limit wins, and 0 turns the look off."""
    probes = EngineProbes(
        settings(tmp_path, start_stall_s=5.0, start_look_s=0.0), EngineHttp(settings(tmp_path))
    )
    clock = Clock()
    log_path = tmp_path / "quiet.log"
    log_path.write_text("loading\n")
    ref = ProcessRef(pid=2**22 + 1, start_ticks=1, boot_id="b")  # no such group
    eng = engine(None, ShardState.STARTING)
    eng.ref, eng.log_path = ref, log_path
    eng.start_watch = StartWatch(clock=clock)
    assert await probes.stalls([eng], now=0.0) == []
    clock.now += 5.0
    ((killed, kill),) = await probes.stalls([eng], now=1.0)
    assert killed is eng and kill.reason is KillReason.START_STALLED
    assert "wrote nothing to its log and used under 1s of CPU for 5s" in kill.why
    assert probes.stall_limit(eng) == 5.0
    assert eng.template is not None
    eng.template = eng.template.model_copy(update={"start_stall_s": 0.0})
    assert probes.stall_limit(eng) == 0.0
    assert await probes.stalls([eng], now=2.0) == [], "a template's 0: never stalled"


async def test_the_start_look_runs_once_a_look_interval(tmp_path: Path) -> None:
    probes = EngineProbes(
        settings(tmp_path, start_stall_s=1.0, start_look_s=10.0), EngineHttp(settings(tmp_path))
    )
    clock = Clock()
    ref = ProcessRef(pid=2**22 + 1, start_ticks=1, boot_id="b")
    eng = engine(None, ShardState.STARTING)
    eng.ref = ref
    eng.start_watch = StartWatch(clock=clock)
    assert await probes.stalls([eng], now=100.0) == []
    clock.now += 5.0
    assert await probes.stalls([eng], now=105.0) == [], "not looked at: too soon"
    assert len(await probes.stalls([eng], now=110.0)) == 1


async def test_work_and_still_tokens_for_hung_after_s_is_a_kill(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script(running=2, tokens=10)
    probes = EngineProbes(settings(tmp_path), http)
    clock = Clock()
    eng = engine(await scripted_engine(aiohttp_server, script))
    eng.progress = ProgressWatch(clock)
    assert await probes.check_ready(eng) is None
    clock.now += 29.0
    assert await probes.check_ready(eng) is None
    script.tokens = 11  # a token: progress, the stall starts over
    assert await probes.check_ready(eng) is None
    clock.now += 1.0
    assert await probes.check_ready(eng) is None
    clock.now += 30.0
    kill = await probes.check_ready(eng)
    assert kill is not None and kill.reason is KillReason.HUNG and not kill.exit_first
    assert kill.why == "hung: 2 request(s) in it and no token for 30s (hung_after_s 30)"
    assert eng.tracker.idle_seconds() is not None, "the scrape fed idleness too"


async def test_failed_health_in_a_row_is_a_kill_and_a_good_one_resets_the_count(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script(health=503)
    probes = EngineProbes(settings(tmp_path), http)
    eng = engine(await scripted_engine(aiohttp_server, script))
    assert await probes.check_ready(eng) is None
    assert await probes.check_ready(eng) is None
    assert eng.health_failures == 2
    script.health = 200
    assert await probes.check_ready(eng) is None
    assert eng.health_failures == 0
    script.health = 503
    for _ in range(2):
        assert await probes.check_ready(eng) is None
    kill = await probes.check_ready(eng)
    assert kill is not None and kill.reason is KillReason.UNHEALTHY
    assert kill.exit_first, "an engine on its way out gets to exit by itself first"
    assert kill.why == "stopped answering /health: answered 503, 3 checks in a row"


async def test_no_answer_while_the_agent_runs_late_is_not_counted(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script(health_delay_s=1.0)
    probes = EngineProbes(settings(tmp_path), http)
    eng = engine(await scripted_engine(aiohttp_server, script))
    probes.loop_lag.record(0.2)  # the monitor woke 0.2s late: over a quarter of 0.3s
    assert await probes.check_ready(eng) is None
    assert eng.health_failures == 0
    probes = EngineProbes(settings(tmp_path), http)  # on time: the same miss counts
    assert await probes.check_ready(eng) is None
    assert eng.health_failures == 1


async def test_an_engine_that_left_ready_meanwhile_gets_no_verdict(
    aiohttp_server: AiohttpServer, http: EngineHttp, tmp_path: Path
) -> None:
    script = Script(health=503)
    probes = EngineProbes(settings(tmp_path, unhealthy_after=1), http)
    eng = engine(await scripted_engine(aiohttp_server, script))

    def unassigned() -> None:  # the lifecycle began its stop while /health was asked
        eng.state = ShardState.STOPPING

    script.on_health = unassigned
    assert await probes.check_ready(eng) is None
    assert eng.health_failures == 0


def test_ready_engines_are_checked_once_a_scrape_interval(tmp_path: Path) -> None:
    probes = EngineProbes(settings(tmp_path, scrape_interval_s=5.0), EngineHttp(settings(tmp_path)))
    assert probes.scrape_due(100.0)
    assert not probes.scrape_due(104.9)
    assert probes.scrape_due(105.0)
