"""Small things every llmgw front end shares: the default controller, the usage
error, examples in --help, and how an exception is shown in one line."""

from __future__ import annotations

import argparse

from llmgw.errors import UsageError as UsageError  # re-exported: its old home

DEFAULT_CONTROLLER = "http://127.0.0.1:7460"


def examples(*commands: str) -> str:
    """A --help epilog of example command lines (with `HelpWithExamples`)."""
    return "example:\n" + "\n".join(f"  {c}" for c in commands)


class HelpWithExamples(argparse.HelpFormatter):
    """argparse's help, wrapped to the terminal as usual, except indented lines
    (the examples), which are kept as written so they can be copied."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text  # (not inside the generator: no zero-argument super there)
        return "\n".join(
            indent + line if line.startswith("  ") or not line else fill(line, width, indent)
            for line in text.splitlines()
        )


def first_line(exc: BaseException) -> str:
    """An exception as one line a person can read: its message, else its type."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
