"""A client that goes away in the middle of its body is nobody's error: the
controller logs no traceback for it and goes on serving."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_body_cut_short_logs_no_traceback(
    aiohttp_server: object, tmp_path: Path, caplog: pytest.LogCaptureFixture, reset: bool
) -> None:
    server: TestServer = await aiohttp_server(create_app(ControllerSettings(state_dir=tmp_path)))  # type: ignore[operator]
    caplog.set_level(logging.DEBUG)
    for path in ("/v1/models", "/v1/agent/report", "/v1/nodes/gpu1/cordon"):
        sock = socket.create_connection(("127.0.0.1", server.port))
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"models": [')
        await asyncio.sleep(0.1)
        if reset:  # RST instead of FIN, as a killed client's kernel sends
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        await asyncio.sleep(0.2)
    client = await asyncio.open_connection("127.0.0.1", server.port)
    reader, writer = client
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 200")
    writer.close()
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
