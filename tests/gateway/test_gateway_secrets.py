"""SMG's admin key and the client keys never reach a command line, and the gateway
removes any SMG worker it did not put there (issue 25 item 5); smg.log holds no
ANSI escapes (issue 25 item 7). Real controller, agent, engine, gateway and SMG."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import Cluster, _stop, free_port, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, model, wait_cluster_ready
from tests.gateway.scripted import engine, wait_engine

pytestmark = pytest.mark.slow
CLIENT_KEY = "sk-acme-00000001"


class Cmdlines:
    """Every command line of the cluster's processes, read as fast as it can go."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.c.tagged_pids():
                with contextlib.suppress(OSError):
                    self.seen.add(Path(f"/proc/{pid}/cmdline").read_bytes())

    def __enter__(self) -> Cmdlines:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def smg_pid(gw: Gateway) -> int:
    assert gw.proc is not None
    children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
    (pid,) = [int(p) for p in children]
    return pid


def test_keys_stay_off_command_lines_and_foreign_workers_are_removed(cluster: Cluster) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="1xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply([model("chat")])
    keys = c.root / "keys"
    keys.write_text(f"acme {CLIENT_KEY}\n")
    gw = Gateway(c, "--api-key-file", str(keys))
    key = {"Authorization": f"Bearer {CLIENT_KEY}"}
    with Cmdlines(c) as cmdlines:
        gw.start()
        gw.wait_serving("chat", headers=key)
        # A restart of SMG is a start too.
        _stop_pid(smg_pid(gw))
        time.sleep(1)
        gw.wait_serving("chat", headers=key)
    assert not [x for x in cmdlines.seen if CLIENT_KEY.encode() in x]
    secrets = gw.work / "smg-secrets.json"
    admin_key = json.loads(secrets.read_text())["control_plane_api_keys"][0].rsplit(":", 1)[1]
    assert cmdlines.seen and any(b"smg_child" in x for x in cmdlines.seen)
    for line in cmdlines.seen:
        assert CLIENT_KEY.encode() not in line and admin_key.encode() not in line, line
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert stat.S_IMODE(gw.work.stat().st_mode) == 0o700

    # A local process that got hold of the admin key adds itself as a worker: removed.
    port = free_port()
    rogue = engine("chat", port, c.env())
    try:
        wait_engine(port)
        admin = {"Authorization": f"Bearer {admin_key}"}
        added = httpx.post(
            f"{gw.url}/workers", json={"url": f"http://127.0.0.1:{port}"}, headers=admin
        )
        assert added.status_code == 202, added.text

        def workers() -> list[str]:
            r = httpx.get(f"{gw.url}/workers", headers=admin, timeout=5)
            return [w["url"] for w in r.json()["workers"]]

        wait_until(
            lambda: f"http://127.0.0.1:{port}" not in workers(),
            timeout=20,
            what="the foreign worker removed",
            diagnose=gw.logs,
        )
        assert len(workers()) == 1
        assert gw.log.read_text().count("was not added by llmgw") == 1
    finally:
        _stop(rogue, signal.SIGKILL, timeout=5)
    smg_log = (gw.work / "smg.log").read_bytes()
    assert smg_log and b"\x1b" not in smg_log


def _stop_pid(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_the_smg_internals_smg_child_uses_still_exist() -> None:
    """smg_child hands the keys to SMG's launcher through these (smg 1.13)."""
    from smg.launch_router import launch_router, parse_router_args
    from smg.router_args import RouterArgs

    assert callable(launch_router)
    args = parse_router_args(["--host", "127.0.0.1", "--port", "1"])
    assert RouterArgs._parse_control_plane_api_keys(["a:b:admin:k"]) == [("a", "b", "k", "admin")]
    assert RouterArgs._parse_tenant_api_keys(["t:k"]) == [("t", "k")]
    args.control_plane_api_keys = []
    args.tenant_api_keys = []
