"""`Liveness`: when each node turns unreachable unless it reports.

A node is unreachable once it has been silent for its grace (a few of its own
report intervals, plus a margin); one never heard from this term gets one grace
from the term's start, as after a restart. Deadlines are kept in a heap and
popped lazily as time passes, so finding the nodes that just turned costs
nothing while none did. Owned by `Facts`, which turns each into a change.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from llmgw.controller.core.nodes import NodeEntry
from llmgw.controller.core.settings import ControllerSettings


class Liveness:
    def __init__(self, settings: ControllerSettings, started_at: float) -> None:
        self._intervals = settings.grace_intervals
        self._extra_s = settings.grace_extra_s
        self.started_at = started_at
        self._deadlines: list[tuple[float, str]] = []  # (moment it turns, node)

    def grace_s(self, entry: NodeEntry) -> float:
        return entry.grace_s(self._intervals, self._extra_s)

    def unreachable_at(self, entry: NodeEntry) -> float:
        """The moment (monotonic) this node turns unreachable unless it reports."""
        return entry.last_heard(self.started_at) + self.grace_s(entry)

    def watch(self, entries: Iterable[NodeEntry]) -> None:
        """These nodes were heard from (or loaded): note their new deadlines."""
        for entry in entries:
            heapq.heappush(self._deadlines, (self.unreachable_at(entry), entry.name))

    def turned(self, now: float, entries: Mapping[str, NodeEntry]) -> list[str]:
        """The nodes whose grace ran out since the last look (each once per silence)."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] < now:
            deadline, name = heapq.heappop(heap)
            entry = entries.get(name)
            if entry is not None and deadline == self.unreachable_at(entry):  # else superseded
                out.append(name)
        return out
