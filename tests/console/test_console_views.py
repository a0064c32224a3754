"""The models view (`m`) and the events view (`e`), against the real controller
(console_fixtures): issue 21 items 2, 4 and 7, console side."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from console_fixtures import DEEPSEEK, LLAMA, MIXTRAL, Faults, LiveController
from console_pilot import Clock, SnapCompare, loaded, repoll, spy_renders, until
from textual.events import Paste
from textual.pilot import Pilot
from textual.widgets import Input

from llmgw.client import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.feeds import EventFeed, fetch_events
from llmgw.console.screens.detail import NodeDetailScreen
from llmgw.console.screens.events import EventsScreen, EventsTable, event_cells
from llmgw.console.screens.main import MainScreen
from llmgw.console.screens.modals import HelpScreen
from llmgw.console.screens.models import ModelsScreen, ModelsTable, model_cells, model_text
from llmgw.controller.http.keys import term_of
from llmgw.present import model_words
from llmgw.render import start_cells
from llmgw.wire import (
    EventList,
    EventReason,
    EventView,
    ModelSpec,
    ModelStarts,
    ModelView,
    RolloutView,
)

MakeApp = Callable[..., ConsoleApp]


def wall(controller: LiveController) -> float:
    assert controller.app is not None
    return term_of(controller.app).facts.wall()


async def models_open(pilot: Pilot[None]) -> ModelsTable:
    app = await loaded(pilot)
    await pilot.press("m")
    await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.models_view)
    await pilot.pause()
    return app.screen.query_one(ModelsTable)


async def events_open(pilot: Pilot[None], *keys: str) -> EventsTable:
    app = await loaded(pilot)
    await pilot.press(*keys)
    await until(
        pilot,
        lambda: (
            isinstance(app.screen, EventsScreen)
            and app.event_feed is not None
            and app.event_feed.loaded
        ),
    )
    await pilot.pause()
    return app.screen.query_one(EventsTable)


def events_asked(faults: Faults) -> list[str]:
    return [r.query for r in faults.requests if r.path == "/v1/events"]


# -- the models view ------------------------------------------------------------------


@pytest.mark.reads_fleet
async def test_models_view_says_what_ctl_models_says(
    make_app: MakeApp, controller: LiveController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await models_open(pilot)
        models = controller.admin("t", lambda a: a.models())
        assert sorted(table.shown) == sorted(m.spec.name for m in models)
        for m in models:
            cells = [c.plain for c in table.shown[m.spec.name]]
            assert cells[-1] == model_words(m)[0]  # one vocabulary with ctl
            assert cells[1:4] == [
                f"{m.ready}/{m.desired}",
                str(m.starting),
                str(m.spec.min_replicas),
            ]
        assert table.shown[LLAMA][-1].plain.startswith("short: needs")


@pytest.mark.reads_fleet
async def test_models_view_is_patched_in_place(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await models_open(pilot)
        cursor = table.cursor_key
        rendered = spy_renders(table, monkeypatch)
        await repoll(pilot)
        await repoll(pilot)
        assert rendered == []  # nothing changed: no row drawn again
        assert table.cursor_key == cursor


def roll_out_mixtral(controller: LiveController, steps: int) -> None:
    """Revision 2 of Mixtral (a changed engine argument), rolled out by `steps` rounds
    of its agents' reports: two rounds per replica (started, ready; an old one stops)."""
    models = controller.admin("t", lambda a: a.models())
    spec = next(m.spec for m in models if m.spec.name == MIXTRAL)
    changed = spec.model_copy(update={"engine_args": ["--max-model-len", "8192"]})
    controller.admin("alice", lambda a: a.apply_models([changed]))
    controller.settle()
    step(controller, steps)


def step(controller: LiveController, rounds: int) -> None:
    assert controller.agents is not None
    for _ in range(rounds):
        controller.agents.report()
        controller.settle()


async def test_models_view_follows_a_rollout(make_app: MakeApp, controller: LiveController) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await models_open(pilot)
        assert table.shown[MIXTRAL][4].plain == "1"
        roll_out_mixtral(controller, 0)
        await repoll(pilot)
        cells = [c.plain for c in table.shown[MIXTRAL]]
        assert cells[4] == "2" and cells[-1] == "updating 0/2", cells
        step(controller, 2)
        await repoll(pilot)
        assert table.shown[MIXTRAL][-1].plain == "updating 1/2"
        step(controller, 2)
        await repoll(pilot)
        assert table.shown[MIXTRAL][-1].plain == "satisfied"


