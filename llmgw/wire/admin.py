"""The operator's conversation (ctl, the console): requests, declared models,
events, and the views the controller serves."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    Field,
    Strict,
    model_validator,
)

from llmgw.wire.agent import GpuReport, ReplicaReport, StorageLocation
from llmgw.wire.gateway import MAX_RPM, MAX_TOKENS, LimitPeriod, ModelPattern, TenantName
from llmgw.wire.rules import (
    MAX_DURATION_S,
    EngineName,
    GpuClass,
    Inbound,
    ModelName,
    NodeName,
    Outbound,
    PathText,
    Reason,
    Seconds,
    text_field,
)
from llmgw.wire.states import AdminFlag, NodeState, ReplicaState, ShardState

# -- admin requests --------------------------------------------------------------


class ReasonRequest(Inbound):
    reason: Reason


class EnrollRequest(Inbound):
    """`POST /v1/agent/enroll` with the enrollment token: a node asks for its credential."""

    node: NodeName


class EnrollReply(Outbound):
    node: str
    credential: str  # shown once; the controller keeps only its hash
    # The node gets no replicas until an admin approves it (--enroll-approval).
    awaiting_approval: bool = False


class CredentialView(Outbound):
    node: str
    source: str  # "enrolled" (revocable with ctl) | "file" (--agent-token-file)
    issued_at: float | None = None  # unix time, controller clock
    by: str | None = None
    awaiting_approval: bool = False  # `llmgw ctl credentials approve NODE`
    # Its node has not reported with it yet: it expires then unless it does.
    expires_at: float | None = None


DEFAULT_ENROLL_TOKEN_TTL_S = 86_400.0  # as kubeadm's bootstrap tokens


class EnrollTokenRequest(Inbound):
    """`POST /v1/credentials/tokens`: make an enrollment token (`ctl credentials token create`)."""

    # How long it enrolls nodes; 0: no expiry (as kubeadm's --ttl 0).
    ttl_s: Seconds = DEFAULT_ENROLL_TOKEN_TTL_S
    uses: int | None = Field(default=None, ge=1, le=1_000_000)  # None: no use limit
    description: Annotated[str, text_field(max_length=256)] | None = None


class EnrollTokenView(Outbound):
    id: str  # public: what `ctl credentials token delete ID` names
    state: str  # "valid" | "expired" | "used up"
    created_at: float  # unix time, controller clock
    by: str
    expires_at: float | None = None  # None: never
    uses: int | None = None  # None: no limit
    used: int = 0
    description: str | None = None
    token: str | None = None  # the secret: in the answer that made it, never again


class ClientKeyRequest(Inbound):
    """`POST /v1/keys`: make a client key for a tenant (`ctl keys create`)."""

    tenant: TenantName
    # The models it allows (shell-style patterns); none given: every model.
    models: list[ModelPattern] = Field(default_factory=list, max_length=64)
    expires_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S)] | None = None  # None: never


class ClientKeyView(Outbound):
    """What `ctl keys list` shows: never the key, nor its digest."""

    id: str
    tenant: str
    models: list[str]
    state: str  # "valid" | "expired"
    created_at: float  # unix time, controller clock
    by: str
    expires_at: float | None = None  # None: never
    last_used: float | None = None  # as the gateways reported it (to the minute)
    key: str | None = None  # the key: in the answer that made it, never again


class LimitRequest(Inbound):
    """`PUT /v1/limits` (`ctl limits set`): the kinds given replace the scope's, the
    others stay as they were."""

    tenant: TenantName
    model: ModelName | None = None  # None: all the tenant's models together
    rpm: Annotated[int, Field(ge=1, le=MAX_RPM)] | None = None
    tpm: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    budget: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    per: LimitPeriod | None = None

    @model_validator(mode="after")
    def _something(self) -> LimitRequest:
        if self.rpm is None and self.tpm is None and self.budget is None:
            raise ValueError("give at least one of rpm, tpm, budget")
        if (self.budget is None) != (self.per is None):
            raise ValueError("a budget goes with its period (per: day or month), and only it")
        return self


class UsageRow(Outbound):
    """`GET /v1/usage` (`ctl usage`): one (tenant, model)'s counts in the window."""

    tenant: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int
    rate_limited: int = 0


