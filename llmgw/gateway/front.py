"""The gateway's front door: client keys and what each tenant may see, before SMG.

SMG checks keys itself, but only plain keys given when it starts, and it knows
nothing of which models a tenant may use. The controller's keys change at any time
and reach a gateway only as digests (llmgw.tenant_keys). So the gateway listens on
the public address with this small proxy, and SMG on a loopback port of its own:

* `/health` passes as it is;
* until the controller's keys are first read, and without a key file,
  everything else is a 503;
* with no key anywhere, every request passes on loopback (open mode), and none
  but /health on a public address;
* otherwise every request needs a key the keyring knows (else 401, in OpenAI's
  error format), but one for SMG's control plane with its key (`control_key`,
  which only this process and SMG know), which passes for SMG to judge;
* a request goes on to SMG with no Authorization: SMG then sends the engine it
  picks that engine's own key (issue 36; a client's header would win over it, so
  SMG has no client keys and checks none: this front checks them all);
* a key limited to some models: `GET /v1/models` lists only those, and a request
  for any other model (`model` in a JSON body, or `/v1/models/NAME`) gets the 404
  an undeclared model gets; a POST without a `model` is a 400;
* SMG's 404 for a model no worker serves becomes OpenAI's answer for a model that
  does not exist ("The model `X` does not exist…", `model_not_found`) when the
  controller has not declared it; one it has is sent again (SMG has not taken its
  worker yet) for up to `DECLARED_RETRY_S`, then a 503 `model_not_ready` with
  Retry-After: a declared model is never a 404. SMG's 503 `no_available_workers`
  (its workers for the model registered but none healthy yet) is sent again the
  same way, never shown with SMG's "circuit breaker open or unhealthy";
* a body over `max_body` is a 413 in OpenAI's error shape, before SMG;
* a request that never reached SMG (its connection refused or reset on connecting:
  SMG restarting) is sent again for up to `UPSTREAM_RETRY_S`; one that reached it
  is never sent twice;
* a completion, chat completion or embedding for a model the controller declared,
  with a key: over one of its tenant's limits, OpenAI's 429 `rate_limit_exceeded`
  with Retry-After, never sent on (limits.py); else its tokens metered per tenant
  and model from the answer's usage as it passes, a stream asked for it and what
  the client did not ask for cut out (metering.py).

It reads a request's head, and the body of a POST, and streams the answer back as
it comes. What it costs per request is in bench/README.md.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Container, Mapping
from typing import Any

from aiohttp import web

from llmgw.gateway.keyring import Grant, Keyring
from llmgw.gateway.limits import Limiter, Refusal
from llmgw.gateway.metering import METERED, STREAMED, Meter, StreamTap, ask_usage, usage_of
from llmgw.gateway.upstream import NotSent, Upstream, UpstreamError
from llmgw.listen import start_site

log = logging.getLogger("llmgw.gateway.front")

# Never forwarded: this hop's own (RFC 9110 7.6.1), and what the proxy sets itself.
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Expect",  # answered here (100 Continue); the body goes on whole
        "Authorization",
    )
)
_ANSWER_HOP = _HOP - {"authorization"}
MAX_BODY = 64 * 2**20  # `llmgw gateway --max-body`'s default (docs/operator-guide.md: why)
NOT_READY_RETRY_S = "1"
# How long a request that could not connect to SMG is tried again: SMG restarts
# within about 1 s of dying (smg.py's first backoff, 0.5 s, and its start).
UPSTREAM_RETRY_S = 5.0
# How long a request for a declared model SMG has no worker for is sent again: its
# worker, or its explainer (a model put to sleep leaves SMG's workers a sync before
# its explainer joins them), is being registered. 5 s was not enough on a loaded
# machine (bench_density: 2 of 612 requests got the 503 at a switch).
DECLARED_RETRY_S = 15.0
_RETRY_EVERY_S = 0.05
# SMG's answers for a request it sent to no worker (smg 1.13): none serves the model,
# or none of those that do is healthy (one just registered, or failing its checks).
# Safe to send again: no engine saw it.
SENT_NOWHERE = frozenset({(404, "model_not_found"), (503, "no_available_workers")})


def openai_error(status: int, kind: str, code: str, message: str, **headers: str) -> web.Response:
    body = {"error": {"type": kind, "code": code, "message": message, "param": None}}
    return web.json_response(body, status=status, headers=headers or None)


# SMG's request ids: a prefix by route, then 24 letters and digits.
_ID_PREFIX = {"/v1/chat/completions": "chatcmpl-", "/v1/completions": "cmpl-"}
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def unknown_model(path: str, model: str, request_id: str | None = None) -> web.Response:
    """OpenAI's answer for a model that does not exist, word for word, with SMG's
    headers for it (smg 1.13): one answer for a model nobody declared and for one a
    key does not allow, so that the two cannot be told apart."""
    if request_id is None:
        request_id = _ID_PREFIX.get(path, "req-") + "".join(
            secrets.choice(_ID_CHARS) for _ in range(24)
        )
    return openai_error(
        404,
        "invalid_request_error",
        "model_not_found",
        f"The model `{model}` does not exist or you do not have access to it.",
        **{"x-smg-error-code": "model_not_found", "x-request-id": request_id},
    )


def too_large(max_body: int) -> web.Response:
    answer = openai_error(
        413,
        "invalid_request_error",
        "request_too_large",
        f"the request body is larger than this gateway takes ({max_body} bytes: "
        "llmgw gateway --max-body)",
    )
    answer.force_close()  # the rest of the body is not read: this connection ends
    return answer


def over_limit(refusal: Refusal) -> web.Response:
    """A request over a tenant's limit: OpenAI's 429, with when to come back and
    which limit (`x-llmgw-limit`: rpm, tpm or budget) as data beside the words."""
    return openai_error(
        429,
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        refusal.message,
        **{"Retry-After": str(refusal.retry_after_s), "x-llmgw-limit": refusal.kind.value},
    )


class Metered:
    """One metered request's answer, as `_forward` saw it."""

    __slots__ = ("body", "cut", "left", "status", "tap")

    def __init__(self, tap: StreamTap | None) -> None:
        self.tap = tap
        self.status = 0  # SMG's answer's; 0: none (the front answered)
        self.cut = False  # SMG's answer broke off
        self.left = False  # the client left before the answer ended: its choice, no error
        self.body: list[bytes] = []  # a whole answer's pieces, for its usage

    @property
    def error(self) -> bool:
        if self.left:
            return self.status >= 400
        return not 0 < self.status < 400 or self.cut or (self.tap is not None and self.tap.error)

    def tokens(self) -> tuple[int, int]:
        if self.tap is not None:
            return self.tap.tokens
        if self.status >= 400 or not self.body:
            return 0, 0
        return usage_of(b"".join(self.body)) or (0, 0)


