"""Nodes: agent reports, the fleet's reads (summary, nodes, events) and the
admin's node actions (cordon, uncordon, drain, the drain plan, forget)."""

from __future__ import annotations

import logging
import re
import time

from aiohttp import web

from llmgw.controller.core.admin_flags import BY_LLMGW
from llmgw.controller.core.auth import Identity
from llmgw.controller.http.adapter_views import adapter_views
from llmgw.controller.http.authorize import report_refusal
from llmgw.controller.http.keys import LEADERSHIP, METRICS, REFUSALS, term_of
from llmgw.controller.http.web_io import json_model, node_param, parse_body, wait_param, who
from llmgw.controller.loop.reconcile import drain_plan as plan_drain
from llmgw.controller.state.facts import Facts
from llmgw.errors import BadRequest, Conflict, NotRevocable, NotTheLeader, PermissionDenied
from llmgw.wire import (
    AdminFlag,
    DrainPlanRequest,
    DrainRequest,
    EmptyRequest,
    NodeReport,
    ReasonRequest,
    UncordonRequest,
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
        term = term_of(request.app)
        identity: Identity = request["identity"]
        refusal = report_refusal(identity, report, term.facts.records)
        if refusal is not None:
            outcome = "refused"
            request.app[REFUSALS].note(identity.node or report.node, refusal)
            raise PermissionDenied(refusal)
        body = term.ingest_json(report, await request.read())
        if identity.node is not None:  # its credential, used: it no longer expires
            term.credentials.reported(identity.node, time.time())
        outcome = "ok"
    finally:
        request.app[METRICS].reports.observe(time.perf_counter() - started, outcome)
    return web.Response(body=body, content_type="application/json")


async def agent_assignments(request: web.Request) -> web.Response:
    """A node's reply (flag, state, assignments) once it is not the one the agent has
    (`If-None-Match`), waiting up to `?wait=S`; 304 if it is still that one."""
    node = node_param(request)
    identity: Identity = request["identity"]
    if identity.node is not None and identity.node != node:
        raise PermissionDenied(f"this credential speaks for node {identity.node!r}, not {node!r}")
    wait = wait_param(request)
    term = term_of(request.app)
    term.facts.require(node)  # 404 for a node that never reported
    have = request.headers.get("If-None-Match", "").strip('"')
    version, body = await term.replies.changed_reply(node, have, wait)
    if term_of(request.app) is not term:  # stepped down and led again meanwhile
        raise NotTheLeader(request.app[LEADERSHIP].leader_url)
    headers = {"ETag": f'"{version}"'}
    if version == have:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def summary(request: web.Request) -> web.Response:
    term = term_of(request.app)
    summary = term.summary(term.gateways.in_flight(term.facts.clock()))
    if term.facts.adapters:
        summary = summary.model_copy(update={"adapters": adapter_views(term)})
    return json_model(summary)


async def list_nodes(request: web.Request) -> web.Response:
    """Every row; with `?since=CURSOR` (even empty), only what changed after it."""
    term = term_of(request.app)
    since = request.query.get("since")
    body = term.rows.rows_json() if since is None else term.rows.nodes_since_json(since)
    return web.Response(body=body, content_type="application/json")


async def get_node(request: web.Request) -> web.Response:
    return json_model(term_of(request.app).rows.detail(node_param(request)))


_EVENT_OBJECT = re.compile(r"(node|model|adapter)/.{1,512}")


async def list_events(request: web.Request) -> web.Response:
    """What the controller decided by itself; `?since=ID` for the ones after an
    id, `?for=node/NAME` or `?for=model/NAME` for one object's."""
    since, obj = request.query.get("since", "0"), request.query.get("for")
    if not since.isdigit() or len(since) > 18:
        raise BadRequest(f"since must be an event id (a whole number), got {since[:40]!r}")
    if obj is not None and not _EVENT_OBJECT.fullmatch(obj):
        raise BadRequest(f"for must be node/NAME, model/NAME or adapter/NAME, got {obj[:60]!r}")
    if obj is not None and obj.startswith("node/"):
        try:
            obj = "node/" + node_name(obj[5:])  # node/GPU01 is node gpu01's
        except ValueError as exc:
            raise BadRequest(f"for: {exc}") from None
    return json_model(term_of(request.app).facts.events(int(since), obj))


async def cordon(request: web.Request) -> web.Response:
    term = term_of(request.app)
    name = node_param(request)
    term.facts.require(name)
    body = await parse_body(request, ReasonRequest)
    term.facts.set_flag(name, AdminFlag.CORDONED, body.reason, who(request))
    return json_model(term.rows.row(name))


async def uncordon(request: web.Request) -> web.Response:
    term = term_of(request.app)
    name = node_param(request)
    term.facts.require(name)
    body = await parse_body(request, UncordonRequest, optional=True)
    if not body.force:
        _refuse_while_its_card_fails(term.facts, name)
    term.facts.set_flag(name, AdminFlag.NONE, None, who(request))
    return json_model(term.rows.row(name))


def _refuse_while_its_card_fails(facts: Facts, name: str) -> None:
    """A node llmgw cordoned for a failed card stays cordoned while a card of it is
    still unhealthy, as Slurm's health-check drains come back: uncordoning it would
    place replicas beside the fault. `force` lifts it anyway; an operator's own
    cordon is theirs to lift."""
    admin = facts.admin_info(name)
    entry = facts.nodes.get(name)
    if admin.flag is not AdminFlag.CORDONED or admin.by != BY_LLMGW or entry is None:
        return
    if admin.awaiting_approval or not entry.faults:
        return
    cards = sorted(entry.faults, key=lambda f: f.gpu_index)
    more = f" (and {len(cards) - 1} more)" if len(cards) > 1 else ""
    raise Conflict(
        f"llmgw cordoned {name} for a card fault and the card is still unhealthy: "
        f"{cards[0].describe()}{more}. Reset or replace the card (the agent reports it "
        "healthy again), or uncordon with --force (force: true) to place replicas beside it"
    )


async def drain(request: web.Request) -> web.Response:
    term = term_of(request.app)
    name = node_param(request)
    term.facts.require(name)
    body = await parse_body(request, DrainRequest)
    term.facts.set_flag(
        name,
        AdminFlag.DRAINING,
        body.reason,
        who(request),
        force=body.force,
        force_after_s=body.force_after_s,
    )
    return json_model(term.rows.row(name))


async def drain_plan(request: web.Request) -> web.Response:
    body = await parse_body(request, DrainPlanRequest)
    term = term_of(request.app)
    for name in body.nodes:
        term.facts.require(name)
    return json_model(plan_drain(term, body.nodes))


async def forget_node(request: web.Request) -> web.Response:
    """Forget a node for good: credential revoked first, then its row and replicas."""
    term = term_of(request.app)
    name = node_param(request)
    term.facts.require(name)
    await parse_body(request, EmptyRequest, optional=True)
    try:
        revoked = term_of(request.app).credentials.revoke(name)
    except NotRevocable:
        revoked = False  # a file credential: the operator removes its line
    term.facts.forget_node(name, who(request))
    log.info("node %s forgotten by %s", name, who(request))
    return web.json_response({"node": name, "forgotten": True, "credential_revoked": revoked})