def view(**fields: object) -> ModelView:
    spec = ModelSpec(name="org/m", source="org/m", min_replicas=2, gpus_per_shard=1)
    base: dict[str, object] = {
        "spec": spec,
        "ready": 2,
        "starting": 0,
        "failed": 0,
        "satisfied": True,
        "nodes": 2,
        "rollout": RolloutView(revision=3, state="complete", desired=2, updated=2, outdated=0),
    }
    return ModelView.model_validate({**base, **fields})


def test_a_model_on_one_node_is_flagged_by_the_shared_rule() -> None:
    spread = [c.plain for c in model_cells(view())]
    assert spread[1:] == ["2/2", "0", "2", "3", "2", "satisfied"]
    lumped = [c.plain for c in model_cells(view(nodes=1))]
    assert lumped[5] == "1 ⚠" and lumped[-1] == "satisfied, all on one node"
    assert "every serving replica is on one node" in model_text(view(nodes=1)).plain
    # Mid-rollout the status says the rollout; the flag still shows.
    rolling = view(
        nodes=1,
        rollout=RolloutView(revision=4, state="progressing", desired=2, updated=1, outdated=1),
    )
    cells = [c.plain for c in model_cells(rolling)]
    assert cells[5] == "1 ⚠" and cells[-1] == "updating 1/2"


def test_ready_is_against_what_demand_asks_for() -> None:
    spec = ModelSpec(name="org/m", source="org/m", min_replicas=2, max_replicas=4, gpus_per_shard=1)
    busy = view(spec=spec, ready=2, starting=2, desired=4, scaling="in flight 15, target 4 -> 4")
    cells = [c.plain for c in model_cells(busy)]
    assert cells[1:4] == ["2/4", "2", "2-4"]
    assert "demand: in flight 15, target 4 -> 4" in model_text(busy).plain
    asleep = view(spec=spec.model_copy(update={"min_replicas": 0}), ready=0, desired=0)
    assert [c.plain for c in model_cells(asleep)][1:4] == ["0/0", "0", "0-4"]


def test_the_detail_says_how_the_replicas_started_and_the_last_wake() -> None:
    """Issue 32 item 5, as the render of `ctl models -o wide` says it in two cells."""
    starts = ModelStarts(hot=12, warm=3, cold=1, last_s={"hot-1": 0.61, "hot-2": 2.4, "cold": 41.2})
    said = model_text(view(starts=starts)).plain.splitlines()[-1]
    assert said == "starts: 12 woken (last L1 0.6s, L2 2.4s), 3 warm, 1 cold (last 41s)"
    assert "starts:" not in model_text(view()).plain, "nothing said before any start"
    assert [c.text for c in start_cells(starts)] == ["12/3/1", "L1 0.6s, L2 2.4s"]


def test_a_stalled_rollout_shows_one_escaped_line() -> None:
    stalled = RolloutView(
        revision=2,
        state="stalled",
        desired=2,
        updated=0,
        outdated=2,
        message="engine exited 1\x1b[31m: CUDA OOM\nTraceback …",
    )
    status = model_cells(view(rollout=stalled))[-1].plain
    assert status == "rollout stalled: engine exited 1\\x1b[31m: CUDA OOM"
    # Under the table, the model under the cursor has the whole tail, still escaped.
    whole = model_text(view(rollout=stalled)).plain
    assert "CUDA OOM\nTraceback …" in whole and "\x1b" not in whole


# -- the events view ------------------------------------------------------------------


async def test_events_view_lists_and_follows_the_controllers_events(
    make_app: MakeApp,
    controller: LiveController,
    faults: Faults,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await events_open(pilot, "e")
        app = pilot.app
        assert isinstance(app, ConsoleApp) and app.event_feed is not None
        kept = controller.admin("t", lambda a: a.events())
        assert list(table.order) == [str(e.id) for e in kept.events]  # oldest first
        assert table.cursor_row == table.row_count - 1  # on the newest
        assert events_asked(faults) == ["since=0"]
        reasons = {c[1].plain for c in table.shown.values()}
        assert {"GpuFault", "Drained", "Placed"} <= reasons
        # Something new: only what came after the newest seen crosses the wire.
        newest = app.event_feed.cursor
        controller.admin("alice", lambda a: a.drain("gpu-b01", "kernel upgrade"))
        controller.settle()
        await repoll(pilot)
        assert events_asked(faults)[-1] == f"since={newest}"
        after = controller.admin("t", lambda a: a.events(newest))
        assert after.events, "the drain made no event"
        assert list(table.order)[-len(after.events) :] == [str(e.id) for e in after.events]
        assert table.cursor_row == table.row_count - 1  # followed to the newest
        # Nothing new, the clock still: nothing added, no row drawn again.
        before = list(table.order)
        rendered = spy_renders(table, monkeypatch)
        await repoll(pilot)
        await repoll(pilot)
        assert list(table.order) == before and rendered == []


@pytest.mark.reads_fleet
async def test_events_of_a_node_from_its_detail(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press(*"/gpu-a06", "enter", "enter")
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        table = await events_open(pilot, "e")
        assert events_asked(faults) == ["since=0&for=node%2Fgpu-a06"]
        assert table.row_count >= 1
        assert table.columns["object"].hidden  # the title names it
        assert "Xid 79" in " ".join(c[3].plain for c in table.shown.values())
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        assert app.event_feed is None  # no longer fetched


@pytest.mark.reads_fleet
async def test_events_of_a_model_from_the_models_view(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        models = await models_open(pilot)
        app = pilot.app
        models.move_cursor(row=models.get_row_index(DEEPSEEK))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen))
        await until(pilot, lambda: bool(events_asked(faults)))
        assert events_asked(faults) == [f"since=0&for=model%2F{DEEPSEEK.replace('/', '%2F')}"]
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen))
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.models_open is False


