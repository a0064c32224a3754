"""The controller's aiohttp application: routes, auth and error handling.

`create_app(settings)` is the factory used by `llmgw controller`, the demo and
the tests. State lives under typed `web.AppKey`s; the store and the reconcile
loop are resources in `cleanup_ctx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from llmgw import __version__
from llmgw.controller.auth import ADMIN_ROLES, AGENT_ROLES, READ_ROLES, Identity, Role, bearer
from llmgw.controller.fleet import BadCursor, FleetState, UnknownModel, UnknownNode
from llmgw.controller.reconcile import Reconciler
from llmgw.controller.reconcile import drain_plan as plan_drain
from llmgw.controller.settings import ControllerSettings
from llmgw.controller.store import StoreUnavailable
from llmgw.controller.stores import StateStore, open_store, store_spec
from llmgw.wire import (
    AdminFlag,
    DrainPlanRequest,
    DrainRequest,
    ModelSpecList,
    NodeReport,
    ReasonRequest,
)

log = logging.getLogger("llmgw.controller")

SETTINGS = web.AppKey("settings", ControllerSettings)
FLEET = web.AppKey("fleet", FleetState)
STORE = web.AppKey("store", StateStore)

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
        {"loc": ".".join(str(p) for p in e["loc"]) or "(body)", "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)
    ][:20]


class BadRequest(Exception):
    def __init__(self, message: str, detail: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


async def parse_body(request: web.Request, model: type[M]) -> M:
    """Read and validate a JSON body; any failure is a 400 that names the field."""
    raw = await request.read()  # raises 413 past client_max_size
    if not raw:
        raise BadRequest("the request needs a JSON body")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        detail = validation_detail(exc)
        where = ", ".join(d["loc"] for d in detail[:3])
        raise BadRequest(f"invalid {model.__name__}: check {where}", detail) from exc


# -- middleware ----------------------------------------------------------------------


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return error(400, exc.message, exc.detail)
    except BadCursor as exc:
        return error(400, str(exc))
    except (UnknownNode, UnknownModel) as exc:
        return error(404, str(exc))
    except StoreUnavailable as exc:  # nothing was stored, nothing changed
        return error(503, str(exc))
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        return error(413, f"request body too large: the limit is {limit} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error(exc.status, exc.reason)
        raise


def auth_middleware(settings: ControllerSettings) -> Callable[..., Awaitable[web.StreamResponse]]:
    tokens = settings.tokens

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        canonical = route.canonical if route is not None else ""
        allowed = ROUTE_ROLES.get(f"{request.method} {canonical}")
        if allowed is None:  # public (healthz) or not found
            return await handler(request)
        if not tokens.enabled:
            request["identity"] = Identity(_claimed_user(request) or "anonymous", None)
            return await handler(request)
        presented = bearer(request.headers.get("Authorization"))
        if presented is None:
            return error(401, "missing bearer token: send `Authorization: Bearer <token>`")
        identity = tokens.identify(presented)
        if identity is None:
            return error(401, "invalid token")
        if identity.role not in allowed:
            need = " or ".join(sorted(r.value for r in allowed))
            return error(403, f"a {identity.role} token cannot do this; it needs a {need} token")
        claimed = _claimed_user(request)
        name = (
            f"{identity.name} ({claimed})"
            if claimed and claimed != identity.name
            else identity.name
        )
        request["identity"] = Identity(name, identity.role)
        return await handler(request)

    return middleware


def _claimed_user(request: web.Request) -> str | None:
    """The operator's login name as the client says it: recorded beside the token's identity."""
    user = request.headers.get("X-LLMGW-User", "").strip()
    return user[:64] or None


def who(request: web.Request) -> str:
    identity: Identity = request["identity"]
    return identity.name


# -- handlers ------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    """Alive, and this controller's role: it writes the store, so it leads."""
    settings = request.app[SETTINGS]
    store = request.app.get(STORE)
    return web.json_response(
        {
            "ok": True,
            "version": __version__,
            "role": "leader",
            "epoch": store.epoch if store is not None else 0,
            "leader": settings.url,
        }
    )


