"""Request bodies cost the controller nothing it has not agreed to pay.

aiohttp inflates a `Content-Encoding: gzip` body as it arrives, on the event
loop, before any handler (or the auth middleware) has run, and its size limit
counts inflated bytes: 1 MiB of gzip is 1 GiB of work and memory. No client of
llmgw compresses what it sends, so the app is built with `auto_decompress`
off (`HANDLER_ARGS`) and `body_guard` refuses an encoded body with a 415
before anything reads it.

A request answered without reading its body (a 401, 403, 404, 413 or 415) is
answered with `Connection: close` and its connection closed, rather than
aiohttp reading and discarding the rest of an unauthenticated body, or closing
a connection it had just told the client it would keep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

# For web.Application(handler_args=...): the server never inflates a body itself.
HANDLER_ARGS = {"auto_decompress": False}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _encoded(request: web.Request) -> str | None:
    """The body's content coding, when it has one other than identity."""
    coding = request.headers.get("Content-Encoding")
    if coding is None:  # (nearly every request: nothing more to look at)
        return None
    coding = coding.strip().lower()
    return coding if coding not in ("", "identity") and request.body_exists else None


@web.middleware
async def body_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    coding = _encoded(request)
    if coding is not None:
        resp: web.StreamResponse = web.json_response(
            {
                "error": f"compressed request bodies are refused (Content-Encoding: {coding}); "
                "send the body uncompressed"
            },
            status=415,
        )
        resp.force_close()  # whatever of the body is still coming is not read
    else:
        resp = await handler(request)
    if request.body_exists and not request.content.is_eof() and not resp.prepared:
        resp.force_close()  # the body was not read: say so, and close
    return resp