class UsageReport(Outbound):
    since: float  # the window's start: the hour `--since` falls in (unix time)
    rows: list[UsageRow]


class EmptyRequest(Inbound):
    """A body that carries nothing: `{}` or no body at all."""


class UncordonRequest(Inbound):
    """`{}` or no body; `force`: uncordon although llmgw cordoned the node for a card
    that is still unhealthy."""

    force: bool = False


MAX_FORCE_AFTER_S = 7 * 86_400


class DrainRequest(Inbound):
    reason: Reason
    force: bool = False
    # Force the drain this many seconds from now unless it is done by then.
    force_after_s: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )


class ModelSpec(Inbound):
    name: ModelName
    source: PathText  # what the engine loads: a repository id or a path
    min_replicas: int = Field(default=1, ge=0, le=10_000)
    gpus_per_shard: int = Field(default=1, ge=1, le=64)
    shards: int = Field(default=1, ge=1, le=256)  # nodes per replica
    gpu_class: GpuClass | None = None
    engine: EngineName = "vllm"
    engine_args: list[Annotated[str, text_field(max_length=1024)]] = Field(
        default_factory=list, max_length=256
    )
    # A rollout of a changed spec: at most this many replicas above the desired
    # count at once, and at most this many ready replicas below it.
    max_surge: int = Field(default=1, ge=0, le=10_000)
    max_unavailable: int = Field(default=0, ge=0, le=10_000)
    # Demand (`llmgw.controller.core.autoscale`): between min_replicas and max_replicas
    # (None: min_replicas, no autoscaling), aiming at target_in_flight requests in
    # flight per replica; down one replica at a time, each after the demand has
    # stayed lower for scale_down_after_s (unloading throws the KV cache away).
    max_replicas: int | None = Field(default=None, ge=0, le=10_000)
    target_in_flight: int = Field(default=8, ge=1, le=1_000_000)
    scale_down_after_s: Annotated[float, Strict()] = Field(
        default=600.0, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    # The warm tier (issue 32): a ready replica idle this long sleeps instead of
    # stopping (None: never; nothing changes for a spec that does not ask), at
    # `sleep_level` (1: weights kept in host memory; 2: dropped, reloaded on waking;
    # auto: 1 when the node's host memory holds the weights, else 2), and is stopped
    # after `stop_asleep_after_s` asleep (None: never), never below the model's minimum
    # or desired count.
    sleep_after_s: Annotated[float, Strict()] | None = Field(
        default=None, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )
    sleep_level: Literal[1, 2, "auto"] = "auto"
    stop_asleep_after_s: Annotated[float, Strict()] | None = Field(
        default=None, ge=0, le=MAX_FORCE_AFTER_S, allow_inf_nan=False
    )
    # The share of each of its cards' memory one engine takes awake (vLLM's
    # --gpu-memory-utilization, SGLang's --mem-fraction-static: the template passes it).
    # Replicas of models that say theirs are awake on one card at once while the shares
    # add up to at most 1; None: an awake engine has its cards to itself.
    gpu_memory_share: Annotated[float, Strict()] | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False
    )

    @property
    def sleeps(self) -> bool:
        """Its idle replicas sleep instead of stopping."""
        return self.sleep_after_s is not None

    @model_validator(mode="after")
    def _a_rollout_can_move(self) -> ModelSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(
                "max_surge and max_unavailable cannot both be 0: a rollout could neither "
                "add a new replica nor stop an old one"
            )
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas "
                f"({self.min_replicas}): raise max_replicas, or leave it out for a fixed count"
            )
        return self

    @property
    def most_replicas(self) -> int:
        """The most replicas demand may ask for (min_replicas without autoscaling)."""
        return self.min_replicas if self.max_replicas is None else self.max_replicas

    @property
    def autoscaled(self) -> bool:
        return self.most_replicas > self.min_replicas


