"""ctl's HTTP/1.1 connection (llmgw.http1) against servers that answer byte by byte
as scripted: every framing a server may choose, keep-alive and its loss, and
answers that are not HTTP at all."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from llmgw import http1
from llmgw.api import Call, ControllerUnreachable
from llmgw.sync_client import SyncAdminClient


class Peer:
    """The server's end of one connection; what it reads is kept in `requests`."""

    def __init__(self, conn: socket.socket, requests: list[bytes]) -> None:
        self.conn, self.requests = conn, requests

    def read_request(self) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                want = int(line.split(b":")[1])
                while len(rest) < want:
                    rest += self.conn.recv(65536)
                data = head + b"\r\n\r\n" + rest
        self.requests.append(data)
        return data

    def sendall(self, data: bytes) -> None:
        self.conn.sendall(data)


Script = Callable[[Peer, int], None]  # (the server's end of a connection, its number)


@contextmanager
def scripted(script: Script) -> Iterator[tuple[int, list[bytes]]]:
    """A server on a free port running `script` per connection; yields (port, requests)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    requests: list[bytes] = []

    def serve() -> None:
        n = 0
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                script(Peer(conn, requests), n)
            n += 1

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield port, requests
    finally:
        listener.close()


def answer(body: bytes, *extra: str, length: bool = True) -> bytes:
    headers = ["HTTP/1.1 200 OK", "Content-Type: application/json", *extra]
    if length:
        headers.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def connection(port: int) -> http1.Connection:
    return http1.Connection("127.0.0.1", port, connect_timeout_s=2, read_timeout_s=2)


def test_content_length_and_keep_alive_use_one_connection() -> None:
    def script(conn: Peer, n: int) -> None:
        for i in range(3):
            conn.read_request()
            conn.sendall(answer(b'{"n": %d, "conn": %d}' % (i, n)))

    with scripted(script) as (port, _):
        c = connection(port)
        bodies = [c.request("GET", "/x", {})[2] for _ in range(3)]
        c.close()
    assert bodies == [b'{"n": 0, "conn": 0}', b'{"n": 1, "conn": 0}', b'{"n": 2, "conn": 0}']


def test_a_chunked_answer_is_joined_and_its_trailers_skipped() -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"4;ext=1\r\n[1, \r\n3\r\n2]\n\r\n0\r\nX-Trailer: y\r\n\r\n"
        )

    with scripted(script) as (port, _):
        _, headers, body = connection(port).request("GET", "/", {})
    assert body == b"[1, 2]\n"
    assert headers["transfer-encoding"] == "chunked"


def test_an_answer_framed_by_closing_is_read_to_the_end_and_not_reused() -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()
        conn.sendall(answer(b'{"to": "the end"}', length=False))

    with scripted(script) as (port, _):
        c = connection(port)
        assert c.request("GET", "/", {})[2] == b'{"to": "the end"}'
        assert not c.reused
        assert c.request("GET", "/", {})[2] == b'{"to": "the end"}'  # a new connection


def test_headers_are_read_case_insensitively_and_the_request_is_well_formed() -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()
        conn.sendall(answer(b"{}", "X-LLMGW-Leader: http://b:7460", "connection: close"))

    with scripted(script) as (port, requests):
        c = connection(port)
        _, headers, _ = c.request("POST", "/v1/a%2Fb", {"Authorization": "Bearer t"}, b'{"k": 1}')
    assert headers["x-llmgw-leader"] == "http://b:7460"
    assert not c.reused  # the server said close
    sent = b"".join(requests)
    assert sent.startswith(b"POST /v1/a%2Fb HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b'\r\nAuthorization: Bearer t\r\nContent-Length: 8\r\n\r\n{"k": 1}' in sent


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "ended after 5 of 10"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", "ended inside its headers"),
    ],
)
def test_what_is_not_http_is_a_protocol_error(reply: bytes, message: str) -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()
        conn.sendall(reply)

    with scripted(script) as (port, _), pytest.raises(http1.ProtocolError, match=message):
        connection(port).request("GET", "/", {})


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/v1/nodes HTTP/1.1\r\nX: y", {}),
        ("/v1/nodes?x= y", {}),
        ("/", {"X-LLMGW-User": "alice\r\nAuthorization: Bearer stolen"}),
        ("/", {"X-Evil\nName": "v"}),
    ],
)
def test_line_breaks_are_never_sent(target: str, headers: dict[str, str]) -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()

    with scripted(script) as (port, requests), pytest.raises(ValueError, match="refusing"):
        connection(port).request("GET", target, headers)
    assert requests == []  # nothing reached the server


def test_the_client_retries_once_when_a_kept_alive_connection_was_closed() -> None:
    """A server that closes idle connections (aiohttp after its keep-alive timeout):
    the next call goes on a fresh connection instead of failing."""

    def script(conn: Peer, n: int) -> None:
        conn.read_request()
        conn.sendall(answer(b'{"ok": true, "conn": %d}' % n))  # then closes, keep-alive or not

    with scripted(script) as (port, _), SyncAdminClient(f"http://127.0.0.1:{port}") as client:
        assert client(Call("GET", "/healthz")) == {"ok": True, "conn": 0}
        assert client(Call("GET", "/healthz")) == {"ok": True, "conn": 1}


def test_a_server_that_never_answers_a_fresh_connection_is_unreachable() -> None:
    def script(conn: Peer, n: int) -> None:
        conn.read_request()  # and close without a word

    with (
        scripted(script) as (port, _),
        SyncAdminClient(f"http://127.0.0.1:{port}") as client,
        pytest.raises(ControllerUnreachable, match="closed the connection"),
    ):
        client(Call("GET", "/healthz"))
