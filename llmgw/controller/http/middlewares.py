"""What every request meets before its handler: `front_middleware` (a compressed
body refused, followers answer only what they may, errors as their statuses) and
`auth_middleware` (who the bearer token is, and whether that role may take the route)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from llmgw.controller.core.auth import Identity, Role, bearer
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.bodies import close_if_unread, refuse_encoded
from llmgw.controller.http.keys import LEADERSHIP, Handler, term_of
from llmgw.controller.http.web_io import answer
from llmgw.controller.state.enroll_tokens import why_spent
from llmgw.errors import (
    BadRequest,
    NotAuthenticated,
    NotTheLeader,
    PermissionDenied,
    ServerError,
    TokenSpent,
)
from llmgw.wire import printable

# What a follower still answers itself: who leads, and its own process metrics.
FOLLOWER_PATHS = frozenset({"/healthz", "/metrics"})


@web.middleware
async def front_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What every request meets before auth, in one layer (each layer costs every
    request a call and a coroutine): a compressed body refused (llmgw.controller.http.bodies);
    only the leader takes reports, admin writes and reads of the fleet; every refusal
    answered here, with its status, body and headers (llmgw.errors): the one place
    that maps errors to answers."""
    try:
        refuse_encoded(request)
        lead = request.app.get(LEADERSHIP)
        if lead is None or lead.is_leader or request.path in FOLLOWER_PATHS:
            resp = await handler(request)
        else:
            raise NotTheLeader(lead.leader_url)
        if (
            lead is not None
            and not lead.is_leader
            and request.method == "GET"
            and request.path not in FOLLOWER_PATHS
        ):
            # Stepped down while it waited (a long poll): its answer is no longer
            # the fleet's. A write that got here was stored under the fence, so
            # its answer stands.
            raise NotTheLeader(lead.leader_url)
    except ServerError as exc:
        resp = answer(exc)
    except web.HTTPException as exc:  # aiohttp's own: no route, method not allowed
        if exc.status < 400:
            raise
        resp = web.json_response({"error": exc.reason}, status=exc.status)
    close_if_unread(request, resp)
    return resp


# What a node credential may do: report as its node, follow its assignments (the
# handlers check it is its node), and say who it is.
NODE_CREDENTIAL_ROUTES = frozenset(
    {"POST /v1/agent/report", "GET /v1/agent/assignments/{name}", "GET /v1/whoami"}
)


def auth_middleware(
    settings: ControllerSettings, route_roles: Mapping[str, frozenset[Role]]
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """`route_roles`: "METHOD /path/{template}" -> the roles allowed (llmgw.controller.http.routes);
    a route not in it (healthz) is public."""
    tokens = settings.tokens

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        canonical = route.canonical if route is not None else ""
        key = f"{request.method} {canonical}"
        allowed = route_roles.get(key)
        if allowed is None:  # public (healthz) or not found
            return await handler(request)
        if not tokens.enabled:
            claimed = _claimed_user(request)
            request["identity"] = ANONYMOUS if claimed is None else Identity(claimed, None)
            return await handler(request)
        header = request.headers.get("Authorization")
        if header is not None and not _is_text(header):
            raise NotAuthenticated("invalid token: the Authorization header is not valid text")
        presented = bearer(header)
        if presented is None:
            raise NotAuthenticated("missing token: this controller needs a bearer token")
        identity, now = tokens.identify(presented), time.time()
        if identity is None:
            node = term_of(request.app).credentials.identify(presented, now)
            identity = None if node is None else Identity(node, Role.AGENT, node)
        if identity is None:
            enroll_token = term_of(request.app).credentials.tokens.identify(presented)
            if enroll_token is not None:
                spent = why_spent(enroll_token, now)
                if spent is not None:
                    raise TokenSpent(spent)
                identity = Identity(f"enrollment token {enroll_token.id}", Role.ENROLL)
                request["enroll_token"] = enroll_token
        if identity is None:
            raise NotAuthenticated("invalid token")
        if identity.node is not None and key not in NODE_CREDENTIAL_ROUTES:
            raise PermissionDenied(
                f"a node credential (node {identity.node}) may only report as its node"
            )
        if identity.role not in allowed:
            need = " or ".join(_article(v) for v in sorted(r.value for r in allowed))
            raise PermissionDenied(
                f"{_article(str(identity.role))} token cannot do this; it needs {need} token"
            )
        claimed = _claimed_user(request)
        if claimed and claimed != identity.name:
            identity = Identity(f"{identity.name} ({claimed})", identity.role, identity.node)
        request["identity"] = identity
        return await handler(request)

    return middleware


ANONYMOUS = Identity("anonymous", None)  # open mode (no tokens), no user said


def _article(word: str) -> str:
    """'an admin', 'an agent', 'a read'."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _claimed_user(request: web.Request) -> str | None:
    """The operator's login name as the client says it: recorded beside the token's identity."""
    user = request.headers.get("X-LLMGW-User")
    if user is None:  # agents and gateways say no user
        return None
    user = user.strip()
    if not _is_text(user) or _has_control(user):
        raise BadRequest("the X-LLMGW-User header must be printable UTF-8 text")
    return user[:64] or None


def _is_text(value: str) -> bool:
    """aiohttp keeps undecodable header bytes as lone surrogates: those are not text."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _has_control(value: str) -> bool:
    return printable(value) != value
