"""Durations as operators type them: one syntax for every option of every program
(`llmgw controller`, `agent`, `gateway`, `demo`, `console`, `ctl`) and the console's
dialogs.

`30s`, `90m`, `1h`, `1h30m`, `2d` (as kubectl's `--timeout`); a bare number is
seconds. Anything else is refused with a message that says what would parse,
never read as something else (`1h` is never 1 minute, `abc` never "no deadline").
"""

from __future__ import annotations

import argparse
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_BARE = re.compile(r"\d+(?:\.\d+)?")
FORMS = "e.g. 30s, 90m, 1h or 1h30m"


class BadDuration(ValueError):
    def __init__(self, text: str) -> None:
        shown = text if len(text) <= 20 else text[:20] + "…"
        if _negative(text):  # the form is right, the sign is not: say so
            why = f"{shown!r} is negative: a duration is 0 or more, {FORMS}"
        else:
            why = f"{shown!r} is not a duration: use a number with a unit, {FORMS}"
        super().__init__(why)
        self.text = text


def _negative(text: str) -> bool:
    raw = text.strip()
    if not raw.startswith("-"):
        return False
    try:
        parse_duration(raw[1:])
    except BadDuration:
        return False
    return True


def parse_duration(text: str) -> float:
    """Seconds in `text` (`30s`, `90m`, `1h30m`, or a bare number of seconds)."""
    raw = text.strip().lower()
    if _BARE.fullmatch(raw):
        return float(raw)
    pos = 0
    total = 0.0
    seen: set[str] = set()
    for m in _PART.finditer(raw):
        if m.start() != pos or m.group(2) in seen:
            raise BadDuration(text)
        seen.add(m.group(2))
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(raw):
        raise BadDuration(text)
    return total


def duration_arg(text: str) -> float:
    """argparse's `type=` for every duration option: seconds, or the parser's one-line
    refusal (`argument --wake-timeout: 'abc' is not a duration: …`). Each program
    checks its own range after parsing."""
    try:
        return parse_duration(text)
    except BadDuration as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_duration(seconds: float) -> str:
    """The shortest exact-enough spelling: `45s`, `1m30s`, `2h`, `1d2h`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts[:2])
