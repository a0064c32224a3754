"""The usage view (`t`, issue 34 item 3) and adapters in the models view (`m`, issue
33 item 4), against the real controller: usage posted as a gateway posts it
(`POST /v1/gateways/usage`), adapters declared on a base that loads them, files on
the L40S nodes, demand told as a gateway tells it (`POST /v1/gateways/status`), and
the engines load them as the fixture agents are told (one load refused).

Every test here only reads the fleet, so the module shares one filled controller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_fixtures import (
    EMBED,
    LLAMA,
    QWEN,
    SMALL_MODELS,
    Faults,
    LiveController,
    fill_small,
    small_reports,
)
from console_pilot import Clock, SnapCompare, loaded, repoll, until
from textual.pilot import Pilot

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.events import EventsScreen
from llmgw.console.screens.main import MainScreen
from llmgw.console.screens.modals import HelpScreen
from llmgw.console.screens.models import ModelsScreen, ModelsTable, adapter_key
from llmgw.console.screens.usage import UsageScreen, UsageTable, count_text, row_key
from llmgw.present import adapter_words
from llmgw.wire import AdapterFound, AdapterSpec, AdapterView, NodeReport, UsageRow

MakeApp = Callable[..., ConsoleApp]
# One worker runs the module (`--dist loadgroup`): the fleet is built once, not per worker.
pytestmark = pytest.mark.xdist_group("console-usage")

SQL, FRENCH, SUMMARIZE = "sql-lora", "chat-fr", "summarize"
ADAPTERS = [
    AdapterSpec(name=SQL, base=QWEN, source="acme/sql-lora"),
    AdapterSpec(name=FRENCH, base=QWEN, source="acme/chat-fr"),
    AdapterSpec(name=SUMMARIZE, base=QWEN, source="acme/summarize"),  # files nowhere
]
REFUSED = (400, "LoRA rank 64 is greater than max_lora_rank 16")
LORA_ARGS = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4"]


def usage_row(
    tenant: str, model: str, requests: int, prompt: int, completion: int, **more: int
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "model": model,
        "requests": requests,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        **more,
    }


USAGE = [
    usage_row("acme", LLAMA, 1284, 2_310_442, 412_907, errors=3),
    usage_row("acme", QWEN, 96, 40_120, 9_876),
    usage_row("globex", LLAMA, 4410, 9_812_334, 1_204_551, rate_limited=57),
    usage_row("initech", EMBED, 88_214, 5_031_002, 0),
    usage_row("umbrella-research-lab", SQL, 12, 3_400, 1_100, errors=1),
]


def with_adapter_files(reports: list[NodeReport]) -> list[NodeReport]:
    """The L40S nodes (Qwen's) hold two of the three adapters complete."""
    found = [
        AdapterFound(name=src, path=f"/nvme/models/{src}", rank=8, size_bytes=40 << 20)
        for src in ("acme/sql-lora", "acme/chat-fr")
    ]
    out = []
    for r in reports:
        if r.node.startswith("l40-"):
            storage = [loc.model_copy(update={"adapters": found}) for loc in r.storage]
            r = r.model_copy(update={"storage": storage})
        out.append(r)
    return out


def post(c: LiveController, path: str, body: dict[str, Any]) -> None:
    response = httpx.post(c.url + path, json=body, timeout=10)
    assert response.status_code in (200, 204), response.text


def fill(c: LiveController) -> None:
    models = [
        m.model_copy(update={"engine_args": LORA_ARGS}) if m.name == QWEN else m
        for m in SMALL_MODELS
    ]
    agents = fill_small(c, models, ADAPTERS, with_adapter_files(small_reports()))
    agents.refuse[FRENCH] = REFUSED
    # Two gateways' batches, as they post each second: the rows are summed.
    post(c, "/v1/gateways/usage", {"name": "gw-a", "run": "r1", "seq": 1, "rows": USAGE[:3]})
    post(c, "/v1/gateways/usage", {"name": "gw-b", "run": "r1", "seq": 1, "rows": USAGE[2:]})
    # A gateway holds requests for two adapters loaded nowhere: both are told to load.
    status: dict[str, Any] = {
        "name": "gw-a",
        "held": {SQL: 1, FRENCH: 2},
        "adapter_in_flight": {SQL: 3},
        "adapter_requests": {SQL: 1284},
    }
    post(c, "/v1/gateways/status", status)
    for _ in range(3):
        c.settle()
        agents.report()
    post(c, "/v1/gateways/status", {**status, "held": {FRENCH: 2}})
    c.settle()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    live = LiveController(Path(tmp_path_factory.mktemp("usage")) / "state").start()
    fill(live)
    yield live
    live.close()


@pytest.fixture
def controller(fleet: LiveController) -> LiveController:
    return fleet  # make_app's controller: the module's shared one


async def usage_open(pilot: Pilot[None]) -> UsageTable:
    app = await loaded(pilot)
    await pilot.press("t")
    await until(
        pilot,
        lambda: (
            isinstance(app.screen, UsageScreen)
            and app.usage_view is not None
            and app.usage_view.loaded
        ),
        "the usage view and its rows",
    )
    await pilot.pause()
    return app.screen.query_one(UsageTable)


def usage_asked(faults: Faults) -> list[str]:
    return [r.query for r in faults.requests if r.path == "/v1/usage"]


def plain(table: UsageTable | ModelsTable, key: str) -> list[str]:
    return [c.plain.strip() for c in table.shown[key]]


# -- the usage view -----------------------------------------------------------------


async def test_usage_lists_what_ctl_usage_lists(make_app: MakeApp, fleet: LiveController) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await usage_open(pilot)
        report = fleet.admin("t", lambda a: a.usage("24h"))
        assert sorted(table.shown) == sorted(row_key(r) for r in report.rows)
        globex = plain(table, f"globex {LLAMA}")
        # globex's LLAMA came in both gateways' batches: summed.
        assert globex == ["globex", LLAMA, "8,820", "19.6M", "2.4M", "0", "114"]
        assert plain(table, f"acme {LLAMA}")[2:] == ["1,284", "2.3M", "413k", "3", "0"]
        # Most requests first (the default sort), the arrow on REQUESTS.
        assert table.order[0] == f"initech {EMBED}"
        assert table.columns["requests"].label.plain == "REQUESTS▼"
        pane = pilot.app.screen.query_one("#usage-pane")
        assert str(pane.border_subtitle).startswith("5/5 · 98,426 requests, 29.8M tokens")
        assert "[24h]" in str(pane.border_title)


async def test_usage_sorts_filters_and_switches_its_window(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await usage_open(pilot)
        assert usage_asked(faults)[-1] == "since=24h&by=tenant%2Cmodel"
        await pilot.press("T")  # by tenant, A to Z
        await pilot.pause()
        assert [k.split()[0] for k in table.order] == [
            "acme",
            "acme",
            "globex",
            "initech",
            "umbrella-research-lab",
        ]
        await pilot.press("T")  # again: reversed
        await pilot.pause()
        assert table.order[0].startswith("umbrella")
        await pilot.press("L")  # rate-limited, most first
        await pilot.pause()
        assert table.order[0] == f"globex {LLAMA}"
        await pilot.press("slash", *"acme", "enter")
        await pilot.pause()
        assert set(table.shown) == {f"acme {LLAMA}", f"acme {QWEN}"}
        screen = pilot.app.screen
        assert "filter: acme" in str(screen.query_one("#usage-pane").border_subtitle)
        await pilot.press("w")  # the next window: 7d, asked for at once
        await until(pilot, lambda: usage_asked(faults)[-1].startswith("since=7d"))
        await repoll(pilot)
        assert "[7d]" in str(screen.query_one("#usage-pane").border_title)
        assert set(table.shown) == {f"acme {LLAMA}", f"acme {QWEN}"}  # the filter stays
        await pilot.press("escape", "escape")  # the filter, then back
        await until(pilot, lambda: isinstance(pilot.app.screen, MainScreen))
        before = len(usage_asked(faults))
        await repoll(pilot)
        assert len(usage_asked(faults)) == before  # closed: no longer fetched
        await usage_open(pilot)  # opened again: the window last chosen
        assert usage_asked(faults)[-1].startswith("since=7d")
        assert "[7d]" in str(pilot.app.screen.query_one("#usage-pane").border_title)


async def test_a_controller_without_usage_says_so_and_the_console_goes_on(
    make_app: MakeApp, faults: Faults
) -> None:
    faults.path_errors["/v1/usage"] = 404
    async with make_app(readonly=True).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("t")
        await until(pilot, lambda: app.usage_view is not None and app.usage_view.error)
        await pilot.pause()
        subtitle = str(app.screen.query_one("#usage-pane").border_subtitle)
        assert (
            subtitle == "this controller serves no usage figures (404): upgrade it to see them here"
        )
        assert app.connection.healthy  # the fleet's own fetch is fine
        del faults.path_errors["/v1/usage"]  # upgraded
        await repoll(pilot)
        assert app.usage_view is not None and app.usage_view.loaded
        assert len(app.screen.query_one(UsageTable).shown) == 5


async def test_a_failed_fetch_keeps_the_rows_and_says_why(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await usage_open(pilot)
        faults.path_errors["/v1/usage"] = 500
        await repoll(pilot)
        assert len(table.shown) == 5
        subtitle = str(pilot.app.screen.query_one("#usage-pane").border_subtitle)
        assert "not updated: 500" in subtitle


async def test_usage_is_in_the_help_and_the_palette(make_app: MakeApp) -> None:
    async with make_app(readonly=True).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        assert "Usage" in [c.title for c in app.get_system_commands(app.screen)]
        await usage_open(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Usage window" in titles and "Filter usage" in titles
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))


def test_counts_stay_within_six_cells() -> None:
    cases = {
        0: "0",
        99_999: "99,999",
        100_000: "100k",
        412_907: "413k",
        2_310_442: "2.3M",
        999_500_000: "1.0G",
        12 * 10**12: "12.0T",
        19_624_668: "19.6M",
    }
    assert {n: count_text(n) for n in cases} == cases
    assert all(len(count_text(n)) <= 6 for k in range(1, 19) for n in (10**k - 1, 10**k))


def test_a_rows_key_is_its_tenant_and_model() -> None:
    row = UsageRow(
        tenant="a", model="m", requests=1, prompt_tokens=2, completion_tokens=3, errors=0
    )
    assert row_key(row) == "a m"  # a space: in neither name, so keys never collide


# -- adapters in the models view ----------------------------------------------------


async def models_open(pilot: Pilot[None]) -> ModelsTable:
    app = await loaded(pilot)
    await pilot.press("m")
    await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.models_view)
    await pilot.pause()
    return app.screen.query_one(ModelsTable)


async def test_adapters_are_listed_under_their_base(
    make_app: MakeApp, fleet: LiveController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        table = await models_open(pilot)
        order = list(table.order)
        base = order.index(QWEN)
        assert order[base + 1 : base + 4] == [adapter_key(n) for n in (FRENCH, SQL, SUMMARIZE)]
        views = {a.spec.name: a for a in fleet.admin("t", lambda a: a.run(adapters_call()))}
        sql = views[SQL]
        assert len(sql.loaded_on) == 1 and sql.in_flight == 3 and sql.requests == 1284
        cells = plain(table, adapter_key(SQL))
        assert cells[:3] == [f"+ {SQL}", "1", "0"]
        assert cells[-1] == "3 in flight, 1284 requests, used 0s ago"
        assert plain(table, adapter_key(FRENCH))[-1].startswith("load failed, 2 held, 0 in flight")
        assert plain(table, adapter_key(SUMMARIZE))[1] == "0"
        # The detail of the adapter under the cursor: its source and its last failure.
        table.move_cursor(row=order.index(adapter_key(FRENCH)))
        await pilot.pause()
        detail = str(pilot.app.screen.query_one("#model-detail").render())
        assert "source acme/chat-fr" in detail and "complete on 2 node(s)" in detail
        assert "last failure:" in detail and REFUSED[1] in detail
        # Enter: that adapter's events (its refused load among them).
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, EventsScreen))
        assert pilot.app.screen.obj == f"adapter/{FRENCH}"


