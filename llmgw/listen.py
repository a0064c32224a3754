"""Taking a listening port: an address already in use is one readable line for a
person (`PortInUse`), never a traceback. The controller, its `--metrics-listen`
port, the agent's `--metrics-listen` port and the gateway all start through here."""

from __future__ import annotations

import errno
import resource
import socket
import ssl

from aiohttp import web

__all__ = ["PortInUse", "check_free", "raise_open_files", "start_site"]


class PortInUse(Exception):
    """The address to listen on is taken (message for a person)."""

    def __init__(self, host: str, port: int, what: str) -> None:
        super().__init__(
            f"cannot listen on {host}:{port} for {what}: the address is already in use "
            "(another llmgw or another program holds it); stop that one or choose another "
            "address"
        )


async def start_site(
    runner: web.AppRunner,
    host: str,
    port: int,
    what: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    backlog: int = 128,
) -> web.TCPSite:
    """Listen on HOST:PORT with `runner`; `PortInUse` when the address is taken."""
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=backlog)
    try:
        await site.start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(host, port, what) from exc
        raise
    return site


def raise_open_files() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit and return it.

    Every held client is a descriptor; a soft limit of 1,024 (systemd's and most
    shells' default, under a hard limit far above it) would turn the 1,000th waiting
    client into a refused accept. Raising the soft limit needs no privilege; that is
    what the hard limit is for (systemd.exec(5), LimitNOFILE=)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a sandbox may refuse; the soft limit stands
            return soft
        return hard
    return soft


def check_free(host: str, port: int, what: str) -> None:
    """`PortInUse` unless HOST:PORT can be bound now: for a port another program
    (SMG) will bind, so that a taken one is said before that program starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(host, port, what) from exc
            raise