class EventReason(StrEnum):
    """Why the controller did something by itself (`ctl events`, `/metrics`)."""

    PLACED = "Placed"  # replicas placed for a model short of its minimum
    STAND_IN = "StandIn"  # a stand-in placed for a replica that must move (drain, fault)
    MOVED = "Moved"  # a moved replica stopped once its stand-in served
    ROLLOUT = "RolloutStep"  # a rollout placed a new replica or let an old one go
    ROLLOUT_STALLED = "RolloutStalled"
    DRAIN_FORCED = "DrainForced"  # a drain's deadline passed
    DRAINED = "Drained"
    GPU_FAULT = "GpuFault"  # a node cordoned for a failed card
    BACK_OFF = "BackOff"  # a model's replica failed: its next placement waits
    NODE_LOST = "NodeLost"  # replicas of a node unreachable too long, replaced
    UNPLACEABLE = "Unplaceable"  # a model short of its minimum that cannot be placed
    ENROLLED = "Enrolled"  # a node traded an enrollment token for its credential
    AWAITING_APPROVAL = "AwaitingApproval"  # enrolled; no replicas until an admin approves
    ENROLL_REFUSED = "EnrollRefused"  # an enrollment of a node that exists was refused
    STOPPED = "Stopped"  # replicas of a deleted model stopped
    SCALED_UP = "ScaledUp"  # demand raised a model's desired replicas
    SCALED_DOWN = "ScaledDown"  # demand stayed lower: one replica leaves, or has stopped
    RECLAIMED = "Reclaimed"  # replicas stopped to make room for a higher-priority model
    CREDENTIAL_EXPIRED = "CredentialExpired"  # issued, never reported with: dropped
    SLEPT = "Slept"  # an idle replica put to sleep (its model's sleep_after_s)
    WOKE = "Woke"  # a sleeping replica woken for its model's requests
    SLEEP_FAILED = "SleepFailed"  # a replica that could not sleep: kept awake
    GATEWAY_CLAMPED = "GatewayClamped"  # a gateway said more was in flight than it admits
    ADAPTER_LOADED = "AdapterLoaded"  # a replica's engine holds a LoRA adapter it was told to
    ADAPTER_UNLOADED = "AdapterUnloaded"  # told to let one go (idle, or room for another)
    ADAPTER_LOAD_FAILED = "AdapterLoadFailed"  # the engine refused a load: its words
    # A replica that must stop stays in routing until the adapters only it serves load
    # on another replica of its base; or it stopped without (the stop grace passed).
    HANDING_OVER_ADAPTERS = "HandingOverAdapters"
    ADAPTERS_NOT_HANDED_OVER = "AdaptersNotHandedOver"
    # A sleeping replica whose cards hold a busy awake engine: stopped, and its
    # model's requests served by a replica placed afresh (a cold or warm start)
    NO_ROOM_TO_WAKE = "NoRoomToWake"


class EventView(Outbound):
    """One event, or a run of repeats counted as one (llmgw.controller.state.events): an
    event with `count` > 1 replaces the newest earlier event of the same object and
    reason, which a client that holds it drops."""

    id: int  # increasing, durable: `GET /v1/events?since=ID` answers the ones after it
    at: float  # unix time, controller clock; of the last repeat when counted
    object: str  # node/NAME, model/NAME or replica/ID
    reason: EventReason
    message: str  # the last repeat's
    count: int = 1  # how many times it happened
    first_at: float | None = None  # the first time, when it happened more than once


class EventList(Outbound):
    events: list[EventView]  # oldest first
    cursor: int  # the newest id answered (or `since` when none): pass it back as since=


class RolloutUndo(Inbound):
    """`POST /v1/models/{name}/undo`: back to what revision N ran (None: the one before)."""

    to_revision: int | None = Field(default=None, ge=1)


class AdapterSpec(Inbound):
    """A LoRA adapter (issue 33): served by replicas of its `base` model, loaded there
    by demand. `source`: the adapter's directory as the agents find it in their
    `--storage` (a name like a model's, org/name), or an absolute path."""

    name: ModelName
    base: ModelName
    source: PathText


class ModelSpecList(Inbound):
    models: list[ModelSpec] = Field(max_length=10_000)
    # Adapters declared in the same files (an entry with `base:`).
    adapters: list[AdapterSpec] = Field(default_factory=list, max_length=10_000)


