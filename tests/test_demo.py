"""`llmgw demo`: the simulated fleet a newcomer sees first."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.storage import StorageScanner
from llmgw.client import AdminClient
from llmgw.demo import (
    DEMO_IDLE_AFTER_S,
    DemoAgent,
    DemoNode,
    _room_elsewhere,
    build_fleet,
    card_to_fail,
    parser,
    run_demo,
    say_when_late,
)
from llmgw.wire import FleetSummary, ReplicaReport, ShardState, StorageScope


def args(**overrides: object) -> Namespace:
    ns = parser().parse_args(["--headless", "--port", "0", "--no-engines"])
    ns.interval = 0.2
    for key, value in overrides.items():
        setattr(ns, key, value)
    return ns


def test_default_fleet_layout(tmp_path: Path) -> None:
    fleet = build_fleet(tmp_path, 48)
    assert len(fleet) == 48
    assert [sum(n.fabric == f for n in fleet) for f in ("ib-a", "ib-b", "ib-c")] == [16, 16, 16]
    assert len({n.name for n in fleet}) == 48
    specs = [s for n in fleet for s in n.gpus]
    assert sum("unhealthy" in s for s in specs) == 4
    mixed = next(n for n in fleet if len(n.gpus) == 2)
    assert mixed.fabric == "ib-b"


def test_simulated_mount_tables_classify_like_a_real_node(tmp_path: Path) -> None:
    fleet = {n.name: n for n in build_fleet(tmp_path, 12)}
    a = fleet["gpu-a01"]
    assert a.mountinfo is not None
    (filer,) = StorageScanner(a.storage, a.mountinfo).scan()
    assert (filer.scope, filer.fs_type, filer.mount_source) == (
        StorageScope.SHARED,
        "nfs4",
        "filer-a:/export/models",
    )
    assert sorted(m.name for m in filer.models) == [
        "Qwen/Qwen2.5-7B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
    ]
    (half,) = filer.incomplete
    assert half.name == "mistralai/Mixtral-8x7B-Instruct-v0.1"
    assert "download in progress" in half.reason
    b = fleet["gpu-b04"]
    assert b.mountinfo is not None
    (local,) = StorageScanner(b.storage, b.mountinfo).scan()
    assert local.scope is StorageScope.LOCAL and local.mount_source == "/dev/nvme0n1"
    assert local.models == [] and "truncated" in local.incomplete[0].reason


async def until(fetch: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if await fetch():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("demo fleet did not settle in time")
        await asyncio.sleep(0.1)


async def test_demo_fleet_end_to_end_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(run_demo(args(nodes=12), stop, urls.append))
    await until(lambda: asyncio.sleep(0, bool(urls)))  # the banner is out
    summary: list[FleetSummary] = []
    async with AdminClient(urls[0]) as client:

        async def settled() -> bool:
            s = await client.summary()
            summary[:] = [s]
            # Every node heard from (the ones with a broken card are cordoned by llmgw).
            return s.nodes.total == 12 and all(f.nodes == 4 for f in s.fabrics)

        await until(settled)
        detail = await client.node("gpu-b03")
    s = summary[0]
    fabrics = {f.fabric: f for f in s.fabrics}
    assert (fabrics["ib-a"].nodes_with_weights, fabrics["ib-a"].models_present) == (4, 2)
    assert (fabrics["ib-b"].nodes_with_weights, fabrics["ib-b"].models_present) == (2, 1)
    assert (fabrics["ib-c"].nodes_with_weights, fabrics["ib-c"].models_present) == (0, 0)
    classes = {c.gpu_class: c for c in s.gpus}
    assert set(classes) == {"A100-SXM-80GB", "H100-SXM-80GB", "L40S-48GB"}
    assert classes["H100-SXM-80GB"].unhealthy == 1 and classes["L40S-48GB"].unhealthy == 1
    assert detail.row.classes == {"A100-SXM-80GB": 4, "L40S-48GB": 4}
    assert "empty directory" in detail.storage[0].incomplete[0].reason
    out = capsys.readouterr().out
    assert f"llmgw ctl --controller {urls[0]} status" in out

    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
    root = Path(out.split("simulated disks: ")[1].splitlines()[0])
    assert not await asyncio.to_thread(
        os.path.exists, root
    )  # a temporary demo leaves nothing behind


@pytest.mark.slow
async def test_demo_declares_models_when_engines_run(tmp_path: Path) -> None:
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        run_demo(args(nodes=3, no_engines=False, state_dir=tmp_path), stop, urls.append)
    )
    await until(lambda: asyncio.sleep(0, bool(urls)))  # the banner is out
    async with AdminClient(urls[0]) as client:
        models = await client.models()
        # Agents with engines say which they can run (ctl apply warns on others).
        for _ in range(100):
            summary = await client.summary()
            if summary.engines:
                break
            await asyncio.sleep(0.1)
    assert len(models) == 6
    assert set(summary.engines) == {"fake", "sglang", "vllm"}
    assert {m.spec.engine for m in models} <= set(summary.engines)
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    assert await asyncio.to_thread(
        os.path.isdir, tmp_path / "controller"
    )  # a given state dir is kept


def test_llmgw_demo_command_runs_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "demo",
            "--headless",
            "--port",
            "0",
            "--nodes",
            "3",
            "--no-engines",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("llmgw demo: 3 simulated nodes in 3 fabrics"), line
        assert "controller:  http://127.0.0.1:" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def _lines_of(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line.rstrip("\n"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_headless_demo_ends_its_output_with_the_banner() -> None:
    """No line per node, engine or request (issue 23 item 13: 48 lines after the
    banner, and one per routed request for as long as it ran)."""
    proc = subprocess.Popen(
        [*DEMO, "--headless", "--port", "0", "--nodes", "12", "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        _lines_of(proc, lines)
        deadline = time.monotonic() + 60
        while not any("traffic comes through it" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "\n".join(lines)
            time.sleep(0.1)
        time.sleep(8)  # engines start, become ready and serve routed requests meanwhile
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "\n".join(lines)
    banner = next(i for i, line in enumerate(lines) if line.startswith("llmgw demo: 12 simulated"))
    end = next(i for i, line in enumerate(lines) if "traffic comes through it" in line)
    assert "controller says node" not in out and "HTTP Request" not in out, out
    assert not [line for line in lines if " INFO llmgw.agent." in line], out  # one per engine
    assert len(lines[:banner]) <= 6, out  # the controller's first decisions, not a line a node
    # Once every node has reported, the controller has acted on what they said: the
    # banner stays in view (a decision a slow machine took late may follow it).
    assert len(lines[end + 1 :]) <= 2, out


def test_bad_node_count() -> None:
    from llmgw.demo import main

    assert main(["--nodes", "1"]) == 2


@pytest.mark.slow
async def test_demo_engines_serve_and_are_gone_after_stop(tmp_path: Path) -> None:
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        run_demo(args(nodes=3, no_engines=False, state_dir=tmp_path), stop, urls.append)
    )
    await until(lambda: asyncio.sleep(0, bool(urls)))
    ports: list[int] = []
    async with AdminClient(urls[0]) as client:

        async def an_engine_is_ready() -> bool:
            for row in await client.nodes():
                detail = await client.node(row.name)
                ports[:] = [r.port for r in detail.replicas if r.port and r.state == "ready"]
                if ports:
                    return True
            return False

        await until(an_engine_is_ready, within=60)
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://127.0.0.1:{ports[0]}/health")).status_code == 200
    stop.set()
    assert await asyncio.wait_for(task, 30) == 0
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{ports[0]}/health", timeout=2)


DEMO = [sys.executable, "-m", "llmgw", "demo"]


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += sorted(kids - out)
            out |= kids
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_closing_the_demos_terminal_stops_every_engine(sig: signal.Signals, tmp_path: Path) -> None:
    """SIGHUP (the terminal closed) and SIGTERM take the demo's engines with it."""
    proc = subprocess.Popen(
        [*DEMO, "--headless", "--port", "0", "--nodes", "3", "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        url = proc.stdout.readline().split()[-1]
        deadline = time.monotonic() + 60
        engines: set[int] = set()
        ports: list[int] = []
        while time.monotonic() < deadline and not ports:
            time.sleep(0.5)
            engines = _descendants(proc.pid)
            for row in httpx.get(f"{url}/v1/nodes").json():
                detail = httpx.get(f"{url}/v1/nodes/{row['name']}").json()
                ports += [
                    r["port"] for r in detail["replicas"] if r["port"] and r["state"] == "ready"
                ]
        assert ports and engines, "no engine started"
        engines = _descendants(proc.pid)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in engines if _alive(p)], "engine processes survived the demo"
    for port in ports:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


@pytest.mark.slow
async def test_panes_fill_and_idleness_is_only_what_was_observed(tmp_path: Path) -> None:
    """Cards an engine holds are in use with memory, every disk names its filesystem,
    and no replica is idle for longer than it has existed (issue 23 item 13: engines
    were presented as quiet for 15 minutes before the demo, busy ones included)."""
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        run_demo(args(nodes=6, no_engines=False, state_dir=tmp_path), stop, urls.append)
    )
    try:
        await until(lambda: asyncio.sleep(0, bool(urls)))
        async with AdminClient(urls[0]) as client:

            async def idleness_known() -> bool:
                replicas = await client.replicas()
                return len([r for r in replicas if r.idle_seconds is not None]) >= 3

            await until(idleness_known, within=60)
            await asyncio.sleep(2.0)  # a few more scrapes of every engine
            now = time.time()
            replicas = await client.replicas()
            for r in replicas:
                if r.idle_seconds is not None:
                    assert r.idle_seconds <= now - r.created_at + 1.0, r
            summary = await client.summary()
            assert summary.idle_after_s == DEMO_IDLE_AFTER_S  # a minute, so idleness shows
            ages = {r.id: now - r.created_at for r in replicas}
            for i in summary.idle_replicas:  # only what was observed, and old enough
                assert summary.idle_after_s <= i.idle_seconds <= ages[i.id] + 1.0, i
            busy = []
            for row in await client.nodes():
                detail = await client.node(row.name)
                busy += [g for g in detail.gpus if g.in_use]
                assert all(s.fs_type for s in detail.storage), detail.storage
            assert busy and all(g.memory_used_mib for g in busy)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


