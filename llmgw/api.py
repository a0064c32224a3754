"""The admin API as data: every call the clients make, without any I/O.

`AdminClient` (async, httpx: the console) and `SyncAdminClient` (blocking,
stdlib: `ctl`, which must start fast) both execute these `Call`s, so a path, a
body or the way an answer is read is written once. Every path segment taken
from a user (a node or model name) is percent-encoded here: model names hold
`/` (`meta-llama/Llama-3.1-8B`).

Importing this module loads neither httpx nor asyncio.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

from llmgw.common import DEFAULT_CONTROLLER, first_line
from llmgw.errors import ControllerError as ControllerError  # the clients' names, re-exported
from llmgw.errors import ControllerUnreachable as ControllerUnreachable
from llmgw.errors import NoLeader, NotAController, controller_error
from llmgw.leader import normalize, split_urls

if TYPE_CHECKING:
    from llmgw.wire import (
        AdapterSpec,
        AdapterView,
        DrainPlan,
        EventList,
        FleetSummary,
        GatewayView,
        ModelDryRun,
        ModelRevision,
        ModelSpec,
        ModelView,
        NodeDetail,
        NodeRow,
        NodesDelta,
        ReplicaView,
        UsageReport,
        WhoAmI,
    )

    T = TypeVar("T")

    class _Answer(Generic[T]):
        """What a call's answer is read as."""

else:

    class _Answer:
        """`Call[X]` says the answer's type to the type checker; at run time it is `Call`."""

        __slots__ = ()

        def __class_getitem__(cls, item: object) -> type:
            return cls

    T = None
    Any = object  # (View's base names it)


normalize_url = normalize  # `host:port` means `http://host:port`; no trailing slash


def controller_url(explicit: str | None = None) -> str:
    """The first controller of the list given (or of LLMGW_CONTROLLER)."""
    return controller_urls(explicit)[0]


def controller_urls(explicit: str | Sequence[str] | None = None) -> list[str]:
    """Every controller given: `--controller A,B` (or a list), else LLMGW_CONTROLLER,
    else the default; the clients follow whichever leads (llmgw.leader)."""
    given: str | Sequence[str] = explicit or os.environ.get("LLMGW_CONTROLLER") or ""
    return split_urls(given) or [DEFAULT_CONTROLLER]


def admin_token(explicit: str | None = None) -> str | None:
    return explicit or os.environ.get("LLMGW_TOKEN") or None


def seg(name: str) -> str:
    """One path segment, percent-encoded (`/` included)."""
    return quote(name, safe="")


def _parse_json(body: bytes) -> Any:
    return json.loads(body) if body else None


def _none(body: bytes) -> None:
    return None


