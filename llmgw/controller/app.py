"""The controller's aiohttp application: routes, auth and error handling.

`create_app(settings)` is the factory used by `llmgw controller`, the demo and
the tests. State lives under typed `web.AppKey`s; the store and the leadership
(which runs the reconcile loop while this controller leads, leadership.py) are
resources in `cleanup_ctx`. Followers answer 503 naming the leader.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from llmgw import __version__
from llmgw.controller.auth import (
    ADMIN_ROLES,
    AGENT_ROLES,
    ENDPOINT_READERS,
    ENROLL_ROLES,
    GATEWAY_ROLES,
    METRICS_ROLES,
    READ_ROLES,
    Identity,
    Role,
    bearer,
)
from llmgw.controller.authorize import RefusalLog, report_refusal
from llmgw.controller.bodies import HANDLER_ARGS, close_if_unread, refused_encoding
from llmgw.controller.credentials import (
    AlreadyEnrolled,
    Credentials,
    NotAllowed,
    NotRevocable,
    TokenSpent,
)
from llmgw.controller.endpoints import (
    MAX_WAIT_S,
    FeedHold,
    Gateways,
    TooManyGateways,
    endpoint_of,
    endpoints_since,
    parse_cursor,
)
from llmgw.controller.enroll_tokens import TooManyTokens, why_spent
from llmgw.controller.enroll_tokens import view as token_view
from llmgw.controller.fleet import FleetState
from llmgw.controller.leadership import Leadership, not_the_leader
from llmgw.controller.metrics import CONTENT_TYPE_LATEST, ControllerMetrics
from llmgw.controller.ratelimit import Once, TokenBucket, retry_after
from llmgw.controller.reconcile import drain_plan as plan_drain
from llmgw.controller.revisions import same_engine
from llmgw.controller.settings import ControllerSettings, split_listen
from llmgw.controller.store import Fenced, Store, StoreUnavailable
from llmgw.controller.stores import StateStore, open_lease, open_store, store_spec
from llmgw.errors import BadRequest, ClientGone, ServerError, SlowBody, TooLarge
from llmgw.listen import PortInUse, start_site
from llmgw.wire import (
    PATTERN_MESSAGES,
    AdminFlag,
    CredentialView,
    DrainPlanRequest,
    DrainRequest,
    EmptyRequest,
    EnrollReply,
    EnrollRequest,
    EnrollTokenRequest,
    EventReason,
    GatewayStatus,
    ModelDryRun,
    ModelSpecList,
    NodeReport,
    ReasonRequest,
    RolloutUndo,
    node_name,
    printable,
    validate_json,
)

log = logging.getLogger("llmgw.controller")

SETTINGS = web.AppKey("settings", ControllerSettings)
FLEET = web.AppKey("fleet", FleetState)
CREDENTIALS = web.AppKey("credentials", Credentials)
REFUSALS = web.AppKey("refusals", RefusalLog)
ENROLL_LIMIT = web.AppKey("enroll_limit", TokenBucket)
ENROLL_REFUSALS = web.AppKey("enroll_refusals", Once)  # an event per node per hour
# What a node credential may do: report as its node (and say who it is).
NODE_CREDENTIAL_ROUTES = frozenset({"POST /v1/agent/report", "GET /v1/whoami"})
METRICS = web.AppKey("metrics", ControllerMetrics)
GATEWAYS = web.AppKey("gateways", Gateways)
FEED_HOLD = web.AppKey("feed_hold", FeedHold)
STORE = web.AppKey("store", StateStore)
LEADERSHIP = web.AppKey("leadership", Leadership)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)


# -- responses -------------------------------------------------------------------


def json_model(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        body=model.model_dump_json(by_alias=True), status=status, content_type="application/json"
    )


def json_models(models: list[Any]) -> web.Response:
    body = b"[" + b",".join(m.model_dump_json(by_alias=True).encode() for m in models) + b"]"
    return web.Response(body=body, content_type="application/json")


def error(status: int, message: str, detail: list[dict[str, Any]] | None = None) -> web.Response:
    payload: dict[str, Any] = {"error": message}
    if detail:
        payload["detail"] = detail
    return web.json_response(payload, status=status)


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
        where = ", ".join(d["loc"] for d in detail[:3])
        raise BadRequest(f"invalid {model.__name__}: check {where}", detail) from exc


# -- middleware ----------------------------------------------------------------------


# What a follower still answers itself: who leads, and its own process metrics.
FOLLOWER_PATHS = frozenset({"/healthz", "/metrics"})


@web.middleware
async def front_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What every request meets before auth, in one layer (each layer costs every
    request a call and a coroutine): a compressed body refused (llmgw.controller.bodies);
    only the leader takes reports, admin writes and reads of the fleet; each error
    answered with its status and message (llmgw.errors)."""
    resp: web.StreamResponse | None = refused_encoding(request)
    if resp is None:
        try:
            lead = request.app.get(LEADERSHIP)
            if lead is None or lead.is_leader:
                resp = await handler(request)
                if (
                    lead is not None
                    and not lead.is_leader
                    and request.method == "GET"
                    and request.path not in FOLLOWER_PATHS
                ):
                    # Stepped down while it waited (a long poll): its answer is no longer
                    # the fleet's. A write that got here was stored under the fence, so
                    # its answer stands.
                    resp = not_the_leader(lead.leader_url)
            elif request.path in FOLLOWER_PATHS:
                resp = await handler(request)
            else:
                resp = not_the_leader(lead.leader_url)
        except ServerError as exc:
            resp = error(exc.status, exc.message, exc.detail)
            if exc.close:
                resp.force_close()
        except Fenced as exc:  # a deposed leader's write: nothing stored, here is the leader
            resp = not_the_leader(exc.leader, str(exc))
        except StoreUnavailable as exc:  # nothing was stored, nothing changed
            resp = error(503, str(exc))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            resp = error(exc.status, exc.reason)
    assert resp is not None
    close_if_unread(request, resp)
    return resp


