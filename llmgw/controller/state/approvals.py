"""`Approvals`: nodes enrolled that await an admin's approval (`--enroll-approval`).

Until approved, a node shows as cordoned by llmgw with one reason for all (so
`ctl status` lists them as one group, as `sinfo -R` does), and nothing is
placed there. Part of the facts (`Facts.approvals`): the credential's state is
durable in the store (credentials.py writes it pending), each change here is an
ADMIN change of the node in the same change log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from llmgw.controller.core import admin_flags
from llmgw.controller.core.changes import ChangeKind, ChangeLog
from llmgw.controller.store.base import StateStore
from llmgw.wire import AdminInfo, EventReason


class Approvals:
    def __init__(
        self,
        store: StateStore,
        log: ChangeLog,
        event: Callable[[str, EventReason, str], None],
        known: Callable[[str], bool],
    ) -> None:
        self._store = store
        self._log = log
        self._event = event
        self._known = known  # whether a node is known (has a row to change)
        self._pending = {
            n: admin_flags.awaiting(at) for n, at in store.pending_credentials().items()
        }

    @property
    def pending(self) -> Mapping[str, AdminInfo]:
        """Each node awaiting approval, with what its row shows."""
        return MappingProxyType(self._pending)

    def await_approval(self, name: str, enrolled_at: float) -> None:
        """A node enrolled (its credential stored as pending): no work until approved."""
        self._pending[name] = admin_flags.awaiting(enrolled_at)
        self._changed(name)
        self._event(
            f"node/{name}",
            EventReason.AWAITING_APPROVAL,
            f"enrolled; gets no replicas until an admin approves it "
            f"(llmgw ctl credentials approve {name})",
        )

    def approve(self, name: str, by: str, at: float) -> bool:
        """An admin approved the node: it may take replicas (False: nothing awaited)."""
        if name not in self._pending:
            return False
        self._store.approve_credential(name, by=by, at=at)
        del self._pending[name]
        self._changed(name)
        return True

    def drop(self, name: str) -> bool:
        """The node enrolled again without needing approval, or was forgotten: it
        awaits nothing any more (True: it did)."""
        if self._pending.pop(name, None) is None:
            return False
        self._changed(name)
        return True

    def _changed(self, name: str) -> None:
        if self._known(name):
            self._log.append(ChangeKind.ADMIN, name)
