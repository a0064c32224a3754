"""Slow request bodies at the gateway (issue 25 item 7), against a real gateway and
its SMG. SMG reads the body itself and bounds it only by its request timeout (no
bound of its own on reading a body), which `--request-timeout` now sets; a client
without a key is refused before its body is read, so only a key holder can be slow."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import Cluster, free_port, wait_until
from tests.gateway.gwprocs import Gateway

pytestmark = pytest.mark.slow
KEY = "client-key-1"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway with client keys and a 3 s request timeout; no controller answers
    (SMG serves with no workers, which is all a body needs)."""
    cluster = Cluster(tmp_path / "cluster")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    keys.chmod(0o600)
    gw = Gateway(
        cluster,
        "--api-key-file",
        str(keys),
        "--request-timeout",
        "3",
        controller=f"http://127.0.0.1:{free_port()}",
    )
    gw.start()

    def answers() -> bool:  # the front door answers 503 until SMG does
        try:
            return httpx.get(f"{gw.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, timeout=40, what="SMG to answer", diagnose=gw.logs)
        yield gw
    finally:
        gw.stop()
        cluster.close()


def trickle(gw: Gateway, key: str | None, seconds: float) -> tuple[bytes, float]:
    """POST a chat body declared 100,000 bytes long, one byte every 0.2 s; the
    reply, and when it came (or `seconds` with no reply)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: 100000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gw.port), timeout=0.2) as s:
        t0 = time.monotonic()
        s.sendall(head.encode() + b'{"model": "m", "messages": [')
        reply = b""
        while time.monotonic() - t0 < seconds:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                try:
                    s.sendall(b" ")
                except OSError:
                    break
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            reply += chunk
        return reply, time.monotonic() - t0


def test_a_slow_body_with_a_key_gets_408_after_the_request_timeout(gateway: Gateway) -> None:
    reply, took = trickle(gateway, KEY, seconds=20)
    assert reply.startswith(b"HTTP/1.1 408"), (reply, took)
    assert b"request_body_timeout" in reply
    assert 2.5 < took < 10, took


def test_a_slow_body_without_a_key_is_refused_before_it_is_read(gateway: Gateway) -> None:
    reply, took = trickle(gateway, None, seconds=20)
    assert reply.startswith(b"HTTP/1.1 401"), (reply, took)
    assert took < 2, took


def test_what_answers_without_a_key_is_what_readme_says(gateway: Gateway) -> None:
    """/health answers anyone; with client keys, /v1/models wants one as every serving
    route does (issue 34: the gateway's front door, before SMG, which would list the
    models to anyone)."""
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    models = httpx.get(f"{gateway.url}/v1/models")
    assert models.status_code == 401, models.text
    keyed = httpx.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert keyed.status_code != 401, keyed.text
    for path in ("/v1/chat/completions", "/v1/completions"):
        refused = httpx.post(f"{gateway.url}{path}", json={"model": "m", "prompt": "x"})
        assert refused.status_code == 401, (path, refused.text)