@pytest.mark.slow
async def test_demo_gateway_routes_to_the_demo_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        run_demo(args(nodes=3, no_engines=False, state_dir=tmp_path), stop, urls.append)
    )
    await until(lambda: asyncio.sleep(0, bool(urls)))
    out = capsys.readouterr().out
    gateway = out.split("gateway (OpenAI API, SMG): ", 1)[1].split()[0]
    assert f"curl -s {gateway}/v1/chat/completions" in out
    async with httpx.AsyncClient(timeout=10) as http:

        async def routed() -> bool:
            endpoints = (await http.get(f"{urls[0]}/v1/endpoints")).json()["endpoints"]
            if not endpoints:
                return False
            body = {"model": endpoints[0]["model"], "messages": [{"role": "user", "content": "hi"}]}
            try:
                resp = await http.post(f"{gateway}/v1/chat/completions", json=body)
            except httpx.HTTPError:
                return False
            return resp.status_code == 200

        await until(routed, within=60)

        # Part of the demo's own traffic goes through the gateway: it counts
        # requests beyond the few this test sent.
        async def demo_traffic_routed() -> bool:
            gateways = (await http.get(f"{urls[0]}/v1/gateways")).json()
            return bool(gateways) and gateways[0]["requests"] >= 5

        await until(demo_traffic_routed, within=60)
    stop.set()
    assert await asyncio.wait_for(task, 30) == 0


