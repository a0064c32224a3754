"""One protocol for every view of the change log.

Nothing tells a view of a change: it reads the log (changes.py) when asked, so
no writer can forget it. How it reads is written here once, after client-go's
`tools/cache` (an informer drives a `ResourceEventHandler`):

* `changed`: a node, model or replica the view follows changed and exists now;
* `removed`: it is gone from the facts;
* `resync`: the log no longer holds the changes the view needs (its first look,
  or it fell behind the history kept, `changes.HISTORY_KEPT`): it rebuilds from
  the facts as they are.

Changes are compressed per key: a view is told once of each key, with the
newest change to it, and whether the key exists is read from the facts then,
not from the change (a node forgotten and back since the last look is
`changed`). Each view keeps its own cache and decides what a change means for
it; handlers read the facts and never write them.

`Follower` is a view kept across asks (its position in the log is kept with
it; the term lists them, term.py); `replay` serves one that lives for one
answer (the endpoint feed's, from a gateway's cursor).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import ClassVar, Protocol

from llmgw.controller.core.changes import SUBJECTS, Change, ChangeKind, HistoryLost, Subject
from llmgw.controller.state.facts import Facts


class ChangeHandler(Protocol):
    """What a view of the log is told (client-go's `ResourceEventHandler`)."""

    follows: ClassVar[frozenset[ChangeKind]]  # the kinds of change it reads

    def changed(self, change: Change, now: float) -> None:
        """`change.key` changed and exists; `change` is its newest change followed."""

    def removed(self, change: Change, now: float) -> None:
        """`change.key` is gone from the facts; `change` is its newest change followed."""

    def resync(self, revision: int, now: float) -> None:
        """What changed is unknown: rebuild from the facts as of `revision`."""


def replay(facts: Facts, after: int, handler: ChangeHandler, now: float) -> int:
    """Tell `handler` what changed after revision `after` (`resync` when the log no
    longer holds it); returns the revision it has been told up to."""
    log = facts.log
    revision = log.revision
    try:
        changes = log.since(after)
    except HistoryLost:
        handler.resync(revision, now)
        return revision
    follows = handler.follows
    newest: dict[tuple[Subject, str], Change] = {}
    for change in changes:
        if change.kind in follows:
            newest[SUBJECTS[change.kind], change.key] = change
    existing: dict[Subject, Mapping[str, object]] = {}
    for (subject, key), change in newest.items():
        exists = existing.get(subject)
        if exists is None:
            exists = existing[subject] = _existing(facts, subject)
        if key in exists:
            handler.changed(change, now)
        else:
            handler.removed(change, now)
    return revision


def _existing(facts: Facts, subject: Subject) -> Mapping[str, object]:
    if subject is Subject.NODE:
        return facts.nodes
    if subject is Subject.MODEL:
        return facts.models
    return facts.records


class Follower(ABC):
    """A view kept across asks: it reads the log from where it last stopped.

    Subclasses keep their own cache, answer the three calls of `ChangeHandler`,
    and say what they still hold of a key (`holds`: nothing of a node, model or
    replica gone may stay behind; tests/controller/test_removal.py asks each)."""

    follows: ClassVar[frozenset[ChangeKind]]

    def __init__(self, facts: Facts) -> None:
        self._facts = facts
        self._at = -1  # the log is read up to this revision (-1: not yet, a resync)

    @property
    def at(self) -> int:
        """The revision the view is up to date with."""
        return self._at

    def catch_up(self, now: float | None = None) -> None:
        """Read the changes since the last look (time first: a node whose grace ran
        out is a change too)."""
        facts = self._facts
        now = facts.clock() if now is None else now
        facts.advance_time(now)
        if facts.log.revision != self._at:
            self._at = replay(facts, self._at, self, now)

    @abstractmethod
    def changed(self, change: Change, now: float) -> None: ...

    @abstractmethod
    def removed(self, change: Change, now: float) -> None: ...

    @abstractmethod
    def resync(self, revision: int, now: float) -> None: ...

    def resync_keys(
        self,
        kind: ChangeKind,
        kept: Iterable[str],
        now_there: Mapping[str, object],
        revision: int,
        now: float,
    ) -> None:
        """A resync as a change of every key this view keeps or the facts hold: changed
        where the facts hold it, removed where they no longer do."""
        for key in set(kept) | now_there.keys():
            change = Change(revision, kind, key)
            if key in now_there:
                self.changed(change, now)
            else:
                self.removed(change, now)

    @abstractmethod
    def holds(self, key: str) -> bool:
        """Whether the view keeps anything of `key` (a node, model or replica)."""
