"""What the console knows: the last fleet it fetched and how the link is doing;
and `ConsoleModel`, the app as screens see it (screens never import the app)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from pydantic import ValidationError

from llmgw.common import first_line as describe
from llmgw.errors import BadAnswer, ClientError, ControllerUnreachable, advice, error_class
from llmgw.wire import FleetSummary, NodeDetail, NodeRow, NodesDelta


class Link(StrEnum):
    CONNECTING = "connecting"
    LIVE = "live"
    LOST = "unreachable"  # no answer at all
    ERROR = "error"  # the controller answered, with an error


@dataclass(frozen=True, eq=False)
class FleetView:
    """One consistent fetch. `eq=False`: identity is enough, and comparing two
    thousand rows field by field on every reactive assignment is not."""

    summary: FleetSummary
    nodes: dict[str, NodeRow]
    fetched_at: float  # console clock
    # Every node's report age now. Rows are re-sent only when they change, so a
    # row's own report_age_s is as old as the row: read ages from here.
    ages: Mapping[str, float | None] = field(default_factory=dict)
    # Names whose rows may differ from the previous fetch; None: all of them.
    changed: frozenset[str] | None = None

    @classmethod
    def merge(
        cls, old: FleetView | None, summary: FleetSummary, delta: NodesDelta, fetched_at: float
    ) -> FleetView:
        """Apply the controller's answer to `GET /v1/nodes?since=` on top of
        the previous fetch (a full answer replaces it)."""
        if delta.full or old is None:
            nodes = {row.name: row for row in delta.nodes}
            changed = None
        else:
            nodes = dict(old.nodes)
            for name in delta.removed:
                nodes.pop(name, None)
            nodes.update((row.name, row) for row in delta.nodes)
            changed = frozenset(row.name for row in delta.nodes) | frozenset(delta.removed)
        return cls(summary, nodes, fetched_at, delta.report_ages, changed)


@dataclass(frozen=True)
class Connection:
    link: Link = Link.CONNECTING
    message: str = ""
    failures: int = 0
    retry_at: float | None = None  # console clock of the next attempt
    last_ok: float | None = None  # console clock of the last good fetch
    status: int | None = None  # HTTP status when the controller answered with an error

    @property
    def healthy(self) -> bool:
        return self.link == Link.LIVE


def next_step(conn: Connection) -> str:
    """What the operator can do about a broken link, in one sentence: the hint
    `llmgw ctl` gives for the same error (llmgw.errors.ADVICE)."""
    error: type[ClientError]
    if conn.link == Link.LOST:
        error = ControllerUnreachable
    elif conn.status is None:  # the controller answered 2xx with something unreadable
        error = BadAnswer
    else:
        error = error_class(conn.status)
    hint = advice(error).hint or "The controller's message says why."
    return hint[0].upper() + hint[1:] + ("" if hint.endswith(".") else ".")


def error_words(exc: Exception) -> str:
    """A failed request as a person reads it: never a class name (pydantic
    titles its errors with the model's: `1 validation error for NodeRow`)."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the body"
        return f"the controller's answer was not understood ({where}: {first['msg']})"
    return describe(exc)


def backoff(failures: int, base: float, cap: float = 30.0) -> float:
    """Retry delay after `failures` consecutive failures: base, 2×, 4× … up to
    `cap`, but never faster than the normal refresh."""
    if failures <= 1:
        return base
    return float(max(base, min(cap, base * 2 ** (failures - 1))))


@dataclass(frozen=True, eq=False)
class NodeView:
    """The node detail screen's data: one node, fetched with each poll."""

    name: str
    detail: NodeDetail | None
    error: str | None = None


class ConsoleModel(Protocol):
    """What screens read from the app. The app satisfies it; screens take
    `cast(ConsoleModel, self.app)` and never import llmgw.console.app."""

    fleet: FleetView | None
    connection: Connection
    node_view: NodeView | None
    readonly: bool  # --readonly, or a token that may only read (or not yet known)
    role_known: bool  # --readonly, or the controller has said what the token may do
    about: str  # shown in the help: the demo's gateway and curl line; "" for none
    gateway: str  # the gateway's URL, for the header, where known (the demo's); else ""

    @property
    def base_url(self) -> str: ...

    @property
    def controller_label(self) -> str: ...

    def clock(self) -> float: ...
