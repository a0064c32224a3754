"""Serving the controller: connection limits, timeouts and TLS around aiohttp.

aiohttp gives the pieces; this module sets them so one slow or hostile client
cannot hold the controller:

- idle and header timeout: aiohttp's keep-alive timer starts when a connection
  opens and again after each response, and closes a connection still waiting
  for a complete request when it fires. So `idle_timeout_s` bounds both the
  idle time between requests and the time a client may take to send its
  request line and headers (a slowloris trickling one header a second is cut).
  Older aiohttp started that timer only after a first response
  (aio-libs/aiohttp#13681), hence the version floor in pyproject.toml.
- body timeout: a handler reads its body within the settings'
  `body_timeout_s` (see `app.parse_body`), else 408 and the connection is closed.
- a cap on open connections: past it a new connection gets a JSON 503 and is
  closed at once, so the process keeps descriptors for its own files and for
  the connections it serves. The cap never exceeds RLIMIT_NOFILE minus a reserve.
- out of file descriptors: asyncio reports every failed accept() with a
  traceback (about one a second per listening socket); it is logged once per
  minute with a count instead.
- a request aiohttp cannot parse (a control character in a header, a bad
  request line) gets a JSON 400 like every other error, and is logged once per
  minute with a count: aiohttp logs an ERROR traceback for each and answers in
  plain text, and anyone can send them without a token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from llmgw.listen import raise_open_files, start_site

log = logging.getLogger("llmgw.controller.http.serve")

FD_RESERVE = 64  # descriptors kept for the database, logs and outbound work
FD_LOG_EVERY_S = 60.0
BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: 51\r\n\r\n"
    b'{"error": "too many open connections; retry later"}'
)


@dataclass(frozen=True)
class ServerLimits:
    idle_timeout_s: float = 15.0  # idle keep-alive, and the time to send a request's headers
    max_connections: int = 4096


def connection_cap(requested: int) -> int:
    """`requested`, lowered to what RLIMIT_NOFILE leaves after a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(1, min(requested, soft - FD_RESERVE))


def cap_connections(server: web.Server, cap: int) -> None:
    """Refuse connections past `cap` with a 503 as soon as they are accepted, and
    answer requests aiohttp cannot parse with a JSON 400 (`_JsonParseErrors`)."""
    admit = server.connection_made

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        if type(handler) is RequestHandler:
            # Same slots, one method more: set before any byte is parsed.
            handler.__class__ = _JsonParseErrors
        admit(handler, transport)
        if len(server.connections) > cap:
            transport.write(BUSY_REPLY)
            # Closed on the next turn: the handler's task must start first, or
            # aiohttp trips over a connection lost before it began.
            asyncio.get_running_loop().call_soon(transport.close)
            _BUSY.note()

    server.connection_made = connection_made  # type: ignore[method-assign]


class _Once:
    """Counts an event and logs it at most once per `every_s`, with the count."""

    def __init__(self, message: str, every_s: float = FD_LOG_EVERY_S) -> None:
        self.message = message
        self.every_s = every_s
        self.count = 0
        self.last = -float("inf")

    def note(self, detail: str = "") -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.warning("%s%s (%d since the last such message)", self.message, detail, self.count)
            self.count = 0


_BUSY = _Once("refused connections: the open-connection cap is reached")
_NO_FDS = _Once("cannot accept connections: out of file descriptors")
_UNPARSABLE = _Once("refused requests that cannot be parsed (400)")


class _JsonParseErrors(RequestHandler):
    """aiohttp's connection handler, with a JSON 400 for a request it cannot parse."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not 400 <= status < 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        why = _first_line(message or (str(exc) if exc is not None else "")) or "malformed request"
        _UNPARSABLE.note(f"; last from {request.remote}: {why}")
        body = {"error": f"bad request: {why}; fix the request line and headers"}
        resp = web.Response(status=status, text=json.dumps(body), content_type="application/json")
        resp.force_close()
        return resp


def _first_line(text: str) -> str:
    """A parser's message, cut and made safe to log and to echo (no control characters)."""
    line = text.strip().splitlines()[0].rstrip(" :") if text.strip() else ""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line)[:200]


def quiet_fd_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's accept() failures (EMFILE, ENFILE) logged once a minute, not per try."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and "out of system resource" in context.get("message", ""):
            _NO_FDS.note(f": {exc.strerror}")
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def serve(
    app: web.Application,
    host: str,
    port: int,
    limits: ServerLimits,
    *,
    ssl_context: ssl.SSLContext | None = None,
    access_log: logging.Logger | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT; the app's cleanup (the final save) always runs.
    `llmgw.listen.PortInUse` when the address is taken."""
    asyncio.run(_serve(app, host, port, limits, ssl_context, access_log, ready))


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    limits: ServerLimits,
    ssl_context: ssl.SSLContext | None,
    access_log: logging.Logger | None,
    ready: Callable[[], None] | None,
) -> None:
    loop = asyncio.get_running_loop()
    quiet_fd_exhaustion(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(
        app,
        access_log=access_log,
        keepalive_timeout=limits.idle_timeout_s,
        # After an early error reply (413, 408), read what the client still
        # sends for at most this long, so it sees the reply; then close.
        lingering_time=1.0,
    )
    try:
        await runner.setup()  # the app's startup: a taken --metrics-listen is raised here
        assert runner.server is not None
        raise_open_files()  # before the cap is fitted to it
        cap_connections(runner.server, connection_cap(limits.max_connections))
        await start_site(runner, host, port, "the API", ssl_context=ssl_context, backlog=1024)
        if ready is not None:
            ready()
        await stop.wait()
    finally:
        await runner.cleanup()