# -- views the controller serves -------------------------------------------------


class AdminInfo(Outbound):
    flag: AdminFlag = AdminFlag.NONE
    reason: str | None = None
    by: str | None = None
    at: float | None = None  # unix time, controller clock
    drained: bool = False  # a drain finished: cordoned, marked drained
    force: bool = False  # a drain that stops replicas without waiting for replacements
    force_at: float | None = None  # unix time, controller clock: the drain is forced then
    # Enrolled and not approved yet (--enroll-approval): cordoned by llmgw until
    # `llmgw ctl credentials approve NODE`.
    awaiting_approval: bool = False


class AdminEvent(Outbound):
    node: str
    action: str  # cordon | uncordon | drain | drain forced (deadline) | drained | forget
    reason: str | None
    by: str
    at: float
    force_at: float | None = None  # a drain's deadline, as it was set


class NodeRow(Outbound):
    """One line of the nodes table: small, so 2,000 of them stay cheap."""

    name: str
    state: NodeState
    admin: AdminInfo
    report_age_s: float | None  # None: no report since the controller started
    classes: dict[str, int]  # gpu class -> cards
    gpus_total: int
    gpus_used: int
    gpus_unhealthy: int
    gpus_unknown: int
    fabrics: list[str]
    models: list[str]  # complete weights held
    replicas: int
    gpu_error: str | None = None
    drain_blocked: str | None = None  # why a drain is not progressing


class NodesDelta(Outbound):
    """`GET /v1/nodes?since=CURSOR`: the rows that changed since a cursor.

    Like a Kubernetes list-then-watch: pass `since=` (empty) for everything,
    then each answer's `cursor` to get only what changed after it. A cursor
    from another controller run (or one not yet issued) gets a full answer.
    A row counts as changed when anything but its report age changed; every
    node's current age is in `report_ages`, so rows that did not change are
    not sent again just because their node reported.
    """

    cursor: str  # pass back as ?since= next time
    full: bool  # `nodes` is every node: drop anything not in it
    nodes: list[NodeRow]  # changed (or, when full, all) rows, by name
    removed: list[str] = Field(default_factory=list)  # nodes the controller forgot
    report_ages: dict[str, float | None]  # every node; None: no report this run


class NodeDetail(Outbound):
    row: NodeRow
    gpus: list[GpuReport]
    storage_configured: bool
    storage: list[StorageLocation]
    replicas: list[ReplicaReport]
    history: list[AdminEvent]
    agent_version: str | None = None
    address: str | None = None


class ShardView(Outbound):
    node: str
    rank: int
    gpus: list[str]
    state: ShardState | None = None  # None: the node has not reported it yet
    idle_seconds: float | None = None
    error: str | None = None


class ReplicaView(Outbound):
    id: str
    model: str
    state: ReplicaState
    shards: list[ShardView]
    gpus: int
    idle_seconds: float | None
    created_at: float
    error: str | None = None
    replaces: str | None = None  # the replica this one stands in for (drain)
    url: str | None = None  # its rank-0 engine, while in routing (the gateway's endpoint)
    revision: int = 0  # the model's revision it runs
    # Not confirmed yet: its state is the last known one, its nodes not heard from since
    # this controller began to lead (a restart, a failover). Seconds it is kept so at
    # most: then they report, or turn unreachable. None: confirmed by its nodes.
    unconfirmed_s: float | None = None


class ModelRevision(Outbound):
    """One revision of a model: the spec its engines were started with, and why."""

    revision: int
    at: float  # unix time, controller clock
    by: str
    change: str  # e.g. "engine_args: --load-seconds 5 -> --load-seconds 6"
    spec: ModelSpec


class ScalingState(StrEnum):
    """Where demand has an autoscaled model (the message beside it says the figures)."""

    FOLLOWING = "following"  # up and down with requests in flight
    WAKING = "waking"  # woken from zero replicas by a request; none serves yet
    ASLEEP = "asleep"  # at zero replicas until a request comes


