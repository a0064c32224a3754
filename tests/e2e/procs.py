"""Real llmgw processes for end-to-end tests: one controller, agents, their engines.

Everything runs on 127.0.0.1 with free ports. Each process starts in its own
session and is stopped by process group. Engines deliberately outlive their
agent (they run in sessions of their own), so every process this module starts
carries a per-cluster tag in its environment, which engines inherit; `close()`
finds whatever still carries the tag in /proc and kills it. Logs go to files
under the cluster's directory and are quoted when a wait times out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

TAG_VAR = "LLMGW_E2E_TAG"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llmgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


def clean_env() -> dict[str, str]:
    """The test's environment without tokens or a controller URL that would leak in."""
    env = dict(os.environ)
    for key in (
        "LLMGW_AGENT_TOKEN",
        "LLMGW_ENROLL_TOKEN",
        "LLMGW_ADMIN_TOKEN",
        "LLMGW_READ_TOKEN",
        "LLMGW_TOKEN",
        "LLMGW_CONTROLLER",
        "LLMGW_AGENT_STATE",
    ):
        env.pop(key, None)
    return env


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    every: float = 0.1,
    diagnose: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something other than None or False."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{diagnose()}" if diagnose else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(every)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> int:
    """Send `sig` to the process group; SIGKILL it if it outstays `timeout`."""
    if proc.poll() is None:
        _kill_group(proc, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait(10)
    return int(proc.returncode)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ControllerProcess:
    """One `llmgw controller` process for a test. Every test that starts a
    controller process starts it here: the argv (`--listen`, `--store` if given
    else `--state-dir`, then `args`), the environment (`clean_env()` plus `env`), a free
    port unless one is given, its output in `log`, the wait for `/healthz`, and
    the stop (SIGTERM to its process group, SIGKILL if it outstays the timeout).

    It can be started again in place (same port, same state). `run()` runs the
    same command to its end instead, for a start that must fail.
    """

    def __init__(
        self,
        log: Path,
        *,
        state_dir: Path | None = None,
        store: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        scheme: str = "http",
    ) -> None:
        self.log = log
        self.state_dir = state_dir
        self.store = store
        self.host = host
        self.port = free_port() if port is None else port
        self.args = tuple(args)
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.preexec_fn = preexec_fn
        self.url = f"{scheme}://{host}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """A client onto this controller (plain HTTP), made on first use."""
        if self._http is None:
            self._http = httpx.Client(base_url=self.url, timeout=5.0)
        return self._http

    def env(self) -> dict[str, str]:
        return {**clean_env(), **self.extra_env}

    def argv(self, *extra: str) -> list[str]:
        where: list[str] = []
        if self.store is not None:  # the store given wins over state_dir
            where += ["--store", self.store]
        elif self.state_dir is not None:
            where += ["--state-dir", str(self.state_dir)]
        return llmgw(
            "controller", "--listen", f"{self.host}:{self.port}", *where, *self.args, *extra
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def healthy(self) -> bool | None:
        """/healthz answers 200 (None while it does not answer at all)."""
        try:
            return self.http.get("/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return None

    def start(
        self,
        *extra: str,
        ready: Callable[[], Any] | None = None,
        what: str = "the controller to answer /healthz",
        timeout: float = 20,
        diagnose: Callable[[], str] | None = None,
    ) -> None:
        """Start it with `args` and `extra`; wait until `ready()` (default: /healthz
        answers 200). If it exits first, fail with `diagnose()` (default: its log)."""
        assert self.proc is None or self.proc.poll() is not None, "the controller is running"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            proc = self.proc = subprocess.Popen(
                self.argv(*extra),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=self.preexec_fn,
            )
        check = ready or self.healthy
        said = diagnose or (lambda: _tail(self.log))

        def up() -> Any:
            if proc.poll() is not None:
                raise AssertionError(f"controller exited {proc.returncode}\n{said()}")
            return check()

        try:
            wait_until(up, timeout=timeout, what=what)
        except BaseException:
            _stop(proc, signal.SIGKILL, timeout=10)  # never left running by a failed start
            raise

    def run(self, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the same command to its end (a start that must fail), output captured."""
        return subprocess.run(
            self.argv(*extra),
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.cwd,
            timeout=timeout,
            preexec_fn=self.preexec_fn,
        )

    # -- the process ----------------------------------------------------------------

    def _running(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None, "the controller was never started"
        return self.proc

    @property
    def pid(self) -> int:
        return self._running().pid

    def poll(self) -> int | None:
        return self._running().poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._running().wait(timeout)

    def send_signal(self, sig: int) -> None:
        """Send `sig` to its process group (SIGSTOP, SIGCONT, ...)."""
        _kill_group(self._running(), sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Send `sig`, SIGKILL it if it outstays `timeout`; its exit status."""
        return _stop(self._running(), sig, timeout)

    def close(self) -> None:
        """Killed if still running (a paused one too); the client closed."""
        if self.proc is not None and self.proc.poll() is None:
            _kill_group(self.proc, signal.SIGCONT)  # a paused one must be able to die
            _stop(self.proc, signal.SIGKILL, timeout=10)
        if self._http is not None:
            self._http.close()
            self._http = None


class Cluster:
    """A controller on a fixed port and state dir (so it can be restarted in
    place), agents by name, and the engines they run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.controller: ControllerProcess | None = None
        self.controller_args: tuple[str, ...] = ()
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.agent_args: dict[str, list[str]] = {}
        self.http = httpx.Client(base_url=self.url, timeout=5.0)

    # -- plumbing -------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {**clean_env(), TAG_VAR: self.tag}

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.root,
                start_new_session=True,
            )

    def logs(self) -> str:
        parts = [f"--- controller ---\n{_tail(self.root / 'controller.log')}"]
        for name in sorted(self.agent_args):
            parts.append(f"--- agent {name} ---\n{_tail(self.root / f'agent-{name}.log')}")
        return "\n".join(parts)

    # -- the controller -----------------------------------------------------------

    def start_controller(self, *extra: str) -> None:
        """Start (or restart, with the same port, state dir and options) the controller."""
        if extra:
            self.controller_args = extra
        if self.controller is None:
            self.controller = ControllerProcess(
                self.root / "controller.log",
                state_dir=self.root / "controller",
                port=self.port,
                env={TAG_VAR: self.tag},
                cwd=self.root,
            )
        self.controller.start(*self.controller_args, diagnose=self.logs)

    def kill_controller(self, sig: int = signal.SIGKILL) -> int:
        assert self.controller is not None
        return self.controller.stop(sig, timeout=10)

    # -- agents ------------------------------------------------------------------

    def state_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def start_agent(
        self,
        name: str,
        *,
        gpus: str = "2xH100-80GB",
        fabric: str = "ib-a",
        interval: float = 0.5,
        extra: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """Start an agent; a restart of `name` reuses its options and state dir.
        `extra`: more agent options (--engine-templates FILE, say)."""
        old = self.agents.get(name)
        assert old is None or old.poll() is not None, f"agent {name} is still running"
        args = self.agent_args.setdefault(
            name,
            [
                "--controller",
                self.url,
                "--node",
                name,
                "--interval",
                str(interval),
                "--fake-gpus",
                gpus,
                "--fabric",
                fabric,
                "--address",
                "127.0.0.1",
                "--state-dir",
                str(self.state_dir(name)),
                *extra,
            ],
        )
        proc = self.agents[name] = self._spawn(
            llmgw("agent", *args), self.root / f"agent-{name}.log"
        )
        return proc

    def stop_agent(self, name: str, sig: int = signal.SIGTERM) -> int:
        return _stop(self.agents[name], sig, timeout=15)

    def agent_log(self, name: str) -> str:
        return (self.root / f"agent-{name}.log").read_text(errors="replace")

    def engine_records(self, name: str) -> list[dict[str, Any]]:
        """The engines an agent's state file lists."""
        try:
            data = json.loads((self.state_dir(name) / "engines.json").read_text())
        except (OSError, ValueError):
            return []
        return list(data.get("engines", []))

    # -- engines -------------------------------------------------------------------

    def tagged_pids(self) -> dict[int, dict[str, str]]:
        """Live processes this cluster started (and their children): pid -> environ."""
        out = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            env = environ_of(pid)
            if env.get(TAG_VAR) == self.tag and pid_alive(pid):
                out[pid] = env
        return out

    def engine_pids(self) -> dict[str, set[int]]:
        """Replica id -> pids of the live engine processes serving it."""
        out: dict[str, set[int]] = {}
        for pid, env in self.tagged_pids().items():
            rid = env.get("LLMGW_REPLICA_ID")
            if rid:
                out.setdefault(rid, set()).add(pid)
        return out

    # -- the admin API and ctl ---------------------------------------------------------

    def get(self, path: str) -> Any:
        resp = self.http.get(path)
        resp.raise_for_status()
        return resp.json()

    def try_get(self, path: str) -> Any | None:
        """Like get, but None while the controller is away."""
        try:
            return self.get(path)
        except httpx.HTTPError:
            return None

    def ctl_argv(self, *args: str) -> list[str]:
        return llmgw("ctl", "--controller", self.url, *args)

    def ctl(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            self.ctl_argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )
        assert done.returncode == 0, (
            f"llmgw ctl {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout}{done.stderr}\n{self.logs()}"
        )
        return done.stdout

    def ctl_json(self, *args: str) -> Any:
        return json.loads(self.ctl(*args, "--json"))

    def apply(self, models: list[dict[str, Any]]) -> None:
        path = self.root / f"models-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
        self.ctl("apply", "-f", str(path))

    # -- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        for proc in self.agents.values():
            _stop(proc, signal.SIGKILL, timeout=10)
        if self.controller is not None:
            self.controller.close()
        self.http.close()
        # Engines live in sessions of their own: find them by the tag.
        for _ in range(50):
            pids = self.tagged_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        raise AssertionError(f"processes left behind: {sorted(self.tagged_pids())}")
