"""The front's HTTP/1.1 client to SMG on loopback: pooled keep-alive connections,
answers parsed by httptools (llhttp, the parser Node.js uses) and streamed as
they come.

Why not aiohttp's client, which the front used before: the hop to SMG is the
front's hot path, and aiohttp's client spends 117-156 us of CPU a request where
this one spends 44-72 us (a streamed answer from the same upstream, one core;
bench/README.md, "The front's client to SMG"). The front needs little of what
aiohttp's client does: one plain-HTTP peer on loopback, whole request bodies
already in memory, no redirects, cookies, proxies or decompression.

Errors (what the front does with each):

    UpstreamError
     ├── NotSent   the connection failed or closed before any byte of an answer
     │             (SMG restarting, or a kept-alive connection it had closed):
     │             safe to send again
     └── Cut       the answer broke off, or was not HTTP
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

# An idle connection older than this is closed rather than reused (aiohttp's own
# keep-alive default, which the front had): SMG may have dropped it meanwhile.
KEEPALIVE_S = 60.0
CONNECT_TIMEOUT_S = 10.0
# An answer the client reads slower than SMG sends it: reading from SMG pauses once
# this much waits here (aiohttp's client pauses at 64 KiB a stream, and so on).
HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """SMG did not give a whole answer."""


class NotSent(UpstreamError):
    """Nothing of an answer came: the request may be sent again."""


class Cut(UpstreamError):
    """The answer broke off midway, or was not HTTP."""


class _Connection(asyncio.Protocol):
    """One TCP connection to SMG; one answer at a time on it."""

    def __init__(self, base: str) -> None:
        self.base = base  # the SMG it goes to (a restarted one listens elsewhere)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.lost = False
        self._answer: Answer | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None:  # nothing asked: SMG has nothing to say here
            self.close()
            return
        answer.received = True
        try:
            answer.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            answer.fail(Cut(f"SMG's answer is not HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._answer is not None:
            self._answer.connection_lost()

    # -- used by Upstream and Answer ---------------------------------------------------------

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def send(self, answer: Answer, head: bytes, body: bytes | None) -> None:
        assert self.transport is not None
        self._answer = answer
        self.transport.writelines([head, body] if body else [head])

    def done(self) -> None:
        self._answer = None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Answer:
    """SMG's answer: status and headers once they came, then the body as it comes.
    Used as `async with`: a whole answer leaves its connection for the next request,
    anything else (read part-way, the handler cancelled) closes it, so that SMG sees
    the client go."""

    def __init__(self, upstream: Upstream, conn: _Connection, head_only: bool) -> None:
        self._upstream = upstream
        self._conn = conn
        self._head_only = head_only  # a HEAD: no body follows the headers
        self.parser = httptools.HttpResponseParser(self)
        self.received = False  # any byte of it
        self.status = 0
        self.reason = ""
        self._raw_headers: list[tuple[str, str]] = []
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self._headers_in = False
        self._wake: asyncio.Future[None] | None = None

    # -- httptools callbacks ----------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        # As aiohttp's parser decodes them: the client gets the bytes SMG sent.
        self._raw_headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers = CIMultiDictProxy(CIMultiDict(self._raw_headers))
        self._headers_in = True
        if self._head_only:
            self._complete = True  # (and its connection not used again: see release)
        self._notify()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        self._complete = True
        # (asked here: llhttp forgets it once the message is done)
        self._keep_alive = self.parser.should_keep_alive()
        self._notify()

    # -- from the connection ------------------------------------------------------------------

    def connection_lost(self) -> None:
        if not self._complete and self._error is None:
            if not self.received:
                self._error = NotSent("SMG closed the connection before answering")
            elif self._headers_in and self._until_close():
                self._complete = True  # (not kept: the connection is gone)
            else:
                self._error = Cut("SMG's answer broke off")
        self._notify()

    def _until_close(self) -> bool:
        """An answer with neither a length nor chunks ends with its connection (RFC 9112
        6.3): httptools cannot be told the end, so it is known here."""
        h = self.headers
        return "Content-Length" not in h and "chunked" not in h.get("Transfer-Encoding", "")

    def fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._notify()

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _wait(self) -> None:
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    # -- reading it -----------------------------------------------------------------------------

    async def head(self) -> None:
        while not self._headers_in:
            if self._error is not None:
                raise self._error
            await self._wait()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "application/octet-stream").split(";")[0].strip()

    @property
    def ended(self) -> bool:
        """The whole answer came and every piece of it was taken."""
        return self._complete and not self._chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces as they come; Cut if it breaks off."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered <= HIGH_WATER // 4 and self._conn.transport:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield chunk
            elif self._complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                await self._wait()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """Done with it: its connection goes back to the pool only when the answer came
        whole, was read whole, and SMG keeps the connection open."""
        conn = self._conn
        conn.done()
        whole = self._complete and not self._chunks and not self._head_only
        if whole and self._keep_alive and not conn.lost:
            self._upstream.put_back(conn)
        else:
            conn.close()


class Upstream:
    """Connections to SMG at `base()` (its URL moves when SMG restarts on a new port)."""

    def __init__(self, base: Callable[[], str]) -> None:
        self._base = base
        self._at = ("", "", 0, b"")  # base URL -> host, port, Host header
        self._idle: collections.deque[_Connection] = collections.deque()  # newest last
        self._closed = False

    def _address(self) -> tuple[str, str, int, bytes]:
        base = self._base()
        if base != self._at[0]:
            parts = urlsplit(base)
            host, port = parts.hostname or "127.0.0.1", parts.port or 80
            self._at = (base, host, port, parts.netloc.encode())
        return self._at

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> Answer:
        """Send `method target` with `headers` (no hop-by-hop ones, no Host, no
        Content-Length: set here) and `body`; the answer once its headers came."""
        if self._closed:
            raise NotSent("the gateway is stopping")
        base, host, port, netloc = self._address()
        conn = self._take(base) or await self._connect(base, host, port)
        lines = [f"{method} {target} HTTP/1.1\r\n".encode(), b"Host: " + netloc + b"\r\n"]
        lines += [f"{k}: {v}\r\n".encode("utf-8", "surrogateescape") for k, v in headers]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(b"Content-Length: %d\r\n" % len(body or b""))
        lines.append(b"\r\n")
        answer = Answer(self, conn, method == "HEAD")
        conn.send(answer, b"".join(lines), body)
        try:
            await answer.head()
        except BaseException:
            conn.done()
            conn.close()
            raise
        return answer

    def _take(self, base: str) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.base == base and conn.usable() and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    async def _connect(self, base: str, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, conn = await loop.create_connection(lambda: _Connection(base), host, port)
        except (OSError, TimeoutError) as exc:
            raise NotSent(f"cannot connect to SMG at {host}:{port}: {exc}") from exc
        return conn

    def put_back(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        now = conn.idle_since = time.monotonic()
        idle = self._idle
        # The oldest go once stale or closed by SMG: after a burst, the pool shrinks back.
        while idle and (idle[0].lost or now - idle[0].idle_since >= KEEPALIVE_S):
            idle.popleft().close()
        idle.append(conn)

    async def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
