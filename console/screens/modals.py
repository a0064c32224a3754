"""Confirmations for cordon, uncordon and drain, and the help overlay.

Every admin modal opens with Cancel focused (Enter or Escape changes
nothing); typing while Cancel is focused goes to the reason box, so the common
path is still "c, type reason, Enter". Modals do no network I/O: the drain
pre-check is fetched by the app and handed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pydantic import TypeAdapter, ValidationError
from rich.table import Table
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Horizontal, HorizontalScroll, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Static

from llmgw.console.commands import AdminForm
from llmgw.console.format import node_state_text, plural, state_text, styled
from llmgw.console.keys import pasted_line, run_widget_binding, type_into
from llmgw.console.state import ConsoleModel
from llmgw.console.widgets.nodes import SORTS
from llmgw.durations import format_duration, parse_duration
from llmgw.present import force_at_words
from llmgw.wire import MAX_FORCE_AFTER_S, PATTERN_MESSAGES, DrainPlan, NodeRow, Reason

FORCE_AFTER_HELP = "30s, 90m, 1h"

REASON_REQUIRED = "A reason is required: say why, it is recorded with your name (as `sinfo -R`)."


_REASON = TypeAdapter(Reason)


def reason_problem(reason: str) -> str | None:
    """Why the controller would refuse this reason (its own rule, in words);
    None: it would take it."""
    try:
        _REASON.validate_python(reason)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        pattern = str((error.get("ctx") or {}).get("pattern"))
        rule = PATTERN_MESSAGES.get(pattern, error["msg"])
        return f"Not sent: in the reason, {rule}. Edit it and press Enter again."
    return None


def parse_force_after(raw: str) -> float | None:
    """The drain's force-after box: seconds, None when empty; ValueError with
    what to type when it does not parse or is out of the controller's bounds."""
    if not raw.strip():
        return None
    seconds = parse_duration(raw)  # BadDuration says what would parse
    if seconds <= 0:
        raise ValueError("force after must be more than 0 (e.g. 30s, 90m, 1h), or empty")
    if seconds > MAX_FORCE_AFTER_S:
        raise ValueError(
            f"force after may be at most {format_duration(MAX_FORCE_AFTER_S)} (7 days)"
        )
    return seconds


def deadline_text(seconds: float, now: float) -> str:
    """`force at 14:05:20 UTC (in 20s)`: when the controller forces the drain."""
    return f"{force_at_words(now + seconds, now=now)} (in {format_duration(seconds)})"


