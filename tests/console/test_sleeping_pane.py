"""The idle pane shows sleeping replicas too (issue 32 item 5): after the idle ones,
longest asleep first, muted, with what they hold in its subtitle; at 80x24."""

from __future__ import annotations

from console_pilot import SnapCompare
from textual.app import App, ComposeResult
from textual.pilot import Pilot

from llmgw.console.widgets.summary import IdleTable
from llmgw.wire import IdleReplica, SleepingReplica

IDLE = [IdleReplica(id="qwen-3f2a", model="Qwen/Qwen2.5-7B", idle_seconds=4000.0, gpus=1)]
ASLEEP = [
    SleepingReplica(id="phi-91bc", model="microsoft/Phi-3-mini", asleep_seconds=90.0, gpus=1),
    SleepingReplica(id="gemma-77de", model="google/gemma-2-9b-it", asleep_seconds=1500.0, gpus=2),
]


class OnePane(App[None]):
    def __init__(
        self, idle: list[IdleReplica] = IDLE, asleep: list[SleepingReplica] = ASLEEP
    ) -> None:
        super().__init__()
        self.idle, self.asleep = idle, asleep

    def compose(self) -> ComposeResult:
        yield IdleTable()

    def on_mount(self) -> None:
        self.query_one(IdleTable).show(self.idle, 600.0, self.asleep)


async def test_sleeping_replicas_follow_the_idle_ones() -> None:
    async with OnePane().run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = pilot.app.query_one(IdleTable)
        keys = list(table.order)
        assert keys == ["qwen-3f2a", "gemma-77de", "phi-91bc"]
        assert table.border_subtitle == "1 GPUs idle, 3 asleep"


async def test_nothing_idle_but_some_asleep_says_so() -> None:
    async with OnePane([], ASLEEP[:1]).run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert pilot.app.query_one(IdleTable).border_subtitle == "1 asleep"


def test_idle_and_asleep_80x24(snap_compare: SnapCompare) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await pilot.pause()

    assert snap_compare(OnePane(), terminal_size=(80, 24), run_before=run)
