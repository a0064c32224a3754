"""The revision marker: the SQLite store's last committed revision, kept in a small
file beside the state file, outside the database.

SQLite cannot tell that its WAL was deleted, truncated or damaged after a crash: it
opens what is left and the newest acknowledged writes are silently gone. The marker
is written after each commit and before the write is acknowledged, so a database
whose revision is below it (or a database gone while the marker is there) has lost
acknowledged writes, and the controller refuses to start from it.

Cheap on purpose: the file is created once (file and directory fsynced) and then
overwritten in place at a fixed width, one `pwrite` and one `fdatasync` per commit.
A crash between the commit and the marker leaves the marker behind the database,
which is safe: only a database behind its marker is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.controller.store.errors import StateError

__all__ = ["MARKER_SUFFIX", "RevisionMarker"]

MARKER_SUFFIX = ".revision"
_WIDTH = 20  # digits: every write is the same length, so it overwrites in place


def _line(revision: int) -> bytes:
    return f"{revision:0{_WIDTH}d}\n".encode()


class RevisionMarker:
    """One marker file; `read` at open, `write` after each commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self) -> int | None:
        """The revision it holds; None when there is no marker. A marker that cannot
        be read or parsed is a `StateError` (it is not ours to guess)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(
                f"cannot read the revision marker {self.path}: {exc.strerror}; fix its permissions"
            ) from exc
        value = text.strip()
        if not value.isdigit() or len(value) > _WIDTH:
            raise StateError(
                f"the revision marker {self.path} is damaged ({text[:40]!r}): if the state "
                "file beside it is known good, delete the marker and start again"
            )
        return int(value)

    def write(self, revision: int) -> None:
        """Durably record `revision` (OSError when it could not be)."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, _line(revision))
                os.ftruncate(fd, len(_line(revision)))
                os.fsync(fd)
                _fsync_dir(self.path.parent)  # the name itself must survive a crash
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return
        _write_all(self._fd, _line(revision))
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(f"short write to the revision marker ({len(data)} bytes wanted)")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
