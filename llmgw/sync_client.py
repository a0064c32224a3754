"""The blocking admin client `ctl` uses: a plain HTTP/1.1 connection
(llmgw.http1), so a one-shot command starts in a few tens of milliseconds
(httpx and asyncio cost more to import than the whole request, http.client
half of it). TLS is set up only for https URLs.

It executes the same `llmgw.api` calls as the async `AdminClient`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from llmgw import api, http1
from llmgw.api import Call
from llmgw.common import first_line
from llmgw.errors import BadAnswer, ControllerUnreachable, TlsRefused, UsageError
from llmgw.leader import Endpoints, Following

if TYPE_CHECKING:
    T = TypeVar("T")

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0


class SyncAdminClient:
    """Blocking client for the controller's admin API.

    `base_urls` may name several controllers: they are tried in order until
    one answers, and the one that answered is kept for the next calls.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str] | None = None,
        token: str | None = None,
        *,
        user: str | None = None,
        ca_file: str | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.endpoints = Endpoints(api.controller_urls(base_urls))
        self.urls = self.endpoints.urls
        self.base_url = self.endpoints.current
        self.ca_file = ca_file
        self.read_timeout_s = read_timeout_s
        self.headers = {"User-Agent": "llmgw-ctl", "Accept": "application/json"}
        tok = api.admin_token(token)
        if tok:
            self.headers["Authorization"] = f"Bearer {tok}"
        if user:  # recorded beside the token's identity on cordons and drains
            self.headers["X-LLMGW-User"] = user
        self._conn: http1.Connection | None = None
        self._conn_url = ""

    def __enter__(self) -> SyncAdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- executing calls ------------------------------------------------------

    def __call__(self, call: Call[T]) -> T:
        """Run one call: its typed answer, or a ClientError (llmgw.errors).

        Several controllers: a follower's "not the leader" sends the call to the
        leader it names; one that does not answer, to the next URL (llmgw.leader)."""
        follow = Following(self.endpoints)
        while (url := follow.next()) is not None:
            try:
                status, headers, body = self._exchange(url, call)
            except ControllerUnreachable as exc:
                follow.unreachable(exc)
                continue
            if follow.answered(url, status, headers, body):
                self.base_url = url
                return self._answer(url, call, status, headers.get("content-type", ""), body)
        if follow.follower is not None:  # only followers answered: no leader right now
            raise api.no_leader(follow.tried(), call.path)
        assert isinstance(follow.failure, ControllerUnreachable)
        raise follow.failure

    def _answer(self, url: str, call: Call[T], status: int, content_type: str, body: bytes) -> T:
        if status >= 400:
            if api.may_not_be_a_controller(status, content_type, body):
                self._check_is_controller(url, status)
            raise api.refusal(status, body, str(status), url + call.path)
        try:
            return api.view(body) if call.typed else call.parse(body)
        except ValueError as exc:  # json and pydantic errors: the answer is not ours
            self._check_is_controller(url, status)
            raise BadAnswer(url + call.path, first_line(exc)) from exc

    def _check_is_controller(self, url: str, status: int) -> None:
        """Raise NotAController unless GET /healthz says this is an llmgw controller."""
        h_status: int | None
        try:
            h_status, h_headers, h_body = self._exchange(url, api.healthz())
            h_type = h_headers.get("content-type", "")
        except ControllerUnreachable:
            h_status, h_type, h_body = None, "", b""
        answered = api.describe_healthz(h_status, h_type, h_body)
        if answered is not None:
            raise api.not_a_controller(url, status, answered)

    def _exchange(self, url: str, call: Call[Any]) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of one request to `url`."""
        body = call.content()
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        target = urlsplit(url).path + call.target()
        while True:
            conn = self._connection(url)
            reused = conn.reused
            try:
                status, answer_headers, data = conn.request(call.method, target, headers, body)
            except (OSError, http1.ProtocolError) as exc:
                self.close()
                if reused and isinstance(exc, ConnectionError):
                    # A kept-alive connection the server had closed (or reset) before
                    # reading the request: once more on a fresh one.
                    continue
                raise ControllerUnreachable(url, _plain(exc)) from exc
            return status, answer_headers, data

    def _connection(self, url: str) -> http1.Connection:
        if self._conn is not None and self._conn_url == url:
            return self._conn
        self.close()
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        tls = None
        if parts.scheme == "https":
            from llmgw.tls import client_context  # ssl only for https

            tls = client_context(self.ca_file)
        elif parts.scheme != "http":
            raise UsageError(
                f"--controller {url}: the scheme must be http:// or https://, not {parts.scheme}://"
            )
        conn = http1.Connection(
            host,
            parts.port or (443 if tls else 80),
            connect_timeout_s=CONNECT_TIMEOUT_S,
            read_timeout_s=self.read_timeout_s,
            tls=tls,
        )
        try:
            conn.connect()
        except OSError as exc:
            from llmgw.errors import TlsConfigError
            from llmgw.tls import is_verify_failure, verify_hint

            if is_verify_failure(exc):  # say which check failed and what to do
                raise TlsRefused(url, TlsConfigError(verify_hint(url, exc))) from exc
            raise ControllerUnreachable(url, _plain(exc)) from exc
        self._conn, self._conn_url = conn, url
        return conn

    def json(self, call: Call[Any]) -> Any:
        """The answer exactly as served, as JSON (for `-o json`, and tables that read
        it as plain objects); decoded once (a 2,000-node listing is 680 KB)."""
        return self(Call(call.method, call.path, call.body, call.params, parse=json.loads))


def _plain(exc: BaseException) -> Exception:
    """Socket errors as people read them ("connection refused", "timed out")."""
    if isinstance(exc, TimeoutError):  # (socket.timeout is TimeoutError)
        return TimeoutError("timed out")
    if isinstance(exc, ConnectionRefusedError):
        return ConnectionRefusedError("connection refused")
    if isinstance(exc, http1.HostNotFound):
        return OSError(f"unknown host ({exc.strerror})")
    if isinstance(exc, OSError) and exc.strerror:
        return OSError(exc.strerror.lower())
    return exc if isinstance(exc, Exception) else Exception(str(exc))