def auth_middleware(settings: ControllerSettings) -> Callable[..., Awaitable[web.StreamResponse]]:
    tokens = settings.tokens

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        canonical = route.canonical if route is not None else ""
        key = f"{request.method} {canonical}"
        allowed = ROUTE_ROLES.get(key)
        if allowed is None:  # public (healthz) or not found
            return await handler(request)
        if not tokens.enabled:
            claimed = _claimed_user(request)
            request["identity"] = ANONYMOUS if claimed is None else Identity(claimed, None)
            return await handler(request)
        header = request.headers.get("Authorization")
        if header is not None and not _is_text(header):
            return error(401, "invalid token: the Authorization header is not valid text")
        presented = bearer(header)
        if presented is None:
            return error(401, "missing token: this controller needs a bearer token")
        identity = tokens.identify(presented)
        if identity is None:
            node = request.app[CREDENTIALS].identify(presented)
            identity = None if node is None else Identity(node, Role.AGENT, node)
        if identity is None:
            enroll_token = request.app[CREDENTIALS].tokens.identify(presented)
            if enroll_token is not None:
                spent = why_spent(enroll_token, time.time())
                if spent is not None:
                    return error(
                        401,
                        f"{spent}: ask an admin for a new one (llmgw ctl credentials token create)",
                    )
                identity = Identity(f"enrollment token {enroll_token.id}", Role.ENROLL)
                request["enroll_token"] = enroll_token
        if identity is None:
            return error(401, "invalid token")
        if identity.node is not None and key not in NODE_CREDENTIAL_ROUTES:
            return error(
                403, f"a node credential (node {identity.node}) may only report as its node"
            )
        if identity.role not in allowed:
            need = " or ".join(_article(v) for v in sorted(r.value for r in allowed))
            return error(
                403, f"{_article(str(identity.role))} token cannot do this; it needs {need} token"
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


def node_param(request: web.Request, key: str = "name") -> str:
    """The node a URL names, normalised as every node name is (`GPU-A01` is gpu-a01)."""
    try:
        return node_name(request.match_info[key])
    except ValueError as exc:
        raise BadRequest(f"no such node can exist: {exc}") from None


def who(request: web.Request) -> str:
    identity: Identity = request["identity"]
    return identity.name


# -- handlers ------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    """Alive, this controller's role and epoch, and who leads."""
    lead = request.app.get(LEADERSHIP)
    role = lead.health() if lead is not None else {"role": "follower", "epoch": 0, "leader": None}
    return web.json_response({"ok": True, "version": __version__, **role})


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


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def agent_enroll(request: web.Request) -> web.Response:
    """Trade an enrollment token for the node's own credential (once per node)."""
    wait = request.app[ENROLL_LIMIT].take()  # before the body: a refusal costs nothing
    if wait:
        rate = request.app[SETTINGS].enroll_rate
        resp = error(429, f"too many enrollments (at most {rate:g} per second): try again shortly")
        resp.headers["Retry-After"] = retry_after(wait)
        return resp
    body = await parse_body(request, EnrollRequest)
    node, by, at = body.node, who(request), time.time()
    fleet, creds = request.app[FLEET], request.app[CREDENTIALS]
    pending = request.app[SETTINGS].enroll_approval
    try:
        secret = creds.enroll(
            node,
            by=by,
            at=at,
            known=node in fleet.nodes,
            pending=pending,
            token=request.get("enroll_token"),
        )
    except (AlreadyEnrolled, NotAllowed) as exc:
        # Someone tried to take over a node that exists: worth an event, once an hour.
        if request.app[ENROLL_REFUSALS].due(node):
            fleet.event(f"node/{node}", EventReason.ENROLL_REFUSED, f"{by}: {exc}")
        return error(409, str(exc))
    except TokenSpent as exc:
        return error(401, f"{exc}: ask an admin for a new one (llmgw ctl credentials token create)")
    fleet.event(f"node/{node}", EventReason.ENROLLED, f"credential issued ({by})")
    if pending:
        fleet.await_approval(node, at)
    else:  # revoked while it awaited approval, enrolled again since it was turned off
        fleet.drop_approval(node)
    log.info(
        "node %s enrolled (%s): credential issued%s",
        node,
        by,
        ", awaiting approval" if pending else "",
    )
    return json_model(EnrollReply(node=node, credential=secret, awaiting_approval=pending))


async def list_credentials(request: web.Request) -> web.Response:
    pending = request.app[FLEET].pending
    return json_models(
        [
            CredentialView(
                node=c.node,
                source=c.source,
                issued_at=c.issued_at,
                by=c.by,
                awaiting_approval=c.node in pending,
            )
            for c in request.app[CREDENTIALS].list()
        ]
    )


async def revoke_credential(request: web.Request) -> web.Response:
    node = node_param(request, "node")
    try:
        revoked = request.app[CREDENTIALS].revoke(node)
    except NotRevocable as exc:
        return error(409, str(exc))
    if not revoked:
        return error(404, f"node {node!r} holds no issued credential")
    log.info("credential of node %s revoked by %s", node, who(request))
    return web.json_response({"node": node, "revoked": True})


async def approve_credential(request: web.Request) -> web.Response:
    """Let an enrolled node take replicas (`ctl credentials approve`), as CSR approval."""
    node = node_param(request, "node")
    await parse_body(request, EmptyRequest, optional=True)
    if not request.app[FLEET].approve(node, who(request)):
        if not request.app[CREDENTIALS].holds(node):
            return error(404, f"node {node!r} holds no credential to approve")
        return error(409, f"node {node!r} awaits no approval: it may take replicas already")
    log.info("node %s approved by %s", node, who(request))
    return web.json_response({"node": node, "approved": True})


async def allow_enroll(request: web.Request) -> web.Response:
    """Let a node that has reported before enroll once (`ctl credentials allow`)."""
    node = node_param(request, "node")
    await parse_body(request, EmptyRequest, optional=True)
    if node not in request.app[FLEET].nodes:
        return error(
            409, f"node {node!r} has never reported here: it may enroll without an allowance"
        )
    try:
        request.app[CREDENTIALS].allow(node, by=who(request), at=time.time())
    except AlreadyEnrolled as exc:
        return error(409, str(exc))
    log.info("node %s allowed to enroll by %s", node, who(request))
    return web.json_response({"node": node, "allowed": True})


async def create_enroll_token(request: web.Request) -> web.Response:
    body = await parse_body(request, EnrollTokenRequest, optional=True)
    try:
        secret, token = request.app[CREDENTIALS].tokens.create(
            by=who(request),
            at=time.time(),
            ttl_s=body.ttl_s or None,
            uses=body.uses,
            description=body.description,
        )
    except TooManyTokens as exc:
        return error(409, str(exc))
    log.info("enrollment token %s made by %s", token.id, who(request))
    return json_model(token_view(token, time.time(), secret), status=201)


async def list_enroll_tokens(request: web.Request) -> web.Response:
    now = time.time()
    return json_models([token_view(t, now) for t in request.app[CREDENTIALS].tokens.list()])


async def delete_enroll_token(request: web.Request) -> web.Response:
    token_id = request.match_info["id"]
    if not request.app[CREDENTIALS].tokens.delete(token_id):
        return error(
            404, f"no enrollment token {token_id[:20]!r} (llmgw ctl credentials token list)"
        )
    log.info("enrollment token %s deleted by %s", token_id, who(request))
    return web.Response(status=204)


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


async def list_nodes(request: web.Request) -> web.Response:
    """Every row; with `?since=CURSOR` (even empty), only what changed after it."""
    fleet = request.app[FLEET]
    since = request.query.get("since")
    body = fleet.rows_json() if since is None else fleet.nodes_since_json(since)
    return web.Response(body=body, content_type="application/json")


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


async def get_node(request: web.Request) -> web.Response:
    return json_model(request.app[FLEET].detail(node_param(request)))


async def summary(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_model(fleet.summary(request.app[GATEWAYS].in_flight(fleet.clock())))


async def list_models(request: web.Request) -> web.Response:
    return json_models(request.app[FLEET].model_views())


async def list_replicas(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    now = fleet.clock()
    urls = {
        rid: ep.url
        for rid, rec in fleet.records.items()
        if (ep := endpoint_of(fleet, rec, now)) is not None
    }
    return json_models(
        [v.model_copy(update={"url": urls.get(v.id)}) for v in fleet.replica_views()]
    )


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


async def put_models(request: web.Request) -> web.Response:
    body = await parse_body(request, ModelSpecList)
    names = [m.name for m in body.models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"model names must be unique; repeated: {', '.join(dupes)}")
    fleet = request.app[FLEET]
    dry_run = request.query.get("dry_run", "false")
    if dry_run not in ("true", "false"):
        raise BadRequest(f"dry_run must be true or false, not {printable(dry_run)!r}")
    if dry_run == "true":  # validated as a real apply is; nothing written
        held = {v.spec.name: v.spec for v in fleet.model_views()}
        return json_models(
            [
                ModelDryRun(
                    spec=s,
                    current=held.get(s.name),
                    new_revision=s.name not in held or not same_engine(held[s.name], s),
                )
                for s in body.models
            ]
        )
    fleet.put_models(body.models, who(request))
    applied = set(names)
    return json_models([v for v in fleet.model_views() if v.spec.name in applied])


async def model_revisions(request: web.Request) -> web.Response:
    return json_models(request.app[FLEET].model_revisions(request.match_info["name"]))


async def undo_rollout(request: web.Request) -> web.Response:
    body = await parse_body(request, RolloutUndo)
    fleet = request.app[FLEET]
    name = request.match_info["name"]
    fleet.undo(name, body.to_revision, who(request))
    return json_model(next(v for v in fleet.model_views() if v.spec.name == name))


async def delete_model(request: web.Request) -> web.Response:
    request.app[FLEET].delete_model(request.match_info["name"])
    return web.Response(status=204)


async def drain_plan(request: web.Request) -> web.Response:
    body = await parse_body(request, DrainPlanRequest)
    fleet = request.app[FLEET]
    for name in body.nodes:
        fleet.require(name)
    return json_model(plan_drain(fleet, body.nodes))


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


async def whoami(request: web.Request) -> web.Response:
    """Any valid token may ask what it is, so front ends offer only what it may do."""
    identity: Identity = request["identity"]
    role = identity.role.value if identity.role is not None else None
    return web.json_response({"name": identity.name, "role": role})


# -- the factory ------------------------------------------------------------------------


ROUTES: list[tuple[str, str, Handler, frozenset[Role]]] = [
    ("POST", "/v1/agent/report", agent_report, AGENT_ROLES),
    ("GET", "/v1/summary", summary, READ_ROLES),
    ("GET", "/v1/nodes", list_nodes, READ_ROLES),
    ("GET", "/v1/nodes/{name}", get_node, READ_ROLES),
    ("GET", "/v1/models", list_models, READ_ROLES),
    ("GET", "/v1/replicas", list_replicas, READ_ROLES),
    ("POST", "/v1/drain-plan", drain_plan, READ_ROLES),
    ("POST", "/v1/nodes/{name}/cordon", cordon, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/uncordon", uncordon, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/drain", drain, ADMIN_ROLES),
    ("POST", "/v1/models", put_models, ADMIN_ROLES),
    ("DELETE", "/v1/models/{name}", delete_model, ADMIN_ROLES),
    ("GET", "/v1/models/{name}/revisions", model_revisions, READ_ROLES),
    ("POST", "/v1/models/{name}/undo", undo_rollout, ADMIN_ROLES),
    ("POST", "/v1/agent/enroll", agent_enroll, ENROLL_ROLES),
    ("GET", "/v1/credentials", list_credentials, ADMIN_ROLES),
    ("DELETE", "/v1/credentials/{node}", revoke_credential, ADMIN_ROLES),
    ("POST", "/v1/credentials/{node}/approve", approve_credential, ADMIN_ROLES),
    ("POST", "/v1/credentials/{node}/allow", allow_enroll, ADMIN_ROLES),
    ("POST", "/v1/credentials/tokens", create_enroll_token, ADMIN_ROLES),
    ("GET", "/v1/credentials/tokens", list_enroll_tokens, ADMIN_ROLES),
    ("DELETE", "/v1/credentials/tokens/{id}", delete_enroll_token, ADMIN_ROLES),
    ("POST", "/v1/nodes/{name}/forget", forget_node, ADMIN_ROLES),
    ("GET", "/metrics", metrics, METRICS_ROLES),
    ("GET", "/v1/endpoints", list_endpoints, ENDPOINT_READERS),
    ("POST", "/v1/gateways/status", gateway_status, GATEWAY_ROLES),
    ("GET", "/v1/gateways", list_gateways, READ_ROLES),
    ("GET", "/v1/events", list_events, READ_ROLES),
    ("GET", "/v1/whoami", whoami, frozenset(Role)),
]
# "METHOD /path/{template}" -> roles allowed; routes not listed (healthz) are public.
ROUTE_ROLES = {f"{method} {path}": roles for method, path, _, roles in ROUTES}


def create_app(settings: ControllerSettings) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[front_middleware, auth_middleware(settings)],
        handler_args=HANDLER_ARGS,
    )
    app[SETTINGS] = settings
    app[METRICS] = ControllerMetrics(per_node=settings.metrics_per_node)
    app[ENROLL_LIMIT] = TokenBucket(settings.enroll_rate, burst=2 * settings.enroll_rate)
    app[ENROLL_REFUSALS] = Once(every_s=3600.0)
    app.router.add_get("/healthz", healthz)
    for method, path, handler, _ in ROUTES:
        app.router.add_route(method, path, handler)
    app.cleanup_ctx.append(_fleet_ctx)
    if settings.metrics_listen:
        app.cleanup_ctx.append(_metrics_site_ctx)
    return app


async def _fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    spec = store_spec(settings)
    store = app[STORE] = open_store(spec, settings.url)
    if isinstance(store, Store):  # SQLite times its own transactions for /metrics
        store.on_write = app[METRICS].observe_store_write
    fleet = app[FLEET] = FleetState(store, settings)
    app[CREDENTIALS] = Credentials(store, settings.tokens)
    app[REFUSALS] = RefusalLog()
    app[GATEWAYS] = Gateways(fleet)
    app[FEED_HOLD] = FeedHold(fleet)
    app[METRICS].gateways = app[GATEWAYS]
    # Leading runs the reconcile loop and the saves; a follower runs neither.
    lead = app[LEADERSHIP] = Leadership(
        settings,
        store,
        fleet,
        app[CREDENTIALS],
        app[GATEWAYS],
        app[METRICS],
        lease=open_lease(spec, settings),
    )
    await lead.start()
    yield
    await lead.stop()
    store.close()


async def _metrics_site_ctx(app: web.Application) -> AsyncIterator[None]:
    """`/metrics` without a token on a separate loopback port (`--metrics-listen`)."""
    host, port = split_listen(app[SETTINGS].metrics_listen or "")
    metrics_app = web.Application()
    metrics_app[METRICS] = app[METRICS]
    metrics_app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(metrics_app, access_log=None)
    await runner.setup()
    try:
        await start_site(runner, host, port, "--metrics-listen")
    except PortInUse:
        await runner.cleanup()
        raise
    yield
    await runner.cleanup()
