"""The nodes listing's JSON, kept encoded per row.

`GET /v1/nodes` at 2,000 nodes spent most of its time validating and dumping a
`NodeRow` per node although almost every row is unchanged since the last answer: only
its report age moves. So each row is encoded once, when its content changes,
as the bytes before and after the age; an answer joins them around the ages.
`?since=` answers are joined the same way, their every-node `report_ages`
included. The bytes are what the models' `model_dump_json(by_alias=True)`
writes (a property test compares them), so clients cannot tell the difference.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from llmgw.wire import NodeRow

if TYPE_CHECKING:
    from llmgw.controller.core.nodes import NodeEntry

_AGE = b'"report_age_s":null'  # cannot occur inside a JSON string: its quotes would be escaped


def _age(entry: NodeEntry, now: float) -> bytes:
    """A report age as pydantic writes it, rounded as `NodeRows.row` rounds it."""
    received = entry.received_at
    return b"null" if received is None else repr(round(now - received, 1)).encode()


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()  # node names are ASCII


class RowEncodings:
    """Node name -> its row's JSON around the age; dropped when the row changes."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple[bytes, bytes]] = {}
        self._keys: dict[str, bytes] = {}  # name -> `"name":`, for report_ages

    def drop(self, name: str) -> None:
        self._parts.pop(name, None)

    def forget(self, name: str) -> None:
        self._parts.pop(name, None)
        self._keys.pop(name, None)

    def holds(self, name: str) -> bool:
        return name in self._parts or name in self._keys

    def rows(
        self,
        entries: Iterable[tuple[str, NodeEntry]],
        contents: Mapping[str, Mapping[str, Any]],
        now: float,
    ) -> list[bytes]:
        """Each entry's row as JSON, with its age at `now`.
        `contents`: every row's content but its age (NodeRows keeps them)."""
        parts, out = self._parts, []
        for name, entry in entries:
            head, tail = parts.get(name) or self._encode(name, contents[name])
            out.append(head + _age(entry, now) + tail)
        return out

    def ages(self, entries: Iterable[tuple[str, NodeEntry]], now: float) -> bytes:
        """`report_ages` of a delta: every entry's age at `now`, by name."""
        keys = self._keys
        pairs = [(keys.get(name) or self._key(name)) + _age(entry, now) for name, entry in entries]
        return b"{" + b",".join(pairs) + b"}"

    def _encode(self, name: str, content: Mapping[str, Any]) -> tuple[bytes, bytes]:
        body = NodeRow.model_validate({**content, "report_age_s": None}).model_dump_json(
            by_alias=True
        )
        head, _, tail = body.encode().partition(_AGE)
        parts = self._parts[name] = (head + b'"report_age_s":', tail)
        return parts

    def _key(self, name: str) -> bytes:
        key = self._keys[name] = _json(name) + b":"
        return key


def json_list(rows: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(rows) + b"]"


def delta_json(
    cursor: str, full: bool, rows: list[bytes], removed: list[str], ages: bytes
) -> bytes:
    """A `NodesDelta` as its model writes it, fields in the model's order."""
    return b"".join(
        (
            b'{"cursor":',
            _json(cursor),
            b',"full":',
            b"true" if full else b"false",
            b',"nodes":',
            json_list(rows),
            b',"removed":',
            _json(removed),
            b',"report_ages":',
            ages,
            b"}",
        )
    )
