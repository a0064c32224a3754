"""The gateway's conversation: the endpoint feed it follows, the status it
reports, and the client keys it checks."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from llmgw.wire.rules import Inbound, ModelName, Outbound, ReplicaId, text_field

# -- client keys of tenants (`ctl keys`; llmgw.tenant_keys) ----------------------------

TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
# A model name's characters and the shell-style glob's own.
ModelPattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/@+*?\[\]!-]{1,256}$")]
ClientKeyId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,16}$")]


class ClientKeyEntry(Outbound):
    """One key as a gateway gets it: its digest, never the key."""

    id: str
    tenant: str
    digest: str
    models: list[str]
    expires_at: float | None = None


class TenantLimitView(Outbound):
    """One limit (`ctl limits`): a tenant's, or a tenant's on one model (`model`);
    None where a kind is not limited. `budget` tokens per `per` (UTC day or month)."""

    tenant: str
    model: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None
    per: str | None = None  # "day" | "month", with a budget
    by: str = ""
    at: float = 0.0


class ClientKeysFeed(Outbound):
    """`GET /v1/keys/feed`: every key (they are few), every tenant's limits, and the
    cursor to wait past."""

    cursor: str
    keys: list[ClientKeyEntry]
    limits: list[TenantLimitView] = Field(default_factory=list)


LimitPeriod = Literal["day", "month"]
MAX_RPM = 10**9
MAX_TOKENS = 10**15


_Count = Annotated[int, Field(ge=0, le=2**53)]


class UsageDelta(Inbound):
    """What one (tenant, model) cost at one gateway since its last batch."""

    tenant: TenantName
    model: ModelName
    requests: _Count = 0
    prompt_tokens: _Count = 0
    completion_tokens: _Count = 0
    errors: _Count = 0
    rate_limited: _Count = 0  # refused over a limit (429), never sent on


class UsageBatch(Inbound):
    """`POST /v1/gateways/usage`: a gateway's counts, each second. `seq` counts the
    batches of the gateway's `run` (one process): a batch sent again, its answer
    lost, is counted once."""

    name: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:@-]+$")
    ]
    run: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    seq: Annotated[int, Field(ge=1, le=2**62)]
    rows: list[UsageDelta] = Field(default_factory=list, max_length=20_000)


class LimitShare(Outbound):
    """What the fleet spent against one limit's scope: the other gateways' requests
    and tokens (running totals of the controller's `run`) and, with a budget, the
    tokens of its period so far, every gateway's."""

    tenant: str
    model: str | None = None
    others_requests: int = 0
    others_tokens: int = 0
    budget_used: int | None = None


class UsageAnswer(Outbound):
    run: str
    shares: list[LimitShare] = Field(default_factory=list)


# -- the gateway (endpoint feed and gateway status) ----------------------------------

# Keys a gateway sends are replica ids: no control characters, as everywhere.
GatewayReplicaId = ReplicaId


class Endpoint(Outbound):
    replica_id: str
    model: str
    url: str  # the rank-0 engine: http://NODE-ADDRESS:PORT
    node: str
    fabric: str | None
    state: Literal["serving", "stopping"]
    adapters: list[str] = Field(default_factory=list)  # LoRA adapters it holds, routable
    # The key its engine asks for, sent to gateway tokens only (`keyless` for every
    # other reader): the URL alone serves nothing. None: a replica placed before keys.
    engine_key: str | None = Field(default=None, repr=False)

    def keyless(self) -> Endpoint:
        return self if self.engine_key is None else self.model_copy(update={"engine_key": None})


class UnservedKind(StrEnum):
    """Why a declared model has no serving endpoint, as a gateway acts on it."""

    NOT_READY = "not_ready"  # replicas are on their way (or will be): 503, retry
    ASLEEP = "asleep"  # at zero replicas, woken by a request: hold requests while it wakes
    UNPLACEABLE = "unplaceable"  # no replica can be placed now: 503, retrying will not help


class Unserved(Outbound):
    """A declared model no replica serves: the kind code reads, the message people read."""

    kind: UnservedKind
    message: str  # "2 replicas starting"; "needs 1 node x 8 H100-80GB ..."

    @field_validator("kind", mode="before")
    @classmethod
    def _unknown_kind(cls, value: object) -> object:
        # A kind from a newer controller reads as "not ready" (503, retry): one new
        # word must not stop a gateway from following the feed.
        known = {k.value for k in UnservedKind}
        return value if not isinstance(value, str) or value in known else UnservedKind.NOT_READY

    def legacy_text(self) -> str:
        """The reason as `EndpointsDelta.unserved` says it to 0.1 gateways."""
        prefix = _LEGACY_PREFIXES.get(self.kind, "")
        return prefix + self.message

    @classmethod
    def from_legacy_text(cls, text: str) -> Unserved:
        """An older controller's reason (`unserved` alone), read back as its words say.
        The only place a reason is recognised by its text; it goes with that field."""
        for kind, prefix in _LEGACY_PREFIXES.items():
            if text.startswith(prefix):
                return cls(kind=kind, message=text.removeprefix(prefix))
        return cls(kind=UnservedKind.NOT_READY, message=text)


# How the text-only `unserved` field marked two kinds; the others had no prefix.
_LEGACY_PREFIXES = {UnservedKind.UNPLACEABLE: "cannot be placed: ", UnservedKind.ASLEEP: "asleep: "}


class EndpointsDelta(Outbound):
    """Endpoints that changed after `since` (every one when `full`), and ids gone.

    `unserved_reasons` names each declared model with no serving endpoint and says
    why, so that a gateway can answer its clients in words and act on the kind."""

    cursor: str
    full: bool
    endpoints: list[Endpoint]
    removed: list[str]
    # The same reasons as text only (`Unserved.legacy_text`), for 0.1 gateways, which
    # read nothing else. Both fields are sent through 0.2 (one release back is
    # understood); `unserved` goes in 0.3, with `Unserved.from_legacy_text`.
    unserved: dict[str, str] = Field(default_factory=dict)
    unserved_reasons: dict[str, Unserved] = Field(default_factory=dict)
    # Every declared adapter -> its base (always whole: they are few beside endpoints).
    adapters: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def build(
        cls,
        cursor: str,
        full: bool,
        endpoints: list[Endpoint],
        removed: list[str],
        unserved: dict[str, Unserved],
        adapters: dict[str, str] | None = None,
    ) -> EndpointsDelta:
        """A delta that says each unserved reason in both fields."""
        return cls(
            cursor=cursor,
            full=full,
            endpoints=endpoints,
            removed=removed,
            unserved={m: r.legacy_text() for m, r in unserved.items()},
            unserved_reasons=unserved,
            adapters=adapters or {},
        )

    def reasons(self) -> dict[str, Unserved]:
        """Why each model is unserved: the structured reason, or, from a 0.1
        controller (text only), the text read back (goes with `unserved` in 0.3)."""
        older = {m: Unserved.from_legacy_text(t) for m, t in self.unserved.items()}
        return older | self.unserved_reasons


# The most a gateway may say it admits at once (`llmgw gateway --max-in-flight`).
GATEWAY_IN_FLIGHT_BOUND = 1_000_000
# What a gateway that does not say is taken to admit: SMG's own least bound (1,024
# per core, at least 4,096).
GATEWAY_IN_FLIGHT_DEFAULT = 4096


class GatewayStatus(Inbound):
    name: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:@-]+$")
    ]
    cursor: Annotated[str, StringConstraints(max_length=80)] = ""  # applied: SMG follows it
    # A later cursor whose new workers SMG routes to while removals are pending (sent
    # only then): a model it declared is answered by its explainer, never a 404.
    routed: Annotated[str, StringConstraints(max_length=80)] = ""
    in_flight: dict[GatewayReplicaId, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, max_length=100_000
    )
    requests: dict[GatewayReplicaId, Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict, max_length=100_000
    )
    # Endpoints it leaves out of routing because it cannot use them, and why.
    rejected: dict[GatewayReplicaId, Annotated[str, text_field(1, 200)]] = Field(
        default_factory=dict, max_length=1024
    )
    # Replicas the feed says are stopping that its SMG no longer routes to (their workers
    # gone from SMG's list): a stop of one waits for nothing else of this gateway's, not
    # for the cursor, which a slow change of another model can hold back.
    released: list[GatewayReplicaId] = Field(default_factory=list, max_length=100_000)
    # Requests it holds per model asleep at zero replicas, waiting for one to wake.
    held: dict[ModelName, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # How long each of those has had requests held, in seconds (sent with `held`).
    held_age: dict[ModelName, Annotated[float, Field(ge=0, le=1e7)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # Its concurrency bound (`llmgw gateway --max-in-flight`, SMG's admission limit):
    # the controller counts at most this many of its requests in flight and held.
    max_in_flight: Annotated[int, Field(ge=1, le=GATEWAY_IN_FLIGHT_BOUND)] | None = None
    # Requests for each adapter it forwarded in flight now, and forwarded in all.
    adapter_in_flight: dict[ModelName, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, max_length=10_000
    )
    adapter_requests: dict[ModelName, Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # Adapters are routed by its explainer, which takes each feed change as it comes,
    # not after SMG (whose removals take seconds): the cursor its adapter routing
    # follows (sent only when later than `cursor`), and the adapters each replica has
    # requests in flight for now (sent only when there are). An adapter leaving a
    # replica is unloaded once every gateway's routing follows that and none has a
    # request for it there in flight.
    adapters_at: Annotated[str, StringConstraints(max_length=80)] = ""
    adapter_busy: dict[
        GatewayReplicaId, Annotated[list[ModelName], Field(min_length=1, max_length=4096)]
    ] = Field(default_factory=dict, max_length=100_000)
    # Client keys used since the last status (key id -> unix time, the gateway's clock).
    keys_used: dict[ClientKeyId, Annotated[float, Field(ge=0, le=1e11)]] = Field(
        default_factory=dict, max_length=10_000
    )
    # Changes only (sent once the controller's answer says it takes them): `in_flight`
    # and `requests` then hold what changed since status `base` of the same `stream`
    # (one per gateway run), and `gone` the replicas dropped from both. Without `base`
    # they are whole; with `stream` and `seq` the controller keeps them as the base
    # of the next. See GatewayStatusReply.
    stream: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]{1,32}$")] | None = None
    seq: Annotated[int, Field(ge=1, le=2**62)] | None = None
    base: Annotated[int, Field(ge=1, le=2**62)] | None = None
    gone: list[GatewayReplicaId] = Field(default_factory=list, max_length=100_000)

    @model_validator(mode="after")
    def _changes_need_their_base(self) -> GatewayStatus:
        if (self.stream is None) != (self.seq is None):
            raise ValueError("`stream` and `seq` go together")
        if self.base is not None and (self.seq is None or self.base >= self.seq):
            raise ValueError("`base` needs a `stream` and a `seq` after it")
        if self.gone and self.base is None:
            raise ValueError("`gone` is for changes (with `base`)")
        return self


class GatewayStatusReply(Outbound):
    """The controller's answer to a status. `deltas`: it takes changes only (a
    controller before them answers 204, no body). `full`: it could not apply this
    status's changes (it holds no status `base` of that stream: it restarted, took
    over, or an answer was lost), so the next status carries the whole figures."""

    deltas: bool = True
    full: bool = False


class GatewayView(Outbound):
    name: str
    cursor: str
    age_s: float
    in_flight: int
    requests: int
    rejected: dict[str, str] = Field(default_factory=dict)  # replica id -> why left out


class WhoAmI(Outbound):
    """`GET /v1/whoami`: whose token this is and what it may do (None: open mode)."""

    name: str
    role: str | None
