"""Real `llmgw agent` processes against a real `llmgw controller` on loopback.

The storage rules end to end: per fabric, `nodes_with_weights` and
`models_present` in `llmgw ctl status --json` count only complete weights,
count a node told nothing like a node that found nothing, and count one shared
filer seen by many nodes as what it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.sample_models import write_model
from tests.e2e.procs import ControllerProcess, clean_env, llmgw

pytestmark = pytest.mark.slow


def mountinfo(path: Path, mounts: list[tuple[Path, str, str]]) -> Path:
    lines = ["22 1 252:1 / / rw,relatime - ext4 /dev/sda1 rw"]
    lines += [
        f"{30 + i} 22 0:{40 + i} / {p} rw - {t} {src} rw" for i, (p, t, src) in enumerate(mounts)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def half_download(directory: Path) -> None:
    """A download in progress: config and one shard there, the other still .incomplete."""
    files = write_model(directory, shards=2)
    files[1].rename(files[1].with_name(files[1].name + ".incomplete"))


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[str]:
    proc = ControllerProcess(
        tmp_path / "controller.log",
        state_dir=tmp_path / "controller",
        args=["--log-level", "warning"],
    )
    try:
        proc.start()
        yield proc.url
        proc.stop()
    finally:
        proc.close()


def status(url: str) -> dict[str, Any]:
    out = subprocess.run(
        llmgw("ctl", "--controller", url, "status", "--json"),
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
        check=True,
    ).stdout
    return dict(json.loads(out))


def test_weights_per_fabric_end_to_end(tmp_path: Path, controller: str) -> None:
    # ib-x: nothing usable anywhere.
    #   x1 is not told to look; x2 looks in an empty directory; x3 holds only
    #   a half-finished download and an empty model directory.
    empty = tmp_path / "x2" / "models"
    empty.mkdir(parents=True)
    x3 = tmp_path / "x3" / "models"
    half_download(x3 / "org" / "downloading")
    (x3 / "org" / "empty-model").mkdir(parents=True)

    # ib-y: one NFS filer seen by three nodes, with two models and a download
    # still in progress.
    filer = tmp_path / "filer"
    write_model(filer / "org" / "alpha", shards=3)
    write_model(filer / "beta")
    half_download(filer / "org" / "gamma")

    # ib-z: local disks. z1 holds alpha (a model the filer in ib-y also has)
    # and delta; z2 holds a truncated copy of delta.
    z1 = tmp_path / "z1" / "models"
    write_model(z1 / "org" / "alpha")
    write_model(z1 / "delta", shards=2)
    z2 = tmp_path / "z2" / "models"
    files = write_model(z2 / "delta", shards=2, tensor_bytes=4096)
    os.truncate(files[0], files[0].stat().st_size - 100)

    tables = tmp_path / "mountinfo"
    tables.mkdir()
    nfs = mountinfo(tables / "nfs", [(filer, "nfs4", "filer1:/export/models")])
    local = mountinfo(tables / "local", [(tmp_path, "xfs", "/dev/nvme0n1")])

    nodes: dict[str, tuple[str, list[str]]] = {
        "x1": ("ib-x", []),
        "x2": ("ib-x", ["--storage", str(empty)]),
        "x3": ("ib-x", ["--storage", str(x3)]),
        "y1": ("ib-y", ["--storage", str(filer), "--mountinfo", str(nfs)]),
        "y2": ("ib-y", ["--storage", str(filer), "--mountinfo", str(nfs)]),
        "y3": ("ib-y", ["--storage", str(filer), "--mountinfo", str(nfs)]),
        "z1": ("ib-z", ["--storage", str(z1), "--mountinfo", str(local)]),
        "z2": ("ib-z", ["--storage", str(z2), "--mountinfo", str(local)]),
    }
    agents = {
        name: subprocess.Popen(
            llmgw(
                "agent",
                "--controller",
                controller,
                "--node",
                name,
                "--fabric",
                fabric,
                "--interval",
                "0.5",
                "--fake-gpus",
                "2xH100-SXM-80GB",
                "--state-dir",
                str(tmp_path / "state" / name),
                *extra,
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=clean_env(),
            text=True,
        )
        for name, (fabric, extra) in nodes.items()
    }
    expected = {"ib-x": (3, 0, 0), "ib-y": (3, 3, 2), "ib-z": (2, 1, 2)}

    def counts(summary: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
        return {
            f["fabric"]: (f["nodes"], f["nodes_with_weights"], f["models_present"])
            for f in summary["fabrics"]
        }

    try:
        # Wait until every node is ready and has reported a finished storage
        # scan (the first report may go out before a slow first scan ends).
        deadline = time.monotonic() + 60
        while True:
            summary = status(controller)
            if summary["nodes"]["ready"] == len(nodes) and counts(summary) == expected:
                break
            dead = {n: p.returncode for n, p in agents.items() if p.poll() is not None}
            assert not dead, f"agents exited: {dead}"
            if time.monotonic() > deadline:
                break  # the assertions below say what is wrong
            time.sleep(0.3)
    finally:
        for proc in agents.values():
            proc.send_signal(signal.SIGTERM)
        errors = {n: p.communicate(timeout=15)[1] for n, p in agents.items()}

    assert summary["nodes"]["ready"] == len(nodes), summary["nodes"]
    assert all(p.returncode == 0 for p in agents.values()), errors
    fabrics = {f["fabric"]: f for f in summary["fabrics"]}
    assert set(fabrics) == {"ib-x", "ib-y", "ib-z"}

    # A node told nothing counts exactly like nodes that looked and found nothing.
    x = fabrics["ib-x"]
    assert (x["nodes"], x["nodes_with_weights"], x["models_present"]) == (3, 0, 0)

    # One filer, three readers: three nodes with weights, two models, one copy each.
    y = fabrics["ib-y"]
    assert (y["nodes"], y["nodes_with_weights"], y["models_present"]) == (3, 3, 2)
    copies = {c["model"]: c for c in y["copies"]}
    assert set(copies) == {"org/alpha", "beta"}  # not the half-finished org/gamma
    assert copies["org/alpha"]["shared_copies"] == 1
    assert copies["org/alpha"]["local_copies"] == 0
    assert copies["org/alpha"]["nodes"] == 3

    # Local disks: a truncated copy is no copy.
    z = fabrics["ib-z"]
    assert (z["nodes"], z["nodes_with_weights"], z["models_present"]) == (2, 1, 2)
    zcopies = {c["model"]: c for c in z["copies"]}
    assert zcopies["delta"]["local_copies"] == 1 and zcopies["delta"]["shared_copies"] == 0
