"""The models view (`m`): each declared model's replicas, rollout and spread, in
the words `ctl models` uses, and under each base its LoRA adapters (where loaded,
in flight, requests, last used). Read-only; Enter or `e` opens the row's events."""

from __future__ import annotations

from typing import Any, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from llmgw.common import printable
from llmgw.console.feeds import EventsWanted, ModelsView, ViewsModel
from llmgw.console.format import styled
from llmgw.console.screens.modals import HelpScreen
from llmgw.console.state import Connection
from llmgw.console.widgets.header import ConnectionBanner
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.console.widgets.widths import fill_width
from llmgw.present import (
    STYLE,
    Meaning,
    adapter_words,
    all_on_one_node,
    duration,
    last_wakes,
    model_words,
    one_line,
)
from llmgw.wire import AdapterView, ModelStarts, ModelView

STATUS_MIN = 20  # narrower, the table scrolls sideways rather than cut every status
MODEL_MIN = 18  # the model under the cursor is shown whole below the table


class ModelsTable(KeyedTable):
    """One row per model, keyed by its name; STATUS takes the width that is left."""

    def on_mount(self) -> None:
        for key, title in (
            ("model", "MODEL"),
            ("ready", "READY"),  # ready/desired, as kubectl's READY
            ("start", "START"),
            ("scale", "RANGE"),  # min_replicas-max_replicas, what demand may ask
            ("rev", "REV"),
            ("nodes", "NODES"),
            ("status", "STATUS"),
        ):
            # Names share their start (meta-llama/Llama-3.1-…): cut in the middle.
            self.add_column(title, key=key, cut_middle=key == "model")

    def show(self, models: tuple[ModelView, ...], adapters: tuple[AdapterView, ...] = ()) -> None:
        """Each model, and under it the adapters it is the base of (as `ctl models`)."""
        by_base: dict[str, list[AdapterView]] = {}
        for a in adapters:
            by_base.setdefault(a.spec.base, []).append(a)
        rows: dict[str, tuple[Text, ...]] = {}
        for m in models:
            rows[m.spec.name] = model_cells(m)
            for a in by_base.pop(m.spec.name, ()):
                rows[adapter_key(a.spec.name)] = adapter_cells(a)
        for orphans in by_base.values():  # a base deleted meanwhile: still listed
            rows.update((adapter_key(a.spec.name), adapter_cells(a)) for a in orphans)
        self.sync(rows)
        self.fit()

    def on_resize(self) -> None:
        super().on_resize()
        self.fit()

    def fit(self) -> None:
        fill_width(self, rest="status", rest_min=STATUS_MIN, give="model", give_min=MODEL_MIN)


def model_cells(m: ModelView) -> tuple[Text, ...]:
    words, meaning = model_words(m)
    rollout = m.rollout
    nodes = styled(m.nodes, "dim" if not m.nodes else "")
    if all_on_one_node(m):  # one node's failure takes the whole model
        nodes = styled(f"{m.nodes} ⚠", STYLE[Meaning.ATTENTION])
    desired = desired_replicas(m)
    ready = Meaning.BROKEN if not m.satisfied else Meaning.FINE
    if m.satisfied and m.ready < desired:
        ready = Meaning.ATTENTION  # above its minimum, short of what demand asks
    s = m.spec
    top = s.max_replicas if s.max_replicas is not None else s.min_replicas
    return (
        styled(printable(s.name), "bold"),
        styled(f"{m.ready}/{desired}", STYLE[ready]),
        styled(m.starting, STYLE[Meaning.STARTING] if m.starting else "dim"),
        styled(s.min_replicas if top == s.min_replicas else f"{s.min_replicas}-{top}"),
        styled(rollout.revision if rollout is not None else "-"),
        nodes,
        styled(printable(words), STYLE[meaning]),
    )


ADAPTER_KEY = "adapter "  # a space is in no model's name: an adapter's row key


def adapter_key(name: str) -> str:
    return ADAPTER_KEY + name


