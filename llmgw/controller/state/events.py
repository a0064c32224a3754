"""Events: every decision the controller takes by itself, as `kubectl get events`
lists a cluster's, so that an operator can always answer "why did this move?".

Who writes: the reconcile loop, `llmgw.controller.loop.faults` and `Facts`' own
decisions (a drain done or forced, a backoff), through `Facts.event`. An
operator's own actions are not events: they are the node's admin history.

Repeats are counted, as Kubernetes' event correlator counts them. A run of events
of one object and reason is each within `WINDOW_S` (10 minutes) of the one before.
In a run, an event with the same message as the newest of the run, or any event
once the run holds `SIMILAR` (10) events with different messages, is not a new
event: the newest counts it (`count`), takes its time (`at`: the last time;
`first_at`: the first) and its message, and moves to a new id, so that a watcher
asking `since=` sees it again (a client drops the one it had: `EventView`). A
flapping card is one event that counts its flips; the first ten replicas a drain
moves keep their own messages.

Bounds: each reason keeps its newest `KEEP_PER_REASON` (1,000), so no kind of
event can push another kind's out (100,000 enrollments leave every placement in
place); `KEEP` in all, 1,000 for each reason (24 reasons today: 24,000). Nothing
whose last time is older than `KEEP_S` (7 days) is kept anywhere.

Kept: in memory, for `GET /v1/events`, the console and `ctl events -w`; in the
store the same, written by `Facts.flush` once a second in one transaction (the
decision itself is durable already; its event is lost only if the controller
dies within that second), with the rows of events replaced or pushed out since.
Ids come from here, one more each time, starting after the newest stored: one
writer at a time (the leader), so they increase across restarts and failovers and
`since=ID` means the same everywhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.controller.store.base import StateStore
from llmgw.wire import EventReason, EventView

__all__ = ["KEEP", "KEEP_PER_REASON", "KEEP_S", "SIMILAR", "WINDOW_S", "Events"]

KEEP_PER_REASON = 1_000
KEEP = KEEP_PER_REASON * len(EventReason)
KEEP_S = 7 * 86400.0
WINDOW_S = 600.0
SIMILAR = 10
MESSAGE_MAX = 2048


@dataclass
class _Run:
    """Events of one object and reason, each within WINDOW_S of the one before."""

    newest: int  # the id of its newest event
    messages: int  # events with a message of their own in it


class Events:
    def __init__(self, stored: Iterable[EventView]) -> None:
        # Ordered by id (a counted event moves to the end with its new id).
        self._kept: dict[int, EventView] = {}
        self._by_reason: dict[EventReason, dict[int, None]] = {r: {} for r in EventReason}
        self._runs: dict[tuple[str, EventReason], _Run] = {}
        self._unsaved: dict[int, EventView] = {}
        self._gone: set[int] = set()  # stored rows to delete: replaced or pushed out
        self._next = 1
        for event in stored:
            self._keep(event, _Run(event.id, 1))
            self._next = event.id + 1
        # Events by reason in this process, for `/metrics` (a counter never goes back).
        self.counts: Counter[EventReason] = Counter()

    def add(self, at: float, obj: str, reason: EventReason, message: str) -> EventView:
        message = message[:MESSAGE_MAX]
        self.counts[reason] += 1
        run = self._runs.get((obj, reason))
        newest = self._kept.get(run.newest) if run is not None else None
        if run is None or newest is None or at - newest.at > WINDOW_S:
            run = _Run(self._next, 1)
            event = EventView(id=self._next, at=at, object=obj, reason=reason, message=message)
        elif newest.message == message or run.messages >= SIMILAR:
            self._drop(newest.id)
            event = newest.model_copy(
                update={
                    "id": self._next,
                    "at": at,
                    "message": message,
                    "count": newest.count + 1,
                    "first_at": newest.first_at if newest.first_at is not None else newest.at,
                }
            )
        else:
            run.messages += 1
            event = EventView(id=self._next, at=at, object=obj, reason=reason, message=message)
        run.newest = self._next
        self._next += 1
        self._keep(event, run)
        self._unsaved[event.id] = event
        return event

    def _keep(self, event: EventView, run: _Run) -> None:
        self._kept[event.id] = event
        self._runs[(event.object, event.reason)] = run
        same = self._by_reason[event.reason]
        same[event.id] = None
        if len(same) > KEEP_PER_REASON:
            self._drop(next(iter(same)))

    def _drop(self, event_id: int) -> None:
        """Forget one event, here and (at the next save) in the store."""
        event = self._kept.pop(event_id)
        del self._by_reason[event.reason][event_id]
        key = (event.object, event.reason)
        if self._runs[key].newest == event_id:
            del self._runs[key]
        if self._unsaved.pop(event_id, None) is None:  # written: its row goes too
            self._gone.add(event_id)

    def since(self, after: int, obj: str | None = None, limit: int = KEEP) -> list[EventView]:
        """Events after id `after` (0: all kept), oldest first; of `obj` alone
        (`node/NAME` or `model/NAME`), when given."""
        out = [e for e in self._kept.values() if e.id > after and (obj is None or e.object == obj)]
        return out[-limit:]

    @property
    def newest(self) -> int:
        return self._next - 1

    def save(self, store: StateStore, now_wall: float) -> None:
        """Write the events not yet written, delete the rows of those gone since, and
        drop what is older than `KEEP_S`; a failed write keeps all for the next save."""
        oldest = now_wall - KEEP_S
        self.forget_before(oldest)
        unsaved, gone = list(self._unsaved.values()), self._gone
        if not unsaved and not gone:
            return
        self._unsaved, self._gone = {}, set()
        try:
            store.add_events(unsaved, gone=gone, keep_after=oldest)
        except Exception:
            self._unsaved = {e.id: e for e in unsaved} | self._unsaved
            self._gone |= gone
            raise

    def forget_before(self, at: float) -> None:
        while self._kept:
            oldest = next(iter(self._kept.values()))
            if oldest.at >= at:
                break
            self._drop(oldest.id)