async def agent_report(request: web.Request) -> web.Response:
    report = await parse_body(request, NodeReport)
    body = request.app[FLEET].ingest_json(report, await request.read())
    return web.Response(body=body, content_type="application/json")


async def list_nodes(request: web.Request) -> web.Response:
    """Every row; with `?since=CURSOR` (even empty), only what changed after it."""
    since = request.query.get("since")
    if since is None:
        return json_models(request.app[FLEET].rows())
    return json_model(request.app[FLEET].nodes_since(since))


async def get_node(request: web.Request) -> web.Response:
    return json_model(request.app[FLEET].detail(request.match_info["name"]))


async def summary(request: web.Request) -> web.Response:
    return json_model(request.app[FLEET].summary())


async def list_models(request: web.Request) -> web.Response:
    return json_models(request.app[FLEET].model_views())


async def list_replicas(request: web.Request) -> web.Response:
    return json_models(request.app[FLEET].replica_views())


async def cordon(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = request.match_info["name"]
    fleet.require(name)
    body = await parse_body(request, ReasonRequest)
    return json_model(fleet.set_flag(name, AdminFlag.CORDONED, body.reason, who(request)))


async def uncordon(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = request.match_info["name"]
    fleet.require(name)
    return json_model(fleet.set_flag(name, AdminFlag.NONE, None, who(request)))


async def drain(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    name = request.match_info["name"]
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
    fleet.put_models(body.models)
    applied = set(names)
    return json_models([v for v in fleet.model_views() if v.spec.name in applied])


async def delete_model(request: web.Request) -> web.Response:
    request.app[FLEET].delete_model(request.match_info["name"])
    return web.Response(status=204)


async def drain_plan(request: web.Request) -> web.Response:
    body = await parse_body(request, DrainPlanRequest)
    fleet = request.app[FLEET]
    for name in body.nodes:
        fleet.require(name)
    return json_model(plan_drain(fleet, body.nodes))


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
]
# "METHOD /path/{template}" -> roles allowed; routes not listed (healthz) are public.
ROUTE_ROLES = {f"{method} {path}": roles for method, path, _, roles in ROUTES}


def create_app(settings: ControllerSettings) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[errors_middleware, auth_middleware(settings)],
    )
    app[SETTINGS] = settings
    app.router.add_get("/healthz", healthz)
    for method, path, handler, _ in ROUTES:
        app.router.add_route(method, path, handler)
    app.cleanup_ctx.append(_fleet_ctx)
    app.cleanup_ctx.append(_reconcile_ctx)
    return app


async def _fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    store = app[STORE] = open_store(store_spec(settings), settings.url)
    fleet = app[FLEET] = FleetState(store, settings)

    async def flush_every_second() -> None:
        # Unsaved sightings stay queued until a save works; the store logs an
        # outage once, so this loop neither dies nor floods the log.
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(StoreUnavailable):
                fleet.flush()

    task = asyncio.create_task(flush_every_second())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _final_save(fleet)
    store.close()


async def _final_save(fleet: FleetState, tries: int = 5) -> None:
    """At shutdown: save what is queued, retrying briefly; a failure is logged, never
    a crash (the nodes concerned are known again at their next report)."""
    for attempt in range(tries):
        try:
            fleet.flush()
            return
        except StoreUnavailable as exc:
            if attempt == tries - 1:
                log.error("final save failed, first sightings of some nodes not stored: %s", exc)
                return
            await asyncio.sleep(0.2)


async def _reconcile_ctx(app: web.Application) -> AsyncIterator[None]:
    reconciler = Reconciler(app[FLEET])
    task = asyncio.create_task(reconciler.run(app[SETTINGS].reconcile_interval_s))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
