"""Admin actions as small command objects, and the message that asks for one.

A screen decides *which* nodes and collects the form (reason, force, force
after); it posts `AdminRequested`, and the app alone talks to the controller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from textual.message import Message

from llmgw.client import AdminClient
from llmgw.wire import AdminFlag, NodeRow


@dataclass(frozen=True)
class AdminForm:
    """What the operator filled in; only what the action uses is read."""

    reason: str = ""
    force: bool = False  # drain: stop replicas now instead of waiting for replacements
    force_after_s: float | None = None  # drain: the controller forces it after this long


@dataclass(frozen=True)
class AdminAction:
    verb: str  # the key's action name and the palette's word: "cordon"
    past: str  # for the notification: "cordoned"
    key: str
    applies: Callable[[NodeRow], bool]  # does it change anything for this node?
    call: Callable[[AdminClient, str, AdminForm], Awaitable[object]]

    @property
    def title(self) -> str:
        return self.verb.capitalize()

    def applicable(self, rows: list[NodeRow]) -> list[str]:
        return [r.name for r in rows if self.applies(r)]


CORDON = AdminAction(
    "cordon",
    "cordoned",
    "c",
    lambda row: row.admin.flag == AdminFlag.NONE,
    lambda client, node, form: client.cordon(node, form.reason),
)
UNCORDON = AdminAction(
    "uncordon",
    "uncordoned",
    "u",
    lambda row: row.admin.flag != AdminFlag.NONE,
    lambda client, node, form: client.uncordon(node),
)
DRAIN = AdminAction(
    "drain",
    "draining",
    "d",
    lambda row: row.admin.flag != AdminFlag.DRAINING,
    lambda client, node, form: client.drain(
        node, form.reason, force=form.force, force_after_s=form.force_after_s
    ),
)
ADMIN_ACTIONS = (CORDON, UNCORDON, DRAIN)
BY_VERB = {a.verb: a for a in ADMIN_ACTIONS}


class AdminRequested(Message):
    """A screen asks the app to run `action` on `nodes` with `form`. `again`:
    when the controller refuses the request as sent, the app calls it with
    why, and the screen asks again with the form as it was filled in."""

    def __init__(
        self,
        action: AdminAction,
        nodes: list[str],
        form: AdminForm,
        again: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.action = action
        self.nodes = nodes
        self.form = form
        self.again = again
