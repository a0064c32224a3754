"""Console at scale: first paint and refresh cycle with 2,000 nodes.

Runs the real app headless (`App.run_test`) against the real controller
(`llmgw.controller.http.app.create_app`), served in this process on 127.0.0.1 from a
thread with its own event loop. The fleet is built and changed only through the
controller's public HTTP API: agent reports (`POST /v1/agent/report`) and admin
cordons. The figures are the console's: fetch (the controller answering on
loopback included) + validation + table patching + one repaint.

    python bench/bench_console.py [--nodes 2000] [--cycles 10] [--churn 0.05]

Prints figures and a baseline measured in the same run: validating the full
summary + nodes JSON into pydantic models, which is what every refresh paid
before the console asked only for changed rows (`GET /v1/nodes?since=`).
Targets from issue 5: first paint < 1 s, refresh cycle < 100 ms. Never
asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiohttp import web
from pydantic import TypeAdapter
from textual import events

from llmgw.client import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.screens.main import MainScreen
from llmgw.console.widgets.nodes import NodesTable
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.wire import (
    FleetSummary,
    GpuHealth,
    GpuReport,
    ModelFound,
    ModelSpec,
    NodeReport,
    NodeRow,
    StorageLocation,
    StorageScope,
)

T = TypeVar("T")

H100 = "H100-SXM-80GB"
A100 = "A100-SXM-40GB"
L40S = "L40S-48GB"  # no node has one: the models asking for it stay unplaceable
LLAMA = "meta-llama/Llama-3.1-70B"
QWEN = "Qwen/Qwen2.5-7B"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
EMBED = "BAAI/bge-small"
# A live node says it reports hourly (the longest interval allowed), so it stays
# reachable through any run; a node meant to be unreachable says every 10 ms and
# falls silent: 3 intervals + GRACE_EXTRA_S later it is unreachable.
LIVE_INTERVAL_S = 3600.0
LOST_INTERVAL_S = 0.01
GRACE_EXTRA_S = 0.5


class Controller:
    """The real controller app on 127.0.0.1 (a free port), served from a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.settings = ControllerSettings(
            state_dir=state_dir,
            grace_extra_s=GRACE_EXTRA_S,
            # The fleet keeps a few nodes with a failed card schedulable, as before.
            cordon_on_gpu_fault=False,
        )
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=60)

    def start(self) -> Controller:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(create_app(self.settings), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._runner is not None:
            self._call(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class Fleet:
    """`n` nodes in four fabrics with a sprinkling of trouble, as agents report them.

    Node i: 8 cards (A100 every third node, else H100), `(i * 7) % 9` of them in
    use, one failed card when i % 41 == 3; Llama on the fabric's shared filer
    (i % 4 == 0) or Qwen on local NVMe; cordoned by alice when i % 50 == 7,
    unreachable (silent) when i % 97 == 11 and not cordoned.
    """

    def __init__(self, n: int) -> None:
        self.names = [f"node-{i:05d}" for i in range(n)]
        self.used = {name: (i * 7) % 9 for i, name in enumerate(self.names)}
        self.cordoned = {name: i for i, name in enumerate(self.names) if i % 50 == 7}
        self.lost = {
            name for i, name in enumerate(self.names) if i % 97 == 11 and name not in self.cordoned
        }

    def report(self, name: str) -> NodeReport:
        i = int(name.removeprefix("node-"))
        cls = H100 if i % 3 else A100
        failed = i % 41 == 3
        gpus = [
            GpuReport(
                uuid=f"GPU-5f2c{g:02d}-{name}",
                index=g,
                name=cls.replace("-", " "),
                gpu_class=cls,
                memory_total_mib=81559 if cls == H100 else 40960,
                in_use=g < self.used[name] and not (failed and g == 7),
                health=GpuHealth.UNHEALTHY if failed and g == 7 else GpuHealth.HEALTHY,
                health_reason="Xid 79: GPU has fallen off the bus" if failed and g == 7 else None,
            )
            for g in range(8)
        ]
        if i % 4 == 0:
            storage = StorageLocation(
                path="/models",
                fs_type="lustre",
                scope=StorageScope.SHARED,
                mount_source=f"10.0.{i % 4}.5@o2ib:/models",
                mount_point="/models",
                models=[
                    ModelFound(
                        name=LLAMA, path=f"/models/{LLAMA}", size_bytes=140 * 2**30, files=30
                    )
                ],
            )
        else:
            storage = StorageLocation(
                path="/nvme/models",
                fs_type="xfs",
                scope=StorageScope.LOCAL,
                mount_point="/nvme",
                models=[
                    ModelFound(
                        name=QWEN, path=f"/nvme/models/{QWEN}", size_bytes=15 * 2**30, files=4
                    )
                ],
            )
        return NodeReport(
            node=name,
            agent_version="0.1.0",
            boot_id="8f1c",
            interval_s=LOST_INTERVAL_S if name in self.lost else LIVE_INTERVAL_S,
            address=f"10.1.{i // 250}.{i % 250}",
            gpus=gpus,
            fabrics=[f"ib-{'abcd'[i % 4]}"],
            storage_configured=True,
            storage=[storage],
        )

    async def post(self, http: httpx.AsyncClient, names: list[str]) -> None:
        """Each node's agent reports (a few at once, as agents do)."""
        sem = asyncio.Semaphore(8)

        async def one(name: str) -> None:
            async with sem:
                resp = await http.post(
                    "/v1/agent/report",
                    content=self.report(name).model_dump_json(),
                    headers={"Content-Type": "application/json"},
                )
                assert resp.status_code == 200, resp.text

        await asyncio.gather(*(one(n) for n in names))

    async def build(self, controller: Controller, http: httpx.AsyncClient) -> None:
        await self.post(http, self.names)
        async with AdminClient(controller.url, user="alice") as alice:
            for name, i in self.cordoned.items():
                await alice.cordon(name, f"ticket OPS-{i}")
            # Two models no node can hold: the summary names them and says why.
            await alice.apply_models(
                [
                    ModelSpec(
                        name=DEEPSEEK, source=DEEPSEEK, gpus_per_shard=8, shards=2, gpu_class=L40S
                    ),
                    ModelSpec(name=EMBED, source=EMBED, gpu_class=L40S),
                ]
            )
        # The silent nodes' grace runs out.
        await asyncio.sleep(3 * LOST_INTERVAL_S + GRACE_EXTRA_S + 0.5)

    async def churn(self, http: httpx.AsyncClient, fraction: float, step: int) -> int:
        """`fraction` of the nodes report a different number of cards in use
        (deterministic; the silent nodes stay silent). Returns how many."""
        every = max(1, round(1 / fraction))
        changed = [
            name
            for i, name in enumerate(self.names)
            if (i + step) % every == 0 and name not in self.lost
        ]
        for name in changed:
            failed = int(name.removeprefix("node-")) % 41 == 3
            self.used[name] = (self.used[name] + 1) % (9 - failed)
        await self.post(http, changed)
        return len(changed)


class Sizes(httpx.AsyncHTTPTransport):
    """The console's transport, noting the size of each `?since=` answer."""

    def __init__(self) -> None:
        super().__init__()
        self.delta_bytes: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path == "/v1/nodes" and request.url.params.get("since"):
            self.delta_bytes.append(int(response.headers.get("content-length", 0)))
        return response


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def baseline(summary_json: bytes, nodes_json: bytes, rounds: int = 5) -> float:
    """Median time to validate the summary and nodes JSON into models."""
    rows = TypeAdapter(list[NodeRow])
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        FleetSummary.model_validate_json(summary_json)
        rows.validate_json(nodes_json)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def controller_alone(
    controller: Controller, fleet: Fleet, agents: httpx.AsyncClient, churn: float, rounds: int = 5
) -> float:
    """Median time for the controller to answer one refresh (summary and
    `?since=` at once, the same fraction changed) to a bare client: the part of
    the console's fetch that is the controller's and the loopback's."""
    times = []
    async with AdminClient(controller.url) as client:
        cursor = (await client.nodes_since("")).cursor
        for step in range(rounds):
            await fleet.churn(agents, churn, 1000 + step)
            t0 = time.perf_counter()
            _, delta = await asyncio.gather(client.summary(), client.nodes_since(cursor))
            times.append(time.perf_counter() - t0)
            cursor = delta.cursor
    return statistics.median(times)


class FullCollections:
    """Pauses of CPython's full (generation 2) garbage collections."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._start)


async def run(nodes: int, cycles: int, churn: float) -> None:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-console-") as tmp:
        controller = Controller(Path(tmp)).start()
        try:
            async with httpx.AsyncClient(base_url=controller.url, timeout=60) as agents:
                await measure(controller, agents, nodes, cycles, churn)
        finally:
            controller.stop()


async def measure(
    controller: Controller, agents: httpx.AsyncClient, nodes: int, cycles: int, churn: float
) -> None:
    fleet = Fleet(nodes)
    t0 = time.perf_counter()
    await fleet.build(controller, agents)
    t_fill = time.perf_counter() - t0
    full_json = (await agents.get("/v1/nodes")).content
    base = baseline((await agents.get("/v1/summary")).content, full_json)
    served = await controller_alone(controller, fleet, agents, churn)
    # The console runs in its own process in use: its full collections never walk
    # the controller's fleet. Freezing what exists now (the controller freezes its
    # heap at start too, `tune_gc`) keeps them out of the console's figures.
    gc.collect()
    gc.freeze()
    full_gc = FullCollections()
    # Timestamps of each show_fleet: (start = data fetched and validated,
    # end = panes patched, painted = the next screen refresh has been drawn).
    marks: list[dict[str, float]] = []
    real_show = MainScreen.show_fleet

    def timed_show(self: MainScreen, fleet: object) -> None:
        if fleet is None:  # the screen's first look, before any fetch came back
            real_show(self, None)
            return
        mark = {"start": time.perf_counter()}
        marks.append(mark)
        real_show(self, fleet)  # type: ignore[arg-type]
        mark["end"] = time.perf_counter()
        mark["rows"] = self.query_one(NodesTable).row_count

    MainScreen.show_fleet = timed_show  # type: ignore[method-assign]

    sizes = Sizes()
    app = ConsoleApp(AdminClient(controller.url, transport=sizes), refresh=3600.0)
    # Every frame the compositor hands to the (headless) driver: "drawn" below
    # means the first frame after the data was patched in. Bench-only hook.
    frames: list[float] = []
    new_frame = asyncio.Event()
    display = app._display

    def timed_display(screen: object, renderable: object) -> None:
        frames.append(time.perf_counter())
        new_frame.set()
        display(screen, renderable)  # type: ignore[arg-type]

    app._display = timed_display  # type: ignore[method-assign]

    def drawn_after(t: float) -> float | None:
        return next((f for f in frames if f > t), None)

    async def drawn(index: int) -> dict[str, float]:
        """Wait for show_fleet call `index` and the first frame after it."""
        while True:
            if len(marks) > index and "end" in marks[index]:
                frame = drawn_after(marks[index]["end"])
                if frame is not None:
                    marks[index]["painted"] = frame
                    return marks[index]
            new_frame.clear()
            await new_frame.wait()

    med = statistics.median
    t_start = time.perf_counter()
    async with app.run_test(size=(200, 50)) as pilot:
        first = await drawn(0)
        table = app.screen.query_one(NodesTable)
        first_rows = int(first["rows"])
        while table.row_count < nodes or not table.complete:
            await pilot.pause()
        t_all = time.perf_counter()

        # The floor for any table change: repaint after moving the cursor one row.
        moves = []
        for _ in range(5):
            t0 = time.perf_counter()
            await pilot.press("down")
            moves.append(time.perf_counter() - t0)
        await pilot.press("up", "up", "up", "up", "up")

        # Harness overhead: a pause with nothing to do.
        t0 = time.perf_counter()
        await pilot.pause()
        idle_pause = time.perf_counter() - t0

        await pilot.press("down", "down", "down", "space")  # a cursor and a mark to keep
        cursor, marked = table.cursor_key, set(table.marks)
        cycle, fetch, patch, paint, changed, delta_bytes = [], [], [], [], [], []
        gc.callbacks.append(full_gc)
        for step in range(cycles):
            changed.append(await fleet.churn(agents, churn, step))
            await pilot.pause()
            seen = len(marks)
            t0 = time.perf_counter()
            app.poll_now()
            m = await drawn(seen)
            delta_bytes.append(sizes.delta_bytes[-1])
            cycle.append(m["painted"] - t0)
            fetch.append(m["start"] - t0)
            patch.append(m["end"] - m["start"])
            paint.append(m["painted"] - m["end"])
        gc.callbacks.remove(full_gc)
        assert table.cursor_key == cursor and table.marks == marked, "cursor/marks lost"

        # A `/` filter narrowing 2,000 rows to a few dozen, then cleared: each is
        # one keystroke's work (the filter box calls set_filter on every change).
        async def filtered(text: str) -> float:
            await pilot.pause()
            t0 = time.perf_counter()
            table.set_filter(text)
            new_frame.clear()
            await new_frame.wait()
            return frames[-1] - t0

        narrow = await filtered("cordoned")
        narrowed_rows = table.row_count
        widen = await filtered("")

        # A burst as a terminal delivers it (one read, nothing handled in
        # between): the key pipeline settles after each key (console/keys.py).
        # Baseline: the same cursor moves called directly, then one frame.
        async def moved(n: int, burst: bool) -> float:
            await pilot.press("g")
            await pilot.pause()
            t0 = time.perf_counter()
            if burst:
                for _ in range(n):
                    app.post_message(events.Key("j", "j"))
            else:
                for _ in range(n):
                    table.action_cursor_down()
            while table.cursor_row < n:  # noqa: ASYNC110 (the first moment it is there)
                await asyncio.sleep(0)
            new_frame.clear()
            await new_frame.wait()
            return frames[-1] - t0

        burst_n = min(200, nodes - 1)  # the cursor stops at the last row
        burst = med([await moved(burst_n, True) for _ in range(3)])
        direct = med([await moved(burst_n, False) for _ in range(3)])

    print(
        f"console bench: {nodes} nodes, {cycles} refresh cycles, "
        f"{statistics.mean(changed):.0f} rows changed per cycle ({churn:.0%}), 200x50 headless,"
        " against the real controller in process"
    )
    print(f"  fleet built through the API (reports, cordons, models)  {t_fill:.1f} s")
    full_kib = len(full_json) / 1024
    print(f"  baseline: validate summary + all rows   {ms(base)}   (a refresh without ?since=)")
    print(
        f"  nodes answer per refresh: {med(delta_bytes) / 1024:.0f} KiB changed rows + ages"
        f" (full list: {full_kib:.0f} KiB)"
    )
    print(
        f"  first paint (app start -> rows drawn)   {ms(first['painted'] - t_start)}"
        "   target < 1000 ms"
    )
    print(f"    app boot + fetch + validate           {ms(first['start'] - t_start)}")
    print(
        f"    patch panes + first {first_rows:>4} rows       {ms(first['end'] - first['start'])}"
        "   (then a batch per frame)"
    )
    print(f"    repaint                               {ms(first['painted'] - first['end'])}")
    print(f"  all {nodes} rows in the table             {ms(t_all - t_start)}")
    print(
        f"  refresh cycle, median (poll -> drawn)   {ms(med(cycle))}   target < 100 ms"
        f"   (max {ms(max(cycle)).strip()})"
    )
    print(f"    fetch + validate                      {ms(med(fetch))}")
    print(f"      baseline: the controller answering it to a bare client {ms(served).strip()}")
    print(f"    patch panes and changed rows          {ms(med(patch))}")
    print(f"    repaint                               {ms(med(paint))}")
    if full_gc.pauses:
        print(
            f"  full GC pauses during the cycles: {len(full_gc.pauses)},"
            f" median {ms(med(full_gc.pauses)).strip()} (inside the figures above)"
        )
    print(
        f"  filter keystroke: {nodes} -> {narrowed_rows} rows   {ms(narrow)};"
        f"   cleared, back to {nodes}: {ms(widen).strip()}"
    )
    print(
        f"  burst of {burst_n} j keys, all taken, drawn {ms(burst)}"
        f"   {burst / direct:.2f}x the baseline"
    )
    print(f"  baseline: {burst_n} cursor moves called directly {ms(direct)}")
    print(f"  baseline: cursor down one row, drawn    {ms(med(moves))}   (pilot.press)")
    print(f"  harness: an idle pilot.pause()          {ms(idle_pause)}")
    print("  cursor and marks survived every refresh: yes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--churn", type=float, default=0.05)
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.cycles, args.churn))


if __name__ == "__main__":
    main()
