"""`NodeRows`: the node rows (`GET /v1/nodes`, `?since=`, node detail), a view of the facts.

It follows the change log (a node's facts, admin flag, assignments; follow.py) and keeps,
for each node, its row's content (everything but the report age), the revision
at which that content last changed, and its JSON (row_json.py). A `?since=`
answer is then the rows changed after the cursor's revision, without a scan of
what every node reported. Nothing tells this view of a change: it reads the log
when asked, so no writer can forget it.
"""

from __future__ import annotations

from typing import Any

from llmgw.controller.core import cursors
from llmgw.controller.core.changes import Change, ChangeKind
from llmgw.controller.core.nodes import NodeEntry
from llmgw.controller.state.facts import Facts
from llmgw.controller.views.follow import Follower
from llmgw.controller.views.row_json import RowEncodings, delta_json, json_list
from llmgw.wire import NodeDetail, NodeRow, NodesDelta

# A node's row content: every `NodeRow` field except the report age.
RowContent = dict[str, Any]
REMOVALS_KEPT = 10_000  # forgotten nodes remembered for `?since=`; older cursors: a full answer


class NodeRows(Follower):
    follows = frozenset({ChangeKind.NODE, ChangeKind.ADMIN, ChangeKind.ASSIGNMENTS})

    def __init__(self, facts: Facts, run: str) -> None:
        super().__init__(facts)
        self.run = run  # cursors of another run get a full answer
        self._content: dict[str, RowContent] = {}
        self._changed_at: dict[str, int] = {}  # name -> revision its content last changed
        self._removed: dict[str, int] = {}  # name -> revision it was forgotten at
        self._json = RowEncodings()
        self._floor = 0  # a cursor before this revision gets a full answer

    # -- what the API serves -----------------------------------------------------------

    def row(self, name: str, now: float | None = None) -> NodeRow:
        entry = self._facts.require(name)
        now = self._facts.clock() if now is None else now
        self.catch_up(now)
        return NodeRow.model_validate({**self._content[name], "report_age_s": _age(entry, now)})

    def rows(self) -> list[NodeRow]:
        now = self._facts.clock()
        return [self.row(name, now) for name in sorted(self._facts.nodes)]

    def rows_json(self) -> bytes:
        """`rows()` as `GET /v1/nodes` sends it: each row's JSON is kept from
        when it last changed (row_json), so an answer only writes the ages."""
        now = self._facts.clock()
        self.catch_up(now)
        return json_list(self._json.rows(sorted(self._facts.nodes.items()), self._content, now))

    def nodes_since(self, since: str) -> NodesDelta:
        """The node rows that changed after cursor `since` ("" for all); see `NodesDelta`.

        Raises `BadCursor` when `since` is neither empty nor RUN.REVISION."""
        cursor, full, names, removed, now = self._delta(since)
        entries = self._facts.nodes
        return NodesDelta(
            cursor=cursor,
            full=full,
            nodes=[self.row(name, now) for name in names],
            removed=removed,
            # By name, like `rows`; the same rounding as `row`.
            report_ages={name: _age(e, now) for name, e in sorted(entries.items())},
        )

    def nodes_since_json(self, since: str) -> bytes:
        """`nodes_since(since)` as `GET /v1/nodes?since=` sends it (see `rows_json`)."""
        cursor, full, names, removed, now = self._delta(since)
        entries = self._facts.nodes
        rows = self._json.rows(((n, entries[n]) for n in names), self._content, now)
        ages = self._json.ages(sorted(entries.items()), now)
        return delta_json(cursor, full, rows, removed, ages)

    def detail(self, name: str) -> NodeDetail:
        entry = self._facts.require(name)
        report = entry.report
        return NodeDetail(
            row=self.row(name),
            gpus=list(report.gpus) if report else [],
            storage_configured=report.storage_configured if report else False,
            storage=list(report.storage) if report else [],
            replicas=list(report.replicas) if report else [],
            history=self._facts.history(name),
            agent_version=report.agent_version if report else None,
            address=report.address if report else None,
        )

    # -- following the facts (follow.py) ---------------------------------------------------

    def _delta(self, since: str) -> tuple[str, bool, list[str], list[str], float]:
        """(cursor, full, the rows to send by name, names removed, now) after `since`."""
        after = cursors.parse(since, self.run)
        now = self._facts.clock()
        self.catch_up(now)
        cursor = cursors.cursor(self.run, self.at)
        if after is None or not self._floor <= after <= self.at:
            return cursor, True, sorted(self._facts.nodes), [], now
        names = sorted(n for n, at in self._changed_at.items() if at > after)
        removed = sorted(n for n, at in self._removed.items() if at > after)
        return cursor, False, names, removed, now

    def catch_up(self, now: float | None = None) -> None:
        super().catch_up(now)
        if len(self._removed) > REMOVALS_KEPT:
            for name, revision in sorted(self._removed.items(), key=lambda kv: kv[1])[
                :-REMOVALS_KEPT
            ]:
                del self._removed[name]
                self._floor = max(self._floor, revision)

    def changed(self, change: Change, now: float) -> None:
        """Rebuild the row; it is sent as changed only if its content moved."""
        name = change.key
        content = self._content_of(name, now)
        if content != self._content.get(name):
            self._content[name] = content
            self._changed_at[name] = change.revision
            self._json.drop(name)
            self._removed.pop(name, None)

    def removed(self, change: Change, now: float) -> None:
        name = change.key
        if self._content.pop(name, None) is not None:
            self._changed_at.pop(name, None)
            self._json.forget(name)
            self._removed[name] = change.revision

    def resync(self, revision: int, now: float) -> None:
        """Every row again; a cursor from before now gets a full answer."""
        self._floor = revision
        self.resync_keys(ChangeKind.NODE, self._content, self._facts.nodes, revision, now)

    def holds(self, key: str) -> bool:
        # (A forgotten node's tombstone is not its row: at most REMOVALS_KEPT are kept.)
        return key in self._content or key in self._changed_at or self._json.holds(key)

    def _content_of(self, name: str, now: float) -> RowContent:
        """Everything a node's row shows except the report age. The row is built
        from this, and its changes are noticed by comparing it: a field added
        here is sent by `?since=` without anything else to remember."""
        facts = self._facts
        entry = facts.nodes[name]
        d = entry.digest
        classes, _ = d.counted(facts.assigned_gpus(name))
        return {
            "name": name,
            "state": facts.state_of(name, now),
            "admin": facts.admin_info(name),
            "classes": {cls: c.total for cls, c in classes},
            "gpus_total": d.gpus_total,
            "gpus_used": sum(c.used for _, c in classes),
            "gpus_unhealthy": sum(c.unhealthy for _, c in classes),
            "gpus_unknown": sum(c.unknown for _, c in classes),
            "fabrics": list(d.fabrics),
            "models": sorted(d.models),
            "replicas": len(facts.by_node.get(name, ())),
            "gpu_error": entry.gpu_error,
            "drain_blocked": facts.decisions.drain_blocked.get(name),
        }


def _age(entry: NodeEntry, now: float) -> float | None:
    """A row's report age, to a tenth of a second; None: no report this run."""
    return None if entry.received_at is None else round(now - entry.received_at, 1)
