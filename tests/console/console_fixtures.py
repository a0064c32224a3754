"""The real controller (`create_app`) for the console tests, and fault injection.

`LiveController` serves the controller's own aiohttp app on loopback from a
thread with its own event loop, so Pilot tests and snapshot tests (which run
the app in a loop of their own) both reach it through the real `AdminClient`
over real HTTP. Its clocks are frozen, so every snapshot draws the same frame.
Fleets are filled through the real API: agent reports built by the
controller tests' factories, cordons and drains through the admin client.

`Faults` is the thin httpx transport in between that can play a controller
that is down, crashing, or answering errors, and records what was sent.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
from fleet_factories import FakeClock, gpu, location, report

from llmgw.client import AdminClient
from llmgw.controller.core.auth import Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.keys import METRICS, term_of
from llmgw.controller.loop import placing
from llmgw.wire import (
    AdapterFailure,
    AdapterSpec,
    EngineTraffic,
    ModelSpec,
    NodeReport,
    ReplicaReport,
    ReportReply,
    ShardAssignment,
    ShardState,
)

NOW = 1_767_000_000.0  # the frozen wall clock of every fixture: 2025-12-29 09:20 UTC
T = TypeVar("T")

H100 = "H100-SXM-80GB"
A100 = "A100-SXM-40GB"
L40S = "L40S-48GB"
LLAMA = "meta-llama/Llama-3.1-70B"
MIXTRAL = "mistralai/Mixtral-8x7B"
QWEN = "Qwen/Qwen2.5-7B"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
EMBED = "BAAI/bge-small"


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    query: str = ""


URL = "http://controller.test:7460"  # what the console is told (and snapshots show)


class Faults(httpx.AsyncBaseTransport):
    """Passes requests to the real controller unless told to fail; records them.

    The console is pointed at `URL`; requests go to wherever the live
    controller listens (`target`), so the URL on screen never changes."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx.AsyncHTTPTransport()
        self.target: httpx.URL | None = None
        self.requests: list[Recorded] = []
        self.down = False  # connection refused
        self.crash = False  # a non-transport error below the client (a bug)
        self.status_error: int | None = None  # the controller answers this status
        self.path_errors: dict[str, int] = {}  # path -> the status the controller answers
        self.delay_s = 0.0

    @property
    def mutations(self) -> list[Recorded]:
        """Requests that change state (the drain pre-check is a dry run)."""
        return [r for r in self.requests if r.method != "GET" and r.path != "/v1/drain-plan"]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        query = request.url.query.decode()
        self.requests.append(Recorded(request.method, request.url.path, body, query))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.crash:
            raise RuntimeError("boom")
        if self.status_error:
            return httpx.Response(self.status_error, json={"error": "controller is restarting"})
        if (status := self.path_errors.get(request.url.path)) is not None:
            return httpx.Response(status, json={"error": f"no route {request.url.path}"})
        if self.target is not None:
            url = request.url.copy_with(host=self.target.host, port=self.target.port)
            request = httpx.Request(
                request.method, url, headers=request.headers, content=request.content
            )
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CountedIds:
    def __init__(self) -> None:
        self.n = 0
        self.keys = 0

    def token_hex(self, nbytes: int) -> str:
        self.n += 1
        return f"{self.n:0{nbytes * 2}x}"

    def token_urlsafe(self, nbytes: int) -> str:  # a replica's engine key: ids unmoved
        self.keys += 1
        return f"engine-key-{self.keys}"


