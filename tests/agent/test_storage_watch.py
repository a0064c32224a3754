"""A hung filesystem must not stop reports."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llmgw.agent.sample_models import write_model
from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.agent.storage_watch import StorageWatch
from llmgw.wire import StorageLocation


def hold_scans(monkeypatch: pytest.MonkeyPatch, scanner: StorageScanner) -> threading.Event:
    """From now on `scanner.scan` blocks (10 s at most) until the returned event is set."""
    release = threading.Event()
    real_scan = scanner.scan

    def held() -> list[StorageLocation]:
        release.wait(10)
        return real_scan()

    monkeypatch.setattr(scanner, "scan", held)
    return release


def test_scans_every_directory(tmp_path: Path) -> None:
    write_model(tmp_path / "a" / "m")
    write_model(tmp_path / "b" / "n")
    watch = StorageWatch([StorageDir(str(tmp_path / "a")), StorageDir(str(tmp_path / "b"))])
    assert watch.configured and not StorageWatch([]).configured
    a, b = watch.scan()
    assert [m.name for m in a.models] == ["m"] and [m.name for m in b.models] == ["n"]


def test_hung_directory_reports_last_result_then_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_model(tmp_path / "fast" / "m")
    write_model(tmp_path / "filer" / "n")
    clock = [0.0]
    watch = StorageWatch(
        [StorageDir(str(tmp_path / "fast")), StorageDir(str(tmp_path / "filer"))],
        wait_s=0.05,
        stuck_after_s=60,
        clock=lambda: clock[0],
    )
    assert [len(loc.models) for loc in watch.scan()] == [1, 1]

    # The filer hangs: its next scan blocks until released.
    slot = watch._slots[1]
    release = hold_scans(monkeypatch, slot.scanner)
    write_model(tmp_path / "fast" / "m2")
    clock[0] = 10
    fast, filer = watch.scan()  # returns after wait_s, not after the hang
    assert {m.name for m in fast.models} == {"m", "m2"}  # fresh
    assert [m.name for m in filer.models] == ["n"] and filer.error is None  # last known

    clock[0] = 100  # hung for 90 s: the filer's models no longer count
    threads_before = threading.active_count()
    _fast, filer = watch.scan()
    assert filer.models == [] and filer.error and "hung" in filer.error
    assert threading.active_count() == threads_before  # no second scan of a hung directory

    release.set()
    assert slot.done.wait(5)
    _fast, filer = watch.scan()
    assert [m.name for m in filer.models] == ["n"] and filer.error is None


def test_first_scan_still_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = StorageWatch([StorageDir(str(tmp_path))], wait_s=0.01)
    slot = watch._slots[0]
    release = hold_scans(monkeypatch, slot.scanner)
    (location,) = watch.scan()
    assert location.error == "first scan still running" and location.models == []
    release.set()
    assert slot.done.wait(5)
    assert watch.scan()[0].error is None


def test_a_crashing_scan_is_an_error_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = StorageWatch([StorageDir(str(tmp_path))])

    def boom() -> list[StorageLocation]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(watch._slots[0].scanner, "scan", boom)
    (location,) = watch.scan()
    assert location.error == "scan failed: disk on fire"
