"""Process plumbing for engines: identity across agent restarts, signals, log tails.

A PID alone is not an identity: after an engine dies its PID can be reused by
anything. We pair it with the process start time from /proc/<pid>/stat (clock
ticks since boot) and the kernel boot id, and check both before every signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TAIL_LINES = 20
TAIL_LINE_CHARS = 240
TAIL_READ_BYTES = 64 * 1024
TAIL_MAX_CHARS = 3000  # leaves room in ReplicaReport.error (4096) for the preamble


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from the state on (the 3rd field), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # comm (field 2) is in parentheses and may itself contain ") ".
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Start time of a live process in clock ticks since boot; None if gone or a zombie."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat


def group_of(pid: int) -> int | None:
    """The process group of a live process (None: gone): an engine's processes are
    its group, whose id is the engine's PID (it leads its own session)."""
    fields = _stat_fields(pid)
    return int(fields[2]) if fields and len(fields) > 2 else None


def cpu_by_group() -> dict[int, float]:
    """CPU seconds (user and system) of the live processes in each process group,
    from one pass over /proc. A process that has exited no longer counts."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    try:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return out
    for pid in pids:
        fields = _stat_fields(pid)
        if not fields or len(fields) < 13:
            continue
        group = int(fields[2])  # field 5, pgrp; utime and stime are fields 14 and 15
        out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


@dataclass(frozen=True)
class ProcessRef:
    """Who an engine process is: enough to recognise it after an agent restart."""

    pid: int
    start_ticks: int
    boot_id: str

    def alive(self) -> bool:
        return self.boot_id == boot_id() and start_ticks(self.pid) == self.start_ticks

    def send(self, sig: signal.Signals) -> bool:
        """Signal the process itself if it is still the one we started."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the engine's whole process group (its workers too).

        Engines start in their own session, so the group id is the engine's
        PID. Only called while the group can still exist under that id: the
        leader is alive (checked) or has just exited, and a PID is not reused
        while a process group of that id has members.
        """
        if self.pid <= 1 or self.pid == os.getpgrp():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


def ref_for(pid: int) -> ProcessRef | None:
    ticks = start_ticks(pid)
    return None if ticks is None else ProcessRef(pid=pid, start_ticks=ticks, boot_id=boot_id())


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exited (status unknown: it was not started by this agent process)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last few lines of a log, each and all bounded; '' if unreadable."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_READ_BYTES))
            data = f.read(TAIL_READ_BYTES)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    kept = [ln[:TAIL_LINE_CHARS] for ln in text.splitlines() if ln.strip()][-lines:]
    out = "\n".join(kept)
    return out[-TAIL_MAX_CHARS:]


def free_port() -> int:
    """A TCP port free on every address right now. The engine binds it a moment
    later: a start that loses that race is started again on a fresh one
    (engine_lifecycle.EngineLifecycle._lost_its_port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