def adapter_cells(a: AdapterView) -> tuple[Text, ...]:
    """An adapter's row under its base: READY is how many replicas hold it, START
    how many are loading it; STATUS says what it serves and when it was last used."""
    loaded, loading = len(a.loaded_on), len(a.loading_on)
    words, meaning = adapter_status(a)
    return (
        styled(f"  + {printable(a.spec.name)}"),
        styled(loaded, STYLE[Meaning.FINE] if loaded else "dim"),
        styled(loading, STYLE[Meaning.STARTING] if loading else "dim"),
        styled("lora", "dim"),
        styled("-", "dim"),
        styled("-", "dim"),
        styled(printable(words), STYLE[meaning]),
    )


def adapter_status(a: AdapterView) -> tuple[str, Meaning]:
    """The STATUS cell: what READY and START do not say, most telling first (a cell
    at 80 columns shows about 20 characters): a failed load, requests held for it,
    in flight, requests, when last used. The detail below says it in `ctl`'s words."""
    _, meaning = adapter_words(a)
    parts = []
    if a.last_failure and not a.loaded_on:
        parts.append("load failed")
    if a.held:
        parts.append(f"{a.held} held")
    parts.append(f"{a.in_flight} in flight")
    parts.append(f"{a.requests} requests")
    parts.append("never used" if a.last_used_s is None else f"used {duration(a.last_used_s)} ago")
    return ", ".join(parts), meaning


def adapter_text(a: AdapterView) -> Text:
    """The adapter under the cursor: its base and source, the replicas holding it,
    and its last failed load, whole."""
    s = a.spec
    words, meaning = adapter_words(a, failure=False)
    text = Text()
    text.append(printable(s.name), style="bold")
    text.append(
        f"  LoRA adapter of {printable(s.base)}  source {printable(s.source)}"
        f"  complete on {a.nodes_with_files} node(s)",
        style="dim",
    )
    text.append("\n" + printable(words), style=STYLE[meaning])
    holders = []
    if a.loaded_on:
        holders.append("loaded on " + ", ".join(printable(r) for r in a.loaded_on))
    if a.loading_on:
        holders.append("loading on " + ", ".join(printable(r) for r in a.loading_on))
    if holders:
        text.append("\n" + "; ".join(holders), style="dim")
    if a.last_failure:
        text.append(
            "\nlast failure: " + printable(a.last_failure.strip(), keep_lines=True),
            style=STYLE[Meaning.BROKEN],
        )
    return text


def desired_replicas(m: ModelView) -> int:
    """What demand asks for now; a controller from before autoscaling sends none,
    and then it is the minimum."""
    return m.desired if "desired" in m.model_fields_set else m.spec.min_replicas


def model_text(m: ModelView) -> Text:
    """The model under the cursor, whole: its shape, its status, and the full reason
    or failure the status cell cuts to one line."""
    s = m.spec
    words, meaning = model_words(m)
    text = Text()
    text.append(printable(s.name), style="bold")
    text.append(
        f"  {s.shards}x{s.gpus_per_shard} {s.gpu_class or 'any class'}  engine {s.engine}"
        f"  source {printable(s.source)}",
        style="dim",
    )
    # Why demand asks for this many (`in flight 12, target 4 -> 3`), said once:
    # the status words end with it (`satisfied: …`) or are it (asleep, waking).
    demand = m.scaling or ""
    if demand and words.endswith(f": {demand}"):
        words = words[: -len(demand) - 2]
    elif demand in words:
        demand = ""
    text.append("\n" + printable(words), style=STYLE[meaning])
    if demand:
        text.append(f"  demand: {printable(demand)}", style="dim")
    rollout = m.rollout
    if rollout is not None and rollout.state != "complete" and rollout.outdated:
        text.append(
            f"  revision {rollout.revision}: {rollout.updated} of {rollout.desired} ready,"
            f" {rollout.outdated} of an older revision still running",
            style="dim",
        )
    if rollout is not None and rollout.state in ("stalled", "waiting") and rollout.message:
        why: str | None = rollout.message
    else:
        why = None if m.satisfied else m.unplaceable_reason
    if why and why.strip() != one_line(why):
        text.append("\n" + printable(why.strip(), keep_lines=True), style="dim")
    elif m.last_failure:
        text.append("\nlast failure: " + printable(m.last_failure.strip(), keep_lines=True))
    if all_on_one_node(m):
        text.append("\n⚠ every serving replica is on one node", style=STYLE[Meaning.ATTENTION])
    starts = start_words(m.starts)
    if starts:
        text.append("\n" + starts, style="dim")
    return text


