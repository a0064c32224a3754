"""The front's client to SMG (gateway/upstream.py) against a scripted HTTP/1.1 server:
every way an answer can be framed, connections kept and reused, what may be sent
again (nothing of an answer came) and what may not (an answer broke off), a slow
reader pausing the reads, and a request given up closing its connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmgw.gateway import upstream as upstream_module
from llmgw.gateway.upstream import Cut, NotSent, Upstream

pytestmark = pytest.mark.timeout(30)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Runs `script` on each connection; counts connections and records requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # a connection ended from the client's side
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


@contextlib.asynccontextmanager
async def client(base: str) -> AsyncIterator[Upstream]:
    up = Upstream(lambda: base)
    try:
        yield up
    finally:
        await up.close()


async def test_a_length_answer_a_chunked_one_and_the_request_as_sent() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello")
            await srv.read_request(reader)
            writer.write(
                b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: text/event-stream; charset=utf-8\r\n\r\n"
                b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            )
            await writer.drain()

    async with Server(script) as srv, client(srv.base) as up:
        headers = [("Authorization", "Bearer k"), ("X-Name", "é")]
        async with await up.request("POST", "/v1/x?q=%2F", headers, b'{"a":1}') as answer:
            assert (answer.status, answer.reason) == (200, "OK")
            assert answer.headers.getall("x-a") == ["1", "2"]
            assert answer.content_length == 5
            assert await answer.read() == b"hello"
        async with await up.request("GET", "/v1/models", [], None) as answer:
            assert (answer.status, answer.content_length) == (201, None)
            assert answer.content_type == "text/event-stream"
            assert [c async for c in answer.chunks()] == [b"abc", b"de"]
        assert srv.connections == 1  # kept alive and used again
        first, second = srv.requests
        assert first.startswith(b"POST /v1/x?q=%2F HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nAuthorization: Bearer k\r\n" in first
        assert "X-Name: é".encode() in first
        assert first.endswith(b'Content-Length: 7\r\n\r\n{"a":1}')
        assert b"Content-Length" not in second  # a GET without a body says none


async def test_an_answer_ended_by_its_connection_is_whole_and_the_connection_not_kept() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    async with Server(script) as srv, client(srv.base) as up:
        for _ in range(2):
            async with await up.request("GET", "/", [], None) as answer:
                assert await answer.read() == b"all of it"
        assert srv.connections == 2


async def test_a_kept_connection_the_server_closed_is_not_sent_on() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()  # then closes: a keep-alive that SMG ends

    async with Server(script) as srv, client(srv.base) as up:
        async with await up.request("GET", "/", [], None) as answer:
            assert await answer.read() == b"ok"
        await asyncio.sleep(0.1)  # the close reaches the pooled connection
        async with await up.request("GET", "/", [], None) as answer:
            assert await answer.read() == b"ok"
        assert srv.connections == 2


async def test_nothing_answered_is_not_sent_and_a_broken_answer_is_cut() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)  # then closes without a word

    async with Server(silent) as srv, client(srv.base) as up:
        with pytest.raises(NotSent):
            await up.request("POST", "/", [], b"x")

    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()

    async with Server(broken) as srv, client(srv.base) as up:
        answer = await up.request("POST", "/", [], b"x")
        with pytest.raises(Cut):
            await answer.read()
        answer.release()

    async def not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async with Server(not_http) as srv, client(srv.base) as up:
        with pytest.raises(Cut):
            await up.request("GET", "/", [], None)


async def test_no_server_is_not_sent() -> None:
    async with Server(lambda r, w: asyncio.sleep(0)) as srv:
        base = srv.base
    async with client(base) as up:
        with pytest.raises(NotSent):
            await up.request("GET", "/", [], None)


async def test_a_head_answer_has_no_body_and_its_connection_is_not_kept() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            await writer.drain()

    async with Server(script) as srv, client(srv.base) as up:
        async with await up.request("HEAD", "/health", [], None) as answer:
            assert (answer.status, answer.content_length) == (200, 100)
            assert await answer.read() == b""
        async with await up.request("HEAD", "/health", [], None) as answer:
            assert answer.status == 200
        assert srv.connections == 2


async def test_a_slow_reader_pauses_the_reads_and_gets_every_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_module, "HIGH_WATER", 1024)
    piece = b"x" * 512
    sent = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(piece) * 2000))
        for _ in range(2000):
            writer.write(piece)
            await writer.drain()  # waits while the client's reads are paused
        sent.set()

    async with Server(script) as srv, client(srv.base) as up:
        answer = await up.request("GET", "/", [], None)
        got = 0
        async for chunk in answer.chunks():
            got += len(chunk)
            if got < 64 * 1024:
                await asyncio.sleep(0.001)
        answer.release()
        assert got == len(piece) * 2000 and sent.is_set()


async def test_a_request_given_up_mid_answer_closes_its_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        srv.closed.set()

    async with Server(script) as srv, client(srv.base) as up:

        async def read_all() -> None:
            async with await up.request("GET", "/", [], None) as answer:
                async for _ in answer.chunks():
                    pass

        task = asyncio.create_task(read_all())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(srv.closed.wait(), 5)  # the server saw the client go


async def test_kept_connections_go_once_idle_past_the_keepalive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_module, "KEEPALIVE_S", 0.3)
    ended: list[int] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = srv.connections
        while not reader.at_eof():
            try:
                await srv.read_request(reader)
            except asyncio.IncompleteReadError:
                break
            await asyncio.sleep(0.05)  # so that three at once take three connections
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        ended.append(n)

    async with Server(script) as srv, client(srv.base) as up:

        async def one() -> bytes:
            async with await up.request("GET", "/", [], None) as answer:
                return await answer.read()

        assert await asyncio.gather(one(), one(), one()) == [b"ok"] * 3
        assert srv.connections == 3 and ended == []
        for _ in range(8):  # 0.4 s on the newest connection: the other two go stale
            assert await one() == b"ok"
        assert srv.connections == 3  # one kept and used again and again
        for _ in range(50):
            if len(ended) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(ended) == 2, ended  # the stale two closed, not left to SMG's timeout
