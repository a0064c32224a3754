"""Cursors: "RUN.REVISION", the one way a client names where it is in the change log.

The run id is new with every leadership term (a start, a takeover), so a cursor
from another term is never read against this term's revisions: it gets a full
answer. Every cursor is written and parsed here.
"""

from __future__ import annotations

import re
import secrets

from llmgw.errors import BadCursor

_CURSOR = re.compile(r"([0-9A-Fa-f]{1,32})\.([0-9]{1,64})")


def new_run() -> str:
    return secrets.token_hex(4)


def cursor(run: str, revision: int) -> str:
    return f"{run}.{revision}"


def parse(since: str, run: str) -> int | None:
    """The revision `since` stands for in `run`; None when it is empty or of another run.

    Raises `BadCursor` when `since` is neither empty nor RUN.REVISION."""
    if not since:
        return None
    m = _CURSOR.fullmatch(since)
    if m is None:
        raise BadCursor(since)
    return int(m.group(2)) if m.group(1).lower() == run else None
