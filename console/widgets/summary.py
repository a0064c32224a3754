"""Summary panes built on KeyedTable: fabrics, weights matrix, idle replicas;
and the unplaceable list. Each is patched from a new FleetSummary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from llmgw.console.format import count_text, styled
from llmgw.console.widgets.keyed_table import GlanceTable
from llmgw.present import duration, latency, percent, short_words
from llmgw.wire import FabricSummary, FleetSummary, IdleReplica, ModelTraffic, SleepingReplica


class FabricsTable(GlanceTable):
    BORDER_TITLE = "Fabrics"

    def on_mount(self) -> None:
        self.add_column("FABRIC", key="fabric")
        # Largest free block: whole free nodes, what a multi-node replica needs.
        # Next to the name, so a narrow pane cuts the other counts, not this.
        self.add_column("BLOCK", key="block")
        self.add_column("NODES", key="nodes")
        self.add_column("W/WTS", key="weights")
        self.add_column("MODELS", key="models")
        self.border_subtitle = "BLOCK: largest free block (whole free nodes)"

    def show(self, fabrics: list[FabricSummary]) -> None:
        self.sync({f.fabric: self._row_cells(f) for f in fabrics})

    @staticmethod
    def _row_cells(f: FabricSummary) -> tuple[Text, ...]:
        return (
            styled(f.fabric, "bold cyan"),
            # The number that decides whether a multi-node replica can land.
            styled(f.largest_free_block, "bold green" if f.largest_free_block else "bold red"),
            styled(f.nodes),
            styled(f"{f.nodes_with_weights}/{f.nodes}", "" if f.nodes_with_weights else "dim"),
            count_text(f.models_present, ""),
        )


class WeightsMatrix(GlanceTable):
    """Model × fabric: where weights are, shared or local, and how many copies."""

    BORDER_TITLE = "Weights per fabric"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fabrics: list[str] = []

    def on_mount(self) -> None:
        self.add_column("MODEL", key="model")
        self.add_column("SPREAD", key="spread")
        self.border_subtitle = "shared: on a filer · N local: node disks · ⚠ one fabric only"

    def show(self, summary: FleetSummary) -> None:
        fabrics = [f.fabric for f in summary.fabrics]
        if fabrics != self.fabrics:
            self._set_fabric_columns(fabrics)
        where: dict[str, dict[str, tuple[int, int]]] = {}
        for f in summary.fabrics:
            for c in f.copies:
                if c.local_copies or c.shared_copies:
                    where.setdefault(c.model, {})[f.fabric] = (c.shared_copies, c.local_copies)
        rows = {}
        for model in sorted(where, key=str.lower):
            held = where[model]
            # The repo's name: the organisation rarely tells two models apart.
            cells = [styled(model.rsplit("/", 1)[-1], "bold")]
            if len(held) == 1 and len(fabrics) > 1:
                # The rest of the cluster cannot serve it without a slow copy.
                cells.append(styled("1 fabric ⚠", "bold yellow"))
            else:
                cells.append(styled(f"{len(held)}/{len(fabrics)}", "green"))
            cells += [self._cell(held.get(fab)) for fab in fabrics]
            rows[model] = cells
        self.sync(rows)

    def _set_fabric_columns(self, fabrics: list[str]) -> None:
        # Rare (a fabric appears or goes): rebuild the columns, rows re-added by sync.
        self.clear(columns=True)
        self.add_column("MODEL", key="model")
        self.add_column("SPREAD", key="spread")
        for fab in fabrics:
            self.add_column(fab, key=f"fab:{fab}")
        self.fabrics = fabrics

    @staticmethod
    def _cell(copies: tuple[int, int] | None) -> Text:
        if copies is None:
            return styled("·", "dim")
        shared, local = copies
        text = Text(no_wrap=True, end="")
        if shared:
            text.append("shared" if shared == 1 else f"shared x{shared}", style="bold blue")
        if local:
            text.append(f"{'+' if shared else ''}{local} local", style="green")
        return text


class IdleTable(GlanceTable):
    BORDER_TITLE = "Idle replicas"

    def on_mount(self) -> None:
        # Most telling first, so a narrow pane cuts the model name, not the time.
        self.add_column("IDLE", key="idle")
        self.add_column("GPUS", key="gpus")
        self.add_column("REPLICA", key="id")
        self.add_column("MODEL", key="model")

    def show(
        self,
        idle: list[IdleReplica],
        idle_after_s: float,
        asleep: Sequence[SleepingReplica] = (),
    ) -> None:
        ordered = sorted(idle, key=lambda r: -r.idle_seconds)  # most idle first
        rows = {r.id: self._row_cells(r) for r in ordered}
        # Then the sleeping ones, longest asleep first: they hold their cards' residue.
        for r in sorted(asleep, key=lambda r: -r.asleep_seconds):
            rows[r.id] = self._asleep_cells(r)
        self.sync(rows)
        after = f"{idle_after_s / 60:g} min" if idle_after_s % 60 == 0 else duration(idle_after_s)
        words = [f"{sum(r.gpus for r in idle)} GPUs idle"] if idle else []
        if asleep:
            words.append(f"{sum(r.gpus for r in asleep)} asleep")
        self.border_subtitle = ", ".join(words) or f"nothing idle for {after}"

    @staticmethod
    def _asleep_cells(r: SleepingReplica) -> tuple[Text, ...]:
        return (
            styled(f"zz {duration(r.asleep_seconds)}", "blue"),
            styled(r.gpus, "dim"),
            styled(r.id, "dim"),
            styled(r.model.rsplit("/", 1)[-1], "dim"),
        )

    @staticmethod
    def _row_cells(r: IdleReplica) -> tuple[Text, ...]:
        hours = r.idle_seconds / 3600
        return (
            styled(duration(r.idle_seconds), "bold red" if hours >= 1 else "yellow"),
            styled(r.gpus, "bold yellow"),
            styled(r.id, "bold"),
            styled(r.model.rsplit("/", 1)[-1], "dim"),
        )


class TrafficTable(GlanceTable):
    """Per model: what its engines served over the last 30 s (and the gateways hold)."""

    BORDER_TITLE = "Traffic"

    def on_mount(self) -> None:
        self.add_column("REQ/S", key="rps")
        self.add_column("FLIGHT", key="in_flight")
        self.add_column("P50", key="p50")
        self.add_column("HIT", key="hit")
        self.add_column("MODEL", key="model")

    def show(self, traffic: list[ModelTraffic]) -> None:
        busiest = sorted(traffic, key=lambda t: (-t.requests_per_s, t.model))
        self.sync({t.model: self._row_cells(t) for t in busiest})
        total = sum(t.requests_per_s for t in traffic)
        self.border_subtitle = f"{total:.1f} req/s" if traffic else "no engine figures yet"

    @staticmethod
    def _row_cells(t: ModelTraffic) -> tuple[Text, ...]:
        hit = t.prefix_hit_rate
        return (
            styled(f"{t.requests_per_s:.1f}", "bold" if t.requests_per_s else "dim"),
            styled(t.in_flight, "bold yellow" if t.in_flight else "dim"),
            styled(latency(t.p50_latency_s)),
            styled(percent(hit), "green" if hit is not None and hit >= 0.5 else ""),
            styled(t.model.rsplit("/", 1)[-1], "bold"),
        )


class UnplaceableList(Static):
    """Short models the scheduler cannot place, each with its reason."""

    BORDER_TITLE = "Unplaceable"

    def show(self, summary: FleetSummary) -> None:
        lines: list[Text] = []
        for model in summary.unplaceable:
            # The name on one line, cut at the end rather than broken inside;
            # the repository's name, as the other panes show it.
            name = Text(no_wrap=True, overflow="ellipsis")
            name.append("✗ ", style="bold red").append(model.rsplit("/", 1)[-1], style="bold")
            reason = summary.unplaceable_reasons.get(model)
            lines += [name, Text("  " + short_words(reason), style="" if reason else "dim")]
        if not summary.unplaceable:
            lines.append(Text("every short model can be placed", style="green"))
        if lines != self._last:
            self._last = lines
            # Sized by the grid, not by its text.
            self.update(Group(*lines), layout=False)

    _last: list[Text] | None = None
