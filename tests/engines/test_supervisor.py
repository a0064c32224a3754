"""EngineSupervisor with real fake-engine processes on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from llmgw.agent import engine_lifecycle
from llmgw.agent.engine_lifecycle import StateDirBusy
from llmgw.agent.engines import EngineSupervisor
from llmgw.wire import ReplicaReport, ShardState

from .conftest import SupervisorFactory, assignment, pid_alive, wait_for


def only(sup: EngineSupervisor) -> ReplicaReport:
    reps = sup.reports()
    assert len(reps) == 1, reps
    return reps[0]


def pid_of(sup: EngineSupervisor) -> int:
    (entry,) = sup.debug_state().values()
    pid = entry["pid"]
    assert isinstance(pid, int)
    return pid


def proc_file(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


def state_of(sup: EngineSupervisor) -> ShardState | None:
    reps = sup.reports()
    return reps[0].state if reps else None


async def test_starts_engine_with_env_and_argv_then_ready(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    sup = make_supervisor()
    await sup.apply([assignment()], {})
    rep = only(sup)
    assert rep.state is ShardState.STARTING
    assert (rep.id, rep.model, rep.rank, rep.gpus) == ("r1", "org/m", 0, ["GPU-aaaa", "GPU-bbbb"])
    assert rep.idle_seconds is None
    pid = pid_of(sup)

    environ = proc_file(pid, "environ").split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in environ
    assert b"LLMGW_REPLICA_ID=r1" in environ
    argv = [a.decode() for a in proc_file(pid, "cmdline").split(b"\0")[:-1]]
    assert argv[1:] == [
        "-m", "llmgw.agent.fake_engine", "--host", "127.0.0.1", "--port", str(rep.port),
        "--model", "org/m", "--enable-server-load-tracking",
        "--disable-access-log-for-endpoints", "/health,/metrics,/load",
        "--load-seconds", "0.3",
    ]  # fmt: skip
    assert os.getsid(pid) == pid, "engines run in their own session"

    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    # Once ready, the metrics scrape makes idleness known.
    await wait_for(lambda: only(sup).idle_seconds is not None, what="first scrape")

    log = (state_dir / "logs" / "r1-0.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in log and "fake engine: loading" in log
    saved = json.loads((state_dir / "engines.json").read_text())
    (rec,) = saved["engines"]
    assert rec["pid"] == pid and rec["port"] == rep.port and rec["start_ticks"] > 0


async def test_a_share_of_the_card_is_given_to_the_engine_last(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor()
    args = ["--load-seconds", "0.3", "--gpu-memory-utilization", "0.9"]
    await sup.apply([assignment(engine_args=args, gpu_memory_share=0.45)], {})
    argv = [a.decode() for a in proc_file(pid_of(sup), "cmdline").split(b"\0")[:-1]]
    # After engine_args, so the share the controller counts is the one the engine takes.
    assert argv[-6:] == [*args, "--gpu-memory-utilization", "0.45"]
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")


async def test_traffic_resets_idle(make_supervisor: SupervisorFactory) -> None:
    sup = make_supervisor()
    await sup.apply([assignment(engine_args=["--load-seconds", "0"])], {})
    await wait_for(lambda: only(sup).idle_seconds is not None, what="first scrape")
    await wait_for(lambda: (only(sup).idle_seconds or 0) >= 0.3, what="idle time growing")
    port = only(sup).port
    sent = time.monotonic()
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{port}/v1/completions"
        async with s.post(url, json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200

    def reset() -> bool:
        # Before the reset, idle > time since the request; after it, idle <= that.
        idle = only(sup).idle_seconds
        return idle is not None and idle <= time.monotonic() - sent

    await wait_for(reset, what="idle reset by a request")


async def test_local_weights_become_source(make_supervisor: SupervisorFactory) -> None:
    tpl = "{python} -m llmgw.agent.fake_engine --host {host} --port {port} --load-seconds 0 --src {source}"
    sup = make_supervisor(templates={"probe": tpl})
    await sup.apply([assignment(engine="probe", engine_args=[])], {"org/m": "/models/org/m"})
    cmdline = proc_file(pid_of(sup), "cmdline").split(b"\0")
    assert cmdline[-3:-1] == [b"--src", b"/models/org/m"]


async def test_unassigned_engine_stops_on_sigterm(make_supervisor: SupervisorFactory) -> None:
    sup = make_supervisor(grace_s=10.0)
    await sup.apply([assignment()], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    pid = pid_of(sup)
    t0 = time.monotonic()
    await sup.apply([], {})
    assert state_of(sup) is ShardState.STOPPING
    await wait_for(lambda: sup.reports() == [], what="stopped")
    assert time.monotonic() - t0 < 5, "a cooperative engine stops on SIGTERM, not after grace"
    assert not pid_alive(pid)
    assert json.loads(sup.settings.state_path.read_text())["engines"] == []


@pytest.mark.slow
async def test_engine_ignoring_sigterm_is_killed_after_grace(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(grace_s=0.6)
    await sup.apply([assignment(engine_args=["--load-seconds", "0", "--ignore-sigterm"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    pid = pid_of(sup)
    t0 = time.monotonic()
    await sup.apply([], {})
    await wait_for(lambda: sup.reports() == [], what="killed")
    assert time.monotonic() - t0 >= 0.6
    assert not pid_alive(pid)


async def test_crash_reports_exit_code_and_log_tail(make_supervisor: SupervisorFactory) -> None:
    sup = make_supervisor()
    a = assignment(engine_args=["--load-seconds", "0", "--fail-after", "0.3", "--exit-code", "3"])
    await sup.apply([a], {})
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="failed")
    rep = only(sup)
    assert rep.exit_code == 3
    assert rep.error is not None
    assert "exited with code 3" in rep.error and "simulated failure" in rep.error
    # Still assigned: stays failed, not restarted behind the controller's back.
    await sup.apply([a], {})
    assert only(sup).state is ShardState.FAILED
    # Unassigned after being reported: forgotten.
    await sup.apply([], {})
    assert sup.reports() == []


async def test_unknown_engine_and_missing_binary_fail_clearly(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(templates={"ghost": "/nonexistent/engine --port {port}"})
    await sup.apply(
        [assignment(replica_id="a", engine="nope"), assignment(replica_id="b", engine="ghost")], {}
    )
    errors = {r.id: r.error or "" for r in sup.reports()}
    assert all(r.state is ShardState.FAILED for r in sup.reports())
    assert "no engine template named 'nope'" in errors["a"] and "fake" in errors["a"]
    assert "cannot start '/nonexistent/engine'" in errors["b"]


async def test_new_supervisor_readopts_running_engine(make_supervisor: SupervisorFactory) -> None:
    a = assignment()
    first = make_supervisor()
    await first.apply([a], {})
    await wait_for(lambda: state_of(first) is ShardState.READY, what="ready")
    pid, port = pid_of(first), only(first).port
    await first.close()  # the agent goes away...
    assert pid_alive(pid), "closing the supervisor must not kill engines"

    second = make_supervisor()  # ...and a new one starts on the same state_dir
    rep = only(second)
    assert (rep.state, rep.port, pid_of(second)) == (ShardState.READY, port, pid)
    await second.apply([a], {})  # same assignment: kept, not restarted
    assert pid_of(second) == pid
    await wait_for(lambda: only(second).idle_seconds is not None, what="scrape after adoption")

    await second.apply([], {})  # an adopted engine can be stopped too
    await wait_for(lambda: second.reports() == [], what="stopped")
    assert not pid_alive(pid)


async def test_engine_dead_during_restart_reported_failed_once(
    make_supervisor: SupervisorFactory,
) -> None:
    first = make_supervisor()
    await first.apply([assignment(engine_args=["--load-seconds", "0"])], {})
    pid = pid_of(first)
    await first.close()
    os.kill(pid, 9)
    await wait_for(lambda: not pid_alive(pid), what="engine dead")

    second = make_supervisor()
    rep = only(second)
    assert rep.state is ShardState.FAILED
    assert rep.error is not None and "while the agent was not running" in rep.error
    await second.apply([], {})
    assert second.reports() == []


async def test_changed_assignment_restarts_after_old_one_stops(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(grace_s=0.3)
    # The old engine ignores SIGTERM, so "stopping" is observable for the grace period.
    args = ["--load-seconds", "0", "--ignore-sigterm"]
    await sup.apply([assignment(engine_args=args)], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    old = pid_of(sup)
    changed = assignment(gpus=["GPU-cccc"])
    await sup.apply([changed], {})
    assert state_of(sup) is ShardState.STOPPING  # the old one first: its cards are needed
    await wait_for(lambda: not pid_alive(old), what="old stopped")
    await wait_for(lambda: sup.reports() == [], what="old forgotten")
    await sup.apply([changed], {})
    rep = only(sup)
    assert rep.state is ShardState.STARTING and rep.gpus == ["GPU-cccc"]
    assert pid_of(sup) != old


async def test_multi_node_worker_without_http_is_ready_once_settled(
    make_supervisor: SupervisorFactory,
) -> None:
    # A worker rank (like vLLM --headless) serves no HTTP: ready once it stays up.
    tpl = {"command": "{python} -m llmgw.agent.fake_engine --port {port} --load-seconds 99"}
    sup = make_supervisor(templates={"w": tpl}, worker_settle_s=0.3)
    a = assignment(engine="w", rank=1, nnodes=2, leader_address="127.0.0.1", engine_args=[])
    await sup.apply([a], {})
    assert state_of(sup) is ShardState.STARTING
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="worker ready")
    assert only(sup).idle_seconds is None, "only the leader's counters say anything"


async def test_worker_without_leader_address_fails_clearly(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor()
    await sup.apply([assignment(rank=1, nnodes=2)], {})
    rep = only(sup)
    assert rep.state is ShardState.FAILED
    assert rep.error is not None and "no leader address" in rep.error


async def test_second_live_supervisor_on_same_state_dir_is_refused(
    make_supervisor: SupervisorFactory,
) -> None:
    first = make_supervisor()
    with pytest.raises(StateDirBusy, match=r"another agent .* is supervising engines"):
        make_supervisor()
    await first.close()
    make_supervisor()  # free again once the first let go


async def test_engine_not_healthy_within_the_start_timeout_is_killed(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(start_timeout_s=0.5)
    a = assignment(engine_args=["--load-seconds", "60"])
    await sup.apply([a], {})
    pid = pid_of(sup)
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="start timeout")
    rep = only(sup)
    assert rep.error is not None and "start timeout" in rep.error and "killed" in rep.error
    assert (
        "llmgw.agent.fake_engine --host" in rep.error
    )  # the log tail: what was launched, how far it got
    await wait_for(lambda: not pid_alive(pid), what="the engine gone")
    # Still assigned: stays failed; the controller's backoff decides on a restart.
    await sup.apply([a], {})
    assert only(sup).state is ShardState.FAILED


async def test_ready_engine_that_stops_answering_health_is_killed(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(unhealthy_after=3)
    await sup.apply([assignment(engine_args=["--load-seconds", "0", "--hang-after", "0.5"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    pid = pid_of(sup)
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="declared hung")
    rep = only(sup)
    assert rep.error is not None
    assert "stopped answering /health: answered 500, 3 checks in a row" in rep.error
    await wait_for(lambda: not pid_alive(pid), what="the engine gone")


async def test_one_failed_health_check_is_forgiven(make_supervisor: SupervisorFactory) -> None:
    sup = make_supervisor(unhealthy_after=3)
    await sup.apply([assignment(engine_args=["--load-seconds", "0"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    (eng,) = sup.lifecycle.engines.values()
    eng.health_failures = 2  # two misses, e.g. a GC pause in the engine
    await wait_for(lambda: eng.health_failures == 0, what="a good check resets the count")
    assert only(sup).state is ShardState.READY


async def test_a_start_with_no_output_and_no_cpu_is_killed_as_stalled(
    make_supervisor: SupervisorFactory,
) -> None:
    """Silent and idle while starting (the fake engine loads by sleeping): killed at the
    stall time, long before the start timeout, counted by its own reason."""
    sup = make_supervisor(start_stall_s=1.5, start_look_s=0.1)
    await sup.apply([assignment(engine_args=["--load-seconds", "600"])], {})
    pid = pid_of(sup)
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="a stalled start")
    rep = only(sup)
    assert rep.error is not None and "while starting (stalled)" in rep.error, rep.error
    assert "wrote nothing to its log and used under 1s of CPU" in rep.error
    assert sup.kills["start_stalled"] == 1
    await wait_for(lambda: not pid_alive(pid), what="the engine gone")


async def test_a_start_that_writes_progress_is_not_stalled(
    make_supervisor: SupervisorFactory,
) -> None:
    """A loader printing its progress (and using little CPU) keeps starting, then serves.
    (The limit leaves a loaded machine time to start the interpreter.)"""
    sup = make_supervisor(start_stall_s=4.0, start_look_s=0.1)
    args = ["--load-seconds", "7", "--load-chatter", "0.3"]
    await sup.apply([assignment(engine_args=args)], {})
    await wait_for(lambda: state_of(sup) is not ShardState.STARTING, 20, what="ready")
    assert state_of(sup) is ShardState.READY, only(sup).error
    assert sup.kills["start_stalled"] == 0


async def test_a_template_can_turn_the_stall_limit_off(make_supervisor: SupervisorFactory) -> None:
    """`start_stall_s = 0` in a template: its starts are never called stalled."""
    sup = make_supervisor(
        start_stall_s=1.0, start_look_s=0.1, templates={"fake": {"start_stall_s": 0}}
    )
    await sup.apply([assignment(engine_args=["--load-seconds", "600"])], {})
    await asyncio.sleep(2.5)
    assert state_of(sup) is ShardState.STARTING
    assert sup.kills["start_stalled"] == 0


async def test_a_template_stall_limit_wins_over_the_agents(
    make_supervisor: SupervisorFactory,
) -> None:
    sup = make_supervisor(
        start_stall_s=0, start_look_s=0.1, templates={"fake": {"start_stall_s": 1.0}}
    )
    await sup.apply([assignment(engine_args=["--load-seconds", "600"])], {})
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="the template's limit")
    assert sup.kills["start_stalled"] == 1


async def test_a_busy_engine_is_scraped_each_tick_until_it_is_seen_empty(
    make_supervisor: SupervisorFactory,
) -> None:
    """The controller reads a replica's requests in flight from these scrapes too: a
    count a whole scrape interval old (here 60 s) kept idle engines from making way
    for a waiting model (bench_density). Once a scrape sees requests in an engine, it
    is scraped every tick until one sees it empty."""
    sup = make_supervisor(scrape_interval_s=60.0)
    args = ["--load-seconds", "0", "--token-interval", "0.2"]
    await sup.apply([assignment(engine_args=args)], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready")
    (eng,) = sup.lifecycle.engines.values()
    await sup.probes.scrape(eng)  # the interval's scrape (its first came before ready)
    assert not eng.meter.busy
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{only(sup).port}/v1/completions"
        asked = asyncio.create_task(s.post(url, json={"prompt": "hi", "max_tokens": 10}))
        await asyncio.sleep(0.5)
        await sup.probes.scrape(eng)  # as the scrape of the interval would, mid-request
        assert eng.meter.busy
        traffic = only(sup).traffic
        assert traffic is not None and traffic.in_flight == 1
        (await asked).release()
    # Far within the 60-s interval: the ticks' scrapes see it empty.
    await wait_for(
        lambda: (t := only(sup).traffic) is not None and t.in_flight == 0, what="seen empty"
    )
    assert not eng.meter.busy


async def test_an_engine_asks_for_its_replicas_key_which_only_its_environment_holds(
    make_supervisor: SupervisorFactory, state_dir: Path
) -> None:
    """Issue 36 item 1: the key is in the engine's environment (VLLM_API_KEY), never on
    its command line nor in its log; the engine refuses its API without it; the agent
    presents it, also after a restart (the state file, mode 0600, keeps it)."""
    key = "ek-0123456789abcdef"
    a = assignment(engine_key=key)
    first = make_supervisor()
    await first.apply([a], {})
    pid = pid_of(first)
    assert f"VLLM_API_KEY={key}".encode() in proc_file(pid, "environ").split(b"\0")
    assert key.encode() not in proc_file(pid, "cmdline")
    await wait_for(lambda: state_of(first) is ShardState.READY, what="ready")
    port = only(first).port
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/v1/models"
        assert (await http.get(url)).status == 401
        assert (await http.get(url, headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await http.get(url, headers={"Authorization": f"Bearer {key}"})).status == 200
    assert key not in (state_dir / "logs" / "r1-0.log").read_text()
    assert (state_dir / "engines.json").stat().st_mode & 0o777 == 0o600
    await first.close()
    second = make_supervisor()  # adopts it, key and all
    assert pid_of(second) == pid
    (eng,) = second.lifecycle.engines.values()
    assert eng.assignment.engine_key == key
    await second.apply([a], {})
    assert pid_of(second) == pid  # the same assignment, key and all: not restarted
    await wait_for(lambda: only(second).idle_seconds is not None, what="scrape after adoption")


async def test_an_engine_that_exits_0_unasked_is_failed_with_the_cause_it_printed(
    make_supervisor: SupervisorFactory,
) -> None:
    """vLLM exits 0 after its engine core dies (issue 36, loose ends): an exit nobody
    asked for is a failure whatever its code, and the cause is what it printed."""
    sup = make_supervisor()
    args = ["--load-seconds", "0", "--fail-after", "0.8", "--exit-code", "0"]
    await sup.apply([assignment(engine_args=args)], {})
    await wait_for(lambda: state_of(sup) is ShardState.READY, what="ready first")
    await wait_for(lambda: state_of(sup) is ShardState.FAILED, what="failed")
    rep = only(sup)
    assert rep.exit_code == 0 and rep.error is not None
    first = rep.error.splitlines()[0]
    assert first.startswith("engine exited with code 0: ") and "simulated failure" in first


@pytest.mark.parametrize(("taken_times", "ends"), [(2, ShardState.READY), (3, ShardState.FAILED)])
async def test_an_engine_whose_port_was_taken_starts_again_on_a_fresh_one(
    make_supervisor: SupervisorFactory,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    taken_times: int,
    ends: ShardState,
) -> None:
    # Another process binds the port between the agent's pick and the engine's bind.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = [taken] * taken_times
        fresh = engine_lifecycle.free_port
        monkeypatch.setattr(
            engine_lifecycle, "free_port", lambda: picks.pop() if picks else fresh()
        )
        sup = make_supervisor()
        await sup.apply([assignment()], {})
        seen: list[ShardState | None] = []

        def settled() -> bool:
            seen.append(state_of(sup))
            return seen[-1] in (ShardState.READY, ShardState.FAILED)

        await wait_for(settled, within_s=30, what="ready or failed")
        assert state_of(sup) is ends, only(sup)
        log = (state_dir / "logs" / "r1-0.log").read_text()
        assert log.lower().count("address already in use") == min(taken_times, 3), log
        rep = only(sup)
        if ends is ShardState.READY:  # no failed start on the way: the controller saw none
            assert ShardState.FAILED not in seen and rep.port != taken
        else:  # past two starts again, a failure as any other, with its cause
            assert rep.error is not None and "address already in use" in rep.error.lower(), rep
