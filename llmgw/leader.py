"""Finding the leading controller among several: what every client shares.

With a PostgreSQL store any number of controllers run; one leads and the others
answer every request with 503 `{"error": "not the leader", "leader": URL}` and
the leader's URL in the `X-LLMGW-Leader` header. A client is given the list of
controllers (`--controller A,B` or LLMGW_CONTROLLER="A,B") and keeps an
`Endpoints`: the controller that answered last is tried first; a "not the
leader" answer sends it to the named leader; a controller that does not answer
sends it to the next in the list. Each client's transport (llmgw.http1, httpx,
aiohttp) asks `Endpoints` where to go and tells it what came back.

Importing this module loads nothing beyond the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

LEADER_HEADER = "X-LLMGW-Leader"
NOT_THE_LEADER = "not the leader"


def normalize(url: str) -> str:
    """`host:port` means `http://host:port`; no trailing slash."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def url_problem(text: str) -> str | None:
    """What is wrong with a controller URL as given (None: nothing), before any
    connection is tried: a mistyped scheme must not read as an unknown host."""
    from urllib.parse import urlsplit

    raw = text.strip()
    scheme, sep, _ = raw.partition("://")
    if sep:
        if scheme.lower() not in ("http", "https"):
            return f"the scheme must be http:// or https://, not {scheme}://"
    else:
        head = raw.split("/", 1)[0].split(":", 1)[0].lower()
        if head in ("http", "https") or raw.split(":", 1)[-1].startswith("/"):
            return "the scheme is written http:// or https://"
    parts = urlsplit(normalize(raw))
    if any(c.isspace() for c in parts.netloc):
        return "a host name holds no blanks"
    if not parts.hostname:
        return "no host name"
    try:
        port = parts.port
    except ValueError:
        return "the port must be a number from 1 to 65535"
    if port == 0:
        return "the port must be a number from 1 to 65535"
    return None


def split_urls(value: str | Iterable[str]) -> list[str]:
    """`"A,B"` (or a list of such) -> [A, B], normalized, without repeats or blanks."""
    items = value.split(",") if isinstance(value, str) else [p for v in value for p in v.split(",")]
    out: list[str] = []
    for item in items:
        if item.strip() and (url := normalize(item)) not in out:
            out.append(url)
    return out


def leader_of(status: int, headers: Mapping[str, str], body: bytes) -> tuple[bool, str | None]:
    """(is this a follower's "not the leader" answer, the leader it names or None)."""
    if status != 503:
        return False, None
    named = headers.get(LEADER_HEADER) or headers.get(LEADER_HEADER.lower())
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if not (isinstance(data, dict) and data.get("error") == NOT_THE_LEADER):
        return (named is not None), (normalize(named) if named else None)
    leader = named or data.get("leader")
    return True, (normalize(str(leader)) if leader else None)


class Endpoints:
    """The controllers a client knows, and which one it goes to first."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.urls = split_urls(list(urls))
        if not self.urls:
            raise ValueError("no controller URL given")
        self.current = self.urls[0]

    def __len__(self) -> int:
        return len(self.urls)

    def order(self) -> list[str]:
        """The current one first, then the rest in the given order."""
        return [self.current, *(u for u in self.urls if u != self.current)]

    def attempts(self) -> int:
        """How many tries one call may make: every URL once, plus a few redirects."""
        return len(self.urls) + 2

    def answered(self, url: str) -> None:
        """`url` answered as the leader (or as the only controller): go there first."""
        self.current = url

    def follow(self, leader: str) -> str:
        """A follower named `leader`: it is current from now on (learned if new)."""
        leader = normalize(leader)
        if leader not in self.urls:
            self.urls.append(leader)
        self.current = leader
        return leader


class Tries:
    """The URLs one call tries, in order: a redirect goes to the front of the queue."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self.queue = endpoints.order()
        self.left = endpoints.attempts()
        self.tried: list[str] = []

    def next(self) -> str | None:
        while self.queue and self.left > 0:
            url = self.queue.pop(0)
            self.left -= 1
            self.tried.append(url)
            return url
        return None

    def redirect(self, leader: str | None) -> None:
        """A "not the leader" answer: try the named leader next, unless just tried."""
        if leader is None:
            return
        leader = self.endpoints.follow(leader)
        if leader in self.queue:
            self.queue.remove(leader)
        if not self.tried or self.tried[-1] != leader:
            self.queue.insert(0, leader)


class Following:
    """One call's way to the leader, free of I/O: every client's loop is

        follow = Following(endpoints)
        while (url := follow.next()) is not None:
            try: status, headers, body = <send the call to url>
            except <no answer> as exc: follow.unreachable(exc); continue
            if follow.answered(url, status, headers, body): return <that answer>
        <follow.follower: only followers answered; else raise follow.failure>

    A follower's "not the leader" sends the call on to the leader it names; a
    controller that does not answer, to the next URL. The transports (llmgw.http1,
    httpx, aiohttp) only send and receive.
    """

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self._tries = Tries(endpoints)
        self.failure: BaseException | None = None  # the first "no answer"
        # The last follower's answer (url, status, body): when nothing else answered,
        # a failover is under way.
        self.follower: tuple[str, int, bytes] | None = None

    def next(self) -> str | None:
        """The next URL to send the call to; None: every try is spent."""
        return self._tries.next()

    def unreachable(self, error: BaseException) -> None:
        self.failure = self.failure or error

    def answered(self, url: str, status: int, headers: Mapping[str, str], body: bytes) -> bool:
        """True: this is the leader's (or the only controller's) answer, and `url` is
        tried first from now on. False: a follower's; go on with `next()`."""
        redirected, leader = leader_of(status, headers, body)
        if redirected:
            self.follower = (url, status, body)
            self._tries.redirect(leader)
            return False
        self.endpoints.answered(url)
        return True

    def tried(self) -> list[str]:
        """The URLs asked, each once, in order."""
        return list(dict.fromkeys(self._tries.tried))


async def aiohttp_request(
    session: aiohttp.ClientSession,
    endpoints: Endpoints,
    method: str,
    path: str,
    **kwargs: Any,
) -> tuple[str, int, bytes]:
    """One request to the leader over aiohttp (the agent, the gateway):
    (URL that answered, status, body). Only followers answering (no leader right
    now) gives the last one's 503; none answering raises the first connection
    error (aiohttp.ClientError or TimeoutError)."""
    import aiohttp

    follow = Following(endpoints)
    while (url := follow.next()) is not None:
        try:
            async with session.request(method, url + path, **kwargs) as resp:
                body = await resp.read()
                status, headers = resp.status, resp.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            follow.unreachable(exc)
            continue
        if follow.answered(url, status, headers, body):
            return url, status, body
    if follow.follower is not None:
        return follow.follower
    assert follow.failure is not None
    raise follow.failure
