"""The engine supervisor: runs the shards the controller assigns to this node.

`apply()` takes the desired set (from the reply to each report) and starts what
is missing and stops what is no longer assigned; `reports()` says what runs.
A background task, started by the first `apply()`, notices exits, escalates
slow stops to SIGKILL, polls `/health` of starting engines, and checks
`/health` and scrapes `/metrics` of ready ones (for idleness and progress).

Lifecycles, per (replica id, rank):

    starting --/health 200--> ready
    starting|ready --process exits--> failed (exit code + the log's cause);
        stays failed while assigned, so the controller's backoff decides on restarts
    starting --not healthy within the start timeout--> failed (killed)
    starting --nothing written to its log and under a second of CPU for the
        start stall time--> failed (killed, "stalled"): a start that will not finish
    ready --requests in it and token counters still for the template's
        `hung_after_s`--> failed (killed, "hung"): whatever /health says, since
        vLLM's API server answers it for an engine core that does nothing
    ready --/health fails `unhealthy_after` checks in a row--> failed (killed):
        a check that timed out while the agent's own loop ran late, or while
        the engine's token counters moved, is load, not a failure
    any --unassigned--> stopping --exit--> gone   (SIGTERM, grace, SIGKILL)
    ready --assignment asks for sleep, POST /sleep answered 200--> sleeping
    ready --it cannot sleep (no sleep mode in its template, /sleep 404 or refused)-->
        ready, with the reason in its reports (`sleep_error`): never tried again
    ready --/sleep answered 200 but its processes still hold the memory on a card
        (llmgw.agent.sleep_check)--> waking --> ready, reported as above (`memory_kept`)
    sleeping --assignment awake, no other engine awake on its cards--> waking
        --POST /wake_up answered 200--> ready
    waking --the wake failed--> failed (killed)

Engines run in their own session, outside the agent's process group, and are
recorded in state_dir/engines.json: an agent restart (or `close()`) leaves them
running, and the next supervisor on that state_dir adopts them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from pydantic import ValidationError

from llmgw.agent import engine_adapters, sleep_level
from llmgw.agent.engine_adapters import AdapterState
from llmgw.agent.engine_proc import (
    ProcessRef,
    cpu_by_group,
    describe_exit,
    free_port,
    log_tail,
    ref_for,
)
from llmgw.agent.engine_state import EngineRecord, load_state, save_state
from llmgw.agent.engine_templates import (
    DEFAULT_RENDEZVOUS_PORT,
    EngineTemplate,
    TemplateError,
    merged_templates,
    python_executable,
    render,
    render_env,
)
from llmgw.agent.exit_cause import exit_reason, sleep_refusal
from llmgw.agent.loop_lag import LoopLag
from llmgw.agent.metrics import IdleTracker, scrape, server_load
from llmgw.agent.progress import START_CPU_S, ProgressWatch, StartWatch
from llmgw.agent.sleep_check import CardMemory, held_by_group, judge, judgeable
from llmgw.agent.traffic import TrafficMeter
from llmgw.wire import (
    AdapterFailure,
    ReplicaReport,
    ShardAssignment,
    ShardState,
    SleepFailure,
    printable,
)

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (replica id, rank)

STATE_FILE = "engines.json"
LOG_ROTATE_BYTES = 64 * 1024 * 1024  # past this, a relaunch moves the old log to .1
MAX_ERROR_CHARS = 4096  # ReplicaReport.error's bound
# Why the supervisor killed an engine: the label of llmgw_agent_engine_kills_total.
KILL_REASONS = ("hung", "unhealthy", "start_timeout", "start_stalled", "wake_failed")
SLEEP_TIMEOUT_S = 300.0  # a sleep or a wake (a level-2 wake reloads the weights from disk)
# How often a starting engine's log and CPU are looked at (a pass over /proc).
START_LOOK_S = 10.0


class HealthFailure(StrEnum):
    """How an engine's /health check failed: what the supervisor acts on."""

    NO_ANSWER = "no_answer"  # nothing within the timeout: a busy engine or agent, or a hang
    ANSWERED = "answered"  # it answered, not 200
    UNREACHABLE = "unreachable"  # refused, reset, or any other connection error


class Unhealthy(NamedTuple):
    """A failed /health check: its kind, and the words logs and errors quote."""

    kind: HealthFailure
    message: str  # "no answer within 5s"; "answered 503"; "Connection refused"


class Refused(NamedTuple):
    """A sleep, wake or reload the engine did not do: its HTTP status (None: no
    answer) beside the words the report quotes."""

    status: int | None
    message: str


