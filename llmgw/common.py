"""Small things every llmgw front end shares: the default controller, the usage
error, and how an exception is shown in one line."""

from __future__ import annotations

DEFAULT_CONTROLLER = "http://127.0.0.1:7460"


class UsageError(Exception):
    """The user asked for something that cannot be done as asked (exit 2)."""


def first_line(exc: BaseException) -> str:
    """An exception as one line a person can read: its message, else its type."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
