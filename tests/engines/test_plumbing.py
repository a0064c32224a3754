"""State file, process identity, log tails and the scrape client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from llmgw.agent.engine_proc import (
    TAIL_LINE_CHARS,
    TAIL_MAX_CHARS,
    cpu_by_group,
    describe_exit,
    log_tail,
    ref_for,
)
from llmgw.agent.engine_state import EngineRecord, load_state, save_state
from llmgw.agent.metrics import MAX_LOAD_BYTES, MAX_METRICS_BYTES, scrape, server_load
from llmgw.wire import ShardAssignment


def record(pid: int = 123) -> EngineRecord:
    a = ShardAssignment(replica_id="r", model="m", source="m", engine="fake", gpus=["GPU-1"])
    return EngineRecord(
        replica_id="r", rank=0, pid=pid, start_ticks=5, boot_id="b", port=8000,
        state="ready", assignment=a, log_path="/x.log", started_at=1.0,
    )  # fmt: skip


def test_state_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    save_state(path, [record(1), record(2)])
    assert [r.pid for r in load_state(path)] == [1, 2]
    assert load_state(path)[0].assignment == record().assignment
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines.json"], "no temp files left"


def test_missing_and_corrupt_state(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    assert load_state(path) == []
    path.write_text('{"engines": [{"pid": ')
    assert load_state(path) == []
    assert (tmp_path / "engines.json.corrupt").exists(), "kept for a person to read"
    assert not path.exists()


def test_process_identity_survives_only_while_the_process_lives() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ref = ref_for(proc.pid)
        assert ref is not None and ref.alive()
        # Same PID, different start time: a reused PID is not our engine.
        impostor = type(ref)(pid=ref.pid, start_ticks=ref.start_ticks + 1, boot_id=ref.boot_id)
        assert not impostor.alive()
    finally:
        proc.kill()
        proc.wait()
    assert not ref.alive()
    assert ref_for(proc.pid) is None


def test_ref_of_self_and_zombie() -> None:
    assert ref_for(os.getpid()) is not None
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ref_for(proc.pid)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert ref is None or not ref.alive()
    proc.wait()


def test_describe_exit() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert "unknown" in describe_exit(None)


def test_log_tail_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    log.write_text("".join(f"line {i} " + "x" * 1000 + "\n" for i in range(500)) + "\n\nlast\n")
    tail = log_tail(log)
    lines = tail.splitlines()
    assert lines[-1] == "last"
    assert len(tail) <= TAIL_MAX_CHARS
    assert all(len(ln) <= TAIL_LINE_CHARS for ln in lines)
    assert log_tail(tmp_path / "missing.log") == ""


async def test_scrape_good_failed_and_oversized(aiohttp_server: AiohttpServer) -> None:
    import aiohttp

    async def good(_: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{model_name="m"} 2\n')

    async def bad(_: web.Request) -> web.Response:
        return web.Response(status=500)

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b"#" * (MAX_METRICS_BYTES + 10))

    app = web.Application()
    app.router.add_get("/good", good)
    app.router.add_get("/bad", bad)
    app.router.add_get("/huge", huge)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        got = await scrape(session, str(server.make_url("/good")))
        assert got is not None and got.gauges == {"vllm:num_requests_running": 2.0}
        assert await scrape(session, str(server.make_url("/bad"))) is None
        assert await scrape(session, str(server.make_url("/huge"))) is None
        assert await scrape(session, "http://127.0.0.1:1/metrics", timeout_s=0.5) is None


async def test_server_load_reads_vllms_count_and_nothing_else(
    aiohttp_server: AiohttpServer,
) -> None:
    import aiohttp

    bodies = {
        "/good": b'{"server_load": 3}',
        "/text": b"busy",
        "/list": b"[3]",
        "/negative": b'{"server_load": -1}',
        "/bool": b'{"server_load": true}',
        "/float": b'{"server_load": 1.5}',
        "/huge": b'{"server_load": 1, "pad": "' + b"x" * (MAX_LOAD_BYTES + 10) + b'"}',
    }

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=bodies[request.path], content_type="application/json")

    app = web.Application()
    for path in bodies:
        app.router.add_get(path, answer)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        got = {p: await server_load(session, str(server.make_url(p))) for p in bodies}
        assert got == {p: (3 if p == "/good" else None) for p in bodies}
        assert await server_load(session, "http://127.0.0.1:1/load", timeout_s=0.5) is None


def test_cpu_by_group_counts_a_busy_group_and_not_an_idle_one() -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 5: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    idle = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while cpu_by_group().get(busy.pid, 0.0) < 0.3:
            assert time.monotonic() < deadline, "the busy group's CPU was never counted"
            time.sleep(0.05)
        assert cpu_by_group().get(idle.pid, 0.0) < 0.1
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
