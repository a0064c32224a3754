"""Request bodies cost the controller nothing it has not agreed to pay.

aiohttp inflates a `Content-Encoding: gzip` body as it arrives, on the event
loop, before any handler (or the auth middleware) has run, and its size limit
counts inflated bytes: 1 MiB of gzip is 1 GiB of work and memory. No client of
llmgw compresses what it sends, so the app is built with `auto_decompress`
off (`HANDLER_ARGS`) and the app's first middleware refuses an encoded body
with a 415 (`refuse_encoded`) before anything reads it.

A request answered without reading its body (a 401, 403, 404, 413 or 415) is
answered with `Connection: close` and its connection closed, rather than
aiohttp reading and discarding the rest of an unauthenticated body, or closing
a connection it had just told the client it would keep (`close_if_unread`).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.errors import CompressedBody

# For web.Application(handler_args=...): the server never inflates a body itself.
HANDLER_ARGS = {"auto_decompress": False}


def _encoded(request: web.Request) -> str | None:
    """The body's content coding, when it has one other than identity."""
    coding = request.headers.get("Content-Encoding")
    if coding is None:  # (nearly every request: nothing more to look at)
        return None
    coding = coding.strip().lower()
    return coding if coding not in ("", "identity") and request.body_exists else None


def refuse_encoded(request: web.Request) -> None:
    """Raise the 415 for a compressed body, before anything reads it."""
    coding = _encoded(request)
    if coding is not None:
        raise CompressedBody(coding)  # closes: whatever of the body is still coming is not read


def close_if_unread(request: web.Request, resp: web.StreamResponse) -> None:
    """An answer given without reading the whole body closes its connection."""
    if request.body_exists and not request.content.is_eof() and not resp.prepared:
        resp.force_close()  # the body was not read: say so, and close