class LiveController:
    """The real controller app on 127.0.0.1, in a thread, with frozen clocks."""

    def __init__(self, state_dir: Path, tokens: Tokens | None = None) -> None:
        self.state_dir = state_dir
        self.tokens = tokens or Tokens()
        self.clock = FakeClock(1000.0)  # the controller's monotonic clock
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self._agent_http: httpx.AsyncClient | None = None  # the agents' reports
        self.app: web.Application | None = None
        self.agents: Agents | None = None  # the fixture fleet's agents, once filled
        self._passed = asyncio.Event()  # set by each reconcile pass that finishes (`settle`)
        # Replica ids are random in production; counted here, for snapshots.
        self._real_secrets = placing.secrets
        placing.secrets = _CountedIds()  # type: ignore[assignment]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=30)

    def start(self) -> LiveController:
        self.call(self._start())
        return self

    async def _start(self) -> None:
        settings = ControllerSettings(
            state_dir=self.state_dir, tokens=self.tokens, reconcile_interval_s=0.05
        )
        self.app = create_app(settings)
        # Count the reconcile loop's passes (the leadership binds this at startup).
        metrics = self.app[METRICS]
        observe = metrics.observe_reconcile

        def counted(seconds: float, failed: bool) -> None:
            self._passed.set()
            observe(seconds, failed)

        metrics.observe_reconcile = counted  # type: ignore[method-assign]
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        # Frozen clocks: ages, "at" times and grace periods are the test's.
        fleet = term_of(self.app)
        fleet.facts.clock = self.clock
        fleet.facts.wall = lambda: NOW - 1000.0 + self.clock.t
        fleet.facts.liveness.started_at = self.clock()

    def stop(self) -> None:
        if self._agent_http is not None:
            self.call(self._agent_http.aclose())
            self._agent_http = None
        if self._runner is not None:
            self.call(self._runner.cleanup())
            self._runner = None

    def restart(self) -> None:
        """Same port, same state directory: as an operator's restart looks."""
        self.stop()
        self.start()

    def close(self) -> None:
        placing.secrets = self._real_secrets
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- filling the fleet through the API ---------------------------------------

    def client(self, faults: Faults | None = None, **kwargs: Any) -> AdminClient:
        """An admin client onto this controller; through `faults`, it believes
        it talks to `URL`."""
        if faults is None:
            return AdminClient(self.url, **kwargs)
        faults.target = httpx.URL(self.url)
        return AdminClient(URL, transport=faults, **kwargs)

    def admin(self, user: str, do: Callable[[AdminClient], Coroutine[Any, Any, T]]) -> T:
        async def run() -> T:
            async with self.client(user=user) as client:
                return await do(client)

        return self.call(run())

    def report(self, *reports: NodeReport) -> None:
        for r in reports:
            self.report_one(r)

    def report_one(self, r: NodeReport) -> ReportReply:
        async def post() -> ReportReply:
            # One client for every report: a new httpx client sets up TLS
            # (~40 ms), which made each console test's fleet take 5 s to build.
            if self._agent_http is None:
                self._agent_http = httpx.AsyncClient(base_url=self.url)
            resp = await self._agent_http.post(
                "/v1/agent/report",
                content=r.model_dump_json(),
                headers={"Content-Type": "application/json"},
            )
            assert resp.status_code == 200, resp.text
            return ReportReply.model_validate_json(resp.content)

        return self.call(post())

    def fingerprint(self) -> tuple[object, ...]:
        """What a test that only reads leaves as it found: the server (a restart makes
        another app), the change log's revision (every change to the fleet is logged),
        the newest event, the frozen clock."""
        assert self.app is not None
        facts = term_of(self.app).facts
        return (id(self.app), facts.log.revision, facts.events().cursor, self.clock.t)

    def settle(self) -> None:
        """Wait until the reconcile loop has nothing left to do: a whole pass,
        begun after everything before it, changed nothing. (It was a fixed 0.2 s
        sleep, which a busy machine could outlast with placements still to make.)"""
        self.call(self._settle())

    async def _settle(self, most: int = 100) -> None:
        assert self.app is not None
        log = term_of(self.app).facts.log
        for _ in range(most):
            revision = log.revision
            for _ in range(2):  # the second pass to finish began after `revision`
                self._passed.clear()
                await self._passed.wait()
            if log.revision == revision:
                return
        raise AssertionError(f"the reconcile loop still changed the fleet after {most} passes")