def _model_in(path: str, body: bytes | None) -> str | None:
    """The model a request names: `/v1/models/NAME`, or `model` in a JSON body."""
    if path.startswith("/v1/models/"):
        return path[len("/v1/models/") :]
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return None
    asked = parsed.get("model") if isinstance(parsed, dict) else None
    return asked if isinstance(asked, str) else None


class Front:
    def __init__(
        self,
        keyring: Keyring,
        upstream: Callable[[], str],
        control_key: str | None = None,
        *,
        public: bool = False,
        body_timeout_s: float = 1800.0,
        max_body: int = MAX_BODY,
        declared: Container[str] = frozenset(),
        meter: Meter | None = None,
        limiter: Limiter | None = None,
        parents: Callable[[], Mapping[str, str]] | None = None,
        on_answered: Callable[[], None] | None = None,
    ) -> None:
        self.keyring = keyring
        # Told when an answer through SMG has ended: a replica may have just gone idle.
        self.on_answered = on_answered
        self.public = public  # not loopback: open mode refused
        # SMG's --request-timeout: the bound on a body this proxy reads itself (one
        # it passes on, SMG reads and bounds).
        self.body_timeout_s = body_timeout_s
        self.max_body = max_body
        self.declared = declared  # the controller's models (the endpoint feed's)
        self.meter = Meter() if meter is None else meter
        self.limiter = Limiter() if limiter is None else limiter
        # Declared LoRA adapter -> its base: `GET /v1/models` names it as `parent`, as vLLM.
        self.parents = parents or dict
        # SMG's control-plane key (None: none passes): the one key that reaches SMG.
        self._control_auth = None if control_key is None else f"Bearer {control_key}"
        self._upstream_auth: str | None = None  # what a client's request carries to SMG
        # SMG, at its base URL now: it moves when a start finds its port taken (smg.py).
        self._upstream = Upstream(upstream)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        # lingering_time: how long aiohttp goes on reading a body left unread (a slow
        # one refused with a 408) before that answer goes out; its default is 10 s.
        app = web.Application(
            client_max_size=self.max_body,
            handler_args={"max_field_size": 65536, "lingering_time": 0.5},
        )
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        # A burst of clients (a thousand held for a waking model) overflows aiohttp's
        # default accept queue of 128; the kernel caps this at net.core.somaxconn.
        await start_site(self._runner, host, port, "the gateway", backlog=1024)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._upstream.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health":
            return await self._forward(request, request.headers.get("Authorization"))
        auth = request.headers.get("Authorization", "")
        if self._control_auth is not None and hmac.compare_digest(
            auth.encode(), self._control_auth.encode()
        ):
            return await self._forward(request, auth)  # SMG's control plane to judge
        keyring = self.keyring
        if not keyring.known and not keyring.has_file_keys:
            return openai_error(
                503,
                "service_unavailable",
                "gateway_starting",
                "the gateway has not read the controller's client keys yet: retry shortly",
                **{"Retry-After": NOT_READY_RETRY_S},
            )
        if not keyring.required:  # no key anywhere
            if self.public:
                return openai_error(
                    401,
                    "invalid_request_error",
                    "invalid_api_key",
                    "this gateway listens on a public address and has no client keys yet: "
                    "make one (llmgw ctl keys create --tenant NAME)",
                )
            if request.method == "GET" and path.rstrip("/") == "/v1/models" and self.parents():
                return await self._models(request, None, self._upstream_auth)
            return await self._forward(request, self._upstream_auth)
        grant = keyring.grant(auth[7:]) if auth[:7].lower() == "bearer " else None
        if grant is None:
            return openai_error(
                401,
                "invalid_request_error",
                "invalid_api_key",
                "no valid API key: send `Authorization: Bearer KEY` with a key of this "
                "gateway (llmgw ctl keys create)",
            )
        upstream_auth = self._upstream_auth
        if request.method == "POST" and path in METERED:
            return await self._metered(request, grant, upstream_auth)
        if grant.models.every:
            if request.method == "GET" and path.rstrip("/") == "/v1/models" and self.parents():
                return await self._models(request, None, upstream_auth)
            return await self._forward(request, upstream_auth)
        return await self._limited(request, grant, upstream_auth)

    async def _limited(
        self, request: web.Request, grant: Grant, upstream_auth: str | None
    ) -> web.StreamResponse:
        """A request with a key limited to some models."""
        path = request.path.rstrip("/")
        if request.method == "GET" and path == "/v1/models":
            return await self._models(request, grant, upstream_auth)
        if path.startswith("/v1/models/"):
            model = request.match_info["tail"][len("v1/models/") :]
            if not grant.models.allows(model):
                return unknown_model(path, model)
            return await self._forward(request, upstream_auth)
        if request.method != "POST":
            return await self._forward(request, upstream_auth)
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        asked = _model_in(path, body)
        if asked is None:
            return openai_error(
                400,
                "invalid_request_error",
                "missing_required_parameter",
                "you must provide a model parameter (a JSON body with a string `model`)",
            )
        if not grant.models.allows(asked):
            return unknown_model(path, asked)
        return await self._forward(request, upstream_auth, body)

    async def _metered(
        self, request: web.Request, grant: Grant, upstream_auth: str | None
    ) -> web.StreamResponse:
        """A request whose answer carries `usage`: the key's models checked, the
        tenant's limits, then its tokens counted as its answer passes (metering.py).
        A model the controller did not declare reaches no engine: neither limited
        nor counted (the tables stay bounded by the models that exist)."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(model, str):
            if grant.models.every:
                return await self._forward(request, upstream_auth, body)  # SMG's to refuse
            return openai_error(
                400,
                "invalid_request_error",
                "missing_required_parameter",
                "you must provide a model parameter (a JSON body with a string `model`)",
            )
        assert isinstance(parsed, dict)
        if not grant.models.allows(model):
            return unknown_model(request.path, model)
        if model not in self.declared:
            return await self._forward(request, upstream_auth, body)
        tenant = grant.tenant
        refusal = self.limiter.check(tenant, model)
        if refusal is not None:
            self.meter.refused(tenant, model)
            return over_limit(refusal)
        tap = None
        if parsed.get("stream") is True and request.path in STREAMED:
            body, keep = ask_usage(body, parsed)
            tap = StreamTap(keep)
        metered = Metered(tap)
        try:
            return await self._forward(request, upstream_auth, body, metered)
        except asyncio.CancelledError:  # the client left (handler_cancellation)
            metered.left = True
            raise
        finally:
            prompt, completion = metered.tokens()
            self.meter.served(tenant, model, prompt, completion, metered.error)
            self.limiter.spent(tenant, model, prompt + completion)

    async def _body(self, request: web.Request) -> bytes | web.Response:
        """The whole body, or a 408 once it has taken longer than SMG's request
        timeout to arrive (only a key holder gets this far: a slow body without a
        key was refused on its head), or a 413 for one over `max_body`."""
        if (request.content_length or 0) > self.max_body:
            return too_large(self.max_body)
        try:
            if request.content.is_eof():  # all of it came with the head: no timer
                return await request.read()
            # A timer on this task: wait_for would start a task a request.
            async with asyncio.timeout(self.body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:  # chunked, and over
            return too_large(self.max_body)
        except TimeoutError:
            return openai_error(
                408,
                "invalid_request_error",
                "request_body_timeout",
                f"the request body did not arrive within {self.body_timeout_s:g} s",
            )

    async def _models(
        self, request: web.Request, grant: Grant | None, upstream_auth: str | None
    ) -> web.Response:
        """SMG's model list, less what the key does not allow (`grant` None: all), each
        adapter with its `parent`."""
        headers = [("Authorization", upstream_auth)] if upstream_auth else []
        try:
            async with await self._upstream.request("GET", "/v1/models", headers, None) as up:
                if up.status != 200:
                    return web.Response(
                        status=up.status, body=await up.read(), content_type=up.content_type
                    )
                listed: dict[str, Any] = json.loads(await up.read())
        except UpstreamError:  # SMG (re)starting
            return openai_error(
                503,
                "service_unavailable",
                "gateway_starting",
                "the gateway's router is starting: retry shortly",
                **{"Retry-After": NOT_READY_RETRY_S},
            )
        data = listed.get("data")
        parents = self.parents()
        if isinstance(data, list):
            listed["data"] = [
                {**m, "parent": parents[m["id"]]} if m.get("id") in parents else m
                for m in data
                if isinstance(m, dict) and (grant is None or grant.models.allows(str(m.get("id"))))
            ]
        return web.json_response(listed)

    async def _forward(
        self,
        request: web.Request,
        authorization: str | None,
        body: bytes | None = None,
        metered: Metered | None = None,
    ) -> web.StreamResponse:
        """`request` to SMG with `authorization` in place of the client's; SMG's
        answer streamed back as it comes (through `metered`'s tap, when it has one)."""
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        if authorization:
            headers.append(("Authorization", authorization))
        if body is None and request.body_exists:
            read = await self._body(request)
            if isinstance(read, web.Response):
                return read
            body = read
        answer: web.StreamResponse | None = None
        began = time.monotonic()
        deadline = began + UPSTREAM_RETRY_S
        try:
            while True:
                try:
                    up = await self._upstream.request(
                        request.method, request.raw_path, headers, body
                    )
                except NotSent:
                    # No answer began: SMG is not listening (restarting), or a kept-alive
                    # connection to the SMG that died was reused and found closed (a
                    # request on each pooled connection would fail so otherwise). Sent
                    # again, a while; one SMG had taken when it died may run twice on its
                    # engine, as a client's own retry of the 503 would.
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(_RETRY_EVERY_S)
                    continue
                if (up.status, up.headers.get("x-smg-error-code")) not in SENT_NOWHERE:
                    break
                # SMG sent it nowhere: no worker for the model, or none healthy yet. One
                # the controller declared is being registered (SMG just restarted, the
                # model was just applied, its one worker not yet healthy): again, a
                # while, and then the 503 to retry.
                model = _model_in(request.path, body) or ""
                if up.status != 404 and model not in self.declared:
                    break  # SMG's own answer, for workers llmgw did not give it
                up.release()
                request_id = up.headers.get("x-request-id")
                if model not in self.declared or time.monotonic() >= began + DECLARED_RETRY_S:
                    return self._no_worker(model, request.path, request_id)
                await asyncio.sleep(_RETRY_EVERY_S)
            async with up:
                answer = web.StreamResponse(status=up.status, reason=up.reason)
                tap = None
                if metered is not None:
                    metered.status = up.status
                    tap = metered.tap if up.status == 200 else None
                for k, v in up.headers.items():
                    if k.lower() not in _ANSWER_HOP:
                        answer.headers.add(k, v)
                if (
                    up.content_length is not None
                    and "Content-Encoding" not in up.headers
                    and tap is None
                ):
                    answer.content_length = up.content_length
                await answer.prepare(request)
                # A piece that came with the answer's end goes out with the end of
                # ours (`write_eof`): one send, not two.
                last = b""
                async for chunk in up.chunks():
                    if tap is not None:
                        chunk = tap.feed(chunk)
                    elif metered is not None:  # a whole answer: its usage read at its end
                        metered.body.append(chunk)
                    if up.ended:
                        last = chunk
                    elif chunk:
                        await answer.write(chunk)
                if tap is not None:
                    last += tap.close()
                await answer.write_eof(last)
                return answer
        except (UpstreamError, ConnectionResetError) as exc:
            if answer is not None and answer.prepared:
                if metered is not None:  # the client gone (a write failed), or SMG's cut
                    transport = request.transport
                    gone = transport is None or transport.is_closing()
                    metered.left, metered.cut = gone, not gone
                raise  # cut mid-answer: the client sees the connection end, as from SMG
            log.debug("SMG did not answer %s %s: %s", request.method, request.path, exc)
            return openai_error(
                503,
                "service_unavailable",
                "gateway_unavailable",
                "the gateway's router is not answering: retry shortly",
                **{"Retry-After": NOT_READY_RETRY_S},
            )
        finally:
            if answer is not None and self.on_answered is not None:
                self.on_answered()

    def _no_worker(self, model: str, path: str, request_id: str | None) -> web.Response:
        """For SMG's 404 "no worker available for model": OpenAI's 404 for a model
        nobody declared, a 503 to retry for one the controller declared (SMG has
        not taken its worker yet)."""
        if model in self.declared:
            return openai_error(
                503,
                "service_unavailable",
                "model_not_ready",
                f"model {model!r} is declared and being put in routing; retry",
                **{"Retry-After": NOT_READY_RETRY_S},
            )
        return unknown_model(path, model, request_id)


def new_upstream_key() -> str:
    return secrets.token_urlsafe(32)
