"""Answers, in words, for declared models that no replica serves.

SMG knows only the models its workers serve: for any other it answers 404
`model_not_found`, and for a model whose workers are gone 503 "All workers are
unavailable". A declared model with no serving replica should get a 503 with
`Retry-After` and the reason ("2 replicas starting", or why it cannot be
placed). So for each such model the gateway registers one more SMG worker: this
small loopback server, under a path of its own, which serves that model's name
in `/v1/models` and answers every request for it with that 503. SMG passes the
status, the header and the body through unchanged (checked with smg 1.13).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from aiohttp import web

from llmgw.gateway.smg import free_loopback_port
from llmgw.wire import UNPLACEABLE_PREFIX

RETRY_AFTER_S = 5


def slug(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:16]


class Explainer:
    def __init__(self) -> None:
        self.reasons: dict[str, tuple[str, str]] = {}  # slug -> (model, reason)
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url_for(self, model: str) -> str:
        return f"http://127.0.0.1:{self.port}/u/{slug(model)}"

    def set_unserved(self, unserved: Mapping[str, str]) -> set[str]:
        """Take the controller's word on unserved models; the worker URLs to register."""
        # A model served again keeps its entry: SMG may route to it until it
        # has taken the new worker list, and then the answer is "retry".
        for s, (m, _) in self.reasons.items():
            if m not in unserved:
                self.reasons[s] = (m, "")
        self.reasons.update({slug(m): (m, why) for m, why in unserved.items()})
        return {self.url_for(m) for m in unserved}

    def owns(self, url: str) -> bool:
        return url.startswith(f"http://127.0.0.1:{self.port}/u/")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/u/{slug}/health", self._health)
        app.router.add_get("/u/{slug}/v1/models", self._models)
        app.router.add_post("/u/{slug}/{tail:.*}", self._unavailable)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_loopback_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _known(self, request: web.Request) -> tuple[str, str]:
        found = self.reasons.get(request.match_info["slug"])
        if found is None:
            raise web.HTTPNotFound()
        return found

    async def _health(self, request: web.Request) -> web.Response:
        self._known(request)
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        model, _ = self._known(request)
        item = {"id": model, "object": "model", "created": 0, "owned_by": "llmgw"}
        return web.json_response({"object": "list", "data": [item]})

    async def _unavailable(self, request: web.Request) -> web.Response:
        model, why = self._known(request)
        retry = RETRY_AFTER_S
        if why.startswith(UNPLACEABLE_PREFIX):
            message = f"model {model!r} is declared but {why}"
            code = "model_unplaceable"
        elif why:
            message = f"model {model!r} is declared but no replica serves it yet: {why}"
            code = "model_not_ready"
        else:
            message = f"model {model!r} is being put in routing; retry"
            code, retry = "model_not_ready", 1
        # `code` is a string, as in OpenAI's error bodies.
        body = {"error": {"message": message, "type": "service_unavailable", "code": code}}
        return web.json_response(body, status=503, headers={"Retry-After": str(retry)})
