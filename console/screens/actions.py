"""The screens' shared base, and the cordon / uncordon / drain keys.

Only the *Admin* screen classes mix `AdminActions` in: with `--readonly` the
bindings and actions do not exist at all. With a token that may only read
(`GET /v1/whoami`), the admin screens disable them (`check_action` is False:
no footer entry, no palette entry, the key does nothing).

Screens never talk to the controller and never import the app: they read the
app through `ConsoleModel` and post `AdminRequested` for the app to run.
"""

from __future__ import annotations

from typing import Any, cast

from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Input

from llmgw.console.commands import (
    ADMIN_ACTIONS,
    BY_VERB,
    CORDON,
    DRAIN,
    UNCORDON,
    AdminAction,
    AdminForm,
    AdminRequested,
)
from llmgw.console.screens.modals import CordonModal, DrainModal, HelpScreen, UncordonModal
from llmgw.console.state import ConsoleModel
from llmgw.wire import NodeRow

# priority=True: the key is acted on the moment the app reads it, not after it
# has bubbled up from the focused table. Otherwise a reason typed right behind
# `c` (a burst on a real terminal) reaches the table before the modal is up:
# "burst" arrived as "t", its `s` sorting the table, its `r` retrying. Inputs
# still get these letters (Textual drops bindings an Input would consume).
# The main screen's and the tables' keys are priority bindings for the same
# reason: acted on in the order typed (see MainScreen).
ADMIN_BINDINGS: list[BindingType] = [
    Binding(CORDON.key, "cordon", CORDON.title, priority=True),
    Binding(UNCORDON.key, "uncordon", UNCORDON.title, priority=True),
    Binding(DRAIN.key, "drain", DRAIN.title, priority=True),
]
ADMIN_VERBS = frozenset({"mark", *BY_VERB})


class NodeScreen(Screen[Any]):
    """A screen about some nodes: says which (`targets`), refreshes its footer
    only when what it would show has changed (Footer rebuilds all its keys on
    every refresh_bindings(); doing that each poll redraws it for nothing)."""

    FOOTER_ACTIONS: tuple[str, ...] = ("open_detail", "mark", *(a.verb for a in ADMIN_ACTIONS))
    _footer_state: tuple[bool | None, ...] | None = None

    @property
    def model(self) -> ConsoleModel:
        return cast(ConsoleModel, self.app)

    def targets(self) -> list[NodeRow]:
        """The nodes an admin key acts on; none by default."""
        return []

    def out_of_view(self, names: list[str]) -> list[str]:
        """Of `names`, those the screen does not show (a filter hides them)."""
        return []

    def acted_on(self, names: list[str]) -> None:
        """An action on `names` was confirmed (marks clear, as in k9s)."""

    def typing(self) -> bool:
        """A text box has focus: letters are text, not commands."""
        return isinstance(self.focused, Input)

    def update_footer(self) -> None:
        state = tuple(self.check_action(a, ()) for a in self.FOOTER_ACTIONS)
        if state != self._footer_state:
            self._footer_state = state
            self.refresh_bindings()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.model.readonly, self.model.about))


class AdminActions(NodeScreen):
    """Mixin for the admin screens: c, u, d on `targets()`."""

    def applicable(self, action: AdminAction) -> list[str]:
        return action.applicable(self.targets())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ADMIN_VERBS and (self.model.readonly or self.typing()):
            return False  # the token may only read, or the filter box has the keys
        if action in BY_VERB:
            # The footer shows only what applies to the selected (or marked) nodes.
            return bool(self.applicable(BY_VERB[action]))
        return super().check_action(action, parameters)

    def _ask(self, action: AdminAction) -> None:
        if self.model.readonly:
            return
        rows = [r for r in self.targets() if action.applies(r)]
        if not rows:
            return
        self._confirm(action, rows)

    def _confirm(
        self, action: AdminAction, rows: list[NodeRow], form: AdminForm | None = None, why: str = ""
    ) -> None:
        """The action's dialog for `rows`; `form` and `why`: filled in as it
        was when the controller refused it, and what it said."""
        names = [r.name for r in rows]
        hidden = self.out_of_view(names)
        if action is CORDON:
            modal: Screen[object] = CordonModal(names, hidden, form, why)
        elif action is UNCORDON:
            modal = UncordonModal(rows, hidden, form, why)
        else:
            modal = DrainModal(names, hidden, form, why)

        def done(answer: object) -> None:
            if isinstance(answer, AdminForm):

                def again(refused: str) -> None:
                    if self.is_attached and not self.model.readonly:
                        self._confirm(action, rows, answer, refused)

                self.post_message(AdminRequested(action, names, answer, again))
                self.acted_on(names)

        # Pushed now, in this key's handler: keys typed next go to the modal.
        self.app.push_screen(modal, done)

    def action_cordon(self) -> None:
        self._ask(CORDON)

    def action_uncordon(self) -> None:
        self._ask(UNCORDON)

    def action_drain(self) -> None:
        self._ask(DRAIN)
