"""The typed admin client: the one place `ctl` and the console talk to the network.

Tests hand it an `httpx.MockTransport` (``transport=``) or point it at a real
controller on loopback.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from llmgw.wire import (
    FleetSummary,
    GatewayView,
    ModelSpec,
    ModelView,
    NodeDetail,
    NodeRow,
    NodesDelta,
    ReplicaView,
)

DEFAULT_CONTROLLER = "http://127.0.0.1:7460"
# Connect fast, read patiently: a drain --wait or a watch stream outlives pings.
DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=3.0)

T = TypeVar("T", bound=BaseModel)


class ControllerError(Exception):
    """The controller answered with an error; `message` is its own words."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.url = url


class ControllerUnreachable(Exception):
    """No answer at all: connection refused, DNS, timeout."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"cannot reach the controller at {url}: {describe(cause)}")
        self.url = url
        self.cause = cause


def describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def controller_url(explicit: str | None = None) -> str:
    return (explicit or os.environ.get("LLMGW_CONTROLLER") or DEFAULT_CONTROLLER).rstrip("/")


def admin_token(explicit: str | None = None) -> str | None:
    return explicit or os.environ.get("LLMGW_TOKEN") or None


_rows = TypeAdapter(list[NodeRow])
_models = TypeAdapter(list[ModelView])
_replicas = TypeAdapter(list[ReplicaView])
_gateways = TypeAdapter(list[GatewayView])


class AdminClient:
    """Async client for the controller's admin API."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        user: str | None = None,
    ) -> None:
        self.base_url = controller_url(base_url)
        headers = {"User-Agent": "llmgw-admin"}
        tok = admin_token(token)
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        if user:  # recorded beside the token's identity on cordons and drains
            headers["X-LLMGW-User"] = user
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

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

    # Typed reads validate the body straight from bytes: at 2,000 nodes that is
    # about half the cost of json.loads followed by validation.

    async def summary(self) -> FleetSummary:
        return FleetSummary.model_validate_json(await self._get_bytes("/v1/summary"))

    async def nodes(self) -> list[NodeRow]:
        return _rows.validate_json(await self._get_bytes("/v1/nodes"))

    async def nodes_since(self, cursor: str = "") -> NodesDelta:
        """Rows changed since `cursor` ("" for all); see `NodesDelta`."""
        return NodesDelta.model_validate_json(
            await self._get_bytes("/v1/nodes", params={"since": cursor})
        )

    async def node(self, name: str) -> NodeDetail:
        return NodeDetail.model_validate_json(await self._get_bytes(f"/v1/nodes/{name}"))

    async def models(self) -> list[ModelView]:
        return _models.validate_json(await self._get_bytes("/v1/models"))

    async def replicas(self) -> list[ReplicaView]:
        return _replicas.validate_json(await self._get_bytes("/v1/replicas"))

    async def gateways(self) -> list[GatewayView]:
        """The gateways that have posted status, with their last report age."""
        return _gateways.validate_json(await self._get_bytes("/v1/gateways"))

    async def summary_json(self) -> Any:
        """The summary exactly as served (for `ctl status --json`)."""
        return await self._get("/v1/summary")

    # -- mutations ------------------------------------------------------------

    async def cordon(self, node: str, reason: str) -> NodeRow:
        return NodeRow.model_validate(
            await self._post(f"/v1/nodes/{node}/cordon", {"reason": reason})
        )

    async def uncordon(self, node: str) -> NodeRow:
        return NodeRow.model_validate(await self._post(f"/v1/nodes/{node}/uncordon", {}))

    async def drain(
        self, node: str, reason: str, *, force: bool = False, force_after_s: float | None = None
    ) -> NodeRow:
        """Drain `node`; with `force_after_s`, the controller forces it after that many
        seconds unless it is done (the deadline is kept by the controller)."""
        body: dict[str, Any] = {"reason": reason, "force": force}
        if force_after_s is not None:
            body["force_after_s"] = force_after_s
        return NodeRow.model_validate(await self._post(f"/v1/nodes/{node}/drain", body))

    async def drain_plan(self, nodes: Iterable[str]) -> Any:
        """What draining these nodes would do to each model (a dry run)."""
        return await self._post("/v1/drain-plan", {"nodes": list(nodes)})

    async def apply_models(self, specs: list[ModelSpec]) -> list[ModelView]:
        body = {"models": [s.model_dump(mode="json") for s in specs]}
        return _models.validate_python(await self._post("/v1/models", body))

    async def delete_model(self, name: str) -> None:
        await self._request("DELETE", f"/v1/models/{name}")

    # -- plumbing -------------------------------------------------------------

    async def _get(self, path: str) -> Any:
        return await self._request("GET", path)

    async def _get_bytes(self, path: str, params: dict[str, str] | None = None) -> bytes:
        return (await self._send("GET", path, params=params)).content

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", path, json=body)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._send(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; transport failures and error statuses become our exceptions."""
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ControllerUnreachable(self.base_url, exc) from exc
        if response.status_code >= 400:
            raise ControllerError(
                response.status_code, _error_message(response), f"{self.base_url}{path}"
            )
        return response


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict) and "error" in body:
        message = str(body["error"])
        detail = body.get("detail")
        if isinstance(detail, list) and detail:
            parts = [
                f"{d.get('loc', '')}: {d.get('msg', '')}" for d in detail if isinstance(d, dict)
            ]
            message += " (" + "; ".join(parts) + ")"
        return message
    return response.text.strip()
