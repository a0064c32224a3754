"""The engines' lifecycle: start what is assigned, stop what is not (SIGTERM, grace,
SIGKILL), notice exits, kill on a verdict, and keep state_dir/engines.json so that
the next agent on the same state_dir adopts the engines this one leaves running.

Engines run in their own session, outside the agent's process group: an agent
restart (or `release()`) leaves them running.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmgw.agent import engine_adapters
from llmgw.agent.engine_proc import ProcessRef, describe_exit, free_port, log_tail, ref_for
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import KILL_REASONS, MAX_ERROR_CHARS, Engine, Key, Kill
from llmgw.agent.engine_state import EngineRecord, load_state, save_state
from llmgw.agent.engine_templates import (
    DEFAULT_RENDEZVOUS_PORT,
    EngineTemplate,
    TemplateError,
    python_executable,
    render,
    render_env,
)
from llmgw.agent.exit_cause import PORT_TAKEN, exit_reason, line_with
from llmgw.agent.metrics import IdleTracker
from llmgw.wire import AdapterFailure, ReplicaReport, ShardAssignment, ShardState, printable

log = logging.getLogger(__name__)

LOG_ROTATE_BYTES = 64 * 1024 * 1024  # past this, a relaunch moves the old log to .1
# Starts again in a row on a fresh port after the engine found its port taken; past
# them it fails as any start does (something else is wrong).
PORT_RETRIES = 2


class StateDirBusy(OSError):
    """Another live agent holds this state dir (an OSError: the CLI reports those)."""


class EngineLifecycle:
    """Owns this node's engine table (one `Engine` per replica id and rank), the
    state dir's lock and state file, the count of kills by reason, and which
    engines refused to start able to sleep here. One per state_dir: constructing
    it takes the lock (StateDirBusy if another agent holds it) and adopts what the
    previous agent left running."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.engines: dict[Key, Engine] = {}
        # Engines killed by this supervisor, by reason (KILL_REASONS): the agent's /metrics.
        self.kills: dict[str, int] = dict.fromkeys(KILL_REASONS, 0)
        # Engines (template names) that refused to start able to sleep here: why.
        self.no_sleep_mode: dict[str, str] = {}
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = _lock(settings.lock_path)
        self._adopt()

    def release(self) -> None:
        """Save and let go: the engines keep running, the lock is free for the next agent."""
        if self._lock_fd is None:
            return
        self.save()
        for eng in self.engines.values():
            eng.popen = None  # let go without waiting: the engine outlives us
        os.close(self._lock_fd)  # releases the lock for the next agent
        self._lock_fd = None

    # -- the assigned set --------------------------------------------------------------

    def converge(
        self, assignments: Sequence[ShardAssignment], local_weights: Mapping[str, str]
    ) -> None:
        """Make the running set match `assignments`: start missing, stop unassigned."""
        self.poll_exits()
        desired = {(a.replica_id, a.rank): a for a in assignments}
        for key, eng in list(self.engines.items()):
            want = desired.get(key)
            if want is not None and want.leader_address is None:
                # A controller that has not heard from the leader's node yet (a fresh
                # term) knows no address for it: not a new leader, not a restart.
                want = desired[key] = want.model_copy(
                    update={"leader_address": eng.assignment.leader_address}
                )
            if want is not None and want.started_as() == eng.assignment.started_as():
                eng.assignment = want  # its sleep or adapters changed: the monitor acts on it
                continue
            # Unassigned, or assigned differently (the new one starts once this is gone).
            if eng.state is ShardState.FAILED:
                if eng.reported:
                    del self.engines[key]
            elif eng.state is not ShardState.STOPPING:
                self.begin_stop(eng)
        for key, a in desired.items():
            if key not in self.engines:
                self.engines[key] = self._start(a, local_weights)
        self.save()

    def in_state(self, state: ShardState) -> list[Engine]:
        return [e for e in self.engines.values() if e.state is state]

    def reports(self) -> list[ReplicaReport]:
        """What runs, for the agent's report; a failure is reported once, then dropped
        when it is no longer assigned."""
        self.poll_exits()
        out: list[ReplicaReport] = []
        for eng in self.engines.values():
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

    def debug_state(self) -> dict[str, Any]:
        """What the table holds, for logs and tests."""
        return {
            f"{k[0]}/{k[1]}": {"state": e.state.value, "pid": e.ref.pid if e.ref else None}
            for k, e in self.engines.items()
        }

    # -- starting ----------------------------------------------------------------------

    def _start(self, a: ShardAssignment, local_weights: Mapping[str, str]) -> Engine:
        templates = self.settings.templates
        template = templates.get(a.engine)
        if template is None:
            known = ", ".join(sorted(templates))
            return self._failed_to_start(
                a, None, f"no engine template named {a.engine!r} on this node; known: {known}"
            )
        port = free_port()
        try:
            values = self._values(a, local_weights, port)
            # engine_args are separate argv words already: appended as they are, never split.
            sleeps = a.sleep_mode and a.engine not in self.no_sleep_mode
            command = template.command_for(a.rank, a.nnodes, sleeps=sleeps)
            argv = [*render(command, values), *a.engine_args, *_memory_share(template, a)]
            template_env = render_env(template, values, sleeps=sleeps)
            if "--enable-lora" in a.engine_args:  # adapters are loaded at run time
                template_env = {**engine_adapters.RUNTIME_ENV, **template_env}
        except (TemplateError, ValueError) as exc:
            return self._failed_to_start(a, template, f"cannot build the engine command: {exc}")
        log_dir = self.settings.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{_safe_name(a.replica_id)}-{a.rank}.log"
        env = {**os.environ, **self.settings.extra_env, **template_env}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(a.gpus)  # UUIDs: stable, unlike indices
        if template.api_key_env is not None:
            # The replica's key, in its environment only (never argv, never the log
            # header below); none inherited from the agent's own when it has none.
            env.pop(template.api_key_env, None)
            if a.engine_key:
                env[template.api_key_env] = a.engine_key
        env.update(LLMGW_REPLICA_ID=a.replica_id, LLMGW_RANK=str(a.rank), LLMGW_MODEL=a.model)
        try:
            _rotate(log_path)
            with log_path.open("ab") as logf:
                shown = {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"], **template_env}
                header = (
                    f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} llmgw agent {self.settings.node}: "
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
                    cwd=self.settings.state_dir,
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
        leader = a.leader_address or (self.settings.address if a.rank == 0 else None)
        if a.nnodes > 1 and leader is None:
            raise ValueError(f"rank {a.rank} of {a.nnodes} has no leader address to join")
        return {
            "python": python_executable(),
            "source": source,
            "model": a.model,
            "replica": a.replica_id,
            "port": str(port),
            "host": self.settings.engine_host,
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

    # -- ready, stopping, exits and kills ------------------------------------------------

    def mark_ready(self, eng: Engine) -> None:
        eng.state = ShardState.READY
        log.info("engine %s/%d ready on port %s", *eng.key, eng.port)
        self.save()

    def mark_sleeping(self, eng: Engine, level: int | None) -> None:
        """Asleep at `level`, as its engine answered (None: a multi-node worker, which
        its leader's engine sleeps: nothing asked of it, nothing saved)."""
        eng.state = ShardState.SLEEPING
        if level is not None:
            eng.slept_level = level
            log.info("engine %s/%d asleep at level %d", *eng.key, level)
            self.save()

    def mark_waking(self, eng: Engine) -> None:
        """Being woken (asked to, or woken again after a sleep that kept its memory)."""
        eng.state = ShardState.WAKING
        log.info("engine %s/%d waking", *eng.key)

    def begin_stop(self, eng: Engine) -> None:
        eng.state = ShardState.STOPPING
        eng.stop_deadline = time.monotonic() + self.settings.grace_s
        if eng.ref is not None and eng.ref.send(signal.SIGTERM):
            log.info("stopping %s/%d pid %d (SIGTERM)", *eng.key, eng.ref.pid)

    def kill_failed(self, eng: Engine, kill: Kill) -> None:
        """Declare a live engine failed and kill it: whatever state it is in, it
        holds GPUs that a replacement will need."""
        if eng.ref is not None:
            eng.ref.signal_group(signal.SIGKILL)
        eng.state = ShardState.FAILED
        eng.exit_code = None
        # Our own words are the cause; the log's last lines say how far it got.
        eng.error = _killed_reason(kill.why, eng.log_path)
        self.kills[kill.reason.value] = self.kills.get(kill.reason.value, 0) + 1
        log.error("engine %s/%d %s; killed", *eng.key, kill.why)
        self.save()

    def _exit_code(self, eng: Engine) -> tuple[bool, int | None]:
        """(exited, exit code if known) without blocking."""
        if eng.popen is not None:
            code = eng.popen.poll()
            return (code is not None, code)
        return (eng.ref is None or not eng.ref.alive(), None)

    def poll_exits(self) -> None:
        """Notice engines that exited (a stop done, a failure, a start to try again
        without sleep mode) and escalate stops past their grace to SIGKILL."""
        changed = False
        now = time.monotonic()
        for key, eng in list(self.engines.items()):
            if eng.ref is None:
                continue
            if eng.state is ShardState.FAILED:
                if eng.popen is not None and eng.popen.poll() is not None:
                    eng.popen = None  # reaped, after kill_failed
                continue
            exited, code = self._exit_code(eng)
            if exited:
                eng.ref.signal_group(signal.SIGKILL)  # workers it left behind hold GPUs
                eng.popen = None
                changed = True
                if eng.state is ShardState.STOPPING:
                    log.info("stopped %s/%d: %s", *key, describe_exit(code))
                    del self.engines[key]
                elif self._refused_sleep_mode(eng):
                    self.engines[key] = self._start(eng.assignment, eng.local_weights)
                elif self._lost_its_port(eng):
                    again = self._start(eng.assignment, eng.local_weights)
                    again.port_retries = eng.port_retries + 1
                    self.engines[key] = again
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
                    log.warning(
                        "engine %s/%d ignored SIGTERM for %gs: SIGKILL", *key, self.settings.grace_s
                    )
                    eng.ref.signal_group(signal.SIGKILL)
                eng.killed = True
        if changed:
            self.save()

    def _lost_its_port(self, eng: Engine) -> bool:
        """A start whose port another process took between our pick and the engine's
        bind (free_port's window, which a busy host hits): started again at once on a
        fresh port, up to PORT_RETRIES times in a row, rather than failed and retried
        by the controller after its backoff."""
        if eng.state is not ShardState.STARTING or eng.log_path is None:
            return False
        if eng.port_retries >= PORT_RETRIES:
            return False
        found = line_with(eng.log_path, PORT_TAKEN, any_case=True)
        if found is None:
            return False
        log.warning("engine %s/%d lost port %s (%s): started again", *eng.key, eng.port, found)
        return True

    def _refused_sleep_mode(self, eng: Engine) -> bool:
        """A start with sleep mode that the engine refused on this machine (its
        template's `unsupported` words in this run's log): noted for its engine name,
        so that it and the next ones start without it (sleep says so once asked to
        sleep, llmgw.agent.engine_sleep), instead of failing every start."""
        mode = eng.template.sleep if eng.template else None
        if eng.state is not ShardState.STARTING or mode is None or not mode.unsupported:
            return False
        if not eng.sleeps or eng.log_path is None:
            return False
        found = line_with(eng.log_path, mode.unsupported)
        if found is None:
            return False
        self.no_sleep_mode[eng.assignment.engine] = found
        log.warning(
            "engine %s/%d refused sleep mode (%s): started again without it", *eng.key, found
        )
        return True

    # -- the state file ----------------------------------------------------------------

    def save(self) -> None:
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
            for eng in self.engines.values()
            if eng.ref is not None and eng.state is not ShardState.FAILED
        ]
        path = self.settings.state_path
        try:
            save_state(path, records)
        except OSError as exc:  # keep supervising; the next save may succeed
            log.error("cannot write engine state %s: %s", path, exc)

    def _adopt(self) -> None:
        """Take back the engines a previous agent left running; report the dead once."""
        for rec in load_state(self.settings.state_path):
            ref = ProcessRef(pid=rec.pid, start_ticks=rec.start_ticks, boot_id=rec.boot_id)
            key = (rec.replica_id, rec.rank)
            log_path = Path(rec.log_path) if rec.log_path else None
            template = self.settings.templates.get(rec.assignment.engine)
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
                    self.begin_stop(eng)  # finish the stop the previous agent began
                self.engines[key] = eng
            elif not rec.stop_requested:
                eng.state = ShardState.FAILED
                eng.ref = None
                eng.error = exit_reason("exited while the agent was not running", log_path)
                self.engines[key] = eng
        self.save()


def _memory_share(template: EngineTemplate, a: ShardAssignment) -> list[str]:
    """The engine's option for its share of each card (last: it wins over engine_args)."""
    if a.gpu_memory_share is None:
        return []
    if template.memory_share_arg is None:
        raise TemplateError(
            f"the model asks for gpu_memory_share {a.gpu_memory_share:g}, and template "
            f"{a.engine!r} has no memory_share_arg to give it to the engine: set one "
            "(vLLM: --gpu-memory-utilization), or leave gpu_memory_share out"
        )
    return [template.memory_share_arg, f"{a.gpu_memory_share:g}"]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100] or "engine"


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
