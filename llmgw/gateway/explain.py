"""Answers, in words, for declared models that no replica serves.

SMG knows only the models its workers serve: for any other it answers 404
`model_not_found`, and for a model whose workers are gone 503 "All workers are
unavailable". A declared model with no serving replica should get a 503 with
`Retry-After` and the reason ("2 replicas starting"); one that cannot be placed,
a 503 that says why and invites no retry. So for each such model the gateway
registers one more SMG worker: this small loopback server, under a path of its
own, which serves that model's name in `/v1/models` and answers every request
for it with that 503. SMG passes the status, the headers and the body through
unchanged (checked with smg 1.13).

A model asleep at zero replicas (its reason's kind is `asleep`) is not
answered at once: its requests are held (at most `MAX_HELD` per model), counted
in the gateway's status so that the controller wakes it, and each is sent to a
replica of the model as soon as one serves, its answer streamed back as it
comes; the client sees latency, not an error. Sent on, it is counted as that
replica's in flight (`sent`), no longer held: the engine counts it from then on,
and the controller takes the gateways' figure or the engines', not both. Past
the wake timeout, or when the model turns out unplaceable, a held request gets
the 503 and the reason.
A held request whose client leaves is dropped at once: no longer counted, never sent.

LoRA adapters (issue 33) are routed here too. SMG takes one model per worker URL
(smg 1.13: its discovery manifest refuses two entries naming the same endpoint, and
a worker registered with a list of models keeps only the first), so an engine that
holds adapters cannot be registered under their names. Each declared adapter gets an
explainer worker instead, and every request for it is sent from here to the replica
holding it with the fewest of its requests in flight; none holding it, the request
is held (counted, so the controller loads it) until one does, as a wake is. An engine
that answers 404 (it let go of the adapter just now) is not asked again for that
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web

from llmgw.gateway.front import MAX_BODY
from llmgw.wire import Unserved, UnservedKind

RETRY_AFTER_S = 5
MAX_HELD = 1000  # requests held per model while it wakes
WAKE_TIMEOUT_S = 300.0
# Headers a held request keeps on its way to the engine (the rest are SMG's or hop-by-hop).
FORWARDED = ("Content-Type", "Accept")


def slug(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:16]


class Explainer:
    def __init__(
        self,
        wake_timeout_s: float = WAKE_TIMEOUT_S,
        on_hold: Callable[[], None] | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        self.max_body = max_body  # a held request's body is read here: the front's bound
        # slug -> (model, why it is unserved; None: served again, SMG not told yet)
        self.reasons: dict[str, tuple[str, Unserved | None]] = {}
        self.port = 0
        self._urls: dict[str, str] = {}  # model or adapter -> its worker URL now (url_for)
        self._spells = 0  # URLs given so far: each new one is told apart by it
        self.wake_timeout_s = wake_timeout_s
        self.held: Counter[str] = Counter()  # model -> requests held now (waiting)
        self._held_since: dict[str, float] = {}  # model -> since when some are (monotonic)
        # A held request sent on to a woken replica is that replica's in flight, no longer
        # held: engine URL -> such requests in flight, and sent in all (the status adds
        # them to the replica's, as SMG's own; they do not pass through SMG's count).
        self.sent: Counter[str] = Counter()
        self.sent_requests: Counter[str] = Counter()
        self._on_hold = on_hold  # told when a request is first held (the status goes early)
        self._serving: dict[str, list[str]] = {}  # model -> URLs of engines serving it
        self._keys: dict[str, str] = {}  # engine URL -> the key it asks for
        self._news = asyncio.Event()  # set (and replaced) whenever reasons or URLs change
        self._turn = itertools.count()
        self.adapters: dict[str, str] = {}  # declared adapter -> its base
        self.adapter_in_flight: Counter[str] = Counter()  # adapter -> forwarded, not done
        self.adapter_requests: Counter[str] = Counter()  # adapter -> forwarded in all
        self._flight: Counter[tuple[str, str]] = Counter()  # (adapter, engine URL) -> in flight
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    def adapters_in_flight_at(self) -> dict[str, set[str]]:
        """Engine URL -> the adapters it has requests from here in flight for."""
        out: dict[str, set[str]] = {}
        for name, url in self._flight:
            out.setdefault(url, set()).add(name)
        return out

    def url_for(self, model: str) -> str:
        """The worker URL that answers for `model` while it is unserved (or an
        adapter). Each spell unserved gets a URL of its own (`/u/SLUG/GEN`): SMG keeps
        a removed worker's URL about 5 s while it drains and takes no new worker under
        it meanwhile, so a model asleep again within seconds of waking had no worker
        to route to, and its requests waited in the front, unseen (not held, so
        nothing woke it)."""
        url = self._urls.get(model)
        if url is None:
            self._spells += 1
            url = self._urls[model] = f"http://127.0.0.1:{self.port}/u/{slug(model)}/{self._spells}"
        return url

    def set_unserved(self, unserved: Mapping[str, Unserved]) -> dict[str, str]:
        """Take the controller's word on unserved models; the workers to register
        (URL -> model)."""
        # A model served again keeps its entry: SMG may route to it until it
        # has taken the new worker list, and then the answer is "retry".
        for s, (m, _) in self.reasons.items():
            if m not in unserved:
                self.reasons[s] = (m, None)
        for m in [m for m in self._urls if m not in unserved and m not in self.adapters]:
            del self._urls[m]  # its next spell unserved gets a new URL
        self.reasons.update({slug(m): (m, why) for m, why in unserved.items()})
        self._tell()
        return {self.url_for(m): m for m in unserved}

    def set_adapters(self, adapters: Mapping[str, str]) -> dict[str, str]:
        """Take the declared adapters (name -> base); their workers (URL -> name)."""
        if adapters != self.adapters:
            self.adapters = dict(adapters)
            for name in adapters:  # the controller's word on it (set_unserved) stands
                if self.reasons.get(slug(name), (name, None))[1] is None:
                    self.reasons[slug(name)] = (name, _waking("loaded on no replica yet"))
            self._tell()
        return {self.url_for(a): a for a in adapters}

    def set_serving(self, serving: Mapping[str, list[str]]) -> None:
        """Where each model is served now: held requests go there."""
        if serving != self._serving:
            self._serving = {m: list(urls) for m, urls in serving.items()}
            live = {u for urls in serving.values() for u in urls} | set(self.sent)
            for gone in self.sent_requests.keys() - live:  # bounded by the engines serving
                del self.sent_requests[gone]
            self._tell()

    def set_keys(self, keys: Mapping[str, str]) -> None:
        """The key each engine asks for (URL -> key): a held or adapter request sent
        from here carries its engine's."""
        self._keys = dict(keys)

    def _tell(self) -> None:
        self._news.set()
        self._news = asyncio.Event()

    def owns(self, url: str) -> bool:
        return url.startswith(f"http://127.0.0.1:{self.port}/u/")

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body)
        # `{spell}`: which of the model's URLs (`url_for`); any of them answers for it.
        app.router.add_get("/u/{slug}/{spell}/health", self._health)
        app.router.add_get("/u/{slug}/{spell}/v1/models", self._models)
        app.router.add_post("/u/{slug}/{spell}/{tail:.*}", self._unavailable)
        # A held request whose client left is dropped at once, never counted or sent:
        # the client closing its connection closes the front's and then SMG's to here
        # (each cancels its handler), and this handler is cancelled with it.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        # A held request's answer streams for as long as the engine takes.
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        # Port 0, read back: a port picked first could be taken before the bind.
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    def _known(self, request: web.Request) -> tuple[str, Unserved | None]:
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

    async def _unavailable(self, request: web.Request) -> web.StreamResponse:
        model, why = self._known(request)
        if model in self.adapters:
            return await self._route_adapter(request, model)
        # Asleep: wait for it. Served meanwhile (SMG has not taken the new worker
        # list yet): send it there rather than ask the client to retry.
        if (why is not None and why.kind is UnservedKind.ASLEEP) or self._serving.get(model):
            return await self._hold(request, model)
        return self._answer(model, why)

    async def _hold(self, request: web.Request, model: str) -> web.StreamResponse:
        """Wait for `model` to wake, then send the request to a replica of it."""
        if self.held[model] >= MAX_HELD:
            return self._answer(
                model, _waking(f"{MAX_HELD} requests are held already while it wakes")
            )
        body = await request.read()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wake_timeout_s
        self._take_hold(model)
        holding = True
        try:
            while True:
                urls = self._serving.get(model)
                if urls:
                    url = urls[next(self._turn) % len(urls)]
                    # Sent on: the replica's in flight from now (the engine counts it
                    # too), no longer held, so that the model's figure counts it once.
                    self._unhold(model)
                    holding = False
                    self.sent[url] += 1
                    self.sent_requests[url] += 1
                    try:
                        answer = await self._forward(request, model, url, body)
                    finally:
                        self.sent[url] -= 1
                        if not self.sent[url]:
                            del self.sent[url]
                    assert answer is not None  # only `not_there` answers None
                    return answer
                _, why = self.reasons.get(slug(model), (model, None))
                # Held already: it waits while replicas are on their way (a replica that
                # failed mid-wake is placed again), not once none can be placed.
                if why is not None and why.kind is UnservedKind.UNPLACEABLE:
                    return self._answer(model, why)
                news, left = self._news, deadline - loop.time()
                if left <= 0:
                    return self._answer(
                        model,
                        _waking(
                            f"woken {self.wake_timeout_s:g}s ago and no replica serves it yet"
                            f" ({why.message if why is not None else 'being put in routing'})"
                        ),
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), left)
        finally:
            if holding:
                self._unhold(model)

    async def _route_adapter(self, request: web.Request, name: str) -> web.StreamResponse:
        """Send a request for adapter `name` to a replica holding it, holding it
        until one does (at most the wake timeout)."""
        body = await request.read()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wake_timeout_s
        tried: set[str] = set()
        holding = False
        try:
            while True:
                urls = [u for u in self._serving.get(name, ()) if u not in tried]
                if urls:
                    if holding:
                        self._unhold(name)
                        holding = False
                    url = min(urls, key=lambda u: self._flight[(name, u)])
                    self._flight[(name, url)] += 1
                    self.adapter_in_flight[name] += 1
                    self.adapter_requests[name] += 1
                    try:
                        answer = await self._forward(request, name, url, body, not_there=True)
                    finally:
                        self._flight[(name, url)] -= 1
                        self.adapter_in_flight[name] -= 1
                        if not self._flight[(name, url)]:
                            del self._flight[(name, url)]
                        if not self.adapter_in_flight[name]:
                            del self.adapter_in_flight[name]
                    if answer is not None:
                        return answer
                    tried.add(url)  # it let go of the adapter: another, or wait
                    continue
                _, why = self.reasons.get(slug(name), (name, None))
                if why is not None and why.kind is UnservedKind.UNPLACEABLE:
                    return self._answer(name, why)  # its files are nowhere: no load comes
                if not holding:
                    if self.held[name] >= MAX_HELD:
                        return self._answer(name, _waking(f"{MAX_HELD} requests are held already"))
                    self._take_hold(name)
                    holding = True
                news, left = self._news, deadline - loop.time()
                if left <= 0:
                    base = self.adapters.get(name, "its base")
                    return self._answer(
                        name,
                        _waking(
                            f"no replica of {base} loaded adapter {name} within "
                            f"{self.wake_timeout_s:g}s"
                        ),
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), left)
                tried.clear()  # where it is held changed: one that let go may hold it again
        finally:
            if holding:
                self._unhold(name)

    def _take_hold(self, name: str) -> None:
        self.held[name] += 1
        if self.held[name] == 1:
            self._held_since[name] = time.monotonic()
            if self._on_hold is not None:
                self._on_hold()

    def _unhold(self, name: str) -> None:
        self.held[name] -= 1
        if not self.held[name]:
            del self.held[name]
            self._held_since.pop(name, None)

    def held_ages(self) -> dict[str, float]:
        """Per model (or adapter) with requests held: seconds since none was not held."""
        now = time.monotonic()
        return {name: round(now - since, 1) for name, since in self._held_since.items()}

    async def _forward(
        self, request: web.Request, model: str, url: str, body: bytes, not_there: bool = False
    ) -> web.StreamResponse | None:
        """Stream the engine's answer back. `not_there`: None, nothing sent to the
        client, when the engine answers 404 (it does not hold the adapter)."""
        assert self._http is not None
        headers = {h: request.headers[h] for h in FORWARDED if h in request.headers}
        if (key := self._keys.get(url)) is not None:
            headers["Authorization"] = f"Bearer {key}"
        target = f"{url}/{request.match_info['tail']}"
        answer: web.StreamResponse | None = None
        try:
            async with self._http.post(target, data=body, headers=headers) as upstream:
                if not_there and upstream.status == 404:
                    return None
                answer = web.StreamResponse(status=upstream.status)
                for h in ("Content-Type", "Content-Encoding"):
                    if h in upstream.headers:
                        answer.headers[h] = upstream.headers[h]
                await answer.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
        except (aiohttp.ClientError, TimeoutError) as exc:
            if answer is not None:  # cut mid-answer: the client sees the stream end
                return answer
            why = Unserved(
                kind=UnservedKind.NOT_READY, message=f"the woken replica did not answer: {exc}"
            )
            return self._answer(model, why)

    def _answer(self, model: str, why: Unserved | None) -> web.Response:
        # Retry-After invites a retry; a model that cannot be placed gets none, and
        # `x-should-retry: false` (which the official OpenAI clients honour) says so:
        # retrying will not place it, and the client learns that at once.
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        if why is None:
            message = f"model {model!r} is being put in routing; retry"
            code, headers = "model_not_ready", {"Retry-After": "1"}
        elif why.kind is UnservedKind.ASLEEP:
            message = f"model {model!r} is waking from zero replicas: {why.message}"
            code = "model_waking"
        elif why.kind is UnservedKind.UNPLACEABLE:
            message = f"model {model!r} is declared but cannot be placed: {why.message}"
            code, headers = "model_unplaceable", {"x-should-retry": "false"}
        else:
            message = f"model {model!r} is declared but no replica serves it yet: {why.message}"
            code = "model_not_ready"
        # `code` is a string, as in OpenAI's error bodies.
        body = {"error": {"message": message, "type": "service_unavailable", "code": code}}
        return web.json_response(body, status=503, headers=headers)


def _waking(message: str) -> Unserved:
    return Unserved(kind=UnservedKind.ASLEEP, message=message)
