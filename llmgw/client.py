"""The typed async admin client: how the console (and the demo) talk to the
controller. `ctl` uses the blocking `SyncAdminClient`; both run the same
`llmgw.api` calls, so paths and bodies are written once.

Tests hand it an `httpx.MockTransport` (``transport=``) or point it at a real
controller on loopback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from llmgw import api
from llmgw.api import (
    Call,
    ControllerError,
    ControllerUnreachable,
    NotAController,
    admin_token,
    controller_url,
    controller_urls,
)
from llmgw.common import DEFAULT_CONTROLLER, first_line
from llmgw.errors import TlsConfigError, TlsRefused
from llmgw.leader import Endpoints, Following
from llmgw.tls import client_context, is_verify_failure, verify_hint
from llmgw.wire import (
    AdapterSpec,
    DrainPlan,
    EventList,
    FleetSummary,
    GatewayView,
    ModelSpec,
    ModelView,
    NodeDetail,
    NodeRow,
    NodesDelta,
    ReplicaView,
    UsageReport,
    WhoAmI,
)

__all__ = [
    "DEFAULT_CONTROLLER",
    "AdminClient",
    "ControllerError",
    "ControllerUnreachable",
    "NotAController",
    "admin_token",
    "controller_url",
    "describe",
]

# Connect fast, read patiently: a drain --wait or a watch stream outlives pings.
DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=3.0)

T = TypeVar("T")

describe = first_line  # the console's name for it


class AdminClient:
    """Async client for the controller's admin API."""

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        user: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        # Several controllers: calls go to the leader (llmgw.leader).
        self.endpoints = Endpoints(controller_urls(base_url))
        headers = {"User-Agent": "llmgw-admin"}
        tok = admin_token(token)
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        if user:  # recorded beside the token's identity on cordons and drains
            headers["X-LLMGW-User"] = user
        schemes = {urlsplit(u).scheme for u in self.endpoints.urls}
        if transport is None and schemes == {"http"}:
            # Plain http needs no TLS context (building httpx's default one costs
            # tens of milliseconds); an empty one is never used for http.
            import ssl

            transport = httpx.AsyncHTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=_verify("https" in schemes, ca_file),
        )

    @property
    def base_url(self) -> str:
        """The controller calls go to first: the one that answered last."""
        return self.endpoints.current

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- reads --------------------------------------------------------------

    async def summary(self) -> FleetSummary:
        return await self.run(api.summary())

    async def nodes(self) -> list[NodeRow]:
        return await self.run(api.nodes())

    async def nodes_since(self, cursor: str = "") -> NodesDelta:
        """Rows changed since `cursor` ("" for all); see `NodesDelta`."""
        return await self.run(api.nodes_since(cursor))

    async def node(self, name: str) -> NodeDetail:
        return await self.run(api.node(name))

    async def models(self) -> list[ModelView]:
        return await self.run(api.models())

    async def replicas(self) -> list[ReplicaView]:
        return await self.run(api.replicas())

    async def events(self, since: int = 0, obj: str | None = None) -> EventList:
        """Events after id `since`, of `obj` (`node/NAME`, `model/NAME`) alone if given."""
        return await self.run(api.events(since, obj))

    async def gateways(self) -> list[GatewayView]:
        return await self.run(api.gateways())

    async def usage(self, since: str, by: str = "tenant,model") -> UsageReport:
        """Tokens and requests per tenant and model over the last `since` (`24h`)."""
        return await self.run(api.usage_report(since, by))

    async def whoami(self) -> WhoAmI:
        """The token's name and role, so a front end offers only what it may do."""
        return await self.run(api.whoami())

    async def summary_json(self) -> Any:
        """The summary exactly as served (for `ctl status --json`)."""
        return await self.run(api.summary_json())

    # -- mutations ------------------------------------------------------------

    async def cordon(self, node: str, reason: str) -> NodeRow:
        return await self.run(api.cordon(node, reason))

    async def uncordon(self, node: str) -> NodeRow:
        return await self.run(api.uncordon(node))

    async def drain(
        self, node: str, reason: str, *, force: bool = False, force_after_s: float | None = None
    ) -> NodeRow:
        return await self.run(api.drain(node, reason, force=force, force_after_s=force_after_s))

    async def drain_plan(self, nodes: Iterable[str]) -> Any:
        """What draining these nodes would do to each model (a dry run), as JSON."""
        return await self.run(api.drain_plan_json(nodes))

    async def drain_plan_typed(self, nodes: Iterable[str]) -> DrainPlan:
        return await self.run(api.drain_plan(nodes))

    async def apply_models(
        self, specs: list[ModelSpec], adapters: list[AdapterSpec] | None = None
    ) -> list[ModelView]:
        return await self.run(api.apply_models(specs, adapters))

    async def delete_model(self, name: str) -> None:
        await self.run(api.delete_model(name))

    async def credentials(self) -> list[dict[str, Any]]:
        return await self.run(api.credentials())

    async def revoke_credential(self, node: str) -> Any:
        return await self.run(api.revoke_credential(node))

    async def forget_node(self, node: str) -> dict[str, Any]:
        return await self.run(api.forget_node(node))

    # -- plumbing -------------------------------------------------------------

    async def run(self, call: Call[T]) -> T:
        """One call; transport failures and error statuses become llmgw.errors."""
        url, response = await self._send(call)
        status, body = response.status_code, response.content
        if status >= 400:
            if api.may_not_be_a_controller(status, response.headers.get("content-type", ""), body):
                await self._check_is_controller(url, status)
            raise api.refusal(status, body, response.reason_phrase, url + call.path)
        try:
            return call.parse(body)
        except ValueError:  # (the console shows a ValidationError as "not understood")
            await self._check_is_controller(url, status)
            raise

    async def _check_is_controller(self, url: str, status: int) -> None:
        h_status: int | None
        try:
            h = await self._send_to(url, api.healthz())
            h_status, h_type, h_body = h.status_code, h.headers.get("content-type", ""), h.content
        except ControllerUnreachable:
            h_status, h_type, h_body = None, "", b""
        answered = api.describe_healthz(h_status, h_type, h_body)
        if answered is not None:
            raise api.not_a_controller(url, status, answered)

    async def _send(self, call: Call[Any]) -> tuple[str, httpx.Response]:
        """The leader's answer and its URL (llmgw.leader.Following)."""
        follow = Following(self.endpoints)
        while (url := follow.next()) is not None:
            try:
                response = await self._send_to(url, call)
            except ControllerUnreachable as exc:
                follow.unreachable(exc)
                continue
            if follow.answered(url, response.status_code, response.headers, response.content):
                return url, response
        if follow.follower is not None:  # only followers answered: no leader right now
            raise api.no_leader(follow.tried(), call.path)
        assert isinstance(follow.failure, ControllerUnreachable)
        raise follow.failure

    async def _send_to(self, url: str, call: Call[Any]) -> httpx.Response:
        headers = {"Content-Type": "application/json"} if call.body is not None else None
        try:
            return await self._http.request(
                call.method,
                url + call.path,
                params=call.params or None,
                content=call.content(),
                headers=headers,
            )
        except httpx.TransportError as exc:
            if is_verify_failure(exc):
                raise TlsRefused(url, TlsConfigError(verify_hint(url, exc))) from exc
            raise ControllerUnreachable(url, exc) from exc


def _verify(https: bool, ca_file: str | None) -> Any:
    """https: verified against --ca-file / LLMGW_CA_FILE, else the system's CAs."""
    if not https:
        return True
    return client_context(ca_file)