@pytest.mark.reads_fleet
async def test_events_filter_like_the_nodes_table(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await events_open(pilot, "e")
        everything = table.row_count
        await pilot.press(*"/gpu-a06", "enter")
        assert 0 < table.row_count < everything
        assert all("gpu-a06" in " ".join(c.plain for c in row) for row in table.shown.values())
        await pilot.press("escape")
        assert table.row_count == everything
        # A paste goes to the box as one line, as in the nodes filter.
        await pilot.press("slash")
        pilot.app.post_message(Paste("Xid\t79\n"))
        await until(pilot, lambda: table.row_count < everything)
        assert pilot.app.screen.query_one("#filter", Input).value == "Xid 79"
        await pilot.press("escape", "escape")
        await until(pilot, lambda: isinstance(pilot.app.screen, MainScreen))


@pytest.mark.reads_fleet
async def test_m_and_e_stay_text_in_the_nodes_filter(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("slash", "m", "e")
        assert isinstance(app.screen, MainScreen)
        assert app.screen.nodes_table.filter_text == "me"
        assert app.event_feed is None and not app.models_open


@pytest.mark.reads_fleet
async def test_the_palette_opens_both_views(make_app: MakeApp) -> None:
    async with make_app(readonly=True).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Models" in titles and "Events" in titles
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen))


