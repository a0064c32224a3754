"""Cordon, uncordon and drain keys, shared by the main and detail screens.

Only the *Admin* screen classes mix this in: in read-only mode the bindings
and the actions do not exist at all, so no key, palette entry or stray
`run_action` can reach the controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from textual.binding import Binding, BindingType
from textual.screen import Screen

from console.screens.modals import CordonModal, DrainForm, DrainModal
from llmgw.wire import AdminFlag, NodeRow

if TYPE_CHECKING:
    from console.app import ConsoleApp

ADMIN_BINDINGS: list[BindingType] = [
    Binding("c", "cordon", "Cordon"),
    Binding("u", "uncordon", "Uncordon"),
    Binding("d", "drain", "Drain"),
]
ADMIN_ACTIONS = ("cordon", "uncordon", "drain")


def can(action: str, row: NodeRow) -> bool:
    """Does `action` change anything for this node?"""
    if action == "cordon":
        return row.admin.flag == AdminFlag.NONE
    if action == "uncordon":
        return row.admin.flag != AdminFlag.NONE
    if action == "drain":
        return row.admin.flag != AdminFlag.DRAINING
    return True


class FooterAware(Screen[Any]):
    """Refreshes the footer only when what it would show has changed.

    Footer rebuilds its keys on every refresh_bindings(); doing that on each
    poll would redraw it every second for nothing.
    """

    FOOTER_ACTIONS: tuple[str, ...] = ("open_detail", *("cordon", "uncordon", "drain"))
    _footer_state: tuple[bool | None, ...] | None = None

    def update_footer(self) -> None:
        state = tuple(self.check_action(a, ()) for a in self.FOOTER_ACTIONS)
        if state != self._footer_state:
            self._footer_state = state
            self.refresh_bindings()


class AdminActions(FooterAware):
    """Mixin base: subclasses say which nodes the keys act on."""

    def targets(self) -> list[NodeRow]:
        raise NotImplementedError

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    def applicable(self, action: str) -> list[str]:
        return [r.name for r in self.targets() if can(action, r)]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The footer shows only what applies to the selected (or marked) nodes.
        if action in ADMIN_ACTIONS:
            return bool(self.applicable(action))
        return super().check_action(action, parameters)

    def action_cordon(self) -> None:
        names = self.applicable("cordon")
        if not names:
            return

        def done(reason: object) -> None:
            if isinstance(reason, str) and reason:
                self.console.send_admin("cordon", names, reason=reason)

        self.app.push_screen(CordonModal(names), done)

    def action_uncordon(self) -> None:
        # Not destructive (it only lets work land again): no confirmation.
        names = self.applicable("uncordon")
        if names:
            self.console.send_admin("uncordon", names)

    def action_drain(self) -> None:
        names = self.applicable("drain")
        if not names:
            return

        def done(form: object) -> None:
            if isinstance(form, DrainForm):
                self.console.send_admin(
                    "drain", names, reason=form.reason, force=form.force, timeout_s=form.timeout_s
                )

        self.app.push_screen(DrainModal(names, self.console.client), done)
