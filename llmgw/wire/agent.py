"""The agent's conversation: its report (cards, storage, engines, traffic) and
the controller's reply (the shards it should run)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from llmgw.wire.rules import (
    Bytes,
    ByValue,
    EngineName,
    ExitCode,
    FabricName,
    GpuClass,
    HostAddress,
    Inbound,
    MiB,
    ModelName,
    NodeName,
    Outbound,
    PathText,
    ReplicaId,
    Seconds,
    ShortText,
    Text,
    Uuid,
    text_field,
)
from llmgw.wire.states import (
    AdminFlag,
    GpuHealth,
    NodeState,
    ShardState,
    SleepFailure,
    StorageScope,
)

# -- the agent's report ---------------------------------------------------------


class GpuReport(Inbound):
    uuid: Uuid
    index: int = Field(ge=0, le=4096)
    name: ShortText = ""  # raw product name as NVML gives it
    gpu_class: GpuClass  # normalised name + memory in GiB, e.g. H100-SXM-80GB
    memory_total_mib: MiB
    memory_used_mib: MiB | None = None
    utilization_pct: int | None = Field(default=None, ge=0, le=100)
    in_use: bool = False  # compute processes present on the card
    health: ByValue[GpuHealth] = GpuHealth.UNKNOWN
    health_reason: Text | None = None
    mig_parent_uuid: Uuid | None = None  # set when this device is a MIG slice


class ModelFound(Inbound):
    name: ModelName  # relative path (org/name) or HF cache repo id
    path: PathText
    format: Annotated[str, text_field(max_length=32)] = "safetensors"
    size_bytes: Bytes
    files: int = Field(default=0, ge=0, le=10_000_000)


class AdapterFound(Inbound):
    """A complete LoRA adapter directory: adapter_config.json naming a LoRA, and its
    weight file whole."""

    name: ModelName
    path: PathText
    rank: int = Field(ge=1, le=65_536)
    base: ShortText | None = None  # base_model_name_or_path, as the adapter says
    size_bytes: Bytes = 0


class ModelIncomplete(Inbound):
    """A directory that looks like a model but is not usable, and why."""

    name: ShortText
    path: PathText
    reason: Text


class StorageLocation(Inbound):
    path: PathText
    fs_type: ShortText = ""
    scope: ByValue[StorageScope] = StorageScope.LOCAL
    scope_overridden: bool = False
    mount_source: Text = ""  # e.g. filer1:/export/models
    mount_point: PathText | None = None
    error: Text | None = None  # e.g. the directory does not exist
    models: list[ModelFound] = Field(default_factory=list, max_length=4096)
    incomplete: list[ModelIncomplete] = Field(default_factory=list, max_length=4096)
    adapters: list[AdapterFound] = Field(default_factory=list, max_length=4096)


class EngineTraffic(Inbound):
    """What an engine served over the agent's last window of scrapes (agent/traffic.py)."""

    requests_per_s: float = Field(ge=0, le=10_000_000)
    in_flight: int = Field(ge=0, le=10_000_000)  # running and queued
    p50_latency_s: Seconds | None = None  # None: no request finished in the window
    # Which histogram p50_latency_s is read from: "ttft" (time to first token, fine
    # buckets) or "e2e" (end to end; vLLM's buckets start at 0.3 s). None: an older agent (e2e).
    p50_metric: Literal["ttft", "e2e"] | None = None
    # The median lies in the first bucket: p50_latency_s is that bucket's bound, not a value.
    p50_upper_bound: bool = False
    prefix_hit_rate: float | None = Field(default=None, ge=0, le=1)  # None: no prompt seen


class AdapterFailure(Inbound):
    """A load the engine refused: its HTTP status (None: no answer) and its words."""

    name: ModelName
    status: int | None = Field(default=None, ge=100, le=599)
    message: Text


class ReplicaReport(Inbound):
    """One engine (one shard of a replica) that the agent runs."""

    id: ReplicaId
    model: ModelName
    rank: int = Field(default=0, ge=0, le=1024)
    state: ByValue[ShardState]
    gpus: list[Uuid] = Field(default_factory=list, max_length=256)
    port: int | None = Field(default=None, ge=1, le=65535)
    idle_seconds: Seconds | None = None  # None: not known yet
    exit_code: ExitCode | None = None
    error: Text | None = None
    traffic: EngineTraffic | None = None  # rank 0 of a ready engine, once scraped twice
    # Asked to sleep, it did not: why (no sleep mode, the engine refused). Said in
    # every report from then on; the agent never tries that engine again.
    sleep_error: Text | None = None
    # LoRA adapters the engine holds now (rank 0), and the loads it refused (kept
    # while the assignment still asks for them).
    adapters: list[ModelName] = Field(default_factory=list, max_length=4096)
    adapter_failures: list[AdapterFailure] = Field(default_factory=list, max_length=4096)
    sleep_failure: ByValue[SleepFailure] | None = None  # its kind (None: an older agent)
    # Its last wake, as the agent timed it (POST /wake_up to ready, a level-2 reload
    # included), and the level it woke from; None: it has not woken since it started.
    last_wake_s: Seconds | None = None
    last_wake_level: int | None = Field(default=None, ge=1, le=2)