@dataclass
class Engine:
    """One engine process (one shard) as the supervisor sees it."""

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
    last_wake: tuple[int, float] | None = None  # (level, seconds) of its last wake
    turning: asyncio.Task[None] | None = None  # a sleep or a wake under way
    adapters: AdapterState = field(default_factory=AdapterState)  # LoRA adapters (rank 0)
    adapting: asyncio.Task[None] | None = None  # loads and unloads under way
    weights_path: str | None = None  # the local weights it loaded (None: not known)
    local_weights: dict[str, str] = field(default_factory=dict)  # as it was started with
    sleeps: bool = False  # started able to sleep (its template's sleep mode on)

    @property
    def key(self) -> Key:
        return (self.assignment.replica_id, self.assignment.rank)

    @property
    def serves_http(self) -> bool:
        return self.template is not None and self.template.serves_http(self.assignment.rank)


def _size(path: Path | None) -> int | None:
    try:
        return None if path is None else path.stat().st_size
    except OSError:
        return None


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100] or "engine"


class EngineSupervisor:
    """Runs this node's engines. One per agent per state_dir (a lock enforces it).

    templates: operator templates (see llmgw.agent.engine_templates), added to or
    replacing the built-ins by name. address: where other nodes reach this one
    (a rank-0 leader's own rendezvous address). grace_s: SIGTERM to SIGKILL.
    engine_host: the address engines listen on (the agent passes --engine-host,
    else --address; never every interface unless asked). start_timeout_s: how long a
    starting engine may take to answer /health (loading a large model from a
    slow filer takes many minutes). start_stall_s: how long a starting engine may
    write nothing and use under a second of CPU (0: no limit). unhealthy_after:
    failed /health checks in a row, one per scrape interval, before a ready engine
    is declared hung. The other interval and timeout knobs exist for tests; the
    defaults suit production.
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        templates: Mapping[str, str | EngineTemplate] | None = None,
        node: str,
        address: str | None = None,
        grace_s: float = 30.0,
        poll_interval_s: float = 1.0,
        scrape_interval_s: float = 5.0,
        health_timeout_s: float = 2.0,
        engine_host: str = "127.0.0.1",
        worker_settle_s: float = 2.0,
        extra_env: Mapping[str, str] | None = None,
        start_timeout_s: float = 1800.0,
        start_stall_s: float = 600.0,
        unhealthy_after: int = 3,
        card_memory: CardMemory | None = None,
        sleep_settle_s: float = 2.0,
        host_memory: Callable[[], int | None] = sleep_level.available_bytes,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.log_dir = self.state_dir / "logs"
        self.state_path = self.state_dir / STATE_FILE
        self.templates = merged_templates(templates)
        self.node = node
        self.address = address
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s
        self.scrape_interval_s = scrape_interval_s
        self.local_adapters: Mapping[str, str] = {}  # adapter source -> local directory
        # Set when what a report would say changed (an adapter loaded or unloaded): the
        # agent reports then rather than at its interval, so routing follows at once.
        self.report_soon = asyncio.Event()
        self.health_timeout_s = health_timeout_s
        self.start_timeout_s = start_timeout_s
        self.start_stall_s = start_stall_s
        self.unhealthy_after = max(1, unhealthy_after)
        self.engine_host = engine_host
        # A rank that serves no HTTP (a multi-node worker) is ready once it has
        # stayed up this long; the leader's health covers the replica as a whole.
        self.worker_settle_s = worker_settle_s
        # Probe on loopback when the engine listens everywhere.
        self.probe_host = "127.0.0.1" if engine_host in ("", "0.0.0.0", "::") else engine_host
        self.extra_env = dict(extra_env or {})
        # What each process holds on each card (GpuSource.processes): a sleep is
        # checked against it (llmgw.agent.sleep_check); None: sleeps taken at their word.
        self.card_memory = card_memory
        self.sleep_settle_s = sleep_settle_s  # how long a sleep's memory may take to go
        self.host_memory = host_memory  # bytes available now: `sleep_level: auto`
        self._unjudged_logged = False
        # Engines (template names) that refused to start able to sleep here: why.
        self._no_sleep_mode: dict[str, str] = {}
        self._engines: dict[Key, Engine] = {}
        # How late the monitor's own sleeps wake, over the last few checks.
        self.loop_lag = LoopLag(window_s=max(1.0, 2 * scrape_interval_s))
        # Engines killed by this supervisor, by reason (KILL_REASONS): the agent's /metrics.
        self.kills: dict[str, int] = dict.fromkeys(KILL_REASONS, 0)
        self._monitor: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_scrape = float("-inf")
        self._last_start_look = float("-inf")
        self._closed = False
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.state_dir / "engines.lock")
        self._adopt()

    # -- public interface ------------------------------------------------------

    async def apply(
        self,
        assignments: Sequence[ShardAssignment],
        local_weights: Mapping[str, str],
        local_adapters: Mapping[str, str] | None = None,
    ) -> None:
        """Make the running set match `assignments`: start missing, stop unassigned."""
        if self._closed:
            raise RuntimeError("the engine supervisor is closed")
        self._ensure_monitor()
        self._poll_exits()
        if local_adapters is not None:
            self.local_adapters = local_adapters
        desired = {(a.replica_id, a.rank): a for a in assignments}
        for key, eng in list(self._engines.items()):
            want = desired.get(key)
            if want is not None and want.started_as() == eng.assignment.started_as():
                eng.assignment = want  # its sleep or adapters changed: the monitor acts on it
                continue
            # Unassigned, or assigned differently (the new one starts once this is gone).
            if eng.state is ShardState.FAILED:
                if eng.reported:
                    del self._engines[key]
            elif eng.state is not ShardState.STOPPING:
                self._begin_stop(eng)
        for key, a in desired.items():
            if key not in self._engines:
                self._engines[key] = self._start(a, local_weights)
        self._save()
        self._steer_adapters()  # now, not at the monitor's next tick: a request waits

    def reports(self) -> list[ReplicaReport]:
        self._poll_exits()
        out: list[ReplicaReport] = []
        for eng in self._engines.values():
            a = eng.assignment
            ready = eng.state is ShardState.READY
            idle = eng.tracker.idle_seconds() if ready else None
            try:
                out.append(
                    ReplicaReport(
                        id=a.replica_id,
                        model=a.model,
                        rank=a.rank,
                        state=eng.state,
                        gpus=a.gpus,
                        port=eng.port,
                        idle_seconds=idle,
                        traffic=eng.meter.traffic() if ready else None,
                        sleep_error=eng.sleep_error,
                        adapters=sorted(eng.adapters.loaded or ()),
                        adapter_failures=[
                            AdapterFailure(name=n, status=st, message=m)
                            for n, (st, m) in sorted(eng.adapters.failures.items())
                        ],
                        sleep_failure=eng.sleep_failure,
                        last_wake_s=eng.last_wake[1] if eng.last_wake else None,
                        last_wake_level=eng.last_wake[0] if eng.last_wake else None,
                        exit_code=eng.exit_code,
                        error=printable(eng.error[:MAX_ERROR_CHARS], keep_lines=True)
                        if eng.error
                        else None,
                    )
                )
            except ValidationError as exc:  # never let one odd id break the report
                log.error("cannot report engine %s/%d: %s", a.replica_id, a.rank, exc)
                continue
            if eng.state is ShardState.FAILED:
                eng.reported = True
        return out

    async def close(self) -> None:
        """Stop supervising. Engines keep running: the next agent adopts them."""
        if self._closed:
            return
        self._closed = True
        for eng in self._engines.values():  # a sleep or wake under way ends with us
            if eng.turning is not None:
                eng.turning.cancel()
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._save()
        for eng in self._engines.values():
            eng.popen = None  # let go without waiting: the engine outlives us
        os.close(self._lock_fd)  # releases the lock for the next agent

    # -- starting ----------------------------------------------------------------

    def _start(self, a: ShardAssignment, local_weights: Mapping[str, str]) -> Engine:
        template = self.templates.get(a.engine)
        if template is None:
            known = ", ".join(sorted(self.templates))
            return self._failed_to_start(
                a, None, f"no engine template named {a.engine!r} on this node; known: {known}"
            )
        port = free_port()
        try:
            values = self._values(a, local_weights, port)
            # engine_args are separate argv words already: appended as they are, never split.
            sleeps = a.sleep_mode and a.engine not in self._no_sleep_mode
            command = template.command_for(a.rank, a.nnodes, sleeps=sleeps)
            argv = [*render(command, values), *a.engine_args]
            template_env = render_env(template, values, sleeps=sleeps)
            if "--enable-lora" in a.engine_args:  # adapters are loaded at run time
                template_env = {**engine_adapters.RUNTIME_ENV, **template_env}
        except (TemplateError, ValueError) as exc:
            return self._failed_to_start(a, template, f"cannot build the engine command: {exc}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{_safe_name(a.replica_id)}-{a.rank}.log"
        env = {**os.environ, **self.extra_env, **template_env}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(a.gpus)  # UUIDs: stable, unlike indices
        env.update(LLMGW_REPLICA_ID=a.replica_id, LLMGW_RANK=str(a.rank), LLMGW_MODEL=a.model)
        try:
            _rotate(log_path)
            with log_path.open("ab") as logf:
                shown = {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"], **template_env}
                header = (
                    f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} llmgw agent {self.node}: "
                    + " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
                    + f" {shlex.join(argv)}\n"
                )
                logf.write(header.encode())
                logf.flush()
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.state_dir,
                    start_new_session=True,  # not in the agent's group: survives the agent
                )
        except OSError as exc:
            return self._failed_to_start(
                a, template, f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            )
        ref = ref_for(popen.pid)
        if ref is None:  # died before we could even read its start time
            code = popen.wait()
            return self._failed_to_start(
                a, template, exit_reason(describe_exit(code), log_path), code, log_path, port
            )
        log.info("started %s/%d (%s) pid %d port %d", a.replica_id, a.rank, a.model, ref.pid, port)
        return Engine(
            assignment=a,
            template=template,
            tracker=IdleTracker(),
            state=ShardState.STARTING,
            port=port,
            log_path=log_path,
            argv=argv,
            ref=ref,
            popen=popen,
            weights_path=values["source"],
            local_weights=dict(local_weights),
            sleeps=sleeps,
        )

    def _values(
        self, a: ShardAssignment, local_weights: Mapping[str, str], port: int
    ) -> dict[str, str]:
        """What a template's `{variables}` stand for, for this shard."""
        # Weights on this node's disk win: the engine loads them instead of fetching.
        source = local_weights.get(a.model) or local_weights.get(a.source) or a.source
        leader = a.leader_address or (self.address if a.rank == 0 else None)
        if a.nnodes > 1 and leader is None:
            raise ValueError(f"rank {a.rank} of {a.nnodes} has no leader address to join")
        return {
            "python": python_executable(),
            "source": source,
            "model": a.model,
            "replica": a.replica_id,
            "port": str(port),
            "host": self.engine_host,
            "gpus": str(len(a.gpus)),
            "gpu_uuids": ",".join(a.gpus),
            "total_gpus": str(len(a.gpus) * a.nnodes),
            "nnodes": str(a.nnodes),
            "rank": str(a.rank),
            "leader_addr": leader or "127.0.0.1",
            "rendezvous_port": str(a.port or DEFAULT_RENDEZVOUS_PORT),
        }

    def _failed_to_start(
        self,
        a: ShardAssignment,
        template: EngineTemplate | None,
        error: str,
        exit_code: int | None = None,
        log_path: Path | None = None,
        port: int | None = None,
    ) -> Engine:
        log.error("engine %s/%d: %s", a.replica_id, a.rank, error)
        return Engine(
            assignment=a,
            template=template,
            tracker=IdleTracker(),
            state=ShardState.FAILED,
            error=error,
            exit_code=exit_code,
            log_path=log_path,
            port=port,
        )

    # -- stopping and exits --------------------------------------------------------

    def _begin_stop(self, eng: Engine) -> None:
        eng.state = ShardState.STOPPING
        eng.stop_deadline = time.monotonic() + self.grace_s
        if eng.ref is not None and eng.ref.send(signal.SIGTERM):
            log.info("stopping %s/%d pid %d (SIGTERM)", *eng.key, eng.ref.pid)

    def _exit_code(self, eng: Engine) -> tuple[bool, int | None]:
        """(exited, exit code if known) without blocking."""
        if eng.popen is not None:
            code = eng.popen.poll()
            return (code is not None, code)
        return (eng.ref is None or not eng.ref.alive(), None)

    def _poll_exits(self) -> None:
        changed = False
        now = time.monotonic()
        for key, eng in list(self._engines.items()):
            if eng.ref is None:
                continue
            if eng.state is ShardState.FAILED:
                if eng.popen is not None and eng.popen.poll() is not None:
                    eng.popen = None  # reaped, after _kill_failed
                continue
            exited, code = self._exit_code(eng)
            if exited:
                eng.ref.signal_group(signal.SIGKILL)  # workers it left behind hold GPUs
                eng.popen = None
                changed = True
                if eng.state is ShardState.STOPPING:
                    log.info("stopped %s/%d: %s", *key, describe_exit(code))
                    del self._engines[key]
                elif self._refused_sleep_mode(eng):
                    self._engines[key] = self._start(eng.assignment, eng.local_weights)
                else:
                    eng.state = ShardState.FAILED
                    eng.exit_code = code
                    eng.error = exit_reason(describe_exit(code), eng.log_path)
                    log.warning("engine %s/%d %s", *key, describe_exit(code))
            elif (
                eng.state is ShardState.STOPPING
                and not eng.killed
                and eng.stop_deadline is not None
                and now >= eng.stop_deadline
            ):
                if eng.ref.alive():
                    log.warning("engine %s/%d ignored SIGTERM for %gs: SIGKILL", *key, self.grace_s)
                    eng.ref.signal_group(signal.SIGKILL)
                eng.killed = True
        if changed:
            self._save()

    def _refused_sleep_mode(self, eng: Engine) -> bool:
        """A start with sleep mode that the engine refused on this machine (its
        template's `unsupported` words in this run's log): noted for its engine name,
        so that it and the next ones start without it (`_cannot_sleep` says so once
        asked to sleep), instead of failing every start."""
        mode = eng.template.sleep if eng.template else None
        if eng.state is not ShardState.STARTING or mode is None or not mode.unsupported:
            return False
        if not eng.sleeps or eng.log_path is None:
            return False
        found = sleep_refusal(eng.log_path, mode.unsupported)
        if found is None:
            return False
        self._no_sleep_mode[eng.assignment.engine] = found
        log.warning(
            "engine %s/%d refused sleep mode (%s): started again without it", *eng.key, found
        )
        return True

    # -- health and metrics ------------------------------------------------------------

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.create_task(self._run_monitor(), name="engine-monitor")

    async def _run_monitor(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad tick must not end supervision
                log.exception("engine monitor tick failed")
            slept = time.monotonic()
            await asyncio.sleep(self.poll_interval_s)
            self.loop_lag.record(time.monotonic() - slept - self.poll_interval_s)

    async def _tick(self) -> None:
        self._poll_exits()
        if self._session is None:
            self._session = aiohttp.ClientSession()
        now = time.monotonic()
        starting = [e for e in self._engines.values() if e.state is ShardState.STARTING]
        for eng in starting:
            if now - eng.started_mono >= self.start_timeout_s:
                self._kill_failed(
                    eng,
                    f"was not healthy {self.start_timeout_s:g}s after starting (start timeout)",
                    "start_timeout",
                )
        starting = [e for e in starting if e.state is ShardState.STARTING]
        watched = [e for e in starting if self._stall_limit(e)]
        if watched and now - self._last_start_look >= START_LOOK_S:
            self._last_start_look = now
            await self._look_at_starts(watched)
            starting = [e for e in starting if e.state is ShardState.STARTING]
        if starting:
            await asyncio.gather(*(self._probe(e, now) for e in starting))
        if now - self._last_scrape >= self.scrape_interval_s:
            self._last_scrape = now
            ready = [
                e for e in self._engines.values() if e.state is ShardState.READY and e.serves_http
            ]
            if ready:
                await asyncio.gather(*(self._check_ready(e) for e in ready))
        self._steer_sleep()
        self._steer_adapters()

    # -- LoRA adapters -------------------------------------------------------------

    def _steer_adapters(self) -> None:
        """Begin loading and unloading what a ready engine's assignment asks for."""
        for eng in self._engines.values():
            busy = eng.adapting is not None and not eng.adapting.done()
            if busy or eng.state is not ShardState.READY or not eng.serves_http:
                continue
            if eng.turning is not None and not eng.turning.done():
                continue
            if eng.adapters.due(eng.assignment.adapters):
                eng.adapting = asyncio.create_task(self._sync_adapters(eng))

    async def _sync_adapters(self, eng: Engine) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        before = (set(eng.adapters.loaded or ()), dict(eng.adapters.failures))
        try:
            await engine_adapters.sync(
                self._session,
                self._url(eng, "").rstrip("/"),
                eng.adapters,
                eng.assignment.adapters,
                self.local_adapters,
            )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("engine %s/%d: adapters: %s", *eng.key, exc)
        if (set(eng.adapters.loaded or ()), eng.adapters.failures) != before:
            self.report_soon.set()

    # -- sleep and wake ------------------------------------------------------------

    def _steer_sleep(self) -> None:
        """Begin the sleep or wake an engine's assignment asks for (one at a time each)."""
        for eng in self._engines.values():
            if eng.turning is not None and not eng.turning.done():
                continue
            asleep_wanted = eng.assignment.sleep_level is not None
            if eng.state is ShardState.READY and asleep_wanted and eng.sleep_error is None:
                eng.turning = asyncio.create_task(self._sleep(eng))
            elif eng.state is ShardState.SLEEPING and not asleep_wanted:
                if self._awake_beside(eng):
                    continue  # it wakes once they sleep or stop
                eng.state = ShardState.WAKING
                eng.turning = asyncio.create_task(self._wake(eng))

    def _awake_beside(self, eng: Engine) -> bool:
        """Another engine awake (or starting, waking, stopping) on a card of `eng`: two
        awake engines do not fit on a shared card (issue 32). The controller wakes a
        sleeping replica only once the others there sleep; this holds whatever it says,
        across a controller's crash or restart, on the node that runs both."""
        cards = set(eng.assignment.gpus)
        for other in self._engines.values():
            if other is eng or other.state in (ShardState.SLEEPING, ShardState.FAILED):
                continue
            if cards.intersection(other.assignment.gpus):
                return True
        return False

    async def _sleep(self, eng: Engine) -> None:
        a, mode = eng.assignment, eng.template.sleep if eng.template else None
        level = a.sleep_level or 1
        if mode is None or not a.sleep_mode or a.engine in self._no_sleep_mode:
            refused = self._no_sleep_mode.get(a.engine)
            why = (
                "its template has no sleep mode"
                if mode is None
                else f"it refused to start able to on this node ({refused})"
                if refused
                else "started unable to"
            )
            self._cannot_sleep(
                eng, SleepFailure.NO_SLEEP_MODE, f"engine {a.engine!r} cannot sleep: {why}"
            )
            return
        if not eng.serves_http:  # a multi-node worker: its leader's engine sleeps it
            eng.state = ShardState.SLEEPING
            return
        if a.sleep_auto:
            level = await self._auto_level(eng)
        awake = await self._held(eng)
        answer = await self._post(eng, f"{mode.sleep_path}?level={level}")
        if eng.state is not ShardState.READY:
            return  # it exited or was unassigned meanwhile
        if answer is None:
            kept = await self._memory_kept(eng, awake, mode.min_freed)
            if eng.state is not ShardState.READY:
                return
            eng.slept_level = level
            if kept is not None:  # awake again and whole: nothing goes on its cards
                self._cannot_sleep(eng, SleepFailure.MEMORY_KEPT, kept)
                eng.state = ShardState.WAKING
                await self._wake(eng)
                return
            eng.state = ShardState.SLEEPING
            log.info("engine %s/%d asleep at level %d", *eng.key, level)
            self._save()
        elif answer.status == 404:
            self._cannot_sleep(
                eng,
                SleepFailure.NO_ENDPOINTS,
                f"engine {a.engine!r} cannot sleep: POST {mode.sleep_path} answered 404 "
                "(no sleep endpoints: a version without sleep mode, or no development mode)",
            )
        else:
            self._cannot_sleep(
                eng, SleepFailure.REFUSED, f"engine {a.engine!r} did not sleep: {answer.message}"
            )

    async def _auto_level(self, eng: Engine) -> int:
        """`sleep_level: auto`: 1 when this node's host memory holds the weights."""
        weights = await asyncio.to_thread(sleep_level.weights_bytes, eng.weights_path)
        level, why = sleep_level.choose(weights, eng.assignment.nnodes, self.host_memory())
        log.info("engine %s/%d sleeps at %s", *eng.key, why)
        return level

    async def _held(self, eng: Engine) -> dict[str, int]:
        """MiB the engine's processes hold on each of its cards now ({}: not measured)."""
        if self.card_memory is None or eng.ref is None:
            return {}
        try:
            processes = await asyncio.to_thread(self.card_memory)
        except Exception:  # a broken reading must not stop the sleep
            log.exception("cannot read the memory processes hold on the cards")
            return {}
        return held_by_group(processes, eng.ref.pid, eng.assignment.gpus)

    async def _memory_kept(
        self, eng: Engine, awake: dict[str, int], min_freed: float
    ) -> str | None:
        """Why the sleep freed too little (figures), after up to `sleep_settle_s` for the
        memory to go; None: it freed enough, or cannot be judged (said once)."""
        if not judgeable(awake):
            if self.card_memory is not None and not self._unjudged_logged:
                self._unjudged_logged = True
                log.warning(
                    "engine %s/%d: none of its processes are seen on its cards, so its "
                    "sleeps are taken at their word (a PID namespace NVML does not see?)",
                    *eng.key,
                )
            return None
        deadline = time.monotonic() + self.sleep_settle_s
        while True:
            kept = judge(awake, await self._held(eng), min_freed)
            if kept is None:
                return None
            if time.monotonic() >= deadline or eng.state is not ShardState.READY:
                return kept.message
            await asyncio.sleep(min(0.25, self.sleep_settle_s))

    def _cannot_sleep(self, eng: Engine, kind: SleepFailure, why: str) -> None:
        eng.sleep_error, eng.sleep_failure = why, kind
        log.warning("engine %s/%d: %s", *eng.key, why)

    async def _wake(self, eng: Engine) -> None:
        mode = eng.template.sleep if eng.template else None
        began = time.monotonic()
        calls: list[tuple[str, dict[str, str] | None]] = []
        if mode is not None and eng.serves_http:
            calls.append((mode.wake_path, None))
            if eng.slept_level == 2:  # the weights were dropped: load them again
                if mode.reload_path:
                    calls.append((mode.reload_path, {"method": "reload_weights"}))
                if mode.reset_cache_path:
                    calls.append((mode.reset_cache_path, None))
        for path, body in calls:
            failed = await self._post(eng, path, body)
            if eng.state is not ShardState.WAKING:
                return
            if failed is not None:
                self._kill_failed(eng, f"did not wake: {failed.message}", "wake_failed")
                return
        eng.tracker = IdleTracker()  # idleness is counted afresh from the wake
        eng.last_wake = (eng.slept_level or 1, round(time.monotonic() - began, 3))
        self._mark_ready(eng)

    async def _post(
        self, eng: Engine, path: str, body: dict[str, str] | None = None
    ) -> Refused | None:
        """POST to the engine; None when it answered 200, else what happened."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            timeout = aiohttp.ClientTimeout(total=SLEEP_TIMEOUT_S)
            async with self._session.post(self._url(eng, path), json=body, timeout=timeout) as r:
                if r.status == 200:
                    return None
                text = printable((await r.text())[:200]) or "nothing"
                return Refused(r.status, f"POST {path} answered {r.status}: {text}")
        except TimeoutError:
            return Refused(None, f"POST {path}: no answer within {SLEEP_TIMEOUT_S:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return Refused(None, f"POST {path}: {str(exc) or type(exc).__name__}")

    def _stall_limit(self, eng: Engine) -> float:
        """How long `eng` may start with no sign of progress (0: for ever)."""
        own = eng.template.start_stall_s if eng.template is not None else None
        return self.start_stall_s if own is None else own

    async def _look_at_starts(self, starting: list[Engine]) -> None:
        """Kill a starting engine that has shown no progress for its stall limit."""
        # Engines lead their own process group. The pass over /proc grows with the
        # node's processes, so it runs off the loop (bench_start_watch.py).
        cpu = await asyncio.to_thread(cpu_by_group)
        for eng in starting:
            if eng.ref is None or eng.state is not ShardState.STARTING:
                continue
            eng.start_watch.observe(_size(eng.log_path), cpu.get(eng.ref.pid))
            quiet = eng.start_watch.quiet_s()
            if quiet >= self._stall_limit(eng):
                self._kill_failed(
                    eng,
                    f"wrote nothing to its log and used under {START_CPU_S:g}s of CPU for "
                    f"{quiet:.0f}s while starting (stalled)",
                    "start_stalled",
                )

    def _url(self, eng: Engine, path: str) -> str:
        host = f"[{self.probe_host}]" if ":" in self.probe_host else self.probe_host
        return f"http://{host}:{eng.port}{path}"

    async def _probe(self, eng: Engine, now: float) -> None:
        if eng.template is None:
            return  # adopted, but its template is gone: keep what we knew
        if not eng.serves_http:
            if now - eng.started_mono >= self.worker_settle_s:
                self._mark_ready(eng)
            return
        if await self._health(eng) is None and eng.state is ShardState.STARTING:
            self._mark_ready(eng)

    async def _health(self, eng: Engine) -> Unhealthy | None:
        """None when /health answers 200; otherwise what went wrong."""
        assert self._session is not None and eng.template is not None
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with self._session.get(
                self._url(eng, eng.template.health_path), timeout=timeout
            ) as resp:
                if resp.status == 200:
                    return None
                return Unhealthy(HealthFailure.ANSWERED, f"answered {resp.status}")
        except TimeoutError:
            return Unhealthy(
                HealthFailure.NO_ANSWER, f"no answer within {self.health_timeout_s:g}s"
            )
        except (aiohttp.ClientError, OSError) as exc:
            return Unhealthy(HealthFailure.UNREACHABLE, str(exc) or type(exc).__name__)

    async def _check_ready(self, eng: Engine) -> None:
        """A ready engine's periodic check: metrics (idleness, progress), then health."""
        checked = time.monotonic()
        await self._scrape(eng)
        if eng.state is not ShardState.READY:
            return
        assert eng.template is not None
        stalled = eng.progress.stalled_s()
        if stalled >= eng.template.hung_after_s:
            self._kill_failed(
                eng,
                f"hung: {eng.progress.work} request(s) in it and no token for {stalled:.0f}s "
                f"(hung_after_s {eng.template.hung_after_s:g})",
                "hung",
            )
            return
        failed = await self._health(eng)
        if eng.state is not ShardState.READY:
            return  # it changed while we waited (exited, or was unassigned)
        if failed is None:
            eng.health_failures = 0
            return
        why = failed.message
        if failed.kind is HealthFailure.NO_ANSWER:
            late = self.loop_lag.worst_s()
            if late >= self.health_timeout_s / 4 or eng.progress.moved_since(checked):
                # The agent's loop ran late, or the engine is working: load, not a hang.
                log.info(
                    "engine %s/%d /health %s while busy (agent loop %.2fs late); not counted",
                    *eng.key, why, late,
                )  # fmt: skip
                return
        eng.health_failures += 1
        log.warning(
            "engine %s/%d /health %s (%d of %d)", *eng.key, why, eng.health_failures,
            self.unhealthy_after,
        )  # fmt: skip
        if eng.health_failures >= self.unhealthy_after:
            # An engine on its way out closes its port first: let its exit speak for it.
            await asyncio.sleep(min(1.0, 4 * self.poll_interval_s))
            self._poll_exits()
            if eng.state is not ShardState.READY:
                return
            self._kill_failed(
                eng,
                f"stopped answering /health: {why}, {eng.health_failures} checks in a row",
                "unhealthy",
            )

    def _kill_failed(self, eng: Engine, why: str, reason: str) -> None:
        """Declare a live engine failed and kill it: whatever state it is in, it
        holds GPUs that a replacement will need. `reason` is one of KILL_REASONS."""
        if eng.ref is not None:
            eng.ref.signal_group(signal.SIGKILL)
        eng.state = ShardState.FAILED
        eng.exit_code = None
        # Our own words are the cause; the log's last lines say how far it got.
        eng.error = _killed_reason(why, eng.log_path)
        self.kills[reason] = self.kills.get(reason, 0) + 1
        log.error("engine %s/%d %s; killed", *eng.key, why)
        self._save()

    def _mark_ready(self, eng: Engine) -> None:
        eng.state = ShardState.READY
        log.info("engine %s/%d ready on port %s", *eng.key, eng.port)
        self._save()

    async def _scrape(self, eng: Engine) -> None:
        assert self._session is not None and eng.template is not None
        sample = await scrape(
            self._session,
            self._url(eng, eng.template.metrics_path),
            timeout_s=self.health_timeout_s,
        )
        held = None
        if sample is not None and eng.template.load_path is not None:
            held = await server_load(
                self._session,
                self._url(eng, eng.template.load_path),
                timeout_s=self.health_timeout_s,
            )
        if sample is not None and eng.state is ShardState.READY:
            eng.tracker.observe(sample)
            eng.meter.observe(sample)
            eng.progress.observe(sample, held)

    # -- the state file ------------------------------------------------------------

    def _save(self) -> None:
        records = [
            EngineRecord(
                replica_id=eng.assignment.replica_id,
                rank=eng.assignment.rank,
                pid=eng.ref.pid,
                start_ticks=eng.ref.start_ticks,
                boot_id=eng.ref.boot_id,
                port=eng.port or 0,
                state=eng.state.value,
                assignment=eng.assignment,
                argv=eng.argv,
                log_path=str(eng.log_path or ""),
                started_at=eng.started_at,
                stop_requested=eng.state is ShardState.STOPPING,
            )
            for eng in self._engines.values()
            if eng.ref is not None and eng.state is not ShardState.FAILED
        ]
        try:
            save_state(self.state_path, records)
        except OSError as exc:  # keep supervising; the next save may succeed
            log.error("cannot write engine state %s: %s", self.state_path, exc)

    def _adopt(self) -> None:
        """Take back the engines a previous agent left running; report the dead once."""
        for rec in load_state(self.state_path):
            ref = ProcessRef(pid=rec.pid, start_ticks=rec.start_ticks, boot_id=rec.boot_id)
            key = (rec.replica_id, rec.rank)
            log_path = Path(rec.log_path) if rec.log_path else None
            template = self.templates.get(rec.assignment.engine)
            eng = Engine(
                assignment=rec.assignment,
                template=template,
                tracker=IdleTracker(),
                state=_shard_state(rec.state),
                port=rec.port or None,
                log_path=log_path,
                argv=rec.argv,
                ref=ref,
                started_at=rec.started_at,
                started_mono=time.monotonic() - max(0.0, time.time() - rec.started_at),
            )
            if eng.state is ShardState.WAKING:
                eng.state = ShardState.SLEEPING  # the wake is asked again (it is idempotent)
            if eng.state is ShardState.SLEEPING:
                eng.slept_level = rec.assignment.sleep_level
            if ref.alive():
                log.info("adopted engine %s/%d pid %d (%s)", *key, rec.pid, eng.state.value)
                if rec.stop_requested:
                    self._begin_stop(eng)  # finish the stop the previous agent began
                self._engines[key] = eng
            elif not rec.stop_requested:
                eng.state = ShardState.FAILED
                eng.ref = None
                eng.error = exit_reason("exited while the agent was not running", log_path)
                self._engines[key] = eng
        self._save()

    def debug_state(self) -> dict[str, Any]:
        """What the supervisor holds, for logs and tests."""
        return {
            f"{k[0]}/{k[1]}": {"state": e.state.value, "pid": e.ref.pid if e.ref else None}
            for k, e in self._engines.items()
        }


def _killed_reason(why: str, log_path: Path | None) -> str:
    text = f"engine {why}; killed"
    if log_path is not None:
        tail = log_tail(log_path, lines=10)
        text += f"\nlast lines of {log_path}:\n{tail}" if tail else f"\nlog: {log_path}"
    return text[:MAX_ERROR_CHARS]


def _shard_state(value: str) -> ShardState:
    try:
        return ShardState(value)
    except ValueError:
        return ShardState.STARTING  # unknown to this version: health decides again


class StateDirBusy(OSError):
    """Another live agent holds this state dir (an OSError: the CLI reports those)."""


def _lock(path: Path) -> int:
    """Hold an exclusive lock on the state dir: two agents must never fight over
    the same engines. Released by closing the fd, or by the kernel when we die."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirBusy(
            f"another agent (pid {holder}) is supervising engines in {path.parent}; "
            "stop it first, or give this one its own --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _rotate(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_suffix(path.suffix + ".1"))
