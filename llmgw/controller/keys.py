"""Where the controller's aiohttp app keeps its parts: one typed `web.AppKey` each
(set up by llmgw.controller.app's `_fleet_ctx`), and the handlers' signature."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.controller.authorize import RefusalLog
from llmgw.controller.credentials import Credentials
from llmgw.controller.endpoints import FeedHold, Gateways
from llmgw.controller.fleet import FleetState
from llmgw.controller.leadership import Leadership
from llmgw.controller.metrics import ControllerMetrics
from llmgw.controller.ratelimit import Once, TokenBucket
from llmgw.controller.settings import ControllerSettings
from llmgw.controller.stores import StateStore

SETTINGS = web.AppKey("settings", ControllerSettings)
FLEET = web.AppKey("fleet", FleetState)
CREDENTIALS = web.AppKey("credentials", Credentials)
REFUSALS = web.AppKey("refusals", RefusalLog)
ENROLL_LIMIT = web.AppKey("enroll_limit", TokenBucket)
ENROLL_REFUSALS = web.AppKey("enroll_refusals", Once)  # an event per node per hour
METRICS = web.AppKey("metrics", ControllerMetrics)
GATEWAYS = web.AppKey("gateways", Gateways)
FEED_HOLD = web.AppKey("feed_hold", FeedHold)
STORE = web.AppKey("store", StateStore)
LEADERSHIP = web.AppKey("leadership", Leadership)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
