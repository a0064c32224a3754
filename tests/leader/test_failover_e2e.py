"""Several controllers on one PostgreSQL (issue 13, items 2-4), with real
controller, agent and fake engine processes and `llmgw ctl`:

- one leads, the other follows and names it (503 body and header, /healthz);
- SIGKILL the leader: the follower takes over within the lease TTL with the
  next epoch; cordons and the model applied before the kill are there, no node
  flips unreachable, agents given both URLs keep reporting, no replica is
  placed twice, and a drain deadline set before the kill still fires;
- a paused leader (SIGSTOP past its TTL) whose write was already under way when
  it paused is refused by the fence after SIGCONT, and steps down by itself.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw import api
from llmgw.sync_client import SyncAdminClient
from llmgw.wire import ModelSpec
from tests.e2e.procs import wait_until
from tests.leader.ha import LEASE_TTL_S, HaCluster

pytestmark = pytest.mark.slow

REPORT = {
    "agent_version": "test",
    "boot_id": "b",
    "interval_s": 5.0,
    "gpus": [],
    "fabrics": ["ib-a"],
    "storage_configured": False,
    "storage": [],
    "replicas": [],
}
# Fills one node: with the other nodes cordoned a stand-in can never be placed, so
# a drain of its node waits for its deadline.
MODEL = {
    "name": "m",
    "source": "org/m",
    "min_replicas": 1,
    "gpus_per_shard": 2,
    "engine": "fake",
    "engine_args": ["--load-seconds", "0.2", "--host", "127.0.0.1"],
}


@pytest.fixture
def ha(tmp_path: Path, pg_url: str) -> Iterator[HaCluster]:
    c = HaCluster(tmp_path / "ha", pg_url)
    try:
        c.start(0, "--reconcile-interval", "0.2", role="leader")
        c.start(1, role="follower")
        yield c
    finally:
        c.close()


def test_one_leads_and_the_follower_names_it(ha: HaCluster) -> None:
    a, b = ha.clients
    lead, follow = ha.health(0), ha.health(1)
    assert lead is not None and follow is not None
    assert lead["role"] == "leader" and lead["leader"] == ha.urls[0]
    assert follow == {**follow, "ok": True, "role": "follower", "leader": ha.urls[0]}
    assert follow["epoch"] == lead["epoch"] >= 1
    a.post("/v1/agent/report", json={**REPORT, "node": "n1"}).raise_for_status()
    for method, path, body in (
        ("GET", "/v1/summary", None),
        ("GET", "/v1/nodes/n1", None),
        ("POST", "/v1/nodes/n1/cordon", {"reason": "to a follower"}),
        ("POST", "/v1/agent/report", {**REPORT, "node": "n2"}),
        ("GET", "/no/such/path", None),
    ):
        resp = b.request(method, path, json=body)
        assert resp.status_code == 503, (path, resp.text)
        assert resp.json() == {"error": "not the leader", "leader": ha.urls[0]}
        assert resp.headers["X-LLMGW-Leader"] == ha.urls[0]
    rows = {r["name"]: r for r in a.get("/v1/nodes").json()}
    assert set(rows) == {"n1"} and rows["n1"]["admin"]["flag"] == "none", "nothing changed"
    assert "llmgw_leader 0.0" in b.get("/metrics").text  # a follower's own metrics
    assert "llmgw_leader 1.0" in a.get("/metrics").text


def ready_nodes(c: HaCluster, n: int) -> None:
    def ready() -> bool:
        s = c.leader_get("/v1/summary")
        return s is not None and s["nodes"]["total"] == n and s["nodes"]["unreachable"] == 0

    wait_until(ready, timeout=30, what=f"{n} nodes reporting", diagnose=c.logs)


def replicas(c: HaCluster) -> dict[str, Any]:
    return {r["id"]: r for r in c.get("/v1/replicas")}


def test_sigkill_of_the_leader_keeps_every_promise(ha: HaCluster) -> None:
    c = ha
    for name in ("n1", "n2", "n3"):
        c.start_agent(name)
    ready_nodes(c, 3)
    # ctl goes to the leader whatever the order of the URLs.
    c.ctl("cordon", "n1", "--reason", "e2e: before the kill")
    c.url = ",".join(reversed(c.urls))
    c.ctl("cordon", "n3", "--reason", "e2e: via the follower's URL first")
    c.url = ",".join(c.urls)
    c.apply([MODEL])

    def serving() -> dict[str, Any] | None:
        reps = c.leader_get("/v1/replicas") or []
        return reps[0] if len(reps) == 1 and reps[0]["state"] == "ready" else None

    placed = wait_until(serving, timeout=30, what="a ready replica", diagnose=c.logs)
    assert [s["node"] for s in placed["shards"]] == ["n2"]
    c.ctl("drain", "n2", "--reason", "e2e: PSU", "--force-after", str(LEASE_TTL_S + 5))
    force_at = c.get("/v1/nodes/n2")["row"]["admin"]["force_at"]
    epoch = c.health(0)["epoch"]  # type: ignore[index]

    killed_at = time.monotonic()
    c.kill(0)
    assert c.wait_leader(timeout=LEASE_TTL_S + 10) == 1
    took = time.monotonic() - killed_at
    assert took < LEASE_TTL_S + 5, f"takeover took {took:.1f} s"
    health = c.health(1)
    assert health is not None and health["epoch"] == epoch + 1 and health["leader"] == c.urls[1]

    # Everything acknowledged before the kill is there; nothing is placed twice.
    rows = {r["name"]: r["admin"] for r in c.get("/v1/nodes")}
    assert rows["n1"]["flag"] == "cordoned" and rows["n3"]["flag"] == "cordoned"
    assert rows["n2"]["flag"] == "draining" and rows["n2"]["force_at"] == force_at
    assert [m["spec"]["name"] for m in c.get("/v1/models")] == ["m"]
    assert set(replicas(c)) == {placed["id"]}

    # Agents given both URLs report to the new leader; no node flips unreachable,
    # through the new leader's first grace period and past it.
    until = time.monotonic() + 3 * 0.5 + 5 + 2
    while time.monotonic() < until:
        summary = c.get("/v1/summary")
        assert summary["nodes"]["unreachable"] == 0, summary
        assert summary["nodes"]["total"] == 3
        time.sleep(0.3)
    ages = {r["name"]: r["report_age_s"] for r in c.get("/v1/nodes")}
    assert all(age is not None and age < 3 for age in ages.values()), ages

    # The drain's deadline, set before the kill, is enforced by the new leader.
    def drained() -> dict[str, Any] | None:
        detail = c.leader_get("/v1/nodes/n2")
        return detail if detail and detail["row"]["admin"]["drained"] else None

    detail = wait_until(drained, timeout=30, what="the deadline to force the drain")
    events = {e["action"]: e for e in detail["history"]}
    assert events["drain forced (deadline)"]["at"] >= force_at
    wait_until(lambda: not c.engine_pids(), timeout=20, what="the engine to stop")
    # ctl with both URLs works with the first one dead.
    out = c.ctl("uncordon", "n1")
    assert "n1" in out
    assert {r["name"]: r["admin"]["flag"] for r in c.get("/v1/nodes")}["n1"] == "none"


def _slow_write(port: int, node: str) -> tuple[socket.socket, bytes]:
    """A cordon whose headers are sent now and whose body later: the handler is
    past every check the leader makes on arrival, waiting for the body."""
    body = json.dumps({"reason": "written by a paused leader"}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        (
            f"POST /v1/nodes/{node}/cordon HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body[:1]
    )
    return sock, body[1:]


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_a_paused_leader_cannot_write_and_steps_down(ha: HaCluster) -> None:
    c = ha
    a, b = c.clients
    a.post("/v1/agent/report", json={**REPORT, "node": "n1"}).raise_for_status()
    time.sleep(1.5)  # first sightings are saved within a second
    epoch = c.health(0)["epoch"]  # type: ignore[index]
    # A gateway's long poll, waiting for a change when the leader pauses: once it
    # returns, the paused leader must not answer it as the fleet's.
    cursor = a.get("/v1/endpoints").json()["cursor"]
    polled: list[httpx.Response] = []
    poll = threading.Thread(
        target=lambda: polled.append(
            httpx.get(
                f"{c.urls[0]}/v1/endpoints",
                params={"since": cursor, "wait": "10"},
                timeout=30,
            )
        )
    )
    poll.start()
    sock, rest = _slow_write(c.ports[0], "n1")
    time.sleep(0.3)  # the handler now waits for the body
    c.signal(0, signal.SIGSTOP)
    try:
        assert c.wait_leader(timeout=LEASE_TTL_S + 10) == 1
    finally:
        c.signal(0, signal.SIGCONT)
    sock.sendall(rest)
    status, body = _answer(sock)
    sock.close()
    assert status == 503, body
    assert body["error"] == "not the leader" and body["leader"] == c.urls[1]
    assert "state not stored" in body["why"], "refused by the store's fence"

    def stepped_down() -> bool:
        h = c.health(0)
        return h is not None and h["role"] == "follower" and h["leader"] == c.urls[1]

    wait_until(stepped_down, timeout=10, what="the old leader to step down", diagnose=c.logs)
    poll.join(30)
    assert polled and polled[0].status_code == 503, polled
    assert polled[0].headers["X-LLMGW-Leader"] == c.urls[1]
    assert c.health(1) == {**c.health(1), "role": "leader", "epoch": epoch + 1}  # type: ignore[dict-item]
    late = a.post("/v1/nodes/n1/cordon", json={"reason": "too late"})
    assert late.status_code == 503 and late.headers["X-LLMGW-Leader"] == c.urls[1]
    assert b.get("/v1/nodes/n1").json()["row"]["admin"]["flag"] == "none", "nothing written"
    assert "no longer the leader" in (c.root / "controller-0.log").read_text()
    # The new leader takes writes.
    assert b.post("/v1/nodes/n1/cordon", json={"reason": "by the leader"}).status_code == 200
    with pytest.raises(httpx.HTTPStatusError):
        a.get("/v1/summary").raise_for_status()


def test_sigkill_during_a_burst_of_cordons_and_applies_loses_and_doubles_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    """Three controllers; one client (as ctl, given every URL) writes without pause
    while the leader is killed. Every acknowledged write is stored exactly once; a
    refused one (in flight at the kill) at most once; exactly one leader throughout."""
    c = HaCluster(tmp_path / "ha3", pg_url, controllers=3)
    nodes = [f"n{i}" for i in range(10)]
    acked: list[tuple[int, str]] = []
    refused: list[tuple[int, str]] = []
    stop = threading.Event()

    def burst() -> None:
        with SyncAdminClient(c.urls) as admin:
            i = 0
            while not stop.is_set():
                what = f"m{i}" if i % 4 == 3 else nodes[i % len(nodes)]
                try:
                    if what.startswith("m"):
                        admin(api.apply_models([ModelSpec.model_validate({**MODEL, "name": what})]))
                    else:
                        admin(api.cordon(what, f"burst {i}"))
                    acked.append((i, what))
                except (api.ControllerError, api.ControllerUnreachable):
                    refused.append((i, what))
                i += 1
                time.sleep(0.03)

    try:
        c.start(0, role="leader")
        c.start(1, role="follower")
        c.start(2, role="follower")
        for name in nodes:
            c.clients[0].post("/v1/agent/report", json={**REPORT, "node": name}).raise_for_status()
        time.sleep(1.5)  # first sightings are saved within a second
        epoch = c.health(0)["epoch"]  # type: ignore[index]
        writer = threading.Thread(target=burst)
        writer.start()
        try:
            wait_until(lambda: len(acked) >= 20, timeout=20, what="writes before the kill")
            c.kill(0)
            new = c.wait_leader(timeout=LEASE_TTL_S + 10)
            before = len(acked)
            wait_until(lambda: len(acked) >= before + 20, timeout=20, what="writes after")
        finally:
            stop.set()
            writer.join(30)
        assert new in (1, 2) and c.leaders() == [new]
        assert c.health(new)["epoch"] == epoch + 1  # type: ignore[index]
        models = [m["spec"]["name"] for m in c.get("/v1/models")]
        assert len(models) == len(set(models))
        stored: dict[str, list[str]] = {}
        for name in nodes:
            history = c.get(f"/v1/nodes/{name}")["history"]
            stored[name] = [e["reason"] for e in history if e["action"] == "cordon"]
        for i, what in acked:
            if what.startswith("m"):
                assert what in models, f"acknowledged apply {what} lost"
            else:
                assert stored[what].count(f"burst {i}") == 1, (i, what, stored[what])
        for i, what in refused:
            if not what.startswith("m"):
                assert stored[what].count(f"burst {i}") <= 1, (i, what)
        assert refused, "the kill was inside the burst"
    finally:
        c.close()


def test_a_clean_stop_hands_over_at_once(tmp_path: Path, pg_url: str) -> None:
    """SIGTERM: the leader's last saves, then it releases the lease, so a follower
    leads within a poll, long before the (here 60 s) TTL would have run out."""
    c = HaCluster(tmp_path / "ha", pg_url)
    try:
        c.start(0, "--lease-ttl", "60", role="leader")
        c.start(1, role="follower")
        c.clients[0].post("/v1/agent/report", json={**REPORT, "node": "n1"}).raise_for_status()
        stopped_at = time.monotonic()
        c.signal(0, signal.SIGTERM)
        assert c.procs[0].wait(15) == 0
        assert c.wait_leader(timeout=10) == 1
        assert time.monotonic() - stopped_at < 10
        assert [r["name"] for r in c.get("/v1/nodes")] == ["n1"], "the final save"
    finally:
        c.close()