def _gpus(node: str, cls: str, n: int, used: int = 0, bad: Sequence[tuple[int, str, str]] = ()):  # type: ignore[no-untyped-def]
    health = {i: (h, why) for i, h, why in bad}
    return [
        gpu(
            node,
            i,
            cls,
            health=health.get(i, ("healthy", None))[0],
            reason=health.get(i, ("healthy", None))[1],
            in_use=i < used,
        )
        for i in range(n)
    ]


def _with_incomplete(loc: dict[str, Any], name: str, reason: str) -> dict[str, Any]:
    return {
        **loc,
        "incomplete": [{"name": name, "path": f"{loc['path']}/{name}", "reason": reason}],
    }


SHARED_A = [
    _with_incomplete(
        location("/models", [LLAMA, DEEPSEEK, QWEN], "shared", "10.0.0.5@o2ib:/models"),
        "meta-llama/Llama-3.1-405B",
        "3 of 191 shards missing (.incomplete files)",
    ),
    _with_incomplete(location("/nvme/models", []), "scratch", "empty directory"),
]


def small_reports() -> list[NodeReport]:
    """Twelve nodes that show every kind of trouble once (no engines yet)."""
    xid = [
        (6, "unhealthy", "Xid 79: GPU has fallen off the bus"),
        (7, "unhealthy", "uncorrectable ECC"),
    ]
    lost = [(7, "unknown", "NVML: GPU is lost")]
    local_b = [location("/nvme/models", [MIXTRAL])]
    local_l = [location("/nvme/models", [EMBED])]
    ib_b = ["ib-b"]
    return [
        *(
            report(f"gpu-a0{i}", gpus=_gpus(f"gpu-a0{i}", H100, 8), storage=SHARED_A)
            for i in range(1, 6)
        ),
        report("gpu-a06", gpus=_gpus("gpu-a06", H100, 8, bad=xid), storage=SHARED_A),
        report("gpu-b01", gpus=_gpus("gpu-b01", A100, 8), fabrics=ib_b, storage=local_b),
        report("gpu-b02", gpus=_gpus("gpu-b02", A100, 8, bad=lost), fabrics=ib_b, storage=local_b),
        report("gpu-b03", gpus=_gpus("gpu-b03", A100, 8), fabrics=ib_b, storage=local_b),
        report("gpu-b04", gpus=_gpus("gpu-b04", A100, 8), fabrics=ib_b),
        report("l40-01", gpus=_gpus("l40-01", L40S, 4), fabrics=[], storage=local_l),
        report("l40-02", gpus=_gpus("l40-02", L40S, 4), fabrics=[], storage=local_l),
    ]


SMALL_MODELS = [
    ModelSpec(name=LLAMA, source=LLAMA, min_replicas=2, gpus_per_shard=8, gpu_class=H100),
    # On the L40S nodes: on an H100 node it would take a whole free one (gpu-a06,
    # the only part-used one, is cordoned for its failed cards) and leave DeepSeek
    # no four-node block.
    ModelSpec(name=QWEN, source=QWEN, min_replicas=1, gpus_per_shard=1, gpu_class=L40S),
    ModelSpec(name=MIXTRAL, source=MIXTRAL, min_replicas=2, gpus_per_shard=4, gpu_class=A100),
    ModelSpec(name=EMBED, source=EMBED, min_replicas=1, gpus_per_shard=1, gpu_class=L40S),
    # Takes four whole H100 nodes, which leaves Llama (one whole node) unplaceable.
    ModelSpec(name=DEEPSEEK, source=DEEPSEEK, min_replicas=1, gpus_per_shard=8, shards=4),
]
# How long each engine has been idle, in the order the controller assigns them.
IDLE_S = [7980.0, 2710.0, 905.0, 42.0, 12.0, 3.0]
# What an engine that was asked something lately served over its last window.
BUSY = [
    EngineTraffic(requests_per_s=4.2, in_flight=3, p50_latency_s=0.84, prefix_hit_rate=0.71),
    EngineTraffic(requests_per_s=0.6, in_flight=0, p50_latency_s=0.31, prefix_hit_rate=0.18),
    EngineTraffic(requests_per_s=11.5, in_flight=9, p50_latency_s=1.9, prefix_hit_rate=0.55),
]


