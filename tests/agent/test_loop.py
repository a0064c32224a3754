"""The report loop against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.agent.assignments_feed import AssignmentFeed
from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.loop import ReportLoop, next_delay
from llmgw.agent.report import ReportBuilder
from llmgw.agent.sample_models import write_model
from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.wire import (
    AdminFlag,
    NodeReport,
    NodeState,
    ReplicaReport,
    ReportReply,
    ShardAssignment,
    ShardState,
    reply_version,
)

ASSIGNMENT = ShardAssignment(replica_id="r1", model="m", source="m", engine="fake", gpus=["GPU-x"])


class FakeController:
    """Accepts reports on a fixed port; can go away and come back."""

    def __init__(self, token: str | None = None) -> None:
        self.reports: list[NodeReport] = []
        self.token = token
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"error": "invalid token"}, status=401)
        report = NodeReport.model_validate_json(await request.read())
        self.reports.append(report)
        reply = ReportReply(
            node=report.node,
            admin_flag=AdminFlag.NONE,
            state=NodeState.READY,
            assignments=[ASSIGNMENT],
        )
        return web.Response(text=reply.model_dump_json(), content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/agent/report", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()
        self.runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FakeEngines:
    def __init__(self) -> None:
        self.applied: list[tuple[list[ShardAssignment], dict[str, str]]] = []
        self.closed = False
        self.fail = False

    def reports(self) -> list[ReplicaReport]:
        return [ReplicaReport(id="r1", model="m", state=ShardState.READY, gpus=["GPU-x"])]

    async def apply(
        self,
        assignments: Sequence[ShardAssignment],
        local_weights: Mapping[str, str],
        local_adapters: Mapping[str, str] | None = None,
    ) -> None:
        if self.fail:
            raise RuntimeError("engine exploded")
        self.applied.append((list(assignments), dict(local_weights)))

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
async def controller() -> AsyncIterator[FakeController]:
    c = FakeController()
    await c.start()
    yield c
    if c.runner is not None:
        await c.stop()


def builder(tmp_path: Path, interval: float = 0.02) -> ReportBuilder:
    write_model(tmp_path / "models" / "m")
    return ReportBuilder(
        node="n1",
        gpus=FakeGpus("n1", [parse_fake_spec("2xH100-80GB")]),
        storage=StorageScanner([StorageDir(str(tmp_path / "models"))]),
        interval_s=interval,
        fabrics=["ib-a"],
        sysfs_root=tmp_path,
        boot_id="boot-1",
    )


async def until(cond: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def messages(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


async def test_reports_reach_the_controller_and_assignments_reach_engines(
    controller: FakeController, tmp_path: Path
) -> None:
    engines = FakeEngines()
    loop = ReportLoop(builder(tmp_path), controller.url, engines=engines)
    async with aiohttp.ClientSession() as session:
        reply = await loop.cycle(session)
    assert reply.assignments == [ASSIGNMENT]
    (report,) = controller.reports
    assert report.node == "n1" and report.boot_id == "boot-1" and report.fabrics == ["ib-a"]
    assert len(report.gpus) == 2 and report.storage_configured
    assert [m.name for m in report.storage[0].models] == ["m"]
    assert [r.id for r in report.replicas] == ["r1"]
    assert engines.applied == [([ASSIGNMENT], {"m": str(tmp_path / "models" / "m")})]


async def test_survives_a_controller_restart_and_logs_once_per_outage(
    controller: FakeController, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.agent.loop")
    loop = ReportLoop(builder(tmp_path), controller.url, rng=random.Random(1), backoff_cap_s=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until(lambda: len(controller.reports) >= 2)

    await controller.stop()  # the controller goes away ...
    failures_seen = loop.failures
    await until(lambda: loop.failures >= failures_seen + 4)
    assert not task.done()  # ... and the agent does not exit
    assert len(messages(caplog, "cannot reach the controller")) == 1

    before = len(controller.reports)
    await controller.start()  # ... and comes back on the same port
    await until(lambda: len(controller.reports) > before + 1)
    assert loop.failures == 0
    assert len(messages(caplog, "reachable again")) == 1
    assert len(messages(caplog, "cannot reach the controller")) == 1

    stop.set()
    await asyncio.wait_for(task, 2)


async def test_rejected_token_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller = FakeController(token="right")
    await controller.start()
    try:
        loop = ReportLoop(builder(tmp_path), controller.url, token="wrong", backoff_cap_s=0.05)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await until(lambda: loop.failures >= 3)
        assert len(messages(caplog, "rejected the agent token")) == 1
        assert "LLMGW_AGENT_TOKEN" in messages(caplog, "rejected")[0]
        loop.token = "right"
        await until(lambda: len(controller.reports) >= 1)
        stop.set()
        await asyncio.wait_for(task, 2)
    finally:
        await controller.stop()


async def test_engine_failure_does_not_stop_reporting(
    controller: FakeController, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engines = FakeEngines()
    engines.fail = True
    loop = ReportLoop(builder(tmp_path), controller.url, engines=engines)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until(lambda: len(controller.reports) >= 3)
    assert loop.failures == 0
    assert messages(caplog, "engines could not apply")
    stop.set()
    await asyncio.wait_for(task, 2)


async def test_build_failure_does_not_stop_the_loop(
    controller: FakeController, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    b = builder(tmp_path)
    b.node = "not a valid name"  # the report will not validate
    loop = ReportLoop(b, controller.url, backoff_cap_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until(lambda: loop.failures >= 3)
    assert len(messages(caplog, "could not build the report")) == 1
    b.node = "n1"
    await until(lambda: len(controller.reports) >= 1)
    stop.set()
    await asyncio.wait_for(task, 2)


def test_interval_jitter_and_capped_backoff() -> None:
    rng = random.Random(7)
    healthy = [next_delay(5.0, 0, rng, 30.0) for _ in range(200)]
    assert min(healthy) >= 4.5 and max(healthy) <= 5.5 and len(set(healthy)) > 100
    for failures, ceiling in [(1, 5.0), (2, 10.0), (3, 20.0), (4, 30.0), (50, 30.0)]:
        delays = [next_delay(5.0, failures, rng, 30.0) for _ in range(200)]
        assert ceiling / 2 <= min(delays) and max(delays) <= ceiling


async def test_stuck_observation_fails_the_report_without_piling_up_threads(
    controller: FakeController, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    b = builder(tmp_path)
    release = threading.Event()
    calls = []
    real_build = b.build

    def stuck(replicas: Sequence[ReplicaReport] = ()) -> NodeReport:
        calls.append(1)
        release.wait(10)
        return real_build(replicas)

    b.build = stuck  # type: ignore[method-assign]
    loop = ReportLoop(b, controller.url, backoff_cap_s=0.05, build_timeout_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until(lambda: loop.failures >= 4)
    assert calls == [1]  # every cycle waited on the one stuck build
    assert len(messages(caplog, "has not finished after")) == 1
    release.set()
    await until(lambda: len(controller.reports) >= 1)
    stop.set()
    await asyncio.wait_for(task, 2)


async def test_a_bug_in_the_engines_report_does_not_kill_the_loop(
    controller: FakeController, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engines = FakeEngines()
    broken = [True]

    def reports() -> list[ReplicaReport]:
        if broken[0]:
            raise KeyError("replica-7")
        return []

    engines.reports = reports  # type: ignore[method-assign]
    loop = ReportLoop(builder(tmp_path), controller.url, engines=engines, backoff_cap_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until(lambda: loop.failures >= 3)
    assert len(messages(caplog, "could not build the report: KeyError")) == 1
    broken[0] = False
    await until(lambda: len(controller.reports) >= 1)
    stop.set()
    await asyncio.wait_for(task, 2)


# -- the assignments feed (agent/assignments_feed.py) ---------------------------------------


class FeedController(FakeController):
    """Also answers `GET /v1/agent/assignments/NODE` as the controller does: the reply
    once it is not the one the agent has, else a 304 after the wait (or at a change)."""

    def __init__(self) -> None:
        super().__init__()
        self.assignments = [ASSIGNMENT]
        self.changed = asyncio.Event()
        self.polls = 0

    def body(self, node: str) -> bytes:
        reply = ReportReply(
            node=node, admin_flag=AdminFlag.NONE, state=NodeState.READY,
            assignments=self.assignments,
        )  # fmt: skip
        return reply.model_dump_json().encode()

    async def handle(self, request: web.Request) -> web.Response:
        report = NodeReport.model_validate_json(await request.read())
        self.reports.append(report)
        return web.Response(body=self.body(report.node), content_type="application/json")

    async def feed(self, request: web.Request) -> web.Response:
        self.polls += 1
        node = request.match_info["node"]
        have = request.headers.get("If-None-Match", "").strip('"')
        if reply_version(self.body(node)) == have:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), float(request.query["wait"]))
            self.changed.clear()
        body = self.body(node)
        etag = {"ETag": f'"{reply_version(body)}"'}
        if reply_version(body) == have:
            return web.Response(status=304, headers=etag)
        return web.Response(body=body, content_type="application/json", headers=etag)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/agent/report", self.handle)
        app.router.add_get("/v1/agent/assignments/{node}", self.feed)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = int(self.runner.addresses[0][1])


async def test_a_change_of_assignments_reaches_the_engines_between_reports(
    tmp_path: Path,
) -> None:
    controller = FeedController()
    await controller.start()
    engines = FakeEngines()
    loop = ReportLoop(builder(tmp_path, interval=60.0), controller.url, engines=engines)
    loop.feed = AssignmentFeed(loop, wait_s=5.0)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: len(engines.applied) >= 1 and controller.polls >= 1)
        second = ShardAssignment(
            replica_id="r2", model="m", source="m", engine="fake", gpus=["GPU-y"]
        )
        controller.assignments = [ASSIGNMENT, second]
        controller.changed.set()
        await until(lambda: any(second in applied for applied, _ in engines.applied))
        assert len(controller.reports) == 1  # no report brought it: the next is a minute away
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await controller.stop()


async def test_a_reports_reply_never_undoes_what_the_feed_applied_while_it_was_out(
    tmp_path: Path,
) -> None:
    engines = FakeEngines()
    loop = ReportLoop(builder(tmp_path), "http://127.0.0.1:9", engines=engines)
    older = ReportReply(node="n1", admin_flag=AdminFlag.NONE, state=NodeState.READY)
    newer = older.model_copy(update={"assignments": [ASSIGNMENT]})
    sent = time.monotonic()  # a report goes out
    await loop.apply(newer)  # the feed brings a change meanwhile
    await loop.apply(older, unless_applied_since=sent)  # the report's reply, from before
    assert [a for a, _ in engines.applied] == [[ASSIGNMENT]]
    await loop.apply(older, unless_applied_since=time.monotonic())  # a later report's: newest
    assert [a for a, _ in engines.applied] == [[ASSIGNMENT], []]
