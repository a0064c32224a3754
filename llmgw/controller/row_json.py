"""The nodes listing's JSON, kept encoded per row.

`GET /v1/nodes` at 2,000 nodes spent ~20 ms validating and dumping a `NodeRow`
per node although almost every row is unchanged since the last answer: only
its report age moves. So each row is encoded once, when its content changes,
as the bytes before and after the age; an answer joins them around the ages.
The bytes are what `NodeRow.model_dump_json(by_alias=True)` writes (a test
compares them), so clients cannot tell the difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from llmgw.wire import NodeRow, NodesDelta

if TYPE_CHECKING:
    from llmgw.controller.nodes import NodeEntry

_AGE = b'"report_age_s":null'  # cannot occur inside a JSON string: its quotes would be escaped


class RowEncodings:
    """Node name -> its row's JSON around the age; dropped when the row changes."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple[bytes, bytes]] = {}

    def drop(self, name: str) -> None:
        self._parts.pop(name, None)

    def rows(
        self,
        entries: Iterable[tuple[str, NodeEntry]],
        contents: Mapping[str, Mapping[str, Any]],
        now: float,
    ) -> list[bytes]:
        """Each entry's row as JSON, with its age at `now` (rounded as `FleetState.row`).
        `contents`: every row's content but its age (FleetState's fingerprints)."""
        parts, out = self._parts, []
        for name, entry in entries:  # one loop, no calls per row: 2,000 rows in ~1 ms
            head, tail = parts.get(name) or self._encode(name, contents[name])
            received = entry.received_at
            age = b"null" if received is None else repr(round(now - received, 1)).encode()
            out.append(head + age + tail)
        return out

    def _encode(self, name: str, content: Mapping[str, Any]) -> tuple[bytes, bytes]:
        body = NodeRow.model_validate({**content, "report_age_s": None}).model_dump_json(
            by_alias=True
        )
        head, _, tail = body.encode().partition(_AGE)
        parts = self._parts[name] = (head + b'"report_age_s":', tail)
        return parts


def json_list(rows: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(rows) + b"]"


def delta_json(delta: NodesDelta, rows: Iterable[bytes]) -> bytes:
    """`delta` (whose `nodes` is empty) with the encoded `rows` in its place."""
    assert not delta.nodes
    body = delta.model_dump_json(by_alias=True).encode()
    head, _, tail = body.partition(b'"nodes":[]')  # the cursor before it is EPOCH.REVISION
    return head + b'"nodes":' + json_list(rows) + tail
