"""What `ctl drain --wait` says while it waits: one compact line, one summary.

Sixteen nodes do not make sixteen lines: nodes are counted and named as a
hostlist, and the reasons a drain is blocked are listed once each with how
many nodes they hold up. Lines are whole: on a terminal the caller fits the
line it rewrites in place to the width; piped, nothing is cut.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmgw.render import clean, duration, hostlist

if TYPE_CHECKING:
    from llmgw.wire import NodeRow


class DrainProgress:
    def __init__(self, nodes: Sequence[str]) -> None:
        self.wanted = frozenset(nodes)
        self.nodes = sorted(self.wanted)

    def _pending(self, rows: Mapping[str, NodeRow]) -> list[NodeRow]:
        return [rows[n] for n in self.nodes if n in rows and not rows[n].admin.drained]

    def done(self, rows: Mapping[str, NodeRow]) -> bool:
        return all(n in rows for n in self.nodes) and not self._pending(rows)

    def _blocked(self, pending: Sequence[NodeRow]) -> str:
        reasons = Counter(clean(r.drain_blocked) for r in pending if r.drain_blocked)
        parts = []
        for reason, count in reasons.most_common(2):
            parts.append(f"{count} waiting: {reason}")
        if len(reasons) > 2:
            parts.append(f"{len(reasons) - 2} other reason(s)")
        return "; ".join(parts)

    def line(self, rows: Mapping[str, NodeRow]) -> str:
        pending = self._pending(rows)
        drained = len(self.nodes) - len(pending) - sum(1 for n in self.nodes if n not in rows)
        left = sum(r.replicas for r in pending)
        text = f"draining {hostlist(self.nodes)}: {drained}/{len(self.nodes)} drained, {left} replica(s) to move"
        blocked = self._blocked(pending)
        return f"{text}; {blocked}" if blocked else text

    def summary(self, rows: Mapping[str, NodeRow], elapsed_s: float) -> str:
        return f"drained: {hostlist(self.nodes)} ({len(self.nodes)} node(s) in {duration(elapsed_s)})\n"

    def timed_out(self, rows: Mapping[str, NodeRow], limit_s: float) -> str:
        pending = self._pending(rows)
        names = [r.name for r in pending] + [n for n in self.nodes if n not in rows]
        left = sum(r.replicas for r in pending)
        blocked = self._blocked(pending)
        return (
            f"timed out after {duration(limit_s)}: {len(self.nodes) - len(names)}/{len(self.nodes)} "
            f"drained; {left} replica(s) still on {hostlist(names)}"
            + (f" ({blocked})" if blocked else "")
            + ".\nThe drain goes on in the controller. To stop the remaining replicas without "
            f"waiting for replacements: llmgw ctl drain {' '.join(names)} --reason REASON --force\n"
        )
