"""What handlers read and answer: a JSON body validated into a wire type (any
failure a 400 naming the field, within the body deadline and size bounds), a node
named in the URL, who is asking; JSON answers, and a refusal's answer (llmgw.errors)."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from llmgw.controller.core.auth import Identity
from llmgw.controller.http.keys import SETTINGS
from llmgw.controller.views.endpoints import MAX_WAIT_S
from llmgw.errors import BadRequest, ClientGone, ServerError, SlowBody, TooLarge
from llmgw.wire import PATTERN_MESSAGES, node_name, validate_json

M = TypeVar("M", bound=BaseModel)


def json_model(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        body=model.model_dump_json(by_alias=True), status=status, content_type="application/json"
    )


def json_models(models: list[Any]) -> web.Response:
    body = b"[" + b",".join(m.model_dump_json(by_alias=True).encode() for m in models) + b"]"
    return web.Response(body=body, content_type="application/json")


def answer(refusal: ServerError) -> web.Response:
    """A refusal as the client sees it: its status, JSON body and headers."""
    resp = web.json_response(refusal.body(), status=refusal.status, headers=refusal.headers())
    if refusal.close:
        resp.force_close()
    return resp


def validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {
            "loc": ".".join(str(p) for p in e["loc"]) or "(body)",
            "msg": _message(e),
            "type": e["type"],
        }
        for e in exc.errors(include_url=False, include_input=False)
    ][:20]


def _message(e: Any) -> str:
    """The error's message; a failed text rule says what it is, not its pattern."""
    pattern = (e.get("ctx") or {}).get("pattern")
    return PATTERN_MESSAGES.get(pattern, e["msg"]) if pattern else str(e["msg"])


async def parse_body(
    request: web.Request, model: type[M], *, optional: bool = False, limit: int | None = None
) -> M:
    """Read and validate a JSON body; any failure is a 400 that names the field.

    With `optional`, an empty body stands for `{}`. `limit`: a smaller bound than
    the app's, a 413 before the body is parsed (or read, when its length is said).
    """
    if limit is not None and (request.content_length or 0) > limit:
        raise TooLarge(limit)
    timeout = 0.0
    try:
        if request.content.is_eof():  # all of it came with the headers (a report): no wait
            raw = await request.read()  # 413 past client_max_size
        else:  # the deadline as a timer on this task (wait_for would add a task per read)
            timeout = request.app[SETTINGS].body_timeout_s
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except TimeoutError:
        raise SlowBody(f"the request body did not arrive within {timeout:g} s") from None
    except ConnectionResetError:  # closed or reset mid-body (aiohttp: "Connection lost")
        raise ClientGone from None
    except web.HTTPRequestEntityTooLarge:
        raise TooLarge(request.app[SETTINGS].max_body_bytes) from None
    if limit is not None and len(raw) > limit:
        raise TooLarge(limit)
    if not raw:
        if optional:
            raw = b"{}"
        else:
            raise BadRequest("the request needs a JSON body")
    try:
        return validate_json(model, raw)
    except ValidationError as exc:
        detail = validation_detail(exc)
        raise BadRequest(refusal_words(detail), detail) from exc


def refusal_words(detail: list[dict[str, Any]]) -> str:
    """A refused body in a person's words: the first field at fault and what is wrong
    with it (the rest are in `detail`), never the name of the class that checked it."""
    first = detail[0]
    where = "request body" if first["loc"] == "(body)" else first["loc"]
    more = f" (and {len(detail) - 1} more in detail)" if len(detail) > 1 else ""
    return f"invalid {where}: {first['msg']}{more}"


def node_param(request: web.Request, key: str = "name") -> str:
    """The node a URL names, normalised as every node name is (`GPU-A01` is gpu-a01)."""
    try:
        return node_name(request.match_info[key])
    except ValueError as exc:
        raise BadRequest(f"no such node can exist: {exc}") from None


def wait_param(request: web.Request) -> float:
    """A long poll's `?wait=S`: seconds, 0 (no wait) to MAX_WAIT_S."""
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        raise BadRequest("`wait` must be a number of seconds") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise BadRequest(f"`wait` must be between 0 and {MAX_WAIT_S:g} seconds")
    return wait


def who(request: web.Request) -> str:
    identity: Identity = request["identity"]
    return identity.name