class View(dict[str, Any]):
    """A JSON object read with attribute access, as the wire type of the same name.

    `SyncAdminClient` (ctl) answers typed calls with these instead of pydantic
    models: importing pydantic and building the models costs a one-shot more
    than everything else it does. The controller built the JSON from the wire
    types, so the fields are there; ctl only reads them. Enum fields are their
    string values (the wire enums are StrEnums: they compare and hash alike).
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name in _ALIASES and _ALIASES[name] in self:
                return self[_ALIASES[name]]
            raise AttributeError(name) from None


_ALIASES = {"gpu_class": "class"}  # GpuClassCounts serializes its field as "class"


def view(body: bytes) -> Any:
    return json.loads(body, object_hook=View)


class Call(_Answer[T]):
    """One request and how to read its answer."""

    __slots__ = ("body", "method", "params", "parse", "path", "typed")

    def __init__(
        self,
        method: str,
        path: str,  # already encoded
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        parse: Callable[[bytes], T] = _parse_json,
        typed: bool = False,  # answered by a wire type: SyncAdminClient reads it as a View
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.params = params or {}
        self.parse = parse
        self.typed = typed

    def target(self) -> str:
        if not self.params:
            return self.path
        query = "&".join(f"{seg(k)}={seg(v)}" for k, v in self.params.items())
        return f"{self.path}?{query}"

    def content(self) -> bytes | None:
        return None if self.body is None else json.dumps(self.body).encode()


# Typed answers validate straight from bytes: at 2,000 nodes that is about half
# the cost of json.loads followed by validation. The wire module (pydantic)
# loads on the first typed read, not at import.


def _wire() -> Any:
    import llmgw.wire

    return llmgw.wire


_adapters: dict[str, Any] = {}


def _list_of(name: str) -> Callable[[bytes], Any]:
    def parse(body: bytes) -> Any:
        adapter = _adapters.get(name)
        if adapter is None:
            from pydantic import TypeAdapter

            adapter = _adapters[name] = TypeAdapter(list[getattr(_wire(), name)])  # type: ignore[misc,arg-type]
        return adapter.validate_json(body)

    return parse


def _one(name: str) -> Callable[[bytes], Any]:
    def parse(body: bytes) -> Any:
        return getattr(_wire(), name).model_validate_json(body)

    return parse


def summary() -> Call[FleetSummary]:
    return Call("GET", "/v1/summary", parse=_one("FleetSummary"), typed=True)


def summary_json() -> Call[Any]:
    return Call("GET", "/v1/summary")


def nodes() -> Call[list[NodeRow]]:
    return Call("GET", "/v1/nodes", parse=_list_of("NodeRow"), typed=True)


def nodes_since(cursor: str = "") -> Call[NodesDelta]:
    return Call("GET", "/v1/nodes", params={"since": cursor}, parse=_one("NodesDelta"), typed=True)


def node(name: str) -> Call[NodeDetail]:
    return Call("GET", f"/v1/nodes/{seg(name)}", parse=_one("NodeDetail"), typed=True)


def models() -> Call[list[ModelView]]:
    return Call("GET", "/v1/models", parse=_list_of("ModelView"), typed=True)


def replicas() -> Call[list[ReplicaView]]:
    return Call("GET", "/v1/replicas", parse=_list_of("ReplicaView"), typed=True)


def whoami() -> Call[WhoAmI]:
    return Call("GET", "/v1/whoami", parse=_one("WhoAmI"), typed=True)


def healthz() -> Call[Any]:
    return Call("GET", "/healthz")


def cordon(node: str, reason: str) -> Call[NodeRow]:
    return Call(
        "POST",
        f"/v1/nodes/{seg(node)}/cordon",
        {"reason": reason},
        parse=_one("NodeRow"),
        typed=True,
    )


def uncordon(node: str, *, force: bool = False) -> Call[NodeRow]:
    """`force`: although llmgw cordoned it for a card that is still unhealthy."""
    body = {"force": True} if force else {}
    return Call("POST", f"/v1/nodes/{seg(node)}/uncordon", body, parse=_one("NodeRow"), typed=True)


def drain(
    node: str, reason: str, *, force: bool = False, force_after_s: float | None = None
) -> Call[NodeRow]:
    body: dict[str, Any] = {"reason": reason, "force": force}
    if force_after_s is not None:  # absent means none: older controllers accept the body
        body["force_after_s"] = force_after_s
    return Call("POST", f"/v1/nodes/{seg(node)}/drain", body, parse=_one("NodeRow"), typed=True)


def drain_plan(nodes: Iterable[str]) -> Call[DrainPlan]:
    return Call(
        "POST", "/v1/drain-plan", {"nodes": list(nodes)}, parse=_one("DrainPlan"), typed=True
    )


def drain_plan_json(nodes: Iterable[str]) -> Call[Any]:
    return Call("POST", "/v1/drain-plan", {"nodes": list(nodes)})


def _spec_body(specs: list[ModelSpec], adapters: list[AdapterSpec]) -> dict[str, Any]:
    body: dict[str, Any] = {"models": [s.model_dump(mode="json") for s in specs]}
    if adapters:  # only then: a controller before adapters refuses the field
        body["adapters"] = [a.model_dump(mode="json") for a in adapters]
    return body


def apply_models(
    specs: list[ModelSpec], adapters: list[AdapterSpec] | None = None
) -> Call[list[ModelView]]:
    body = _spec_body(specs, adapters or [])
    return Call("POST", "/v1/models", body, parse=_list_of("ModelView"), typed=True)


def adapters() -> Call[list[AdapterView]]:
    return Call("GET", "/v1/adapters", parse=_list_of("AdapterView"), typed=True)


def apply_models_dry_run(
    specs: list[ModelSpec], adapters: list[AdapterSpec] | None = None
) -> Call[list[ModelDryRun]]:
    """What applying `specs` would change, as the controller validates them; nothing written."""
    body = _spec_body(specs, adapters or [])
    return Call(
        "POST",
        "/v1/models",
        body,
        params={"dry_run": "true"},
        parse=_list_of("ModelDryRun"),
        typed=True,
    )


def model_revisions(name: str) -> Call[list[ModelRevision]]:
    return Call(
        "GET", f"/v1/models/{seg(name)}/revisions", parse=_list_of("ModelRevision"), typed=True
    )


def undo_rollout(name: str, to_revision: int | None = None) -> Call[ModelView]:
    body = {"to_revision": to_revision}
    return Call("POST", f"/v1/models/{seg(name)}/undo", body, parse=_one("ModelView"), typed=True)


def delete_model(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/models/{seg(name)}", parse=_none)


def events(since: int = 0, obj: str | None = None) -> Call[EventList]:
    params = {"since": str(since)}
    if obj is not None:
        params["for"] = obj
    return Call("GET", "/v1/events", params=params, parse=_one("EventList"), typed=True)


def gateways() -> Call[list[GatewayView]]:
    return Call("GET", "/v1/gateways", parse=_list_of("GatewayView"), typed=True)


def credentials() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/credentials")


def revoke_credential(node: str) -> Call[Any]:
    return Call("DELETE", f"/v1/credentials/{seg(node)}")


def approve_credential(node: str) -> Call[Any]:
    return Call("POST", f"/v1/credentials/{seg(node)}/approve", {})


def allow_enroll(node: str) -> Call[Any]:
    return Call("POST", f"/v1/credentials/{seg(node)}/allow", {})


def create_enroll_token(
    ttl_s: float | None = None, uses: int | None = None, description: str | None = None
) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"uses": uses, "description": description}
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    return Call("POST", "/v1/credentials/tokens", body)


def enroll_tokens() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/credentials/tokens")


def delete_enroll_token(token_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/credentials/tokens/{seg(token_id)}", parse=_none)


def create_client_key(
    tenant: str, models: list[str], expires_s: float | None = None
) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/keys", {"tenant": tenant, "models": models, "expires_s": expires_s})


def client_keys() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/keys")


def revoke_client_key(key_id: str) -> Call[Any]:
    return Call("DELETE", f"/v1/keys/{seg(key_id)}")


def usage(since: str, by: str) -> Call[dict[str, Any]]:
    return Call("GET", "/v1/usage", params={"since": since, "by": by})


def usage_report(since: str, by: str = "tenant,model") -> Call[UsageReport]:
    return Call(
        "GET", "/v1/usage", params={"since": since, "by": by}, parse=_one("UsageReport"), typed=True
    )


def set_limit(body: dict[str, Any]) -> Call[dict[str, Any]]:
    return Call("PUT", "/v1/limits", body)


def limits() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/limits")


def delete_limit(tenant: str, model: str | None) -> Call[Any]:
    return Call("DELETE", f"/v1/limits/{seg(tenant)}", params={"model": model} if model else None)


def client_keys_feed(cursor: str, wait_s: float) -> Call[Any]:
    """Every client key's digest (the gateway's), long-polled past `cursor`."""
    return Call("GET", "/v1/keys/feed", params={"since": cursor, "wait": f"{wait_s:g}"})


def forget_node(node: str) -> Call[dict[str, Any]]:
    return Call("POST", f"/v1/nodes/{seg(node)}/forget", {})


# -- the agent's and the gateway's calls (sent over aiohttp: llmgw.leader) ----------


def agent_report() -> Call[Any]:
    """The body is the NodeReport's JSON, made by the agent (it sends bytes)."""
    return Call("POST", "/v1/agent/report")


