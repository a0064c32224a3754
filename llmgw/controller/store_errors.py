"""What the store raises: the state cannot be used at start (`StateError`, the
controller stops with its message), or one write was not stored (`StoreUnavailable`,
the API answers 503; `Fenced` when another controller leads)."""

from __future__ import annotations

__all__ = ["Fenced", "StateError", "StoreUnavailable"]


class StateError(Exception):
    """The state cannot be opened: the controller must not start (message for a person)."""


class StoreUnavailable(Exception):
    """A write was not stored (message names the cause); nothing in memory changed."""


class Fenced(StoreUnavailable):
    """A write refused because this controller does not hold the leader's lease (any
    more): `leader` is the URL of the controller that does, when one does."""

    def __init__(self, message: str, leader: str | None) -> None:
        super().__init__(message)
        self.leader = leader
