"""Tenants' usage and limits: gateways post what they metered and hear what the fleet
spent; an admin sets limits; anyone with a read token asks who used what."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from llmgw.controller.http.keys import term_of
from llmgw.controller.http.web_io import json_model, json_models, parse_body, who
from llmgw.controller.state.limits import view
from llmgw.durations import parse_duration
from llmgw.errors import BadRequest, UnknownLimit
from llmgw.wire import LimitRequest, UsageBatch, UsageReport

log = logging.getLogger("llmgw.controller")

BY = ("tenant", "model")
MAX_SINCE_S = 400 * 86_400.0


async def usage_batch(request: web.Request) -> web.Response:
    body = await parse_body(request, UsageBatch)
    answer = term_of(request.app).usage.ingest(body, time.time())
    return json_model(answer)


async def usage_report(request: web.Request) -> web.Response:
    """`?since=24h` (a duration back from now; default 24h) `&by=tenant,model`."""
    try:
        since_s = parse_duration(request.query.get("since", "24h"))
    except ValueError as exc:
        raise BadRequest(f"`since`: {exc}") from None
    if not 0 < since_s <= MAX_SINCE_S:
        raise BadRequest(f"`since` must be more than 0 and at most {MAX_SINCE_S / 86_400:g}d")
    by = tuple(x for x in request.query.get("by", "tenant,model").split(",") if x)
    if not by or any(x not in BY for x in by):
        raise BadRequest("`by` is tenant, model or tenant,model")
    now = time.time()
    usage = term_of(request.app).usage
    since = now - since_s
    return json_model(UsageReport(since=since - since % 3600, rows=usage.report(since, by)))


async def set_limit(request: web.Request) -> web.Response:
    body = await parse_body(request, LimitRequest)
    limit = term_of(request.app).limits.set(body, by=who(request), at=time.time())
    log.info("limits of tenant %s%s set by %s", limit.tenant, _on(limit.model), who(request))
    return json_model(view(limit))


async def list_limits(request: web.Request) -> web.Response:
    return json_models([view(k) for k in term_of(request.app).limits.list()])


async def delete_limit(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    model = request.query.get("model") or None
    limit = term_of(request.app).limits.delete((tenant, model))
    if limit is None:
        raise UnknownLimit(tenant, model)
    log.info("limits of tenant %s%s deleted by %s", limit.tenant, _on(model), who(request))
    return web.json_response({"tenant": limit.tenant, "model": limit.model, "deleted": True})


def _on(model: str | None) -> str:
    return f" on model {model}" if model else ""
