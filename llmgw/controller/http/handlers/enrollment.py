"""Enrollment and node credentials: a node trading an enrollment token for its
credential; an admin's credentials, approvals, allowances and enrollment tokens."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from llmgw.controller.http.keys import ENROLL_LIMIT, ENROLL_REFUSALS, SETTINGS, term_of
from llmgw.controller.http.web_io import json_model, json_models, node_param, parse_body, who
from llmgw.controller.state.enroll_tokens import view as token_view
from llmgw.errors import (
    AlreadyEnrolled,
    Conflict,
    EnrollNotAllowed,
    TooManyEnrollments,
    Unknown,
    UnknownEnrollToken,
)
from llmgw.wire import (
    CredentialView,
    EmptyRequest,
    EnrollReply,
    EnrollRequest,
    EnrollTokenRequest,
    EventReason,
)

log = logging.getLogger("llmgw.controller")


async def agent_enroll(request: web.Request) -> web.Response:
    """Trade an enrollment token for the node's own credential (once per node)."""
    wait = request.app[ENROLL_LIMIT].take()  # before the body: a refusal costs nothing
    if wait:
        raise TooManyEnrollments(request.app[SETTINGS].enroll_rate, wait)
    body = await parse_body(request, EnrollRequest)
    node, by, at = body.node, who(request), time.time()
    term = term_of(request.app)
    creds = term.credentials
    pending = request.app[SETTINGS].enroll_approval
    term.expire_credentials(at)  # enrollments add credentials: the expired go first
    try:
        secret = creds.enroll(
            node,
            by=by,
            at=at,
            known=node in term.facts.nodes,
            pending=pending,
            token=request.get("enroll_token"),
        )
    except (AlreadyEnrolled, EnrollNotAllowed) as exc:
        # Someone tried to take over a node that exists: worth an event, once an hour.
        if request.app[ENROLL_REFUSALS].due(node):
            term.facts.event(f"node/{node}", EventReason.ENROLL_REFUSED, f"{by}: {exc}")
        raise
    term.facts.event(f"node/{node}", EventReason.ENROLLED, f"credential issued ({by})")
    if pending:
        term.facts.approvals.await_approval(node, at)
    else:  # revoked while it awaited approval, enrolled again since it was turned off
        term.facts.approvals.drop(node)
    log.info(
        "node %s enrolled (%s): credential issued%s",
        node,
        by,
        ", awaiting approval" if pending else "",
    )
    return json_model(EnrollReply(node=node, credential=secret, awaiting_approval=pending))


async def list_credentials(request: web.Request) -> web.Response:
    term = term_of(request.app)
    term.expire_credentials(time.time())
    pending = term.facts.approvals.pending
    return json_models(
        [
            CredentialView(
                node=c.node,
                source=c.source,
                issued_at=c.issued_at,
                by=c.by,
                awaiting_approval=c.node in pending,
                expires_at=c.expires_at,
            )
            for c in term.credentials.list()
        ]
    )


async def revoke_credential(request: web.Request) -> web.Response:
    node = node_param(request, "node")
    if not term_of(request.app).credentials.revoke(node):
        raise Unknown(f"node {node!r} holds no issued credential")
    log.info("credential of node %s revoked by %s", node, who(request))
    return web.json_response({"node": node, "revoked": True})


async def approve_credential(request: web.Request) -> web.Response:
    """Let an enrolled node take replicas (`ctl credentials approve`), as CSR approval."""
    node = node_param(request, "node")
    await parse_body(request, EmptyRequest, optional=True)
    term = term_of(request.app)
    if not term.facts.approvals.approve(node, who(request), term.facts.wall()):
        if not term.credentials.holds(node):
            raise Unknown(f"node {node!r} holds no credential to approve")
        raise Conflict(f"node {node!r} awaits no approval: it may take replicas already")
    log.info("node %s approved by %s", node, who(request))
    return web.json_response({"node": node, "approved": True})


async def allow_enroll(request: web.Request) -> web.Response:
    """Let a node that has reported before enroll once (`ctl credentials allow`)."""
    node = node_param(request, "node")
    await parse_body(request, EmptyRequest, optional=True)
    if node not in term_of(request.app).facts.nodes:
        raise Conflict(f"node {node!r} has never reported here: it may enroll without an allowance")
    term_of(request.app).credentials.allow(node, by=who(request), at=time.time())
    log.info("node %s allowed to enroll by %s", node, who(request))
    return web.json_response({"node": node, "allowed": True})


async def create_enroll_token(request: web.Request) -> web.Response:
    body = await parse_body(request, EnrollTokenRequest, optional=True)
    secret, token = term_of(request.app).credentials.tokens.create(
        by=who(request),
        at=time.time(),
        ttl_s=body.ttl_s or None,
        uses=body.uses,
        description=body.description,
    )
    log.info("enrollment token %s made by %s", token.id, who(request))
    return json_model(token_view(token, time.time(), secret), status=201)


async def list_enroll_tokens(request: web.Request) -> web.Response:
    now = time.time()
    return json_models([token_view(t, now) for t in term_of(request.app).credentials.tokens.list()])


async def delete_enroll_token(request: web.Request) -> web.Response:
    token_id = request.match_info["id"]
    if not term_of(request.app).credentials.tokens.delete(token_id):
        raise UnknownEnrollToken(token_id)
    log.info("enrollment token %s deleted by %s", token_id, who(request))
    return web.Response(status=204)
