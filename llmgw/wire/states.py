"""The states and flags that cross the wire: a node's, a card's, a replica's, a shard's."""

from __future__ import annotations

from enum import StrEnum

# -- enums ---------------------------------------------------------------------


class NodeState(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    UNREACHABLE = "unreachable"


class AdminFlag(StrEnum):
    """What an operator set on a node. Liveness is derived, never stored."""

    NONE = "none"
    CORDONED = "cordoned"
    DRAINING = "draining"


class GpuHealth(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class StorageScope(StrEnum):
    LOCAL = "local"
    SHARED = "shared"


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    SLEEPING = "sleeping"  # its process keeps its cards, serves nothing (issue 32)
    WAKING = "waking"  # a sleeping replica on its way back to ready


class StartKind(StrEnum):
    """How a replica came to serve (issue 32): woken from sleep, or an engine start on
    a node that held its weights, or one that did not."""

    HOT = "hot"  # a sleeping replica woken
    WARM = "warm"  # an engine started where its weights were on disk
    COLD = "cold"  # an engine started where they were not


class ShardState(StrEnum):
    """What an agent says about one engine process it runs."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"
    SLEEPING = "sleeping"  # its engine answered the sleep: it serves nothing
    WAKING = "waking"  # asked to wake, not answered yet


class SleepFailure(StrEnum):
    """Why an engine asked to sleep is awake instead (beside `sleep_error`'s words)."""

    NO_SLEEP_MODE = "no_sleep_mode"  # its template has none, or it started without it
    NO_ENDPOINTS = "no_endpoints"  # /sleep answered 404: an old version, no dev mode
    REFUSED = "refused"  # /sleep answered an error, or nothing
    # /sleep answered 200 but its processes still held the memory on a card (vLLM
    # #47654): woken again, so that nothing is placed on a card it still fills
    MEMORY_KEPT = "memory_kept"
