"""Storage scans off the report path, so a hung filesystem cannot stop reports.

A hung NFS or Lustre mount blocks `stat` for minutes. Each storage directory
is scanned in its own worker thread; a report waits a little for fresh
results, then goes out with what it has. A directory whose scan has been
running longer than `stuck_after_s` is reported with an error and no models:
an engine could not load from it either. A stuck thread is left to finish on
its own (a thread blocked in the kernel cannot be cancelled), and no second
scan of that directory starts while it runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.wire import StorageLocation


class _Slot:
    """One directory: its scanner, the scan in flight, the latest result."""

    def __init__(self, directory: StorageDir, mountinfo: Path) -> None:
        self.dir = directory
        self.scanner = StorageScanner([directory], mountinfo)
        self.thread: threading.Thread | None = None
        self.started = 0.0
        self.latest: StorageLocation | None = None
        self.done = threading.Event()

    def kick(self, now: float) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.done.clear()
        self.started = now
        self.thread = threading.Thread(
            target=self._run, name=f"storage-scan {self.dir.path}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        try:
            self.latest = self.scanner.scan()[0]
        except Exception as exc:  # never let one directory kill the report
            self.latest = StorageLocation(path=self.dir.path, error=f"scan failed: {exc}"[:4096])
        finally:
            self.done.set()

    def result(self, now: float, stuck_after_s: float) -> StorageLocation:
        running = not self.done.is_set()
        if running and now - self.started > stuck_after_s:
            return StorageLocation(
                path=self.dir.path,
                error=f"scan has not finished after {now - self.started:.0f} s: "
                "is the filesystem hung? (models here are not counted)",
            )
        if self.latest is None:
            return StorageLocation(path=self.dir.path, error="first scan still running")
        return self.latest


class StorageWatch:
    """Same interface as StorageScanner (`configured`, `scan()`), never blocks long."""

    def __init__(
        self,
        dirs: Sequence[StorageDir],
        mountinfo: Path = Path("/proc/self/mountinfo"),
        *,
        wait_s: float = 5.0,
        stuck_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots = [_Slot(d, mountinfo) for d in dirs]
        self.wait_s = wait_s
        self.stuck_after_s = stuck_after_s
        self.clock = clock

    @property
    def configured(self) -> bool:
        return bool(self._slots)

    def observe_scans(self, callback: Callable[[float, int], None]) -> None:
        """Tell `callback` each directory scan's duration and files looked at."""
        for slot in self._slots:
            slot.scanner.on_scan = callback

    def scan(self) -> list[StorageLocation]:
        for slot in self._slots:
            slot.kick(self.clock())
        deadline = time.monotonic() + self.wait_s
        for slot in self._slots:
            slot.done.wait(max(0.0, deadline - time.monotonic()))
        now = self.clock()
        return [slot.result(now, self.stuck_after_s) for slot in self._slots]
