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
* otherwise a `/v1/...` request needs a key the keyring knows (else 401, in
  OpenAI's error format), and any other path passes as it is, for SMG to judge
  (its control plane wants its admin key; its data plane a key it was given);
* a key from the controller goes on to SMG as the gateway's own key for SMG
  (`upstream_key`, which only this process and SMG know); a key from the key file
  goes on as it is (SMG has it too, and scopes stored responses by it);
* a key limited to some models: `GET /v1/models` lists only those, and a request
  for any other model (`model` in a JSON body, or `/v1/models/NAME`) gets the 404
  SMG gives an unknown model, word for word; a POST without a `model` is a 400.

It reads a request's head, and its body only for a limited key, and streams the
answer back as it comes. What it costs per request is in bench/README.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

import aiohttp
from aiohttp import web

from llmgw.gateway.keyring import Grant, Keyring

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
MAX_BODY = 512 * 1024 * 1024  # SMG's own default (--max-payload-size)
NOT_READY_RETRY_S = "1"


def openai_error(status: int, kind: str, code: str, message: str, **headers: str) -> web.Response:
    body = {"error": {"type": kind, "code": code, "message": message, "param": None}}
    return web.json_response(body, status=status, headers=headers or None)


# SMG's request ids: a prefix by route, then 24 letters and digits.
_ID_PREFIX = {"/v1/chat/completions": "chatcmpl-", "/v1/completions": "cmpl-"}
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def unknown_model(path: str, model: str) -> web.Response:
    """What SMG answers for a model no worker serves (smg 1.13), word for word and
    header for header, so that a model a key does not allow cannot be told apart."""
    request_id = _ID_PREFIX.get(path, "req-") + "".join(
        secrets.choice(_ID_CHARS) for _ in range(24)
    )
    return openai_error(
        404,
        "invalid_request_error",
        "model_not_found",
        f"No worker available for model '{model}'",
        **{"x-smg-error-code": "model_not_found", "x-request-id": request_id},
    )


class Front:
    def __init__(
        self,
        keyring: Keyring,
        upstream: str,
        upstream_key: str,
        *,
        public: bool = False,
        body_timeout_s: float = 1800.0,
    ) -> None:
        self.keyring = keyring
        self.public = public  # not loopback: open mode refused
        # SMG's --request-timeout: the bound on a body this proxy reads itself (one
        # it passes on, SMG reads and bounds).
        self.body_timeout_s = body_timeout_s
        self.upstream = upstream.rstrip("/")
        self._upstream_auth = f"Bearer {upstream_key}"
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        # No total timeout: SMG ends a request at --request-timeout.
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        # lingering_time: how long aiohttp goes on reading a body left unread (a slow
        # one refused with a 408) before that answer goes out; its default is 10 s.
        app = web.Application(
            client_max_size=MAX_BODY, handler_args={"max_field_size": 65536, "lingering_time": 0.5}
        )
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health":
            return await self._forward(request, request.headers.get("Authorization"))
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
            return await self._forward(request, self._upstream_auth)
        auth = request.headers.get("Authorization", "")
        grant = keyring.grant(auth[7:]) if auth[:7].lower() == "bearer " else None
        if grant is None:
            if not path.startswith("/v1/"):
                return await self._forward(request, auth or None)  # SMG's to judge
            return openai_error(
                401,
                "invalid_request_error",
                "invalid_api_key",
                "no valid API key: send `Authorization: Bearer KEY` with a key of this "
                "gateway (llmgw ctl keys create)",
            )
        upstream_auth = auth if grant.from_file else self._upstream_auth
        if grant.models.every:
            return await self._forward(request, upstream_auth)
        return await self._limited(request, grant, upstream_auth)

    async def _limited(
        self, request: web.Request, grant: Grant, upstream_auth: str
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
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        asked = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(asked, str):
            return openai_error(
                400,
                "invalid_request_error",
                "missing_required_parameter",
                "you must provide a model parameter (a JSON body with a string `model`)",
            )
        if not grant.models.allows(asked):
            return unknown_model(path, asked)
        return await self._forward(request, upstream_auth, body)

    async def _body(self, request: web.Request) -> bytes | web.Response:
        """The whole body, or a 408 once it has taken longer than SMG's request
        timeout to arrive (only a key holder gets this far: a slow body without a
        key was refused on its head)."""
        try:
            return await asyncio.wait_for(request.read(), self.body_timeout_s)
        except TimeoutError:
            return openai_error(
                408,
                "invalid_request_error",
                "request_body_timeout",
                f"the request body did not arrive within {self.body_timeout_s:g} s",
            )

    async def _models(self, request: web.Request, grant: Grant, upstream_auth: str) -> web.Response:
        """SMG's model list, less what the key does not allow."""
        assert self._http is not None
        headers = {"Authorization": upstream_auth}
        async with self._http.get(f"{self.upstream}/v1/models", headers=headers) as up:
            if up.status != 200:
                return web.Response(
                    status=up.status, body=await up.read(), content_type=up.content_type
                )
            listed: dict[str, Any] = await up.json()
        data = listed.get("data")
        if isinstance(data, list):
            listed["data"] = [
                m for m in data if isinstance(m, dict) and grant.models.allows(str(m.get("id")))
            ]
        return web.json_response(listed)

    async def _forward(
        self, request: web.Request, authorization: str | None, body: bytes | None = None
    ) -> web.StreamResponse:
        """`request` to SMG with `authorization` in place of the client's; SMG's
        answer streamed back as it comes."""
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if authorization:
            headers["Authorization"] = authorization
        if body is None and request.body_exists:
            read = await self._body(request)
            if isinstance(read, web.Response):
                return read
            body = read
        url = f"{self.upstream}{request.rel_url}"
        answer: web.StreamResponse | None = None
        try:
            async with self._http.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            ) as up:
                answer = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _ANSWER_HOP:
                        answer.headers.add(k, v)
                if up.content_length is not None and "Content-Encoding" not in up.headers:
                    answer.content_length = up.content_length
                await answer.prepare(request)
                async for chunk in up.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
        except aiohttp.ClientError as exc:
            if answer is not None and answer.prepared:
                raise  # cut mid-answer: the client sees the connection end, as from SMG
            log.debug("SMG did not answer %s %s: %s", request.method, request.path, exc)
            return openai_error(
                503,
                "service_unavailable",
                "gateway_unavailable",
                "the gateway's router is not answering: retry shortly",
                **{"Retry-After": NOT_READY_RETRY_S},
            )


def new_upstream_key() -> str:
    return secrets.token_urlsafe(32)
