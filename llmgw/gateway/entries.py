"""Which endpoint entries SMG can take: one bad entry is left out, never the others.

SMG refused a whole discovery manifest for one malformed URL in it (keeping its last
good list), and refuses a worker registration with one: one node reporting a bad
address must never freeze routing for every model, nor hold up the others' workers.
So each entry is checked here first; an entry that fails is left out of SMG's
workers, logged once, and reported to the controller in the gateway's status
(`rejected`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from llmgw.wire import Endpoint, host_problem, printable

log = logging.getLogger("llmgw.gateway")

MAX_REASON = 200  # characters of a reason sent to the controller


def url_problem(url: str) -> str | None:
    """Why SMG could not use `url` as a worker, or None: `http[s]://HOST:PORT` only."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "the scheme is not http or https"
    if parts.username is not None or parts.password is not None:
        return "the URL carries a user name"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "the URL has a path, query or fragment"
    if port is None or port == 0:
        return "the URL names no port (1-65535)"
    host = parts.hostname or ""
    netloc_host = parts.netloc.rsplit(":", 1)[0]
    if ":" in host and netloc_host != f"[{host}]":
        return "an IPv6 host must be in brackets"
    if ":" not in host and netloc_host != host and netloc_host.lower() != host:
        return "the host is not a plain host name"
    problem = host_problem(host)
    return None if problem is None else f"the host {problem}"


class Entries:
    """Splits the controller's endpoints into usable and rejected, logging each
    rejected entry once (again only if its URL changes)."""

    def __init__(self) -> None:
        self.rejected: dict[str, str] = {}  # replica id -> why it is left out
        self._logged: dict[str, str] = {}  # replica id -> the URL logged as rejected

    def usable(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        ok: list[Endpoint] = []
        rejected: dict[str, str] = {}
        logged: dict[str, str] = {}
        for ep in endpoints:
            why = url_problem(ep.url)
            if why is None:
                ok.append(ep)
                continue
            rejected[ep.replica_id] = why[:MAX_REASON]
            logged[ep.replica_id] = ep.url
            if self._logged.get(ep.replica_id) != ep.url:
                log.warning(
                    "endpoint %s (model %s, node %s) left out of routing: %s: %s",
                    printable(ep.replica_id),
                    printable(ep.model),
                    printable(ep.node),
                    printable(ep.url),
                    why,
                )
        self.rejected, self._logged = rejected, logged
        return ok
