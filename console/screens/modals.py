"""Confirmations for cordon and drain, and the help overlay.

Every destructive modal opens with Cancel focused (Enter or Escape changes
nothing); typing while Cancel is focused goes to the reason box, so the common
path is still "c, type reason, Enter".
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Static

from console.format import VERDICT_STYLE, plural, styled
from llmgw.client import AdminClient, ControllerError, ControllerUnreachable
from llmgw.wire import DrainPlan

REASON_REQUIRED = "A reason is required: say why, it is recorded with your name (as `sinfo -R`)."


def targets_label(names: list[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{', '.join(names[:3])} and {len(names) - 3} more ({len(names)} nodes)"


class ReasonModal(ModalScreen[object]):
    """Base: a reason box, an error line, Cancel (focused) and a confirm button."""

    AUTO_FOCUS = "#cancel"
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    verb = "Confirm"

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def compose_fields(self) -> ComposeResult:
        yield from ()

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text(), id="title")
            yield Input(
                placeholder="reason (required)", id="reason", max_length=1024, select_on_focus=False
            )
            yield from self.compose_fields()
            yield Label("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.verb, id="confirm", variant="error")

    def title_text(self) -> Text:
        return Text(f"{self.verb} {targets_label(self.names)}", style="bold")

    def on_key(self, event: events.Key) -> None:
        # Cancel has focus, but typing means the operator is writing a reason.
        if self.focused is self.query_one("#cancel") and event.is_printable and event.character:
            reason = self.query_one("#reason", Input)
            reason.focus()
            reason.insert_text_at_cursor(event.character)
            event.stop()
            event.prevent_default()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#confirm")
    @on(Input.Submitted, "#reason")
    def _confirm(self) -> None:
        reason = self.query_one("#reason", Input).value.strip()
        if not reason:
            self.show_error(REASON_REQUIRED)
            self.query_one("#reason", Input).focus()
            return
        result = self.result(reason)
        if result is not None:
            self.dismiss(result)

    def show_error(self, message: str) -> None:
        error = self.query_one("#error", Label)
        error.update(Text(message, style="bold red"))
        error.display = True

    def result(self, reason: str) -> object | None:
        return reason


class CordonModal(ReasonModal):
    """Result: the reason (str), or None when cancelled."""

    verb = "Cordon"

    def compose_fields(self) -> ComposeResult:
        yield Static("No new replicas will be placed; running ones stay.", classes="hint")


@dataclass(frozen=True)
class DrainForm:
    reason: str
    force: bool
    timeout_s: float | None  # force the drain if still running after this long


class DrainModal(ReasonModal):
    """Result: a DrainForm, or None when cancelled. Shows the controller's
    pre-check (POST /v1/drain-plan) of what the drain does to each model."""

    verb = "Drain"

    def __init__(self, names: list[str], client: AdminClient) -> None:
        super().__init__(names)
        self.client = client
        self.plan: DrainPlan | None = None

    def compose_fields(self) -> ComposeResult:
        with Horizontal(id="options"):
            yield Label("force after", classes="field-label")
            yield Input(placeholder="min", id="timeout", type="integer", max_length=5)
            yield Label("minutes", classes="field-label")
            yield Checkbox("force now (stop replicas without waiting)", id="force")
        yield Static(
            "Replicas move elsewhere first; the node then stays cordoned, marked drained.",
            classes="hint",
        )
        yield Label("Pre-check: asking the controller…", id="plan-title")
        yield DataTable(id="plan", cursor_type="none", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#plan", DataTable)
        for key, title in (
            ("model", "MODEL"),
            ("ready", "READY/MIN"),
            ("move", "TO MOVE"),
            ("place", "PLACEABLE"),
            ("verdict", "VERDICT"),
        ):
            table.add_column(title, key=key)
        # Reasons wrap inside a fixed column rather than scroll sideways.
        table.add_column("WHY", key="why", width=30)
        self.load_plan()

    @work(exclusive=True, group="drain-plan", exit_on_error=False)
    async def load_plan(self) -> None:
        title = self.query_one("#plan-title", Label)
        try:
            raw = await self.client.drain_plan(self.names)
            plan = DrainPlan.model_validate(raw)
        except (ControllerError, ControllerUnreachable) as exc:
            title.update(Text(f"Pre-check failed: {exc}. You can still drain.", style="red"))
            return
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            title.update(Text(f"Pre-check answer not understood: {exc}", style="red"))
            return
        self.plan = plan
        self.show_plan(plan)

    def show_plan(self, plan: DrainPlan) -> None:
        worst = {i.verdict for i in plan.impacts}
        summary = Text(
            f"Pre-check: {plural(plan.replicas_to_move, 'replica')} to move", style="bold"
        )
        if "unplaceable" in worst or "below_minimum" in worst:
            summary.append(" · some models drop below their minimum", style="bold yellow")
        elif plan.impacts:
            summary.append(" · every model keeps its minimum", style="green")
        else:
            summary.append(" · nothing runs there", style="green")
        self.query_one("#plan-title", Label).update(summary)
        table = self.query_one("#plan", DataTable)
        for i in plan.impacts:
            table.add_row(
                styled(i.model, "bold"),
                styled(f"{i.ready_now}/{i.min_replicas}"),
                styled(i.replicas_on_nodes),
                styled(
                    i.replaceable, "green" if i.replaceable >= i.replicas_on_nodes else "yellow"
                ),
                styled(i.verdict.replace("_", " "), VERDICT_STYLE.get(i.verdict, "")),
                Text(i.reason or "", style="dim"),
                key=i.model,
                height=None,
            )

    def result(self, reason: str) -> DrainForm | None:
        raw = self.query_one("#timeout", Input).value.strip()
        timeout = None
        if raw:
            if not raw.isdigit() or int(raw) <= 0:
                self.show_error("Force-after must be a whole number of minutes, or empty.")
                return None
            timeout = int(raw) * 60.0
        return DrainForm(reason, self.query_one("#force", Checkbox).value, timeout)


class HelpScreen(ModalScreen[None]):
    """Keys of the screen it was opened from (so read-only help has no c/u/d)."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def __init__(self, keys: list[tuple[str, str]], readonly: bool) -> None:
        super().__init__()
        self.keys = keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("Keys\n\n", style="bold")
        for key, what in self.keys:
            text.append(f"  {key:<10}", style="bold cyan").append(f"{what}\n")
        text.append("  ctrl+p    ", style="bold cyan").append("command palette (same actions)\n")
        text.append("\nFilter: words all must match name, state, reason, GPU class,\n")
        text.append("fabric or model (e.g. `cordoned ib-a`).\n")
        text.append("Marks (space) make c/u/d act on every marked node.\n")
        if self.readonly:
            text.append(
                "\nRead-only: cordon, uncordon and drain are not available.\n", style="blue"
            )
        with Vertical(id="dialog"):
            yield Static(text)
            yield Button("Close", id="close", variant="primary")

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)
