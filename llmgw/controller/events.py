"""Events: every decision the controller takes by itself, as `kubectl get events`
lists a cluster's, so that an operator can always answer "why did this move?".

Who writes: the reconcile loop, `llmgw.controller.faults` and `Facts`' own
decisions (a drain done or forced, a backoff), through `Facts.event`. An
operator's own actions are not events: they are the node's admin history.

Kept: in memory, the newest `KEEP`, for `GET /v1/events`, the console and
`ctl events -w`; in the store the same, written by `Facts.flush` once a
second in one transaction (the decision itself is durable already; its event
is lost only if the controller dies within that second). Nothing older than
`KEEP_S` is kept anywhere. Ids come from here, one more each time, starting
after the newest stored: one writer at a time (the leader), so they increase
across restarts and failovers and `since=ID` means the same everywhere.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from llmgw.controller.stores.base import StateStore
from llmgw.wire import EventReason, EventView

__all__ = ["KEEP", "KEEP_S", "Events"]

KEEP = 10_000
KEEP_S = 7 * 86400.0
MESSAGE_MAX = 2048


class Events:
    def __init__(self, stored: Iterable[EventView]) -> None:
        self._kept: deque[EventView] = deque(stored, maxlen=KEEP)
        self._next = self._kept[-1].id + 1 if self._kept else 1
        self._unsaved: list[EventView] = []
        # Events by reason in this process, for `/metrics` (a counter never goes back).
        self.counts: Counter[EventReason] = Counter()

    def add(self, at: float, obj: str, reason: EventReason, message: str) -> EventView:
        event = EventView(
            id=self._next, at=at, object=obj, reason=reason, message=message[:MESSAGE_MAX]
        )
        self._next += 1
        self._kept.append(event)
        self._unsaved.append(event)
        self.counts[reason] += 1
        return event

    def since(self, after: int, obj: str | None = None, limit: int = KEEP) -> list[EventView]:
        """Events after id `after` (0: all kept), oldest first; of `obj` alone
        (`node/NAME` or `model/NAME`), when given."""
        out = [e for e in self._kept if e.id > after and (obj is None or e.object == obj)]
        return out[-limit:]

    @property
    def newest(self) -> int:
        return self._next - 1

    def save(self, store: StateStore, now_wall: float) -> None:
        """Write the events not yet written, and drop what is older than `KEEP_S`;
        a failed write keeps them for the next save."""
        unsaved = self.unsaved()
        if not unsaved:
            return
        oldest = now_wall - KEEP_S
        try:
            store.add_events(unsaved, keep_after_id=unsaved[-1].id - KEEP, keep_after=oldest)
        except Exception:
            self.put_back(unsaved)
            raise
        self.forget_before(oldest)

    def unsaved(self) -> list[EventView]:
        """The events not yet written, handed over once (the caller writes them)."""
        out, self._unsaved = self._unsaved, []
        return out

    def put_back(self, events: list[EventView]) -> None:
        """A write that failed: written with the next flush (at most `KEEP` wait)."""
        self._unsaved[:0] = events
        del self._unsaved[: max(len(self._unsaved) - KEEP, 0)]

    def forget_before(self, at: float) -> None:
        while self._kept and self._kept[0].at < at:
            self._kept.popleft()
