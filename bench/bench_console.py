"""Console at scale: first paint and refresh cycle with 2,000 nodes.

Runs the real app headless (`App.run_test`) against a fake controller
(bench/console_fake.py: `httpx.MockTransport`, no sockets), so the figures are the
console's own: fetch + validation + table patching + one repaint.

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
import sys
import time
from pathlib import Path

from pydantic import TypeAdapter
from textual import events

sys.path.insert(0, str(Path(__file__).resolve().parent))

from console_fake import NOW, FakeController

from console.app import ConsoleApp
from console.screens.main import MainScreen
from console.widgets.nodes import NodesTable
from llmgw.wire import FleetSummary, NodeRow


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def baseline(fake: FakeController, rounds: int = 5) -> float:
    """Median time to validate the summary and nodes JSON into models."""
    summary_json = fake.handler_json("/v1/summary")
    nodes_json = fake.handler_json("/v1/nodes")
    rows = TypeAdapter(list[NodeRow])
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        FleetSummary.model_validate_json(summary_json)
        rows.validate_json(nodes_json)
        times.append(time.perf_counter() - t0)
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
    fake = FakeController.big(nodes)
    full_gc = FullCollections()
    base = baseline(fake)
    # Timestamps of each show_fleet: (start = data fetched and validated,
    # end = panes patched, painted = the next screen refresh has been drawn).
    marks: list[dict[str, float]] = []
    real_show = MainScreen.show_fleet

    def timed_show(self: MainScreen, fleet: object) -> None:
        mark = {"start": time.perf_counter()}
        marks.append(mark)
        real_show(self, fleet)  # type: ignore[arg-type]
        mark["end"] = time.perf_counter()
        mark["rows"] = self.query_one(NodesTable).row_count

    MainScreen.show_fleet = timed_show  # type: ignore[method-assign]

    app = ConsoleApp(fake.client(), refresh=3600.0, clock=lambda: NOW)
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
            changed.append(fake.churn(churn, step))
            delta_bytes.append(fake.last_delta_bytes)
            await pilot.pause()
            seen = len(marks)
            t0 = time.perf_counter()
            app.poll_now()
            m = await drawn(seen)
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

        burst_n = 200
        burst = med([await moved(burst_n, True) for _ in range(3)])
        direct = med([await moved(burst_n, False) for _ in range(3)])

    print(
        f"console bench: {nodes} nodes, {cycles} refresh cycles, "
        f"{statistics.mean(changed):.0f} rows changed per cycle ({churn:.0%}), 200x50 headless"
    )
    full_kib = len(fake.handler_json("/v1/nodes")) / 1024
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
