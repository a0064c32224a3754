"""Several controllers on one PostgreSQL (issue 13, items 2-4), with real
controller processes:

- one leads, the other follows and names it (503 body and header, /healthz);
- a paused leader (SIGSTOP past its TTL) whose write was already under way when
  it paused is refused by the fence after SIGCONT, and steps down by itself;
- a clean stop (SIGTERM) hands the lease over at once.

SIGKILL of the leader (steady, in a burst of writes, mid-drain) is
test_failover_matrix_e2e.py.
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
    # Answered as it stepped down (not at the end of its wait): before it has read who
    # leads now, so it names no leader, never itself; a client asks the others.
    assert polled and polled[0].status_code == 503, polled
    assert polled[0].headers.get("X-LLMGW-Leader") in (None, c.urls[1]), polled[0].headers
    assert c.health(1) == {**c.health(1), "role": "leader", "epoch": epoch + 1}  # type: ignore[dict-item]
    late = a.post("/v1/nodes/n1/cordon", json={"reason": "too late"})
    assert late.status_code == 503 and late.headers["X-LLMGW-Leader"] == c.urls[1]
    assert b.get("/v1/nodes/n1").json()["row"]["admin"]["flag"] == "none", "nothing written"
    assert "no longer the leader" in (c.root / "controller-0.log").read_text()
    # The new leader takes writes.
    assert b.post("/v1/nodes/n1/cordon", json={"reason": "by the leader"}).status_code == 200
    with pytest.raises(httpx.HTTPStatusError):
        a.get("/v1/summary").raise_for_status()


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
