"""What the store raises: the state cannot be used at start (`StateError`, the
controller stops with its message), or one write was not stored (`StoreUnavailable`,
the API answers 503; `Fenced` when another controller leads). The last two are
refusals a client sees, so they live in the one error tree (llmgw.errors) and are
named here for the store's modules."""

from __future__ import annotations

from llmgw.errors import Fenced, StoreUnavailable

__all__ = ["Fenced", "StateError", "StoreUnavailable"]


class StateError(Exception):
    """The state cannot be opened: the controller must not start (message for a person)."""