@pytest.mark.slow
async def test_a_card_fails_a_few_minutes_in_and_its_replica_moves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo shows fault handling: a card under a serving engine fails, the node
    is cordoned by llmgw naming the card, and its replica is replaced elsewhere."""
    stop = asyncio.Event()
    urls: list[str] = []
    caplog.set_level(logging.WARNING, "llmgw.demo")
    demo = args(nodes=6, no_engines=False, state_dir=tmp_path, fail_card_after=1.0)
    task = asyncio.create_task(run_demo(demo, stop, urls.append))
    try:
        said: list[str] = []

        async def failed() -> bool:
            said[:] = [r.getMessage() for r in caplog.records if "fails now" in r.getMessage()]
            return bool(said)

        await until(failed, within=60)
        words = said[0].split()
        card, node, replica = words[2], words[4], words[-2]
        async with AdminClient(urls[0]) as client:

            async def cordoned_and_moved() -> bool:
                row = (await client.node(node)).row
                if row.admin.by != "llmgw" or card[:8] not in (row.admin.reason or ""):
                    return False
                replicas = {r.id: r for r in await client.replicas()}
                moving = replicas.get(replica)
                stand_in = [r for r in replicas.values() if r.replaces == replica]
                return moving is None or (moving.state == "draining" and bool(stand_in))

            await until(cordoned_and_moved, within=60)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


def test_the_failed_card_is_one_whose_replica_can_move() -> None:
    """The demo fails a card only where a stand-in fits elsewhere: the replicas a model
    spreads over its GPU class can fill every node of that class, and a fault there shows
    only a cordon (one CI run failed a card of the routed model's, with nowhere to go)."""

    def agent(name: str, spec: str, held: int = 0) -> DemoAgent:
        gpus = FakeGpus(name, [parse_fake_spec(spec)])
        gpus.in_use.update(gpus.uuids[:held])
        return DemoAgent(DemoNode(name, "ib-b", [spec]), cast(Any, None), None, gpus)

    home = agent("b01", "8xA100-SXM-80GB", held=8)
    replica = home.gpus.uuids
    full = agent("b02", "8xA100-SXM-80GB", held=8)
    other_class = agent("c01", "8xL40S-48GB")
    faulty = agent("b03", "8xA100-SXM-80GB,unhealthy=7")
    assert not _room_elsewhere([home, full, other_class, faulty], home, replica)
    free = agent("b04", "8xA100-SXM-80GB")
    assert _room_elsewhere([home, full, other_class, faulty, free], home, replica)
    assert not _room_elsewhere([home, agent("b05", "8xA100-SXM-80GB", held=1)], home, replica)

    # Of two ready replicas, the one with room elsewhere: here the second node's.
    def serving(a: DemoAgent, rid: str) -> DemoAgent:
        report = ReplicaReport(id=rid, model="m", state=ShardState.READY, gpus=a.gpus.uuids)
        a.engines = cast(Any, SimpleNamespace(reports=lambda: [report]))
        return a

    h100 = [serving(agent(f"a0{i}", "4xH100-SXM-80GB", held=4), f"r{i}") for i in (1, 2)]
    spare = agent("a03", "4xH100-SXM-80GB")
    fleet = [serving(home, "r0"), full, *h100, spare]
    assert card_to_fail(fleet) == (h100[0], h100[0].gpus.uuids[0], "r1")
    assert card_to_fail([serving(home, "r0"), full]) is None


async def test_the_demo_says_when_its_event_loop_ran_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The demo's controller and simulated nodes share one event loop: a stall long enough
    to show nodes unreachable is said, with its length (a CI run once saw the whole demo
    fleet unreachable and nothing said why)."""
    caplog.set_level(logging.WARNING, "llmgw.demo")
    stop = asyncio.Event()
    watch = asyncio.create_task(say_when_late(stop, every_s=0.05, said_s=1.0))
    await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.name == "llmgw.demo"]  # on time: nothing said
    time.sleep(1.5)  # noqa: ASYNC251 - the loop blocked, as a busy machine blocks it
    await asyncio.sleep(0.2)
    stop.set()
    await watch
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw.demo"]
    late = [float(m.split(" ran ")[1].split(" s late")[0]) for m in said]
    assert late and max(late) >= 1.4, said
    assert "nodes may show unreachable" in said[0], said


def test_the_routed_model_gets_rushes_and_scales_with_them() -> None:
    """The demo's own traffic makes its routed model scale within its first minutes."""
    from llmgw.demo import ROUTED_MODEL, ROUTED_RATE, RUSH_RATE, demo_specs, routed_rate

    assert routed_rate(30) == ROUTED_RATE and routed_rate(90) == RUSH_RATE
    assert routed_rate(300) == ROUTED_RATE and routed_rate(700) == RUSH_RATE
    (routed,) = [s for s in demo_specs() if s.name == ROUTED_MODEL]
    assert routed.autoscaled and routed.min_replicas < routed.most_replicas


@pytest.mark.slow
async def test_the_banners_curl_line_wakes_the_sleeping_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model the banner's curl line names sleeps at zero replicas and answers it."""
    from llmgw.demo import SLEEPING_MODEL

    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        run_demo(args(nodes=3, no_engines=False, state_dir=tmp_path), stop, urls.append)
    )
    try:
        await until(lambda: asyncio.sleep(0, bool(urls)))
        out = capsys.readouterr().out
        gateway = out.split("gateway (OpenAI API, SMG): ", 1)[1].split()[0]
        assert f'"model": "{SLEEPING_MODEL}"' in out
        async with AdminClient(urls[0]) as client:
            assert not [r for r in await client.replicas() if r.model == SLEEPING_MODEL]
        body = {"model": SLEEPING_MODEL, "messages": [{"role": "user", "content": "hello"}]}
        async with httpx.AsyncClient(timeout=90) as http:

            async def answered() -> bool:
                resp = await http.post(f"{gateway}/v1/chat/completions", json=body)
                return resp.status_code == 200

            await until(answered, within=120)
        async with AdminClient(urls[0]) as client:
            assert [r for r in await client.replicas() if r.model == SLEEPING_MODEL]
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