def adapters_call() -> Any:
    from llmgw.api import adapters

    return adapters()


def test_an_adapters_words_say_where_and_what() -> None:
    spec = AdapterSpec(name="x", base="b", source="o/x")
    idle = AdapterView(spec=spec)
    assert adapter_words(idle) == ("adapter, loaded on 0; 0 in flight, 0 requests", "muted")
    busy = AdapterView(
        spec=spec, loaded_on=["r1"], loading_on=["r2"], in_flight=2, requests=9, last_used_s=4.0
    )
    words, meaning = adapter_words(busy)
    assert words == (
        "adapter, loaded on 1; loading on 1; 2 in flight, 9 requests; last used 4s ago"
    )
    assert meaning == "fine"
    failed = AdapterView(spec=spec, last_failure="rank too big")
    assert adapter_words(failed)[0].endswith("last failure: rank too big")
    assert "failure" not in adapter_words(failed, failure=False)[0]
    assert adapter_words(failed)[1] == "broken"


# -- snapshots ------------------------------------------------------------------------


def test_usage_120x40(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await usage_open(pilot)

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


def test_usage_80x24(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await usage_open(pilot)
        await pilot.press("j", "j", "j", "j")  # the long tenant's row, whole below

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


def adapter_row(name: str) -> Callable[[Pilot[None]], Any]:
    async def run(pilot: Pilot[None]) -> None:
        table = await models_open(pilot)
        table.move_cursor(row=table.get_row_index(adapter_key(name)))
        await pilot.pause()

    return run


def test_models_with_adapters_120x40(
    snap_compare: SnapCompare, make_app: MakeApp, clock: Clock
) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=adapter_row(FRENCH))


def test_models_with_adapters_80x24(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=adapter_row(SQL))
