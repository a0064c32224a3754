"""Why an engine ended, read from its log: the cause, not the last lines.

A dying engine prints its cause once and then hundreds of lines of shutdown
noise (vLLM: leak reports, executor warnings), so the tail of the log rarely
holds the reason. We look, in the current run's part of the log (after the
agent's last `=== … llmgw agent` header), for the first line that looks like a
cause, and keep a few lines around it. The first line of the text we build is
a one-line form for table cells; the excerpt follows.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmgw.agent.engine_proc import TAIL_LINE_CHARS, log_tail

READ_BYTES = 1024 * 1024  # a crash's noise runs to tens of KiB; a cause is within this
RUN_HEADER = re.compile(r"^=== .* llmgw agent ")
# What makes a line a cause: a Python exception line (`RuntimeError: …`, also behind a
# log prefix such as `(EngineCore pid=1) ERROR … [core.py:1] `; case-sensitive), or one
# of the phrases engines and drivers print when they die (any case).
_EXC = re.compile(r"(?:^|[\s\]])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|$)")
_PHRASE = re.compile(
    r"died unexpectedly|CUDA error|out of memory|\bXid\b|\bNCCL error"
    r"|Segmentation fault|core dumped|\bfatal\b",
    re.IGNORECASE,
)
BEFORE, AFTER = 2, 4
ONE_LINE_CHARS = 200


def looks_like_cause(line: str) -> bool:
    return bool(_PHRASE.search(line) or _EXC.search(line))


def _current_run(path: Path) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - READ_BYTES))
            data = f.read(READ_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if RUN_HEADER.match(lines[i]):
            return lines[i + 1 :]
    return lines


def cause_excerpt(path: Path) -> tuple[str, str] | None:
    """(the cause line, a few lines around it), or None when no line looks like one."""
    lines = _current_run(path)
    for i, line in enumerate(lines):
        if looks_like_cause(line):
            around = [ln[:TAIL_LINE_CHARS] for ln in lines[max(0, i - BEFORE) : i + AFTER + 1]]
            return line.strip()[:ONE_LINE_CHARS], "\n".join(ln for ln in around if ln.strip())
    return None


def exit_reason(what: str, log_path: Path | None) -> str:
    """`engine <what>: <cause>` on the first line, then where and what the log says."""
    text = f"engine {what}"
    if log_path is None:
        return text
    found = cause_excerpt(log_path)
    if found is not None:
        cause, excerpt = found
        return f"{text}: {cause}\nfrom {log_path}:\n{excerpt}"
    tail = log_tail(log_path, lines=10)
    return f"{text}; last lines of {log_path}:\n{tail}" if tail else f"{text}; log: {log_path}"


# EADDRINUSE as Python's asyncio and uvicorn word it (compared in lower case).
PORT_TAKEN = "address already in use"


def line_with(path: Path, words: str, *, any_case: bool = False) -> str | None:
    """The first line of this run's log holding `words` (in any case: `any_case`), cut to
    one line's length, or None: a sleep mode refused (the template's `unsupported`
    words), a port taken (`PORT_TAKEN`)."""
    for line in _current_run(path):
        if words in (line.lower() if any_case else line):
            return line.strip()[:ONE_LINE_CHARS]
    return None