def start_words(starts: ModelStarts) -> str:
    """`starts: 12 woken (last L1 0.6s), 3 warm, 1 cold (last 41s)`, the kinds seen
    only; "" before any."""
    if not starts.hot + starts.warm + starts.cold:
        return ""
    last = starts.last_s
    wakes = last_wakes(last)
    parts = [f"{starts.hot} woken" + (f" (last {wakes})" if wakes else "")] if starts.hot else []
    for kind, count in (("warm", starts.warm), ("cold", starts.cold)):
        took = last.get(kind)
        if count:
            parts.append(f"{count} {kind}" + (f" (last {took:.0f}s)" if took is not None else ""))
    return "starts: " + ", ".join(parts)


class ModelsScreen(Screen[Any]):
    # Priority: acted on as the key is read (see console/keys.py).
    BINDINGS = [
        Binding("escape", "back", "Back", priority=True),
        Binding("e", "events", "Events", priority=True),
        Binding("question_mark", "help", "Help", priority=True),
    ]

    _detail: Text | None = None

    @property
    def model(self) -> ViewsModel:
        return cast(ViewsModel, self.app)

    def compose(self) -> ComposeResult:
        yield ConnectionBanner(id="banner")
        with Vertical(id="models-pane", classes="pane"):
            yield ModelsTable(id="models")
        yield Static(id="model-detail", classes="cursor-detail")
        yield Footer()

    def on_mount(self) -> None:
        pane = self.query_one("#models-pane")
        pane.border_title = "Models"
        pane.border_subtitle = "loading…"
        self.query_one(ModelsTable).focus()
        self.watch(self.app, "models_view", self.show_view)
        self.watch(self.app, "connection", self.show_connection)

    def show_view(self, view: ModelsView | None) -> None:
        if view is None:
            return
        self.query_one(ModelsTable).show(view.models, view.adapters)
        self._show_detail()
        short = sum(1 for m in view.models if not m.satisfied)
        parts = [f"{len(view.models)} models", f"{short} short" if short else "all satisfied"]
        if view.adapters:
            loaded = sum(1 for a in view.adapters if a.loaded_on)
            parts.append(f"{len(view.adapters)} adapters, {loaded} loaded")
        if any(all_on_one_node(m) for m in view.models):
            parts.append("⚠ all on one node")
        if view.error:
            parts.append(f"not updated: {view.error}")
        self.query_one("#models-pane").border_subtitle = " · ".join(parts)

    def show_connection(self, conn: Connection) -> None:
        self.query_one(ConnectionBanner).show(conn, self.model.fleet, self.model.clock())
        self.set_class(not conn.healthy, "-stale")

    def selected(self) -> str | None:
        return self.query_one(ModelsTable).cursor_key

    def _show_detail(self) -> None:
        view, key = self.model.models_view, self.selected()
        text: Text | None = None
        if view is not None and key is not None and key.startswith(ADAPTER_KEY):
            name = key.removeprefix(ADAPTER_KEY)
            adapter = next((a for a in view.adapters if a.spec.name == name), None)
            text = adapter_text(adapter) if adapter is not None else None
        elif view is not None:
            found = next((m for m in view.models if m.spec.name == key), None)
            text = model_text(found) if found is not None else None
        if text != self._detail:
            self._detail = text
            detail = self.query_one("#model-detail", Static)
            detail.update(text or Text(""))
            detail.set_class(text is not None, "-visible")

    @on(KeyedTable.RowHighlighted, "#models")
    def _row_highlighted(self) -> None:
        self._show_detail()

    def action_events(self) -> None:
        key = self.selected()
        if key is None:
            return
        if key.startswith(ADAPTER_KEY):
            self.post_message(EventsWanted(f"adapter/{key.removeprefix(ADAPTER_KEY)}"))
        else:
            self.post_message(EventsWanted(f"model/{key}"))

    @on(KeyedTable.RowSelected, "#models")
    def _row_selected(self) -> None:
        self.action_events()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.model.readonly, self.model.about))

    def action_back(self) -> None:
        self.dismiss(None)  # the app's callback stops fetching models
