"""Slow clients against a real controller process with few file descriptors:
trickled headers and dribbled bodies are cut, new connections are served
after them, and the log stays small."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.controller.http.serve import _Once, connection_cap, quiet_fd_exhaustion
from tests.e2e.procs import ControllerProcess, wait_until

NOFILE = 256
CONTROLLER_ARGS = ("--idle-timeout", "1", "--body-timeout", "1")


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    log = tmp_path / "controller.log"

    def few_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    proc = ControllerProcess(
        log, state_dir=tmp_path / "s", args=CONTROLLER_ARGS, preexec_fn=few_fds
    )
    port = proc.port
    try:
        proc.start(ready=lambda: healthy(port), what="controller up")
        yield "127.0.0.1", port, log
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, log.read_text()[-2000:]
        proc.close()


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def open_slow(host: str, port: int, n: int, body: bool) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=5)
        if body:  # complete headers declaring 1 MiB, then a dribble
            s.sendall(
                b"POST /v1/agent/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1048576\r\n\r\n{"
            )
        else:  # a request line and the start of a header
            s.sendall(b"GET /v1/summary HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    return socks


RECEIVED: dict[int, bytes] = {}


def closed_by_server(s: socket.socket) -> bool:
    """The server closed it (maybe after a reply): reading reaches EOF."""
    s.settimeout(0.01)
    try:
        while True:
            chunk = s.recv(65536)
            RECEIVED[s.fileno()] = RECEIVED.get(s.fileno(), b"") + chunk
            if not chunk:
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True  # reset


@pytest.mark.slow
def test_slow_clients_are_cut_and_new_ones_served(controller: tuple[str, int, Path]) -> None:
    host, port, log = controller
    headers = open_slow(host, port, 150, body=False)
    bodies = open_slow(host, port, 150, body=True)
    slow = headers + bodies
    # Trickle one byte a quarter second on every one of them, as slowloris does.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        for s in slow:
            with contextlib.suppress(OSError):
                s.send(b"a")
        time.sleep(0.25)
    wait_until(
        lambda: all(closed_by_server(s) for s in slow), timeout=10, what="slow connections cut"
    )
    # A dribbled body gets its 408 (unless it arrived past the connection cap: 503).
    replies = [RECEIVED.get(s.fileno(), b"") for s in bodies]
    assert all(r.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for r in replies), replies[:3]
    assert any(r.startswith(b"HTTP/1.1 408") for r in replies)
    for s in slow:
        s.close()
    for _ in range(20):  # new connections are served again, one after another
        assert healthy(port)
    text = log.read_text()
    assert "Traceback" not in text
    assert len(text) < 20_000, text[-3000:]


def test_the_connection_cap_fits_the_descriptor_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10) == 10
    assert connection_cap(10**9) == soft - 64


async def test_out_of_descriptors_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    fresh = _Once("cannot accept connections: out of file descriptors")
    monkeypatch.setattr("llmgw.controller.http.serve._NO_FDS", fresh)
    old = loop.get_exception_handler()
    quiet_fd_exhaustion(loop)
    try:
        caplog.set_level(logging.WARNING)
        for _ in range(500):
            loop.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(24, "Too many open files"),
                }
            )
    finally:
        loop.set_exception_handler(old)
    lines = [r for r in caplog.records if "file descriptors" in r.getMessage()]
    assert len(lines) == 1
    assert fresh.count == 499
