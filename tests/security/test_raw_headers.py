"""Header bytes that are not UTF-8 are a 400/401, never a 500 (raw sockets:
an HTTP client library would refuse to send them)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient

from tests.security.conftest import ADMIN, auth, views


async def raw_request(client: TestClient, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        length = b"Content-Length: %d\r\n" % len(body)
        writer.write(head + length + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    status = int(reply.split(b" ", 2)[1])
    return status, reply


@pytest.mark.parametrize("value", [b"Bearer \xff", b"Bearer \xc3(", b"\xff\xfe"])
async def test_an_authorization_header_that_is_not_text_is_401(
    client: TestClient, value: bytes
) -> None:
    head = b"GET /v1/summary HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
    status, reply = await raw_request(client, head)
    assert status == 401, reply
    assert b'"error"' in reply


async def test_a_user_header_that_is_not_text_is_400_and_changes_nothing(
    client: TestClient,
) -> None:
    before = await views(client)
    token = auth(ADMIN)["Authorization"].encode()
    head = (
        b"POST /v1/nodes/gpu01/cordon HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: " + token + b"\r\nX-LLMGW-User: \xff\r\n"
        b"Content-Type: application/json\r\n"
    )
    status, reply = await raw_request(client, head, b'{"reason": "x"}')
    assert status == 400, reply
    assert b"X-LLMGW-User" in reply
    assert await views(client) == before


@pytest.mark.parametrize(
    "target", [b"/v1/nodes/%ff", b"/v1/nodes/\xff", b"/v1/nodes/%ff/cordon", b"/v1/models/%c3%28"]
)
async def test_a_path_that_is_not_text_is_never_a_500(client: TestClient, target: bytes) -> None:
    before = await views(client)
    token = auth(ADMIN)["Authorization"].encode()
    method = b"POST" if target.endswith(b"cordon") else b"GET"
    head = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + token + b"\r\n"
    status, reply = await raw_request(
        client, head, b'{"reason": "x"}' if method == b"POST" else b""
    )
    assert 400 <= status < 500, reply
    assert await views(client) == before