async def test_a_failed_events_fetch_keeps_what_is_shown_and_says_why() -> None:
    answers = [
        httpx.Response(200, json={"events": [event(1).model_dump(mode="json")], "cursor": 1}),
        httpx.Response(503, json={"error": "the store is not writable"}),
        httpx.Response(404, json={"error": "not found"}),
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":  # asked after a 404: it is a controller
            return httpx.Response(200, json={"ok": True, "version": "0.9"})
        return answers.pop(0)

    transport = httpx.MockTransport(answer)
    feed = EventFeed(None)
    async with AdminClient("http://controller.test:7460", transport=transport) as client:
        await fetch_events(client, feed)
        await fetch_events(client, feed)
        assert [e.id for e in feed.events] == [1] and feed.cursor == 1
        assert feed.error is not None and "store is not writable" in feed.error
        await fetch_events(client, feed)  # a controller from before events
        assert feed.error is not None and "upgrade it" in feed.error
        assert [e.id for e in feed.events] == [1]


@pytest.mark.reads_fleet
async def test_at_80_columns_neither_view_scrolls_sideways(make_app: MakeApp) -> None:
    """MODEL and OBJECT give up their tails before STATUS and MESSAGE do."""
    async with make_app().run_test(size=(80, 24)) as pilot:
        models = await models_open(pilot)
        assert models.virtual_size.width <= models.scrollable_content_region.width
        assert models.columns["model"].width == 20  # cut with …; whole below the table
        await pilot.press("escape")
        events = await events_open(pilot, "e")
        assert events.virtual_size.width <= events.scrollable_content_region.width


@pytest.mark.reads_fleet
async def test_help_from_either_view_is_the_consoles_help(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        app.about = "llmgw demo: 12 simulated nodes"
        await models_open(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert app.screen.about == app.about
        await pilot.press("escape", "e")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert app.screen.about == app.about


def event(i: int, message: str = "placed 1 replica") -> EventView:
    return EventView(
        id=i, at=1000.0 + i, object="model/org/m", reason=EventReason.PLACED, message=message
    )


def test_the_feed_keeps_the_newest_and_moves_its_cursor() -> None:
    feed = EventFeed(None, limit=3)
    assert feed.take(EventList(events=[event(i) for i in range(1, 6)], cursor=5)) == 5
    assert [e.id for e in feed.events] == [3, 4, 5] and feed.cursor == 5
    # An answer repeated (a retried fetch) adds nothing twice.
    assert feed.take(EventList(events=[event(5), event(6)], cursor=6)) == 1
    assert [e.id for e in feed.events] == [4, 5, 6] and feed.cursor == 6
    assert feed.take(EventList(events=[], cursor=6)) == 0


def test_a_counted_event_replaces_the_one_it_counted() -> None:
    feed = EventFeed(None)
    feed.take(EventList(events=[event(1), event(2, "other")], cursor=2))
    counted = event(3, "placed 1 replica again").model_copy(update={"count": 3, "first_at": 940.0})
    assert feed.take(EventList(events=[counted], cursor=3)) == 1
    assert [(e.id, e.count) for e in feed.events] == [(1, 1), (3, 3)]
    cells = event_cells(counted, now=1100.0)
    assert cells[3].plain == "(x3 over 1m03s) placed 1 replica again"
    assert cells[0].plain == "1m37s", "the age of its last time"


def test_free_text_in_events_is_escaped() -> None:
    cells = event_cells(event(1, "moved\x1b[2J off\ngpu-a01"), now=1100.0)
    assert cells[3].plain == "moved\\x1b[2J off\\ngpu-a01"
    assert cells[0].plain == "1m39s"


# -- snapshots ----------------------------------------------------------------------------


def _snap_clock(clock: Clock, controller: LiveController) -> None:
    """The console's clock a little after the controller's: ages read as they would."""
    clock.now = wall(controller) + 95


@pytest.mark.reads_fleet
def test_models_120x40(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await models_open(pilot)

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


def test_models_mid_rollout_120x40(
    snap_compare: SnapCompare, make_app: MakeApp, controller: LiveController
) -> None:
    roll_out_mixtral(controller, 2)

    async def run(pilot: Pilot[None]) -> None:
        await models_open(pilot)
        await pilot.press("j", "j", "j")  # Mixtral: the model under the cursor, whole
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_models_80x24(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await models_open(pilot)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


@pytest.mark.reads_fleet
def test_events_120x40(
    snap_compare: SnapCompare, make_app: MakeApp, clock: Clock, controller: LiveController
) -> None:
    _snap_clock(clock, controller)

    async def run(pilot: Pilot[None]) -> None:
        await events_open(pilot, "e")

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_events_80x24(
    snap_compare: SnapCompare, make_app: MakeApp, clock: Clock, controller: LiveController
) -> None:
    _snap_clock(clock, controller)

    async def run(pilot: Pilot[None]) -> None:
        await events_open(pilot, "e")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


@pytest.mark.reads_fleet
def test_events_of_a_node_80x24(
    snap_compare: SnapCompare, make_app: MakeApp, clock: Clock, controller: LiveController
) -> None:
    _snap_clock(clock, controller)

    async def run(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        await pilot.press(*"/gpu-a06", "enter", "enter")
        await events_open(pilot, "e")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


def test_the_model_detail_says_demand_once() -> None:
    """Issue 35 item 8: the detail said `satisfied: in flight 3, …` and then
    `demand: in flight 3, …`, the same words twice."""
    spec = ModelSpec(name="org/m", source="org/m", min_replicas=1, max_replicas=4, gpus_per_shard=1)
    scaling = "in flight 3, target 4 -> 1"
    for m in (
        view(spec=spec, ready=1, desired=1, scaling=scaling),  # satisfied: …
        view(spec=spec, ready=1, desired=2, scaling=scaling),  # scaling up 1 -> 2: …
        view(spec=spec, ready=3, desired=2, scaling=scaling),  # scaling down 3 -> 2: …
    ):
        text = model_text(m).plain
        assert text.count(scaling) == 1 and f"demand: {scaling}" in text, text
    assert model_text(view(spec=spec, ready=1, desired=1, scaling=scaling)).plain.splitlines()[
        1
    ] == (f"satisfied  demand: {scaling}")


def test_long_model_names_are_cut_in_the_middle_where_they_differ() -> None:
    """Issue 35 item 8: two models both read `meta-llama/Llama-3.…` at 80 columns."""
    from llmgw.console.widgets.keyed_table import cut_middle

    a, b = "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B"
    assert cut_middle(a, 19) == "meta-llama/…3.1-70B"
    assert cut_middle(b, 19) == "meta-llama/….1-405B"
    assert cut_middle(a, 30) == a
    assert len(cut_middle("x" * 40, 12)) == 12
    # An organisation too long to keep whole: half of the start, the rest from the end.
    assert cut_middle("deepseek-ai/DeepSeek-V3-0324-Instruct", 18) == "deepseek…-Instruct"
