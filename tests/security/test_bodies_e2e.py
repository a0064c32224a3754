"""Compressed and unauthenticated bodies against a real controller process (issue 25
item 2): a gzip body is refused before anything inflates it, an unauthenticated
body is never read, and a connection closed early says `Connection: close`."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import Cluster

pytestmark = pytest.mark.slow
ADMIN, NODE = "admin-secret", "node-secret"
# 1 MiB of gzip that inflates to 256 MiB: what aiohttp inflated on the loop before.
BOMB = gzip.compress(b"\0" * (256 << 20), compresslevel=9)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster")
    (tmp_path / "admins").write_text(f"alice {ADMIN}\n")
    (tmp_path / "agents").write_text(f"gpu01 {NODE}\n")
    try:
        c.start_controller(
            "--admin-token-file",
            str(tmp_path / "admins"),
            "--agent-token-file",
            str(tmp_path / "agents"),
        )
        yield c
    finally:
        c.close()


def rss_mib(c: Cluster) -> float:
    assert c.controller is not None
    for line in Path(f"/proc/{c.controller.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def raw(c: Cluster, head: bytes, body: bytes, declared: int | None = None) -> tuple[bytes, float]:
    """Send a request (saying its body is `declared` bytes long); the reply, and how
    long it took."""
    with socket.create_connection(("127.0.0.1", c.port), timeout=20) as s:
        t0 = time.monotonic()
        length = len(body) if declared is None else declared
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % length)
        with contextlib.suppress(OSError):  # closed before the whole body was sent: fine
            s.sendall(body)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply, time.monotonic() - t0


@pytest.mark.parametrize("token", [None, NODE], ids=["unauthenticated", "node-credential"])
def test_gzip_bodies_are_refused_uninflated(cluster: Cluster, token: str | None) -> None:
    c = cluster
    before = rss_mib(c)
    auth = b"Authorization: Bearer %s\r\n" % token.encode() if token else b""
    head = (
        b"POST /v1/agent/report HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"Content-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\n"
    )
    for _ in range(10):
        reply, took = raw(c, head, BOMB)
        status = int(reply.split(b" ", 2)[1])
        assert status == 415, reply  # refused before auth, before anything reads it
        assert b"\r\nConnection: close\r\n" in reply, reply
        assert took < 2, took
    assert rss_mib(c) - before < 40, (before, rss_mib(c))
    assert c.http.get("/healthz").status_code == 200
    nodes = httpx.get(f"{c.url}/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"})
    assert nodes.json() == []  # nothing was taken


def test_an_unauthenticated_body_is_not_read_and_the_connection_closes(cluster: Cluster) -> None:
    """A body still coming when the 401 is sent: the reply says `Connection: close`
    (before, the connection was closed after a reply that promised keep-alive, and
    the client's next request on it was reset)."""
    c = cluster
    head = b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for declared in (1000, 900_000):
        reply, took = raw(c, head, b"x" * 100, declared=declared)
        assert reply.startswith(b"HTTP/1.1 401"), reply
        assert b"\r\nConnection: close\r\n" in reply, reply
        assert took < 1, took  # answered at once, not after reading the body


@pytest.mark.parametrize(
    "header",
    [b"X-Probe: a\x01b\r\n", b"User-Agent: \x1b[31mred\r\n", b"Bad Name: x\r\n"],
    ids=["control-character", "escape", "space-in-name"],
)
def test_a_header_aiohttp_cannot_parse_is_a_json_400_logged_once_a_minute(
    cluster: Cluster, header: bytes
) -> None:
    """No token needed: before, each was an ERROR traceback in the log (551 B) and
    a plain-text 400."""
    c = cluster
    head = b"GET /v1/summary HTTP/1.1\r\nHost: x\r\n" + header
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", c.port), timeout=10) as s:
            s.sendall(head + b"\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        status, _, rest = reply.partition(b"\r\n")
        assert status.split(b" ")[1] == b"400", reply
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert b"Content-Type: application/json" in headers, reply
        error = json.loads(body)["error"]
        assert error.startswith("bad request: ") and "\x1b" not in error, error
    assert c.http.get("/healthz").status_code == 200
    log = (c.root / "controller.log").read_text(errors="replace")
    assert "Traceback" not in log and "Error handling request" not in log, log[-2000:]
    said = [line for line in log.splitlines() if "cannot be parsed" in line]
    assert len(said) == 1, said
