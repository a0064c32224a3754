"""The controller itself: `/healthz` (alive, role, who leads), `/metrics`, whoami."""

from __future__ import annotations

from aiohttp import web

from llmgw import __version__
from llmgw.controller.core.auth import Identity
from llmgw.controller.http.keys import LEADERSHIP, METRICS
from llmgw.controller.metrics import CONTENT_TYPE_LATEST


async def healthz(request: web.Request) -> web.Response:
    """Alive, this controller's role and epoch, and who leads."""
    lead = request.app.get(LEADERSHIP)
    role = lead.health() if lead is not None else {"role": "follower", "epoch": 0, "leader": None}
    return web.json_response({"ok": True, "version": __version__, **role})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def whoami(request: web.Request) -> web.Response:
    """Any valid token may ask what it is, so front ends offer only what it may do."""
    identity: Identity = request["identity"]
    role = identity.role.value if identity.role is not None else None
    return web.json_response({"name": identity.name, "role": role})