def targets_label(names: Sequence[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{', '.join(names[:3])} and {len(names) - 3} more ({len(names)} nodes)"


def hidden_text(hidden: Sequence[str]) -> Text:
    """Marked nodes the filter hides: the action reaches them too, so say so."""
    return Text.assemble(
        ("⚠ Not in view: ", "bold yellow"),
        (targets_label(hidden), "bold"),
        (
            " (marked, hidden by the filter). To act only on what you see,"
            " Cancel and press Escape twice: the filter, then the marks.",
            "yellow",
        ),
    )


class ConfirmModal(ModalScreen[object]):
    """Base of every confirmation: a title, fields, an error line, and Cancel
    (focused: Enter or Escape changes nothing) beside the confirm button."""

    AUTO_FOCUS = "#cancel"
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    verb = "Confirm"

    def __init__(
        self,
        names: list[str],
        hidden: Sequence[str] = (),
        form: AdminForm | None = None,
        why: str = "",
    ) -> None:
        super().__init__()
        self.names = names
        self.hidden = list(hidden)  # of `names`, those the screen's filter hides
        # Asked again after the controller refused it: filled in as it was, and why.
        self.form = form
        self.why = why
        self._answered = False  # see dismiss

    def on_mount(self) -> None:
        if self.why:
            self.show_error(self.why)

    def compose_fields(self) -> ComposeResult:
        yield from ()

    def compose_body(self) -> ComposeResult:
        yield from self.compose_fields()

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text(), id="title")
            # The body scrolls (Tab scrolls to what it focuses); the error and
            # the buttons below it stay in view on a short terminal.
            with VerticalScroll(id="body", can_focus=False):
                if self.hidden:
                    yield Static(hidden_text(self.hidden), id="hidden")
                yield from self.compose_body()
            yield Label("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.verb, id="confirm", variant="error")

    def title_text(self) -> Text:
        return Text(f"{self.verb} {targets_label(self.names)}", style="bold")

    def dismiss(self, result: object | None = None) -> AwaitComplete:
        """Answer once. Two answers can be on their way before the first one's pop
        lands (Enter in the box and a click on the button, both queued): the
        first runs the action, a second must neither run it again nor pop
        the screen below (Textual's dismiss pops whatever is on top)."""
        if self._answered:
            return AwaitComplete.nothing()
        self._answered = True
        return super().dismiss(result)

    def action_cancel(self) -> None:
        self.dismiss(None)

    # -- keys, in the order they were typed ------------------------------------
    #
    # The app's key pipeline (console/keys.py) calls take_key for every key
    # while this screen is on top, one at a time: it acts on each at once for
    # whichever widget has focus now, so typing that moves focus (into the
    # reason box, Tab) cannot reorder the keys behind it.

    async def take_key(self, event: events.Key) -> bool:
        key, focused = event.key, self.focused
        if key == "escape":
            self.action_cancel()
        elif key == "tab":
            self.focus_next()
        elif key == "shift+tab":
            self.focus_previous()
        elif key == "enter" and isinstance(focused, Input):
            self.confirm()  # Enter in any box submits the form
        elif key == "enter" and focused is None:
            self.action_cancel()  # nothing chosen yet: the safe answer
        elif key in ("left", "right") and isinstance(focused, Button):
            self.step_button(focused, 1 if key == "right" else -1)
        elif event.is_printable and event.character and self.type_text(event.character, key):
            pass
        elif focused is not None and await run_widget_binding(focused, key):
            pass  # Enter / space on a button or checkbox, editing keys in a box
        else:
            return False
        return True

    def step_button(self, button: Button, step: int) -> None:
        """Right / Left: the next button along the row (it stops at either end)."""
        buttons = list(self.query("#buttons Button").results(Button))
        index = max(0, min(len(buttons) - 1, buttons.index(button) + step))
        self.set_focus(buttons[index])

    def type_text(self, text: str, key: str = "") -> bool:
        """Printable text; False: not for this modal (it has no boxes)."""
        return False

    def take_paste(self, text: str) -> bool:
        self.type_text(pasted_line(text))
        return True  # a paste into a modal with no box is dropped

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#confirm")
    def _confirm_pressed(self) -> None:
        self.confirm()

    def confirm(self) -> None:
        self.dismiss(AdminForm())

    def show_error(self, message: str) -> None:
        error = self.query_one("#error", Label)
        error.update(Text(message, style="bold red"))
        error.display = True


class ReasonModal(ConfirmModal):
    """A confirmation with a reason box. Typing goes to the reason whatever
    has focus (Cancel, the confirm button, nothing yet), so a reason typed or
    pasted the instant the modal opens is recorded whole (see take_key)."""

    def compose_body(self) -> ComposeResult:
        yield Input(
            self.form.reason if self.form else "",
            placeholder="reason (required)",
            id="reason",
            max_length=1024,
            select_on_focus=False,
        )
        yield from self.compose_fields()

    def type_text(self, text: str, key: str = "") -> bool:
        """Into the box that has focus; anywhere else (a button, nothing yet
        because the modal is still opening) into the reason box, which then
        takes focus. A space on a checkbox ticks it."""
        focused = self.focused
        if isinstance(focused, Checkbox) and key == "space":
            return False  # the checkbox's own binding toggles it
        box = focused if isinstance(focused, Input) else self.query_one("#reason", Input)
        if box is not focused:
            self.set_focus(box)
        type_into(box, text)
        return True

    def confirm(self) -> None:
        box = self.query_one("#reason", Input)
        reason = box.value.strip()
        problem = REASON_REQUIRED if not reason else reason_problem(reason)
        if problem:  # refused here, with the text kept, not by the controller
            self.show_error(problem)
            box.focus()
            return
        self.submit(reason)

    def submit(self, reason: str) -> None:
        self.dismiss(AdminForm(reason=reason))


class CordonModal(ReasonModal):
    """Result: an AdminForm with the reason, or None when cancelled."""

    verb = "Cordon"

    def compose_fields(self) -> ComposeResult:
        yield Static("No new replicas will be placed; running ones stay.", classes="hint")


class UncordonModal(ConfirmModal):
    """Uncordon puts nodes back in service: say which reasons it clears."""

    verb = "Uncordon"

    def __init__(
        self,
        rows: list[NodeRow],
        hidden: Sequence[str] = (),
        form: AdminForm | None = None,
        why: str = "",
    ) -> None:
        super().__init__([r.name for r in rows], hidden, form, why)
        self.rows = rows

    def compose_fields(self) -> ComposeResult:
        text = Text()
        for i, row in enumerate(self.rows[:8]):
            if i:
                text.append("\n")
            text.append(f"  {row.name}  ", style="bold")
            text.append_text(node_state_text(row))
            text.append(f"  “{row.admin.reason or 'no reason recorded'}”", style="yellow")
            if row.admin.by:
                text.append(f" by {row.admin.by}", style="dim")
        if len(self.rows) > 8:
            text.append(f"\n  … and {len(self.rows) - 8} more", style="dim")
        yield Label("These reasons are cleared:", classes="hint")
        yield Static(text, id="clears")
        yield Static("New replicas may be placed here again at once.", classes="hint")


class ForceConfirmModal(ConfirmModal):
    """A forced drain that drops models below their minimum: a second,
    explicit yes that names the models."""

    verb = "Force drain"

    def __init__(
        self,
        names: list[str],
        models: list[str],
        after_s: float | None = None,
        now: float = 0.0,
        hidden: Sequence[str] = (),
    ) -> None:
        super().__init__(names, hidden)
        self.models = models
        self.after_s = after_s  # None: forced now; else the force-after deadline
        self.now = now

    def compose_fields(self) -> ComposeResult:
        if self.after_s is None:
            text = Text("Forcing stops replicas now, without waiting for replacements.\n")
        else:
            text = Text.assemble(
                (deadline_text(self.after_s, self.now), "bold magenta"),
                ": unless the drain is done by then, the controller stops what is left"
                " without waiting for replacements.\n",
            )
        text.stylize("bold")
        if self.models:
            text.append("These models fall below their minimum:\n", style="bold yellow")
            for model in self.models:
                text.append(f"  ✗ {model}\n", style="bold red")
        else:
            text.append(
                "The pre-check did not answer: what this does to each model is unknown.",
                style="bold yellow",
            )
        yield Static(text, id="below")

    def confirm(self) -> None:
        self.dismiss(True)


class DrainModal(ReasonModal):
    """Result: an AdminForm, or None when cancelled. Shows the controller's
    pre-check (POST /v1/drain-plan) of what the drain does to each model: the
    modal asks for it (`PlanWanted`) and the app hands it over (`show_plan`)."""

    verb = "Drain"

    class PlanWanted(Message):
        def __init__(self, modal: DrainModal) -> None:
            super().__init__()
            self.modal = modal

    def __init__(
        self,
        names: list[str],
        hidden: Sequence[str] = (),
        form: AdminForm | None = None,
        why: str = "",
    ) -> None:
        super().__init__(names, hidden, form, why)
        self.plan: DrainPlan | None = None
        self.plan_error: str | None = None

    def compose_fields(self) -> ComposeResult:
        after = self.form.force_after_s if self.form else None
        after_text = "" if after is None else format_duration(after)
        with Horizontal(id="options"):
            yield Label("force after", classes="field-label")
            yield Input(after_text, placeholder="e.g. 90m", id="timeout", max_length=16)
            yield Label(FORCE_AFTER_HELP, classes="field-label")
            yield Checkbox("force now", self.form.force if self.form else False, id="force")
        yield Label(self.deadline_words(after_text), id="deadline")
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
        self.post_message(self.PlanWanted(self))

    def now(self) -> float:
        return cast(ConsoleModel, self.app).clock()

    def deadline_words(self, raw: str = "") -> Text:
        """What the force-after box means, echoed as it is typed."""
        try:
            seconds = parse_force_after(raw)
        except ValueError as exc:
            return Text(f"✗ {exc}", style="bold red")
        if seconds is None:
            return Text("No deadline: replicas move once their replacements serve.", style="dim")
        return Text.assemble(
            (deadline_text(seconds, self.now()), "bold magenta"),
            ": the controller (whoever is connected) then stops what has not moved.",
        )

    @on(Input.Changed, "#timeout")
    def _timeout_changed(self, event: Input.Changed) -> None:
        self.query_one("#deadline", Label).update(self.deadline_words(event.value))

    def plan_failed(self, message: str) -> None:
        self.plan_error = message
        title = self.query_one("#plan-title", Label)
        title.update(Text(f"Pre-check failed: {message}. You can still drain.", style="red"))

    def show_plan(self, plan: DrainPlan) -> None:
        self.plan = plan
        summary = Text(
            f"Pre-check: {plural(plan.replicas_to_move, 'replica')} to move", style="bold"
        )
        if self.below_minimum():
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
                state_text(i.verdict),
                Text(i.reason or "", style="dim"),
                key=i.model,
                height=None,
            )

    def below_minimum(self) -> list[str]:
        """Models the pre-check says fall below their minimum."""
        if self.plan is None:
            return []
        return [i.model for i in self.plan.impacts if i.verdict != "ok"]

    def submit(self, reason: str) -> None:
        box = self.query_one("#timeout", Input)
        try:
            force_after_s = parse_force_after(box.value)
        except ValueError as exc:
            self.show_error(f"Not drained: {exc}.")
            box.focus()
            return
        form = AdminForm(reason, self.query_one("#force", Checkbox).value, force_after_s)
        forcing = form.force or form.force_after_s is not None
        if not forcing or (self.plan is not None and not self.below_minimum()):
            self.dismiss(form)
            return

        def forced(yes: object) -> None:
            if yes is True:
                self.dismiss(form)

        # Both ways of forcing stop replicas without replacements: a second,
        # explicit yes that names the models, as `ctl drain --force --yes`.
        when = None if form.force or force_after_s is None else force_after_s
        modal = ForceConfirmModal(self.names, self.below_minimum(), when, self.now(), self.hidden)
        self.app.push_screen(modal, forced)


# The help lists view keys, then (unless read-only) admin keys, then app keys.
VIEW_KEYS = [
    ("↑↓ j k g G", "move (pgup / pgdn: a page)"),
    ("enter", "node detail (escape goes back)"),
    ("/", "filter nodes (escape clears)"),
    ("m", "models: ready, rollouts, spread (e: its events)"),
    ("e", "events llmgw decided by itself (on a node: its own)"),
    ("t", "usage per tenant and model (w: 1h, 24h, 7d)"),
    ("p", "next summary panes, under 34 rows (GPUs, fabrics, idle, traffic, weights)"),
    ("s / S", "sort by the next column (every column in turn) / reverse"),
    (
        " ".join(s.letter for s in SORTS[:3]) + " …",
        "sort by that column, as below (again: reverse)",
    ),
]
ADMIN_KEYS = [
    ("space", "mark nodes for one action (escape clears marks)"),
    ("c", "cordon: no new replicas here (asks for a reason)"),
    ("u", "uncordon: back in service (confirms, shows the reason it clears)"),
    ("d", "drain: move replicas off (reason, force after, pre-check)"),
]
APP_KEYS = [
    ("r", "retry the controller now"),
    ("?", "this help"),
    ("ctrl+p", "command palette (same actions)"),
    ("q", "quit"),
]


def command_line(about: str) -> str:
    """The first command in `about` that a newcomer would paste (the demo's curl)."""
    return next((s for line in about.splitlines() if (s := line.strip()).startswith("curl ")), "")


def help_keys(readonly: bool) -> list[tuple[str, str]]:
    return [*VIEW_KEYS, *([] if readonly else ADMIN_KEYS), *APP_KEYS]


def sort_letters() -> list[tuple[str, str]]:
    """k9s' shift+letter: (letter, the column's title) for every column."""
    return [(sort.letter, sort.title) for sort in SORTS]


def _key_grid(rows: list[tuple[str, str]], columns: int = 1) -> Table:
    """Keys and what they do; long descriptions wrap in their own column."""
    grid = Table.grid(padding=(0, 2))
    for _ in range(columns):
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column()
    for i in range(0, len(rows), columns):
        grid.add_row(*(cell for pair in rows[i : i + columns] for cell in pair))
    return grid


class HelpScreen(ModalScreen[None]):
    """Keys of the console as it is now (so read-only help has no c/u/d)."""

    # Priority: acted on as the key is read (see console/keys.py).
    BINDINGS = [
        Binding("escape", "dismiss", "Close", priority=True),
        Binding("question_mark", "dismiss", "Close", show=False, priority=True),
        Binding("q", "dismiss", "Close", show=False, priority=True),
        Binding("y", "copy_command", "Copy the curl line", priority=True),
    ]

    def __init__(self, readonly: bool, about: str = "") -> None:
        super().__init__()
        self.readonly = readonly
        self.about = about  # first: how to reach what the console shows (the demo's)
        self.command = command_line(about)

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("Filter: words all must match name, state, reason, GPU class,\n")
        text.append("fabric or model (e.g. `cordoned ib-a`).\n")
        if self.readonly:
            text.append(
                "\nRead-only: cordon, uncordon and drain are not available.\n", style="blue"
            )
        else:
            text.append("Marks (space) make c/u/d act on every marked node;\n")
            text.append("they clear once the action is confirmed.\n")
        # Scrolls: at 80x24 the help is taller than the terminal.
        with VerticalScroll(id="dialog"):
            if self.about:
                yield Static(Text("This fleet", style="bold"))
                # Unwrapped, as it was printed: a wrapped command pastes as two.
                with HorizontalScroll(id="about-scroll", classes="keys"):
                    yield Static(Text(self.about, no_wrap=True, overflow="ignore"), id="about")
                if self.command:
                    yield Static(
                        Text.assemble(
                            ("y", "bold cyan"),
                            " copies the curl line to your terminal's clipboard (OSC 52)",
                        ),
                        classes="keys",
                    )
            yield Static(Text("Keys", style="bold"))
            yield Static(_key_grid(help_keys(self.readonly)), classes="keys")
            yield Static(Text("Sort by a column (shift+letter)", style="bold"))
            yield Static(_key_grid(sort_letters(), columns=4), classes="keys")
            yield Static(text)
            yield Button("Close", id="close", variant="primary")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return bool(self.command) if action == "copy_command" else True

    def action_copy_command(self) -> None:
        self.app.copy_to_clipboard(self.command)
        self.notify("Copied the curl line: paste it into a shell.", timeout=4)

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)
