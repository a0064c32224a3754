"""Gateways: the endpoint feed they follow (long-polled) and the status they send."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgw.controller.core import cursors
from llmgw.controller.core.auth import Identity, Role
from llmgw.controller.http.keys import term_of
from llmgw.controller.http.web_io import json_model, json_models, parse_body, wait_param, who
from llmgw.errors import Unavailable
from llmgw.wire import GatewayStatus, GatewayStatusReply

log = logging.getLogger(__name__)


async def list_endpoints(request: web.Request) -> web.Response:
    """The serving endpoints; `?since=CURSOR` for changes only, `&wait=S` to long-poll."""
    term = term_of(request.app)
    not_yet = term.feed_hold.reason()  # a new leader, before the agents reported
    if not_yet is not None:
        raise Unavailable(not_yet)
    since = request.query.get("since", "")
    wait = wait_param(request)
    after = cursors.parse(since, term.run)
    if wait and after is not None and after >= term.facts.revision:
        await term.facts.wait_changed(after, wait)
    return json_model(term.endpoints_since(since, with_keys=holds_engine_keys(request)))


def holds_engine_keys(request: web.Request) -> bool:
    """Whether this reader is told engine keys: a gateway's token, or anyone in open
    mode (no tokens: loopback only, where every caller is trusted alike)."""
    identity: Identity = request["identity"]
    return identity.role is None or identity.role is Role.GATEWAY


async def gateway_status(request: web.Request) -> web.Response:
    # Bounded by the replicas that exist: a bigger status is not worth parsing.
    body = await parse_body(
        request, GatewayStatus, limit=term_of(request.app).gateways.status_bytes()
    )
    term = term_of(request.app)
    took = term.gateways.report(body, by=who(request))
    if log.isEnabledFor(logging.DEBUG):  # what a wake or a switch waited on, when traced
        busy = {r: n for r, n in body.in_flight.items() if n}
        log.debug(
            "gateway %s status: in flight %s (of %d), held %s, released %s",
            body.name, busy, len(body.in_flight), body.held, body.released,
        )  # fmt: skip
    if body.held or body.released:  # a wake, or a stop, waits on the loop's next pass
        term.decide_soon.set()
    if body.keys_used:
        term.client_keys.used(body.keys_used)
    return json_model(GatewayStatusReply(full=not took))


async def list_gateways(request: web.Request) -> web.Response:
    return json_models(term_of(request.app).gateways.views())
