"""One engine process (one shard) as the supervisor sees it, and the words the
supervisor's parts share about it: why one was killed, and the kill itself."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from llmgw.agent.engine_adapters import AdapterState
from llmgw.agent.engine_proc import ProcessRef
from llmgw.agent.engine_templates import EngineTemplate
from llmgw.agent.metrics import IdleTracker
from llmgw.agent.progress import ProgressWatch, StartWatch
from llmgw.agent.traffic import TrafficMeter
from llmgw.wire import ShardAssignment, ShardState, SleepFailure

Key = tuple[str, int]  # (replica id, rank)

MAX_ERROR_CHARS = 4096  # ReplicaReport.error's bound


class KillReason(StrEnum):
    """Why the supervisor killed an engine: the label of llmgw_agent_engine_kills_total."""

    HUNG = "hung"  # work in it and token counters still
    UNHEALTHY = "unhealthy"  # /health failing, check after check
    START_TIMEOUT = "start_timeout"
    START_STALLED = "start_stalled"  # no output and no CPU while starting
    WAKE_FAILED = "wake_failed"


KILL_REASONS = tuple(r.value for r in KillReason)


class Kill(NamedTuple):
    """A verdict that a live engine must die: why (the words its report quotes) and
    its reason. `exit_first`: give an engine on its way out a moment to exit by
    itself first (it closes its port before it goes), so that its exit speaks."""

    reason: KillReason
    why: str
    exit_first: bool = False


@dataclass
class Engine:
    """One engine process (one shard). Who writes what: the lifecycle
    (llmgw.agent.engine_lifecycle) its assignment, process, identity and state
    through starting, ready, stopping and failed; the probes
    (llmgw.agent.engine_probes) their readings (health_failures, tracker, progress,
    start_watch, meter); sleep and wake (llmgw.agent.engine_sleep) the sleep fields
    and last_wake, the moves between ready, sleeping and waking, and a fresh idle
    tracker after a wake; the supervisor (llmgw.agent.engines) the adapter fields."""

    assignment: ShardAssignment
    template: EngineTemplate | None
    state: ShardState
    port: int | None = None
    log_path: Path | None = None
    argv: list[str] = field(default_factory=list)
    ref: ProcessRef | None = None  # None: never started
    popen: subprocess.Popen[bytes] | None = None  # None: adopted from a previous agent
    started_at: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    error: str | None = None
    stop_deadline: float | None = None  # monotonic
    killed: bool = False
    reported: bool = False  # a failure is kept until it has been reported once
    health_failures: int = 0  # failed /health checks in a row while ready
    tracker: IdleTracker = field(default_factory=IdleTracker)
    progress: ProgressWatch = field(default_factory=ProgressWatch)
    start_watch: StartWatch = field(default_factory=StartWatch)  # while starting
    meter: TrafficMeter = field(default_factory=TrafficMeter)
    sleep_error: str | None = None  # asked to sleep, it could not: why
    sleep_failure: SleepFailure | None = None  # its kind
    slept_level: int | None = None  # the level it went to sleep at (a level-2 wake reloads)
    turning: asyncio.Task[None] | None = None  # a sleep or a wake under way
    adapters: AdapterState = field(default_factory=AdapterState)  # LoRA adapters (rank 0)
    adapting: asyncio.Task[None] | None = None  # loads and unloads under way
    weights_path: str | None = None  # the local weights it loaded (None: not known)
    local_weights: dict[str, str] = field(default_factory=dict)  # as it was started with
    sleeps: bool = False  # started able to sleep (its template's sleep mode on)
    last_wake: tuple[int, float] | None = None  # (level, seconds) of its last wake
    port_retries: int = 0  # starts again in a row because its port was taken

    @property
    def key(self) -> Key:
        return (self.assignment.replica_id, self.assignment.rank)

    @property
    def serves_http(self) -> bool:
        return self.template is not None and self.template.serves_http(self.assignment.rank)
