"""Nodes: agent reports, the fleet's reads (summary, nodes, events) and the
admin's node actions (cordon, uncordon, drain, the drain plan, forget)."""

from __future__ import annotations

import logging
import re
import time

from aiohttp import web

from llmgw.controller.auth import Identity
from llmgw.controller.authorize import report_refusal
from llmgw.controller.credentials import NotRevocable
from llmgw.controller.keys import CREDENTIALS, FLEET, GATEWAYS, METRICS, REFUSALS
from llmgw.controller.reconcile import drain_plan as plan_drain
from llmgw.controller.web_io import error, json_model, node_param, parse_body, who
from llmgw.errors import BadRequest
from llmgw.wire import (
    AdminFlag,
    DrainPlanRequest,
    DrainRequest,
    EmptyRequest,
    NodeReport,
    ReasonRequest,
    node_name,
)

log = logging.getLogger("llmgw.controller")


async def agent_report(request: web.Request) -> web.Response:
    started, outcome = time.perf_counter(), None
    try:
        try:
            report = await parse_body(request, NodeReport)
        except BadRequest:
            outcome = "rejected"
            raise
        fleet = request.app[FLEET]
        identity: Identity = request["identity"]
        refusal = report_refusal(identity, report, fleet.records)
        if refusal is not None:
            outcome = "refused"
            request.app[REFUSALS].note(identity.node or report.node, refusal)
            return error(403, refusal)
        body = fleet.ingest_json(report, await request.read())
        outcome = "ok"
    finally:
        request.app[METRICS].reports.observe(time.perf_counter() - started, outcome)
    return web.Response(body=body, content_type="application/json")


async def summary(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_model(fleet.summary(request.app[GATEWAYS].in_flight(fleet.clock())))


async def list_nodes(request: web.Request) -> web.Response:
    """Every row; with `?since=CURSOR` (even empty), only what changed after it."""
    fleet = request.app[FLEET]
    since = request.query.get("since")
    body = fleet.rows_json() if since is None else fleet.nodes_since_json(since)
    return web.Response(body=body, content_type="application/json")


async def get_node(request: web.Request) -> web.Response:
    return json_model(request.app[FLEET].detail(node_param(request)))


_EVENT_OBJECT = re.compile(r"(node|model)/.{1,512}")


async def list_events(request: web.Request) -> web.Response:
    """What the controller decided by itself; `?since=ID` for the ones after an
    id, `?for=node/NAME` or `?for=model/NAME` for one object's."""
    since, obj = request.query.get("since", "0"), request.query.get("for")
    if not since.isdigit() or len(since) > 18:
        raise BadRequest(f"since must be an event id (a whole number), got {since[:40]!r}")
    if obj is not None and not _EVENT_OBJECT.fullmatch(obj):
        raise BadRequest(f"for must be node/NAME or model/NAME, got {obj[:60]!r}")
    if obj is not None and obj.startswith("node/"):
        try:
            obj = "node/" + node_name(obj[5:])  # node/GPU01 is node gpu01's
        except ValueError as exc:
            raise BadRequest(f"for: {exc}") from None
    return json_model(request.app[FLEET].events(int(since), obj))


async def cordon(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = node_param(request)
    fleet.require(name)
    body = await parse_body(request, ReasonRequest)
    return json_model(fleet.set_flag(name, AdminFlag.CORDONED, body.reason, who(request)))


async def uncordon(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = node_param(request)
    fleet.require(name)
    await parse_body(request, EmptyRequest, optional=True)
    return json_model(fleet.set_flag(name, AdminFlag.NONE, None, who(request)))


async def drain(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = node_param(request)
    fleet.require(name)
    body = await parse_body(request, DrainRequest)
    row = fleet.set_flag(
        name,
        AdminFlag.DRAINING,
        body.reason,
        who(request),
        force=body.force,
        force_after_s=body.force_after_s,
    )
    return json_model(row)


async def drain_plan(request: web.Request) -> web.Response:
    body = await parse_body(request, DrainPlanRequest)
    fleet = request.app[FLEET]
    for name in body.nodes:
        fleet.require(name)
    return json_model(plan_drain(fleet, body.nodes))


async def forget_node(request: web.Request) -> web.Response:
    """Forget a node for good: credential revoked first, then its row and replicas."""
    fleet = request.app[FLEET]
    name = node_param(request)
    fleet.require(name)
    await parse_body(request, EmptyRequest, optional=True)
    try:
        revoked = request.app[CREDENTIALS].revoke(name)
    except NotRevocable:
        revoked = False  # a file credential: the operator removes its line
    fleet.forget_node(name, who(request))
    log.info("node %s forgotten by %s", name, who(request))
    return web.json_response({"node": name, "forgotten": True, "credential_revoked": revoked})
