"""The change log of the controller's state: what changed, in order.

`Facts` (facts.py), the one writer, appends one `Change` per change it makes
(a node's facts, an admin flag, a model, a replica, a backoff, an unplaceable
reason); each gets the next revision. Everything derived follows this log
instead of being told, each view the same way (follow.py): the node rows and
`?since=` answers (node_rows.py), the summary's totals (summary.py), cached
report replies (replies.py), the gateways' statuses and the endpoint feed
(endpoints.py); the capacity placement reads (`capacity_version`) and long
polls read its revisions.

Only the newest `HISTORY_KEPT` changes are kept. A reader whose revision is
older than that cannot be told what it missed (`HistoryLost`) and must give a
full answer instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from enum import StrEnum
from itertools import islice
from typing import NamedTuple

# About 200 s of history at 10,000 nodes with 5 % of rows changing every second.
HISTORY_KEPT = 100_000


class ChangeKind(StrEnum):
    # A node's facts: added or forgotten, its report's digest, cards, faults,
    # address or error changed, or it turned unreachable or came back.
    NODE = "node"
    ADMIN = "admin"  # a node's admin flag (cordon, drain, deadline, approval, why a drain waits)
    ASSIGNMENTS = "assignments"  # what a node's agent is told to run, the cards replicas hold
    MODEL = "model"  # a model spec (added, changed or deleted)
    REPLICA = "replica"  # a replica record (added, changed or removed)
    BACKOFF = "backoff"  # a model's crash-loop backoff
    UNPLACEABLE = "unplaceable"  # why a model cannot be placed (or that it now can)
    LISTENING = "listening"  # where a node's engines listen (its address, rank-0 ports)


class Subject(StrEnum):
    """What a change's key names."""

    NODE = "node"
    MODEL = "model"
    REPLICA = "replica"


SUBJECTS: dict[ChangeKind, Subject] = {
    ChangeKind.NODE: Subject.NODE,
    ChangeKind.ADMIN: Subject.NODE,
    ChangeKind.ASSIGNMENTS: Subject.NODE,
    ChangeKind.LISTENING: Subject.NODE,
    ChangeKind.MODEL: Subject.MODEL,
    ChangeKind.BACKOFF: Subject.MODEL,
    ChangeKind.UNPLACEABLE: Subject.MODEL,
    ChangeKind.REPLICA: Subject.REPLICA,
}


class Change(NamedTuple):
    revision: int
    kind: ChangeKind
    key: str  # node name, model name or replica id: its kind's subject


class HistoryLost(LookupError):
    """The changes after this revision are no longer (or not yet) known."""

    def __init__(self, revision: int, oldest: int, newest: int) -> None:
        super().__init__(
            f"revision {revision} is outside the change history kept ({oldest}..{newest})"
        )
        self.revision = revision


class ChangeLog:
    """Revisions are consecutive, so the log keeps only kinds and keys: two
    deques of objects the garbage collector need not walk, not 100,000 tuples."""

    def __init__(self) -> None:
        self.revision = 0
        self._kinds: deque[ChangeKind] = deque()
        self._keys: deque[str] = deque()
        # The newest revision of each key, by kind: what the derived views compare.
        # (Dicts of str -> int, which the garbage collector does not track.)
        self._latest: dict[ChangeKind, dict[str, int]] = {kind: {} for kind in ChangeKind}
        self._newest: dict[ChangeKind, int] = dict.fromkeys(ChangeKind, 0)  # by kind, any key
        self._changed: asyncio.Event | None = None  # made by the first waiter
        self.closed = False  # its term ended: long polls on it end at once

    def append(self, kind: ChangeKind, key: str) -> int:
        self.revision += 1
        self._kinds.append(kind)
        self._keys.append(key)
        self._latest[kind][key] = self.revision
        self._newest[kind] = self.revision
        while len(self._kinds) > HISTORY_KEPT:
            self._kinds.popleft()
            self._keys.popleft()
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        return self.revision

    @property
    def oldest(self) -> int:
        """The oldest revision a reader may hold and still be told every change after it."""
        return self.revision - len(self._kinds)

    def latest(self, kind: ChangeKind, key: str) -> int:
        """The revision of the last change of this kind to this key (0: none this run)."""
        return self._latest[kind].get(key, 0)

    def newest(self, *kinds: ChangeKind) -> int:
        """The revision of the last change of any of these kinds, to any key (0: none)."""
        return max(self._newest[kind] for kind in kinds)

    def forget_key(self, key: str) -> None:
        """Drop the per-key index entries of something gone (its changes stay in the log)."""
        for latest in self._latest.values():
            latest.pop(key, None)

    def since(self, revision: int) -> list[Change]:
        """Every change after `revision`, oldest first; `HistoryLost` when that is unknown."""
        n = self.revision - revision
        if not 0 <= n <= len(self._kinds):
            raise HistoryLost(revision, self.oldest, self.revision)
        if n <= 64:  # a view a few changes behind (a report's reply): index from the end
            end, recent_kinds, recent_keys = self.revision + 1, self._kinds, self._keys
            return [Change(end + i, recent_kinds[i], recent_keys[i]) for i in range(-n, 0)]
        kinds = list(islice(reversed(self._kinds), n))
        keys = list(islice(reversed(self._keys), n))
        first = revision + 1
        return [
            Change(first + i, kind, key)
            for i, (kind, key) in enumerate(zip(reversed(kinds), reversed(keys), strict=True))
        ]

    def close(self) -> None:
        """The term this log is of ended (stepped down, stopping): every wait ends now,
        and its answer is a follower's 503 (the front middleware's check)."""
        self.closed = True
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_changed(self, after_revision: int, timeout_s: float) -> int:
        """Return the revision once it is past `after_revision`, or after `timeout_s`
        (at once once the log is closed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.revision <= after_revision and not self.closed:
            left = deadline - loop.time()
            if left <= 0:
                break
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return self.revision
