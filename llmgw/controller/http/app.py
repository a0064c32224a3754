"""The controller's aiohttp application, assembled: `create_app(settings)` is the
factory used by `llmgw controller`, the demo and the tests.

State lives under typed `web.AppKey`s (keys.py); the store and the leadership
(which runs the reconcile loop while this controller leads, leadership.py) are
resources in `cleanup_ctx`. Followers answer 503 naming the leader. The parts:
middlewares.py (encoding, leadership, errors; auth), routes.py (every route and
the roles it allows), handlers/ (nodes, models, enrollment, gateways, service),
web_io.py (bodies in, JSON and errors out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from llmgw.controller.core.settings import ControllerSettings, split_listen
from llmgw.controller.http.authorize import RefusalLog
from llmgw.controller.http.bodies import HANDLER_ARGS
from llmgw.controller.http.handlers.service import healthz, metrics
from llmgw.controller.http.keys import (
    ENROLL_LIMIT,
    ENROLL_REFUSALS,
    LEADERSHIP,
    METRICS,
    REFUSALS,
    SETTINGS,
    STORE,
)
from llmgw.controller.http.middlewares import auth_middleware, front_middleware
from llmgw.controller.http.ratelimit import Once, TokenBucket
from llmgw.controller.http.routes import ROUTE_ROLES, ROUTES
from llmgw.controller.leadership import Leadership
from llmgw.controller.metrics import ControllerMetrics
from llmgw.controller.store import Store, open_lease, open_store, store_spec
from llmgw.listen import PortInUse, start_site


def create_app(settings: ControllerSettings) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[front_middleware, auth_middleware(settings, ROUTE_ROLES)],
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
    app.on_shutdown.append(_step_down)
    if settings.metrics_listen:
        app.cleanup_ctx.append(_metrics_site_ctx)
    return app


async def _fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    spec = store_spec(settings)
    store = app[STORE] = open_store(spec, settings.url)
    if isinstance(store, Store):  # SQLite times its own transactions for /metrics
        store.on_write = app[METRICS].observe_store_write
    app[REFUSALS] = RefusalLog()
    # Leading runs the reconcile loop and the saves; a follower runs neither.
    lead = app[LEADERSHIP] = Leadership(
        settings, store, app[METRICS], lease=open_lease(spec, settings)
    )
    await lead.start()
    yield
    await lead.stop()
    store.close()


async def _step_down(app: web.Application) -> None:
    """As shutdown begins (the port closed, requests under way not yet waited for): stop
    leading, so no decision is taken unheard and long polls end at once."""
    lead = app.get(LEADERSHIP)
    if lead is not None:
        await lead.stop()


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
