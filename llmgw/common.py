"""Small things every llmgw front end shares: the default controller, examples
in --help, how an exception is shown in one line, and text made safe to print.
Standard library only: `ctl` imports it at start."""

from __future__ import annotations

import argparse
import re

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


# C0 controls, DEL and C1 controls: what moves a terminal's cursor or starts an
# escape sequence (the characters llmgw.wire refuses in names).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, keep_lines: bool = False) -> str:
    """`text` with control characters shown as escapes (`\\x1b`, `\\n`), safe to print.

    Use it for anything a report or a request put there before it reaches a
    terminal: a forged newline or an escape sequence then shows as text, and a
    table row stays one line. With `keep_lines`, tab and newline stay (for
    multi-line error text).
    """
    pattern = _CONTROL_BUT_LINES if keep_lines else _CONTROL
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
