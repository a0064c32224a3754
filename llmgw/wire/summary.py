"""The fleet summary: a wire contract, whose fields may be added, never removed."""

from __future__ import annotations

from pydantic import (
    Field,
)

from llmgw.wire.admin import AdapterView
from llmgw.wire.rules import Outbound
from llmgw.wire.states import AdminFlag

# -- the fleet summary (a wire contract: fields may be added, never removed) ----


class NodeCounts(Outbound):
    total: int
    ready: int
    cordoned: int
    draining: int
    unreachable: int


class GpuClassCounts(Outbound):
    gpu_class: str = Field(alias="class", serialization_alias="class")
    total: int
    used: int
    unhealthy: int
    # Added fields. Every card is in exactly one bucket:
    # total = used + unhealthy + unknown + unschedulable + free
    unknown: int = 0  # health not readable: never counted as free
    unschedulable: int = 0  # healthy, unused, but on a node that takes no new work
    free: int = 0  # healthy, unused, on a ready node


class FabricModelCopies(Outbound):
    model: str
    local_copies: int  # nodes holding it on local storage
    shared_copies: int  # distinct shared filers (mount sources) holding it
    nodes: int  # nodes that can read it


class FabricSummary(Outbound):
    fabric: str
    nodes: int
    nodes_with_weights: int
    models_present: int
    largest_free_block: int
    copies: list[FabricModelCopies] = Field(default_factory=list)


class ReplicaCounts(Outbound):
    ready: int = 0
    starting: int = 0
    draining: int = 0
    failed: int = 0
    sleeping: int = 0  # the warm tier: holding their cards, serving nothing
    waking: int = 0


class ModelCounts(Outbound):
    total: int
    satisfied: int
    short: int


class IdleReplica(Outbound):
    id: str
    model: str
    idle_seconds: float
    gpus: int


class SleepingReplica(Outbound):
    """A replica asleep (the warm tier): it holds its cards' residual memory and its
    engine process, serves nothing, and wakes in seconds for its model's requests."""

    id: str
    model: str
    asleep_seconds: float
    gpus: int


class ModelTraffic(Outbound):
    """What a model's serving replicas served over the engines' last window.

    Requests and in-flight are sums over replicas (in flight: the engine's own
    count, or the gateways' when higher). Latency and hit rate are per-replica
    figures weighted by each replica's requests: engines export histograms and
    counters, and the agents report each engine's window, not its raw samples."""

    model: str
    replicas: int  # serving replicas with figures
    requests_per_s: float
    in_flight: int
    p50_latency_s: float | None
    prefix_hit_rate: float | None
    p50_metric: str | None = None  # as EngineTraffic's, when every replica says the same
    p50_upper_bound: bool = False  # every replica's median was below its first bucket


class ReasonGroup(Outbound):
    """Nodes sharing one admin reason, as `sinfo -R` lists them."""

    reason: str
    flag: AdminFlag
    by: str | None
    at: float | None
    nodes: list[str]


class WakingModel(Outbound):
    model: str
    seconds: float  # since the first held request woke it
    held: int  # requests the gateways hold for it


IDLE_AFTER_S = 600.0  # idle means nothing asked for at least 10 minutes (--idle-after)


class FleetSummary(Outbound):
    nodes: NodeCounts
    gpus: list[GpuClassCounts]
    fabrics: list[FabricSummary]
    replicas: ReplicaCounts
    models: ModelCounts
    unplaceable: list[str]
    idle_replicas: list[IdleReplica]
    # added fields
    unplaceable_reasons: dict[str, str] = Field(default_factory=dict)
    reasons: list[ReasonGroup] = Field(default_factory=list)
    generated_at: float = 0.0  # controller clock
    traffic: list[ModelTraffic] = Field(default_factory=list)  # models with figures, by name
    # engine -> reachable nodes whose agent can run it (agents that say so)
    engines: dict[str, int] = Field(default_factory=dict)
    # Models woken from zero replicas that none serves yet, by name.
    waking: list[WakingModel] = Field(default_factory=list)
    # What `idle_replicas` means: ready and asked nothing for this long (`--idle-after`).
    idle_after_s: float = IDLE_AFTER_S
    # Each declared LoRA adapter: where it is loaded, what it serves, when last used.
    adapters: list[AdapterView] = Field(default_factory=list)
    # Replicas asleep, the longest asleep first: the cards they hold are the first
    # to share (a card's room beside them) after the idle ones.
    sleeping_replicas: list[SleepingReplica] = Field(default_factory=list)
