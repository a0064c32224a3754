"""Tenants' client keys: an admin makes, lists and revokes them; gateways follow them."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from llmgw.controller.http.keys import term_of
from llmgw.controller.http.web_io import json_model, json_models, parse_body, wait_param, who
from llmgw.controller.state.client_keys import view
from llmgw.controller.state.limits import view as limit_view
from llmgw.errors import UnknownClientKey
from llmgw.wire import ClientKeyRequest

log = logging.getLogger("llmgw.controller")


async def create_client_key(request: web.Request) -> web.Response:
    body = await parse_body(request, ClientKeyRequest)
    secret, key = term_of(request.app).client_keys.create(
        tenant=body.tenant,
        models=tuple(dict.fromkeys(body.models)),
        by=who(request),
        at=time.time(),
        expires_s=body.expires_s,
    )
    log.info("client key %s of tenant %s made by %s", key.id, key.tenant, who(request))
    return json_model(view(key, time.time(), secret), status=201)


async def list_client_keys(request: web.Request) -> web.Response:
    now = time.time()
    return json_models([view(k, now) for k in term_of(request.app).client_keys.list()])


async def revoke_client_key(request: web.Request) -> web.Response:
    key_id = request.match_info["id"]
    key = term_of(request.app).client_keys.revoke(key_id)
    if key is None:
        raise UnknownClientKey(key_id)
    log.info("client key %s of tenant %s revoked by %s", key.id, key.tenant, who(request))
    return web.json_response({"id": key.id, "tenant": key.tenant, "revoked": True})


async def client_keys_feed(request: web.Request) -> web.Response:
    """Every key's digest; `?since=CURSOR&wait=S` long-polls until they change."""
    wait = wait_param(request)
    keys = term_of(request.app).client_keys
    if wait:
        await keys.wait_past(request.query.get("since", ""), wait)
    term = term_of(request.app)  # (a takeover may have come while it waited)
    limits = [limit_view(k) for k in term.limits.list()]
    return json_model(term.client_keys.feed().model_copy(update={"limits": limits}))