def agent_assignments(node: str, wait_s: float) -> Call[Any]:
    """The node's reply once it changes (`If-None-Match` its ETag): 200, or 304."""
    return Call("GET", f"/v1/agent/assignments/{node}", params={"wait": f"{wait_s:g}"})


def enroll() -> Call[Any]:
    return Call("POST", "/v1/agent/enroll")


def endpoints_since(cursor: str, wait_s: float) -> Call[Any]:
    return Call("GET", "/v1/endpoints", params={"since": cursor, "wait": f"{wait_s:g}"})


def gateway_status() -> Call[Any]:
    return Call("POST", "/v1/gateways/status")


def error_message(body: bytes, reason: str) -> str:
    """The controller's own words from an error answer."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return first_line(Exception(text)) if text else reason
    if isinstance(data, dict) and "error" in data:
        message = str(data["error"])
        detail = data.get("detail")
        if isinstance(detail, list) and detail:
            parts = [
                f"{d.get('loc', '')}: {d.get('msg', '')}" for d in detail if isinstance(d, dict)
            ]
            message += " (" + "; ".join(parts) + ")"
        return message
    return body.decode("utf-8", "replace").strip()


def refusal(status: int, body: bytes, reason: str, url: str) -> ControllerError:
    """The client error for an error answer (its class chosen by status)."""
    return controller_error(status, error_message(body, reason), url)


def may_not_be_a_controller(status: int, content_type: str, body: bytes) -> bool:
    """An error answer that a wrong URL could give: ask /healthz before blaming the call."""
    return status in (404, 405) or not is_llmgw_error(body, content_type)


def is_llmgw_error(body: bytes, content_type: str) -> bool:
    """Every controller error is a JSON object with an `error` field."""
    if "json" not in content_type:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and "error" in data


def no_leader(tried: list[str], path: str) -> NoLeader:
    """Only followers answered: a failover is under way (or the store is away)."""
    return NoLeader(
        503,
        f"not the leader: no controller leads right now (asked {', '.join(tried)}); a "
        "failover takes up to the lease TTL (8 s by default): try again in a few seconds",
        tried[-1] + path,
    )


def not_a_controller(url: str, status: int, healthz_answer: str) -> NotAController:
    return NotAController(
        status,
        f"{url} is not an llmgw controller (GET /healthz answered {healthz_answer}); "
        "check --controller (e.g. http://HOST:7460)",
        url,
    )


def describe_healthz(status: int | None, content_type: str, body: bytes) -> str | None:
    """None when /healthz is an llmgw controller's; else what it answered, briefly."""
    if status is None:
        return "nothing"
    if status == 200 and "json" in content_type:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("ok") is True and "version" in data:
            return None
    kind = content_type.split(";")[0].strip() or "no content type"
    return f"{status} with {kind}"


def host_of(url: str) -> str:
    return urlsplit(url).netloc