class NodeReport(Inbound):
    node: NodeName
    agent_version: ShortText
    boot_id: ShortText
    interval_s: float = Field(gt=0, le=3600)
    uptime_s: Seconds | None = None  # agent uptime, a duration
    address: HostAddress | None = None  # where engines on this node can be reached
    gpus: list[GpuReport] = Field(default_factory=list, max_length=256)
    gpu_error: Text | None = None  # why there are no GPUs (no NVML, driver error)
    fabrics: list[FabricName] = Field(default_factory=list, max_length=16)
    storage_configured: bool = False
    storage: list[StorageLocation] = Field(default_factory=list, max_length=64)
    replicas: list[ReplicaReport] = Field(default_factory=list, max_length=256)
    # Engine templates this agent can run (built-in and --engine-templates);
    # None: not said (an older agent). Lets `ctl apply` warn about an engine
    # no node has before its replicas fail.
    engines: list[EngineName] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _gpus_unique(self) -> NodeReport:
        """One card, one entry: a repeated UUID or index would let one card be placed twice."""
        gpus, n = self.gpus, len(self.gpus)
        if n < 2 or (len({g.uuid for g in gpus}) == n and len({g.index for g in gpus}) == n):
            return self  # (sets: what every report pays; the names of repeats only on a refusal)
        for what, values in (
            ("uuid", [g.uuid for g in self.gpus]),
            ("index", [g.index for g in self.gpus]),
        ):
            dupes = sorted(str(v) for v, n in Counter(values).items() if n > 1)
            if dupes:
                raise ValueError(f"GPU {what} repeated: {', '.join(dupes[:5])}")
        return self


class ShardAssignment(Outbound):
    """One engine the controller wants a node to run."""

    replica_id: str
    model: str
    source: str
    engine: str
    engine_args: list[str] = Field(default_factory=list)
    gpus: list[str]  # UUIDs of the cards to use
    rank: int = 0
    nnodes: int = 1
    leader_node: str | None = None
    leader_address: str | None = None
    port: int | None = None  # rendezvous port for multi-node engines
    sleep_mode: bool = False  # start the engine able to sleep (its spec asks for sleep)
    sleep_level: int | None = None  # asleep at this level (1, 2); None: awake
    # Its spec's `gpu_memory_share`: the template tells the engine, and the agent wakes it
    # beside other awake engines only while their shares add up to at most 1.
    gpu_memory_share: float | None = None
    # LoRA adapters the engine should hold: name -> source (found in the agent's storage)
    adapters: dict[str, str] = Field(default_factory=dict)
    # The spec says `auto`: the agent picks the level from its host memory and the
    # weights (llmgw.agent.sleep_level); `sleep_level` is then 2, what an older agent uses.
    sleep_auto: bool = False
    # The key the engine asks for on its API (`VLLM_API_KEY` in its environment, never
    # its command line) and the agent presents; None: its replica has none (placed
    # before keys). Out of repr, so that no log of an assignment shows it.
    engine_key: str | None = Field(default=None, repr=False)

    def started_as(self) -> ShardAssignment:
        """What restarts the engine when it changes: neither its sleep nor its adapters."""
        if self.sleep_level is None and not self.sleep_auto and not self.adapters:
            return self
        return self.model_copy(update={"sleep_level": None, "sleep_auto": False, "adapters": {}})


# Shares are written in decimals (0.45 + 0.55): their float sum may pass 1 by a rounding.
_SHARE_SLACK = 1e-9


def fit_together(shares: Iterable[float | None]) -> bool:
    """Whether engines taking these shares of a card (`gpu_memory_share`; None: the
    whole card) may be awake on it at once: one alone always; several only when each
    says its share and they add up to at most 1. The controller wakes by this rule and
    the agent holds to it whatever the controller says."""
    shares = list(shares)
    if len(shares) < 2:
        return True
    total = 0.0
    for share in shares:
        if share is None:
            return False
        total += share
    return total <= 1 + _SHARE_SLACK


class ReportReply(Outbound):
    node: str
    admin_flag: AdminFlag
    state: NodeState
    assignments: list[ShardAssignment] = Field(default_factory=list)


def reply_version(body: bytes) -> str:
    """A reply's version (its ETag on `GET /v1/agent/assignments/NODE`): a digest of
    its encoded body, so equal replies have equal versions on every controller."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()
