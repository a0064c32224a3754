"""SMG as a child process: start it, watch it, restart it with backoff, read it.

Facts this relies on (smg 1.13):

* `smg launch --discovery-provider file --discovery-file F` rereads the JSON
  manifest `{"version": 1, "workers": [{"url": ...}]}` as soon as it changes,
  and registers or removes workers to match; each worker's model comes from its
  `/v1/models`. So the gateway owns the worker set through one file.
* `GET /workers` lists what SMG has registered; with any client key set it
  needs a control-plane key, which only this process knows (a fresh random
  one per start). Client keys are SMG tenant keys. Neither is on SMG's command
  line: SMG runs through `llmgw.gateway.smg_child`, which reads them from a file
  of mode 0600 in the 0700 work dir. `DELETE /workers/{id}` removes a worker
  (the gateway removes any it did not put in the manifest).
* SMG colours its log whether or not it writes to a terminal: its output goes
  through a pipe here, and smg.log gets it without ANSI escapes.
* Prometheus metrics are served on `--prometheus-host/--prometheus-port`,
  here a loopback port only this process knows: `smg_worker_requests_active
  {worker=URL}` (in flight) and `smg_worker_requests_total{worker=URL,model}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmgw.gateway.front import MAX_BODY
from llmgw.gateway.keys import ApiKey
from llmgw.gateway.smg_child import SECRETS_ENV, write_secrets
from llmgw.wire import GATEWAY_IN_FLIGHT_DEFAULT

log = logging.getLogger("llmgw.gateway.smg")

BACKOFF_START_S = 0.5
BACKOFF_CAP_S = 10.0
OURS_FOR_S = 120.0  # a URL left the manifest this recently: SMG may still list it
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SmgOptions:
    host: str
    port: int
    policy: str
    keys: list[ApiKey]
    workdir: Path
    # SMG's one bound on a request, reading its body included (it has no bound of
    # its own for a body it buffers): a slow body is a 408 after this long.
    request_timeout_s: int = 1800
    log_level: str = "warn"
    max_body: int = MAX_BODY  # the front refuses larger ones first
    # Requests SMG admits at once (its --max-concurrent-requests, given to it only when
    # `max_in_flight_given`; else its own default, which this computes); the status says
    # it, and the controller counts no more of this gateway's requests than that.
    max_in_flight: int = field(default_factory=lambda: default_max_in_flight())
    max_in_flight_given: bool = False
    extra: list[str] = field(default_factory=list)


def default_max_in_flight() -> int:
    """SMG's own default bound, made explicit so that the status can say it: 1,024
    requests per core this process may run on, at least 4,096."""
    return max(GATEWAY_IN_FLIGHT_DEFAULT, 1024 * len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    routable: bool  # healthy and ready


@dataclass(frozen=True)
class WorkerLoad:
    in_flight: dict[str, int]  # worker URL -> requests running
    requests: dict[str, int]  # worker URL -> requests sent, ever (this SMG run)


class Smg:
    """One SMG child at a time; `run()` keeps one up until cancelled."""

    def __init__(self, options: SmgOptions) -> None:
        self.options = options
        self.manifest = options.workdir / "workers.json"
        self.secrets = options.workdir / "smg-secrets.json"
        self.admin_key = secrets.token_urlsafe(24)
        self.metrics_port = free_loopback_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.started = asyncio.Event()  # set while a child answers
        self.runs = 0
        self._session: aiohttp.ClientSession | None = None
        self._urls: list[str] = []
        self._ours: dict[str, float] = {}  # URL -> when it left the manifest (inf: in it)

    @property
    def base(self) -> str:
        host = self.options.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.options.port}"

    def argv(self) -> list[str]:
        o = self.options
        argv = [
            sys.executable,
            "-m",
            "llmgw.gateway.smg_child",
            "--host",
            o.host,
            "--port",
            str(o.port),
            "--policy",
            o.policy,
            "--discovery-provider",
            "file",
            "--discovery-file",
            str(self.manifest),
            "--discovery-check-interval-secs",
            "1",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--health-check-interval-secs",
            "2",
            "--request-timeout-secs",
            str(o.request_timeout_s),
            "--log-level",
            o.log_level,
            "--max-payload-size",
            str(o.max_body),
            # SMG's breaker counts a worker's 5xx as failures and then refuses the
            # model with its own 503: an explainer's 503s (held past the bound,
            # unplaceable, not ready) are its answers, not failures. Engines that
            # fail leave routing by the controller's word and SMG's health checks.
            "--disable-circuit-breaker",
        ]
        if o.max_in_flight_given:
            # Only when asked: SMG's explicit bound held far fewer than its derived one
            # in test_held_requests_whose_clients_left_are_dropped (1,000 held never
            # reached within 60 s; reached in 10 s without the option).
            argv += ["--max-concurrent-requests", str(o.max_in_flight)]
        return argv + o.extra

    def write_secrets(self) -> None:
        """The keys SMG needs, where only this user can read them (never on argv)."""
        write_secrets(
            self.secrets,
            [f"llmgw:llmgw-gateway:admin:{self.admin_key}"],
            [f"{k.tenant}:{k.key}" for k in self.options.keys],
        )

    def ours(self, url: str) -> bool:
        """Whether this gateway put `url` in the manifest (now or lately)."""
        return url in self._ours

    def write_workers(self, urls: Iterable[str]) -> None:
        """Replace the manifest atomically: SMG never reads half a file."""
        now = time.monotonic()
        new = sorted(set(urls))
        for u in set(self._urls) - set(new):
            self._ours[u] = now
        self._ours.update((u, math.inf) for u in new)
        self._ours = {u: t for u, t in self._ours.items() if now - t < OURS_FOR_S}
        self._urls = new
        body = {"version": 1, "workers": [{"url": u} for u in self._urls]}
        tmp = self.manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, self.manifest)

    async def run(self) -> None:
        """Keep SMG running: restart with backoff, one log line per outage."""
        self.options.workdir.mkdir(parents=True, exist_ok=True)
        self.options.workdir.chmod(0o700)  # the secrets file lives here
        self.write_secrets()
        if not self.manifest.exists():
            self.write_workers([])
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3))
        backoff = BACKOFF_START_S
        try:
            while True:
                log_path = self.options.workdir / "smg.log"
                # In our process group, so that whoever kills the gateway's group
                # kills SMG with it.
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv(),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env={**os.environ, SECRETS_ENV: str(self.secrets)},
                )
                assert self.proc.stdout is not None
                copier = asyncio.create_task(_copy_log(self.proc.stdout, log_path))
                self.runs += 1
                t0 = time.monotonic()
                try:
                    code = await self._watch(self.proc)
                finally:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(copier, 2)
                self.started.clear()
                if time.monotonic() - t0 > 30:
                    backoff = BACKOFF_START_S  # it ran well: a new outage
                log.warning(
                    "SMG exited with code %s (log: %s); restarting in %.1fs",
                    code,
                    log_path,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_CAP_S, backoff * 2)
        finally:
            await self.stop()
            await self._session.close()

    async def _watch(self, proc: asyncio.subprocess.Process) -> int:
        exited = asyncio.create_task(proc.wait())
        while not self.started.is_set() and not exited.done():
            if await self._answers():
                self.started.set()
                if self.runs > 1:
                    log.warning("SMG is back (start %d)", self.runs)
                break
            await asyncio.sleep(0.1)
        return await exited

    async def _answers(self) -> bool:
        try:
            await self.workers()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return True

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    # -- reading SMG ------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("SMG is not running")
        return self._session

    async def registered(self) -> list[Worker]:
        """Every worker SMG has registered, whoever put it there."""
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        async with self._http().get(f"{self.base}/workers", headers=headers) as resp:
            resp.raise_for_status()
            body = await resp.json()
        return [
            Worker(
                str(w.get("id", "")),
                w["url"],
                bool(w.get("is_healthy")) and w.get("status", "ready") == "ready",
            )
            for w in body.get("workers", [])
        ]

    async def workers(self) -> dict[str, bool]:
        """Registered worker URL -> whether SMG routes to it (healthy and ready)."""
        return {w.url: w.routable for w in await self.registered()}

    async def remove(self, worker_id: str) -> None:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        url = f"{self.base}/workers/{worker_id}"
        async with self._http().delete(url, headers=headers) as resp:
            resp.raise_for_status()

    async def load(self) -> WorkerLoad:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        async with self._http().get(url) as resp:
            resp.raise_for_status()
            text = await resp.text()
        in_flight: dict[str, int] = {}
        requests: dict[str, int] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                worker = s.labels.get("worker")
                if worker is None:
                    continue
                if s.name == "smg_worker_requests_active":
                    in_flight[worker] = in_flight.get(worker, 0) + int(s.value)
                elif s.name == "smg_worker_requests_total":
                    requests[worker] = requests.get(worker, 0) + int(s.value)
        return WorkerLoad(in_flight, requests)


async def _copy_log(stream: asyncio.StreamReader, path: Path) -> None:
    """SMG's output into `path`, line by line, without its ANSI colour escapes."""
    with path.open("ab") as out:
        pending = b""
        while chunk := await stream.read(65536):
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if cut == 0 and len(pending) < 65536:
                continue  # an escape may straddle the chunks: wait for the line's end
            cut = cut or len(pending)
            out.write(_ANSI.sub(b"", pending[:cut]))
            out.flush()
            pending = pending[cut:]
        out.write(_ANSI.sub(b"", pending))