class RolloutState(StrEnum):
    COMPLETE = "complete"  # every replica runs the current revision
    PROGRESSING = "progressing"
    WAITING = "waiting"  # no room for a new replica: `message` says why
    STALLED = "stalled"  # a replica of the new revision failed: no more old ones stop


class RolloutView(Outbound):
    revision: int
    state: RolloutState
    desired: int
    updated: int  # ready replicas of the current revision
    outdated: int  # replicas of older revisions still running
    message: str | None = None


class ModelStarts(Outbound):
    """How a model's replicas came to serve, counted since the model was first applied
    (issue 32): woken (hot), started where the weights were (warm) or not (cold), and
    how long the last of each took (hot: per sleep level, as the agent timed the wake;
    warm and cold: placement to ready)."""

    hot: int = 0
    warm: int = 0
    cold: int = 0
    last_s: dict[str, float] = Field(default_factory=dict)  # "hot-1", "hot-2", "warm", "cold"


class ModelView(Outbound):
    spec: ModelSpec
    ready: int
    starting: int
    failed: int
    satisfied: bool
    unplaceable_reason: str | None = None
    last_failure: str | None = None
    # Distinct nodes under its serving (ready or draining) replicas: ready >= 2 on
    # 1 node means one node's failure takes the whole model (ctl, the console flag it).
    nodes: int = 0
    rollout: RolloutView | None = None
    # Demand: the replicas it should have now (min_replicas without autoscaling),
    # its requests in flight (smoothed, as the autoscaler reads them) and why the
    # count is what it is (`in flight 12, target 4 -> 3`; a scale-up that waits).
    desired: int = 0
    in_flight: float = 0.0
    scaling: str | None = None
    scaling_state: ScalingState | None = None  # None: not autoscaled (or a controller before it)
    # The warm tier: replicas asleep (holding their cards, serving nothing) and waking.
    # They count for `satisfied`: a request wakes one in seconds.
    sleeping: int = 0
    waking: int = 0
    # Requests the live gateways hold for it (no replica awake to take them: it wakes,
    # or waits for a card), and how long the longest-held has waited, in seconds.
    held: int = 0
    held_s: float | None = None
    # Replicas counted in their last known state, their nodes not heard from since this
    # controller began to lead, and the most seconds that lasts (ReplicaView.unconfirmed_s).
    unconfirmed: int = 0
    unconfirmed_s: float | None = None
    starts: ModelStarts = Field(default_factory=ModelStarts)


class AdapterView(Outbound):
    """One adapter: its spec, where it is loaded and what it serves (issue 33)."""

    spec: AdapterSpec
    loaded_on: list[str] = Field(default_factory=list)  # replica ids that hold it
    loading_on: list[str] = Field(default_factory=list)  # told to load, not yet reported
    nodes_with_files: int = 0  # nodes whose storage holds it complete
    in_flight: int = 0
    requests: int = 0
    held: int = 0
    last_used_s: float | None = None  # seconds since a request for it (None: never seen)
    last_failure: str | None = None


class AdapterDryRun(Outbound):
    spec: AdapterSpec
    current: AdapterSpec | None = None


class ModelDryRun(Outbound):
    """`POST /v1/models?dry_run=true`: a spec as the controller would store it,
    beside the one it holds now (None: it would be created); nothing is written."""

    spec: ModelSpec
    current: ModelSpec | None = None
    new_revision: bool  # a field the engine sees changes: new replicas are rolled out


# -- drain pre-check ----------------------------------------------------------------


class DrainPlanRequest(Inbound):
    nodes: list[NodeName] = Field(min_length=1, max_length=10_000)


class DrainImpact(Outbound):
    """What draining some nodes would do to one model."""

    model: str
    min_replicas: int
    ready_now: int
    replicas_on_nodes: int  # replicas that would have to move
    replaceable: int  # of those, how many the scheduler can place elsewhere now
    verdict: str  # "ok" | "below_minimum" | "unplaceable"
    reason: str | None = None


class DrainPlan(Outbound):
    nodes: list[str]
    replicas_to_move: int
    impacts: list[DrainImpact]  # only models with replicas on the nodes, worst first
