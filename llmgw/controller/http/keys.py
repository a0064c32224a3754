"""Where the controller's aiohttp app keeps its parts: one typed `web.AppKey` each
(set up by llmgw.controller.http.app's `_fleet_ctx`), the term the leadership holds now
(`term_of`: it changes with each term, so it is not a key), and the handlers' signature."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.authorize import RefusalLog
from llmgw.controller.http.ratelimit import Once, TokenBucket
from llmgw.controller.leadership import Leadership
from llmgw.controller.metrics import ControllerMetrics
from llmgw.controller.store import StateStore
from llmgw.controller.term import Term

SETTINGS = web.AppKey("settings", ControllerSettings)
REFUSALS = web.AppKey("refusals", RefusalLog)
ENROLL_LIMIT = web.AppKey("enroll_limit", TokenBucket)
ENROLL_REFUSALS = web.AppKey("enroll_refusals", Once)  # an event per node per hour
METRICS = web.AppKey("metrics", ControllerMetrics)
STORE = web.AppKey("store", StateStore)
LEADERSHIP = web.AppKey("leadership", Leadership)


def term_of(app: web.Application) -> Term:
    """The term this controller leads, whose facts and views the handlers use (a
    follower answers only what needs none: leader_middleware)."""
    return app[LEADERSHIP].term


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