class Agents:
    """Plays every node's agent: reports, and runs whatever it is assigned
    (engines report ready at once, idle for a set time)."""

    def __init__(self, controller: LiveController, reports: list[NodeReport]) -> None:
        self.c = controller
        self.reports = {r.node: r for r in reports}
        self.running: dict[str, list[ReplicaReport]] = {}
        self._idle = iter(IDLE_S * 10)
        self._busy = iter(BUSY * 20)
        # Adapter loads the engines refuse: name -> (HTTP status, the engine's words).
        self.refuse: dict[str, tuple[int, str]] = {}

    def report(self, *, skip: Sequence[str] = ()) -> None:
        for name, base in self.reports.items():
            if name in skip:
                continue
            reply = self.c.report_one(
                base.model_copy(update={"replicas": self.running.get(name, [])})
            )
            wanted = {a.replica_id: a for a in reply.assignments}
            kept = [r for r in self.running.get(name, []) if r.id in wanted]
            have = {r.id for r in kept}
            for a in reply.assignments:
                if a.replica_id not in have:
                    idle_s = next(self._idle)
                    busy = a.rank == 0 and idle_s < 600
                    kept.append(
                        ReplicaReport(
                            id=a.replica_id,
                            model=a.model,
                            rank=a.rank,
                            state=ShardState.READY,
                            gpus=a.gpus,
                            port=8000 + len(kept),
                            idle_seconds=idle_s,
                            traffic=next(self._busy) if busy else None,
                        )
                    )
            self.running[name] = [self._load_adapters(r, wanted[r.id]) for r in kept]

    def _load_adapters(self, r: ReplicaReport, a: ShardAssignment) -> ReplicaReport:
        """The engine holds what its assignment names at once, but what it refuses."""
        if r.rank != 0 or not (a.adapters or r.adapters or r.adapter_failures):
            return r
        held = sorted(n for n in a.adapters if n not in self.refuse)
        failed = [
            AdapterFailure(name=n, status=self.refuse[n][0], message=self.refuse[n][1])
            for n in sorted(a.adapters)
            if n in self.refuse
        ]
        return r.model_copy(update={"adapters": held, "adapter_failures": failed})


def fill_small(
    c: LiveController,
    models: Sequence[ModelSpec] = SMALL_MODELS,
    adapters: Sequence[AdapterSpec] = (),
    reports: Sequence[NodeReport] | None = None,
) -> Agents:
    """The console tests' fleet, built as an operator's would come to be."""
    agents = Agents(c, list(reports) if reports is not None else small_reports())
    agents.report()
    # gpu-a06's failed cards cordon it now, before the clock moves: the
    # cordon's time on screen must not depend on how busy the machine is.
    c.settle()
    # Hours of history before any model exists (the clock jumps past every
    # node's grace here, which with replicas running would replace them).
    c.clock.advance(600)
    c.admin("alice", lambda a: a.drain("gpu-a03", "RMA: fan tray 2 failing"))
    c.settle()  # nothing runs there: the drain finishes, the node stays cordoned
    c.clock.advance(1800)
    c.admin("carol", lambda a: a.cordon("gpu-b04", "PSU swap"))
    c.clock.advance(3600)
    agents.report()
    c.admin("alice", lambda a: a.apply_models(list(models), list(adapters) or None))
    for _ in range(3):  # assignments arrive, engines start and report ready
        c.settle()
        agents.report()
    # gpu-b04 goes quiet; the others keep reporting within their grace.
    for _ in range(5):
        c.clock.advance(19)
        agents.report(skip=["gpu-b04"])
    c.clock.advance(2)
    c.settle()
    c.agents = agents
    return agents


def node_report(name: str, *, used: int | None = None) -> NodeReport:
    """gpu-xxx's report in the small fleet, with `used` cards in use instead."""
    base = next(r for r in small_reports() if r.node == name)
    if used is None:
        return base
    gpus = [g.model_copy(update={"in_use": g.index < used}) for g in base.gpus]
    return base.model_copy(update={"gpus": gpus})
