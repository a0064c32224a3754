"""Gateways: the endpoint feed they follow (long-polled) and the status they send."""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.endpoints import MAX_WAIT_S, TooManyGateways, endpoints_since, parse_cursor
from llmgw.controller.keys import FEED_HOLD, FLEET, GATEWAYS
from llmgw.controller.web_io import error, json_model, json_models, parse_body, who
from llmgw.errors import BadRequest
from llmgw.wire import GatewayStatus


async def list_endpoints(request: web.Request) -> web.Response:
    """The serving endpoints; `?since=CURSOR` for changes only, `&wait=S` to long-poll."""
    fleet = request.app[FLEET]
    not_yet = request.app[FEED_HOLD].reason()  # a new leader, before the agents reported
    if not_yet is not None:
        return error(503, not_yet)
    since = request.query.get("since", "")
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        raise BadRequest("`wait` must be a number of seconds") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise BadRequest(f"`wait` must be between 0 and {MAX_WAIT_S:g} seconds")
    after = parse_cursor(fleet, since)
    if wait and after is not None and after >= fleet.revision:
        await fleet.wait_changed(after, wait)
    return json_model(endpoints_since(fleet, since))


async def gateway_status(request: web.Request) -> web.Response:
    # Bounded by the replicas that exist: a bigger status is not worth parsing.
    body = await parse_body(request, GatewayStatus, limit=request.app[GATEWAYS].status_bytes())
    try:
        request.app[GATEWAYS].report(body, by=who(request))
    except TooManyGateways as exc:
        return error(429, str(exc))
    return web.Response(status=204)


async def list_gateways(request: web.Request) -> web.Response:
    return json_models(request.app[GATEWAYS].views())
