"""A minimal blocking HTTP/1.1 client connection, for `llmgw ctl`.

Why not `http.client`: importing it loads the `email` package to parse
headers, and `ssl`, even for a plain `http://` URL: about 15 ms, half of what a
bare interpreter start costs, paid by every one-shot `ctl` command. This is only
what a client of one known server needs: one request at a time on a kept-alive
connection, bodies framed by Content-Length, chunked or the end of the
connection; TLS through a caller's `ssl.SSLContext` (ssl is imported by whoever
builds one). Anything else in the answer is a `ProtocolError`.

A plain connection uses `_socket`, the C module under `socket`: `socket`'s import
(its enums, `selectors`) costs a one-shot ctl 2 ms, and `_Reader` does what its
`makefile("rb")` did here. TLS needs `socket.socket` (ssl wraps one) and imports it.
"""

from __future__ import annotations

import _socket
from typing import Any

HostNotFound = _socket.gaierror  # for callers, who then need not import `_socket` themselves
MAX_LINE = 65536  # a status or header line
MAX_HEADERS = 100


class ProtocolError(Exception):
    """The peer did not answer in HTTP/1.x."""


class Disconnected(ConnectionError):
    """The peer closed the connection before answering (a kept-alive one it timed out)."""


def _check(target: str, *parts: str) -> None:
    """Nothing that would end a line or the request target early (request smuggling)."""
    for part in (target, *parts):
        if not part.isprintable() or (part is target and " " in part):
            raise ValueError(f"refusing to send {part[:40]!r} in a request line or header")


# (status, headers, body); header names in lower case, a repeated one keeps its
# last value.
Response = tuple[int, dict[str, str], bytes]


class _Reader:
    """Buffered reads from a socket: a line, a count of bytes, or all until closed."""

    __slots__ = ("_buf", "_pos", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = b""
        self._pos = 0

    def _more(self) -> bool:
        chunk: bytes = self._sock.recv(65536)
        if not chunk:
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def readline(self, limit: int) -> bytes:
        """Up to and with the next LF, at most `limit` bytes (less at the end)."""
        while True:
            end = self._buf.find(b"\n", self._pos, self._pos + limit)
            if end >= 0:
                end += 1
                break
            if len(self._buf) - self._pos >= limit or not self._more():
                end = min(len(self._buf), self._pos + limit)
                break
        line = self._buf[self._pos : end]
        self._pos = end
        return line

    def read(self, n: int | None = None) -> bytes:
        """`n` bytes (fewer if the connection ends first); None: all until it ends."""
        if n is None:
            while self._more():
                pass
            data = self._buf[self._pos :]
            self._buf, self._pos = b"", 0
            return data
        have = self._buf[self._pos : self._pos + n]
        self._pos += len(have)
        if len(have) == n:
            return have
        out = bytearray(n)  # a large body goes straight into its buffer
        out[: len(have)] = have
        view, got = memoryview(out), len(have)
        while got < n:
            k = self._sock.recv_into(view[got:])
            if not k:
                break
            got += k
        return bytes(view[:got])

    def close(self) -> None:
        self._buf, self._pos = b"", 0


def _open(host: str | bytes, port: int, timeout: float) -> Any:
    """A connected plain socket, each address in turn (as socket.create_connection)."""
    failure: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock
    raise failure or OSError("getaddrinfo returned no address")


class Connection:
    """One connection to `host:port`, opened on first use and kept alive."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        tls: Any = None,  # an ssl.SSLContext for https
    ) -> None:
        self.host, self.port = host, port
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.tls = tls
        self._sock: Any = None  # a _socket.socket, or an ssl.SSLSocket
        self._file: _Reader | None = None
        self.reused = False  # the next request goes on a connection that answered before

    def connect(self) -> None:
        # An ASCII name as bytes: a str would load the idna codec first.
        host: str | bytes = self.host.encode() if self.host.isascii() else self.host
        if self.tls is None:
            sock = _open(host, self.port, self.connect_timeout_s)
        else:
            import socket

            address: Any = (host, self.port)  # typeshed wants a str; getaddrinfo takes bytes
            sock = socket.create_connection(address, timeout=self.connect_timeout_s)
        try:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.read_timeout_s)
        except BaseException:
            sock.close()
            raise
        self._sock, self._file, self.reused = sock, _Reader(sock), False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None = None
    ) -> Response:
        _check(target, *headers, *headers.values())
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        host = self.host if ":" not in self.host else f"[{self.host}]"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._sock.sendall(head + body if body else head)
        response, keep = self._read_response(method)
        if keep:
            self.reused = True
        else:
            self.close()
        return response

    # -- reading the answer -----------------------------------------------------------

    def _line(self) -> bytes:
        assert self._file is not None
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("header line too long")
        return line

    def _read_response(self, method: str) -> tuple[Response, bool]:
        status_line = self._line()
        if not status_line:
            raise Disconnected("the server closed the connection without answering")
        version, _, rest = status_line.decode("latin-1").rstrip("\r\n").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
            raise ProtocolError(f"not an HTTP answer: {status_line[:40]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        while True:
            line = self._line()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ProtocolError("the answer ended inside its headers")
            if len(headers) >= MAX_HEADERS:
                raise ProtocolError("too many headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:40]!r}")
            headers[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return (status, headers, b""), keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return (status, headers, self._chunked()), keep
        length = headers.get("content-length")
        if length is None:  # framed by the end of the connection
            assert self._file is not None
            return (status, headers, self._file.read()), False
        if not length.isdigit():
            raise ProtocolError(f"bad Content-Length {length[:20]!r}")
        return (status, headers, self._exactly(int(length))), keep

    def _exactly(self, n: int) -> bytes:
        assert self._file is not None
        data = self._file.read(n)
        if len(data) != n:
            raise ProtocolError(f"the answer ended after {len(data)} of {n} bytes")
        return data

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                size = -1
            if size < 0:
                raise ProtocolError(f"bad chunk size {size_line[:20]!r}")
            if size == 0:
                while self._line() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._exactly(2)  # the CRLF after the chunk
