"""State you can trust (issue 10, item 6; findings 8 and 9), against real controller
processes: damaged or missing state stops the start with one message; a write that
was not stored is a JSON 503, never a 200; background saves survive an outage;
SIGTERM always saves and exits 0; a cordoned node is durable at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import ControllerProcess, wait_until

STATE = "controller.sqlite3"


def report(node: str) -> dict[str, object]:
    return {
        "node": node,
        "agent_version": "test",
        "boot_id": "boot-1",
        "interval_s": 5.0,
        "gpus": [],
        "fabrics": ["ib-a"],
        "storage_configured": False,
        "storage": [],
        "replicas": [],
    }


class Controller(ControllerProcess):
    """One controller process on a state dir (or `store`), restartable in place."""

    state_dir: Path

    def __init__(self, state_dir: Path, log: Path, store: str | None = None) -> None:
        super().__init__(log, state_dir=state_dir, store=store)

    def report(self, node: str) -> None:
        self.http.post("/v1/agent/report", json=report(node)).raise_for_status()

    def cordon(self, node: str) -> httpx.Response:
        return self.http.post(f"/v1/nodes/{node}/cordon", json={"reason": "test"})


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(tmp_path / "state", tmp_path / "controller.log")
    yield c
    c.close()


def start_fails(c: Controller, *extra: str) -> str:
    """Run the controller expecting it to refuse to start; its stderr."""
    done = c.run(*extra, timeout=30)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "listening" not in done.stdout
    return done.stderr


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *options)), "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(d: Path) -> Path:
    """Fill the file system `d` is on; the filler file. Unbuffered, so that no
    write is left over to fail when the file is closed."""
    filler = d / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    return filler


# -- at start: one message, no traceback, never a silent empty start ------------------


@pytest.mark.slow
def test_empty_state_file_stops_the_start_and_reset_state_moves_it_aside(
    controller: Controller,
) -> None:
    controller.state_dir.mkdir()
    (controller.state_dir / STATE).write_bytes(b"")
    err = start_fails(controller)
    assert str(controller.state_dir / STATE) in err
    assert "empty (0 bytes)" in err and "--reset-state" in err and "backup" in err
    assert len(err.strip().splitlines()) == 1

    controller.start("--reset-state")
    assert controller.http.get("/v1/nodes").json() == []
    kept = [p.name for p in controller.state_dir.iterdir() if ".reset-" in p.name]
    assert kept, "the old state is moved aside, not deleted"


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, says",
    [
        (b"not a database at all\n" * 20, "is not a SQLite database"),
        (b"SQLite format 3\x00" + os.urandom(8000), "is damaged"),
    ],
    ids=["not-sqlite", "damaged-sqlite"],
)
def test_damaged_state_file_stops_the_start(
    controller: Controller, content: bytes, says: str
) -> None:
    controller.state_dir.mkdir()
    (controller.state_dir / STATE).write_bytes(content)
    err = start_fails(controller)
    assert str(controller.state_dir / STATE) in err and says in err and "--reset-state" in err
    assert (controller.state_dir / STATE).read_bytes() == content, "left as it was"


@pytest.mark.slow
def test_a_read_only_state_dir_stops_the_start(controller: Controller, tmp_path: Path) -> None:
    with tmpfs(controller.state_dir, "1m", "ro"):
        err = start_fails(controller)
    assert str(controller.state_dir) in err and "not writable" in err


# -- while running: never a 200 for something not stored -------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["delete", "truncate", "replace"])
def test_a_state_file_lost_while_running_refuses_writes(
    controller: Controller, damage: str
) -> None:
    controller.start()
    controller.report("n1")
    controller.report("n2")
    assert controller.cordon("n1").status_code == 200
    path = controller.state_dir / STATE
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        os.truncate(path, 0)
    else:
        path.rename(path.with_suffix(".old"))
        path.write_bytes(path.with_suffix(".old").read_bytes())

    refused = controller.cordon("n2")
    assert refused.status_code == 503, refused.text
    assert str(path) in refused.json()["error"]
    models = {"models": [{"name": "m", "source": "x", "engine": "fake", "min_replicas": 0}]}
    assert controller.http.post("/v1/models", json=models).status_code == 503
    # Nothing changed in memory either: the refused cordon is not shown.
    assert controller.http.get("/v1/nodes/n2").json()["row"]["admin"]["flag"] == "none"
    assert controller.stop() == 0
    assert controller.output().count("writes are refused") == 1, "logged once per outage"


@pytest.mark.slow
def test_disk_full_refuses_writes_then_recovers_and_saves_every_sighting(
    controller: Controller,
) -> None:
    with tmpfs(controller.state_dir, "2m"):
        controller.start()
        controller.report("before")
        assert controller.cordon("before").status_code == 200
        filler = fill(controller.state_dir)

        refused = controller.cordon("before")
        assert refused.status_code == 503, refused.text
        assert "state not stored" in refused.json()["error"]
        assert "full" in refused.json()["error"]
        during = [f"during-{i}" for i in range(5)]
        for name in during:
            controller.report(name)  # soft state: reports still work
        wait_until(
            lambda: "writes are refused" in controller.output(), timeout=10, what="the outage log"
        )
        filler.unlink()
        wait_until(lambda: "work again" in controller.output(), timeout=10, what="saves to resume")
        controller.report("after")
        assert controller.cordon("after").status_code == 200
        assert controller.stop() == 0
        out = controller.output()
        assert "Traceback" not in out
        assert out.count("writes are refused") == 1, out

        controller.start()
        names = {row["name"] for row in controller.http.get("/v1/nodes").json()}
        assert {"before", "after", *during} <= names
        assert controller.stop() == 0


@pytest.mark.slow
def test_sigterm_during_disk_full_exits_0_with_a_logged_failure(controller: Controller) -> None:
    with tmpfs(controller.state_dir, "2m"):
        controller.start()
        fill(controller.state_dir)
        controller.report(f"late-{uuid.uuid4().hex[:6]}")
        assert controller.stop() == 0
        out = controller.output()
        assert "Traceback" not in out and "final save failed" in out


@pytest.mark.slow
def test_a_node_cordoned_right_after_its_first_report_survives_sigkill(
    controller: Controller,
) -> None:
    controller.start()
    controller.report("fresh")
    assert controller.cordon("fresh").status_code == 200  # well within the 1 s batch
    assert controller.stop(signal.SIGKILL) == -signal.SIGKILL

    controller.start()
    node = controller.http.get("/v1/nodes/fresh")
    assert node.status_code == 200, node.text
    assert node.json()["row"]["admin"]["flag"] == "cordoned"
    assert controller.http.post("/v1/nodes/fresh/uncordon").status_code == 200


# -- after a crash: a lost or damaged WAL is never a silent start (issue 25 item 6) ----


def acknowledged_writes_then_sigkill(controller: Controller) -> None:
    """Three cordons and a model, each answered 200, then a SIGKILL: all of it is
    in the WAL, none of it checkpointed into the file."""
    controller.start()
    for node in ("n1", "n2", "n3"):
        controller.report(node)
    for node in ("n1", "n2", "n3"):
        assert controller.cordon(node).status_code == 200
    models = {"models": [{"name": "m", "source": "x", "engine": "fake", "min_replicas": 0}]}
    assert controller.http.post("/v1/models", json=models).status_code == 200
    assert controller.stop(signal.SIGKILL) == -signal.SIGKILL
    assert (controller.state_dir / f"{STATE}-wal").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "truncated", "corrupted"])
def test_a_wal_lost_after_sigkill_stops_the_start_and_reset_state_starts_empty(
    controller: Controller, damage: str
) -> None:
    acknowledged_writes_then_sigkill(controller)
    wal = controller.state_dir / f"{STATE}-wal"
    size = wal.stat().st_size
    if damage == "deleted":
        wal.unlink()
    elif damage == "truncated":
        os.truncate(wal, size // 2)
    else:  # 64 bytes flipped in the last frame (the model): SQLite drops it silently
        data = bytearray(wal.read_bytes())
        data[size - 200 : size - 136] = bytes(b ^ 0xFF for b in data[size - 200 : size - 136])
        wal.write_bytes(bytes(data))

    err = start_fails(controller)
    assert len(err.strip().splitlines()) == 1, err
    assert str(controller.state_dir / STATE) in err and "behind its last committed write" in err
    assert "acknowledged writes are lost" in err and "--reset-state" in err and "backup" in err
    start_fails(controller)  # refused again: the refusal changed nothing

    controller.start("--reset-state")
    assert controller.http.get("/v1/nodes").json() == []
    aside = {p.name for p in controller.state_dir.iterdir() if ".reset-" in p.name}
    assert any(name.endswith(".revision") for name in aside), aside
    assert any(not name.endswith((".revision", "-wal", "-shm")) for name in aside), aside


@pytest.mark.slow
def test_a_state_file_deleted_while_running_stops_the_next_start(controller: Controller) -> None:
    controller.start()
    controller.report("n1")
    assert controller.cordon("n1").status_code == 200
    (controller.state_dir / STATE).unlink()
    assert controller.cordon("n1").status_code == 503
    assert controller.stop() == 0

    err = start_fails(controller)
    assert len(err.strip().splitlines()) == 1, err
    assert f"state file {controller.state_dir / STATE} is missing" in err
    assert "--reset-state" in err and "delete controller.sqlite3.revision" in err
    assert "first start" not in err
    assert not (controller.state_dir / STATE).exists()
