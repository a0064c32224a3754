"""The supervisor's state file: which engines this node runs, so a restarted
agent can find them again. Written atomically (temp file, fsync, rename, fsync
of the directory) so a crash mid-write leaves the old file, never half of one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.wire import ShardAssignment

log = logging.getLogger(__name__)

STATE_VERSION = 1


class EngineRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    replica_id: str
    rank: int
    pid: int
    start_ticks: int  # /proc/<pid>/stat start time: guards against PID reuse
    boot_id: str
    port: int
    state: str  # ShardState value at the time of writing
    assignment: ShardAssignment
    argv: list[str] = Field(default_factory=list)
    log_path: str
    started_at: float  # unix time, for people reading the file
    stop_requested: bool = False


class StateFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int = STATE_VERSION
    engines: list[EngineRecord] = Field(default_factory=list)


def load_state(path: Path) -> list[EngineRecord]:
    """Records from the file; [] if it is missing. A corrupt file is moved aside
    (kept for a person to read) rather than trusted or silently lost."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("cannot read engine state %s: %s; starting with no engines", path, exc)
        return []
    try:
        return StateFile.model_validate_json(text).engines
    except (ValidationError, ValueError) as exc:
        aside = path.with_suffix(path.suffix + ".corrupt")
        log.error("engine state %s is unreadable (%s); moved to %s", path, exc, aside)
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        return []


def save_state(path: Path, records: list[EngineRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = StateFile(engines=records).model_dump(mode="json")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Mode 0600: the assignments it keeps carry their engines' keys.
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
