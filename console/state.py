"""What the console knows: the last fleet it fetched and how the link is doing."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmgw.wire import FleetSummary, NodeDetail, NodeRow


class Link(StrEnum):
    CONNECTING = "connecting"
    LIVE = "live"
    LOST = "unreachable"  # no answer at all
    ERROR = "error"  # the controller answered, with an error


@dataclass(frozen=True, eq=False)
class Fleet:
    """One consistent fetch. `eq=False`: identity is enough, and comparing two
    thousand rows field by field on every reactive assignment is not."""

    summary: FleetSummary
    nodes: dict[str, NodeRow]
    fetched_at: float  # console clock


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
    """What the operator can do about a broken link, in one sentence."""
    if conn.status in (401, 403):
        return "Check the admin token (--token or LLMGW_TOKEN)."
    if conn.link == Link.LOST:
        return "Check that `llmgw controller` runs and --controller points at it."
    if conn.status is not None and conn.status >= 500:
        return "The controller is failing; its log says why."
    return "This console may not match the controller's version."


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
