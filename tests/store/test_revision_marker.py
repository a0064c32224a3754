"""The SQLite store's revision marker (issue 25 item 6), in process: a copy of the
state directory taken while the store is open is what a SIGKILL leaves behind
(the WAL not yet checkpointed). The same against a real controller process is in
test_state_integrity.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controller.store import STATE_FILE, StateError, Store
from llmgw.controller.store.marker import MARKER_SUFFIX
from llmgw.wire import AdminFlag, AdminInfo, ModelSpec

MARKER = STATE_FILE + MARKER_SUFFIX
WAL = STATE_FILE + "-wal"


def write_some(store: Store) -> None:
    """Three cordons and a model, each acknowledged (one transaction each)."""
    store.add_nodes([(f"n{i}", 1.0) for i in range(3)])
    for i in range(3):
        info = AdminInfo(flag=AdminFlag.CORDONED, reason="test", by="ops", at=2.0)
        store.set_admin(f"n{i}", info, action="cordon", by="ops", at=2.0)
    store.put_models([ModelSpec(name="m", source="x", engine="fake", min_replicas=0)], at=3.0)


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[Path]:
    """A state directory as a SIGKILL leaves it: every write in the WAL."""
    live = tmp_path / "live"
    store = Store(live)
    write_some(store)
    shutil.copytree(live, tmp_path / "crashed")
    store.close()
    assert (tmp_path / "crashed" / WAL).stat().st_size > 0
    yield tmp_path / "crashed"


def contents(d: Path) -> dict[str, bytes]:
    """What a refused start must leave as it was (the -shm is SQLite's cache)."""
    return {p.name: p.read_bytes() for p in d.iterdir() if not p.name.endswith("-shm")}


def test_a_crashed_store_with_its_wal_opens_with_every_write(crashed: Path) -> None:
    store = Store(crashed)
    assert store.admin()["n2"].flag is AdminFlag.CORDONED and "m" in store.models()
    assert int((crashed / MARKER).read_text()) == store.revision == 5
    store.close()


def damage_wal(d: Path, how: str) -> None:
    wal = d / WAL
    size = wal.stat().st_size
    if how == "deleted":
        wal.unlink()
    elif how == "truncated":
        os.truncate(wal, size // 2)
    else:  # 64 bytes flipped inside the last frame: SQLite drops it silently
        data = bytearray(wal.read_bytes())
        at = size - 200
        data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
        wal.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["deleted", "truncated", "corrupted"])
def test_a_lost_or_damaged_wal_refuses_to_open_and_changes_nothing(crashed: Path, how: str) -> None:
    damage_wal(crashed, how)
    before = contents(crashed)
    with pytest.raises(StateError) as refused:
        Store(crashed)
    said = str(refused.value)
    assert str(crashed / STATE_FILE) in said and "behind its last committed write" in said
    assert "says 5" in said and "--reset-state" in said and f"delete {MARKER}" in said
    assert contents(crashed).items() >= before.items(), "the file and its WAL left as they were"


def test_a_missing_state_file_with_its_marker_refuses_to_open(crashed: Path) -> None:
    (crashed / STATE_FILE).unlink()
    (crashed / WAL).unlink()
    with pytest.raises(StateError, match=r"is missing, but .* says it held 5 committed writes"):
        Store(crashed)
    assert not (crashed / STATE_FILE).exists(), "no empty state file made in its place"


def test_reset_moves_the_marker_aside_with_the_state(crashed: Path) -> None:
    damage_wal(crashed, "deleted")
    aside = Store.reset(crashed)
    assert aside is not None
    assert Path(f"{aside}{MARKER_SUFFIX}").exists() and Path(f"{aside}").exists()
    store = Store(crashed)
    assert store.admin() == {} and int((crashed / MARKER).read_text()) == 0
    store.close()


def test_a_marker_behind_the_file_is_a_crash_before_it_moved_and_opens(crashed: Path) -> None:
    (crashed / MARKER).write_text("3\n")
    store = Store(crashed)
    assert store.revision == 5 and int((crashed / MARKER).read_text()) == 5
    store.close()


def test_a_state_file_from_before_markers_opens_and_gets_one(crashed: Path) -> None:
    (crashed / MARKER).unlink()
    Store(crashed).close()
    assert int((crashed / MARKER).read_text()) == 5


def test_a_damaged_marker_refuses_to_open(crashed: Path) -> None:
    (crashed / MARKER).write_bytes(b"\x00garbage")
    with pytest.raises(StateError, match=r"revision marker .* is damaged"):
        Store(crashed)


def test_every_commit_moves_the_marker_before_it_returns(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for expected in range(1, 4):
        store.add_nodes([(f"n{expected}", 1.0)])
        assert int((tmp_path / MARKER).read_text()) == expected == store.revision
    store.close()
