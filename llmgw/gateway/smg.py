"""SMG as a child process: start it, watch it, restart it with backoff, read it.

Facts this relies on (smg 1.13):

* Workers are registered through SMG's API: `POST /workers {"url", "api_key"}`
  (202; registered in the background, its model read from its `/v1/models` with
  that key; a second POST of a URL on its way in is a 409) and `DELETE
  /workers/{id}` (202; gone from `/workers` about 5 s later). Each engine asks
  for its replica's key (issue 36), which SMG's file discovery manifest cannot
  carry (it refuses any field but the URL's kind). So `write_workers` sets the
  wanted set (URL -> key) and `converge` brings SMG to it, at once and every
  second after (a restarted SMG starts empty and is filled again).
* SMG sends a worker its key as `Authorization: Bearer KEY` only when the
  request it forwards carries no Authorization of its own: a client's header
  wins (checked with smg 1.13: the engine saw the client's key, not its own).
  So SMG is given no client keys and the front sends it none: the front checks
  every key itself (front.py), and SMG's data plane answers only on its loopback
  port. `GET /workers` and the rest of its control plane need the control-plane
  key, which only this process knows (a fresh random one per start), kept off
  SMG's command line: SMG runs through `llmgw.gateway.smg_child`, which reads it
  from a file of mode 0600 in the 0700 work dir. The gateway removes any worker
  it did not add.
* SMG colours its log whether or not it writes to a terminal: its output goes
  through a pipe here, and smg.log gets it without ANSI escapes.
* Prometheus metrics are served on `--prometheus-host/--prometheus-port`,
  here a loopback port only this process knows: `smg_worker_requests_active
  {worker=URL}` (in flight) and `smg_worker_requests_total{worker=URL,model}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmgw.gateway.front import MAX_BODY
from llmgw.gateway.keys import ApiKey
from llmgw.gateway.smg_child import SECRETS_ENV, write_secrets
from llmgw.wire import GATEWAY_IN_FLIGHT_DEFAULT, printable

log = logging.getLogger("llmgw.gateway.smg")

BACKOFF_START_S = 0.5
BACKOFF_CAP_S = 10.0
OURS_FOR_S = 120.0  # a URL left the wanted set this recently: SMG may still list it
CONVERGE_EVERY_S = 1.0  # SMG's workers compared with the wanted set at least this often
# A worker asked for and not listed yet is asked again after this long (SMG drops a
# registration that fails: an engine not answering yet).
ASK_AGAIN_S = 3.0
# One asked to leave and still listed this long after is asked again. Not sooner: SMG
# keeps a removed worker about 5 s (its drain settle) while what it sent there ends,
# and a second DELETE in that time drops it at once (measured, smg 1.13: 1.0 s after
# the first with a second at 1 s, 5.0 s with one).
LEAVE_AGAIN_S = 30.0
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
    keys: list[ApiKey]  # SMG's own client keys: none behind the front (see above)
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
        self.secrets = options.workdir / "smg-secrets.json"
        self.admin_key = secrets.token_urlsafe(24)
        self.metrics_port = free_loopback_port()
        self._listen_on(options.port)
        self.proc: asyncio.subprocess.Process | None = None
        self.started = asyncio.Event()  # set while a child answers
        self.runs = 0
        self._session: aiohttp.ClientSession | None = None
        self._wanted: dict[str, str | None] = {}  # URL -> its engine key (None: none)
        self._ours: dict[str, float] = {}  # URL -> when it left the wanted set (inf: in it)
        # This SMG run's requests: URL -> (the key it was added with, when asked); URL ->
        # when its removal was asked. Both forgotten when SMG restarts.
        self._asked: dict[str, tuple[str | None, float]] = {}
        self._leaving: dict[str, float] = {}
        self._refused: set[str] = set()  # URLs SMG refused to register (said once each)
        self._converge_now = asyncio.Event()

    def _listen_on(self, port: int) -> None:
        """SMG's port, and its URL as `base` (read for every request the front sends)."""
        self.port = port
        host = self.options.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        self.base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def argv(self) -> list[str]:
        o = self.options
        argv = [
            sys.executable,
            "-m",
            "llmgw.gateway.smg_child",
            "--host",
            o.host,
            "--port",
            str(self.port),
            "--policy",
            o.policy,
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
        """Whether this gateway wants `url` as a worker (now or lately)."""
        return url in self._ours

    @property
    def wanted(self) -> Mapping[str, str | None]:
        return self._wanted

    def write_workers(self, workers: Mapping[str, str | None]) -> None:
        """The workers SMG should have, URL -> the key its engine asks for (None:
        none, as an explainer); `converge` makes it so, beginning now."""
        now = time.monotonic()
        for u in self._wanted.keys() - workers.keys():
            self._ours[u] = now
        self._ours.update((u, math.inf) for u in workers)
        self._ours = {u: t for u, t in self._ours.items() if now - t < OURS_FOR_S}
        self._wanted = dict(workers)
        self._converge_now.set()

    async def converge(self) -> None:
        """One pass: add each wanted worker SMG does not list (with its key), remove
        each of ours it lists that is not wanted, or was added with another key (a
        replaced replica's engine on the same address and port)."""
        listed = await self.registered()
        by_url = {w.url: w for w in listed}
        now = time.monotonic()
        for url, key in list(self._wanted.items()):
            asked = self._asked.get(url)
            present = by_url.get(url)
            if present is not None:
                if asked is None or asked[0] != key:  # not ours as it is: in again anew
                    await self._leave(present, now)
                continue
            if asked is not None and asked[0] == key and now - asked[1] < ASK_AGAIN_S:
                continue  # on its way in
            self._leaving.pop(url, None)
            # Noted before it is sent: an answer lost after SMG took it must not make
            # the worker look like someone else's (and be removed) on the next pass.
            self._asked[url] = (key, now)
            try:
                await self._add(url, key)
            except aiohttp.ClientResponseError as exc:
                if exc.status >= 500:
                    raise
                # Refused for itself (entries.py checks URLs first): the others go on;
                # asked again after ASK_AGAIN_S, said once.
                if url not in self._refused:
                    self._refused.add(url)
                    log.warning("SMG refused worker %s: %s", printable(url), exc.message)
        for w in listed:
            if w.url not in self._wanted and w.url in self._ours:
                await self._leave(w, now)
        self._leaving = {u: t for u, t in self._leaving.items() if u in by_url}
        self._refused &= self._wanted.keys()

    async def _add(self, url: str, key: str | None) -> None:
        body: dict[str, str] = {"url": url}
        if key is not None:
            body["api_key"] = key
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        async with self._http().post(f"{self.base}/workers", json=body, headers=headers) as r:
            if r.status != 409:  # 409: its registration is under way already
                r.raise_for_status()

    async def _leave(self, worker: Worker, now: float) -> None:
        if now - self._leaving.get(worker.url, -math.inf) < LEAVE_AGAIN_S:
            return
        self._leaving[worker.url] = now
        self._asked.pop(worker.url, None)
        await self.remove(worker.id)

    async def _converging(self) -> None:
        """Converge whenever the wanted set changes, and each second: what a pass
        could not do (SMG busy, restarting) is done by a later one."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._converge_now.wait(), CONVERGE_EVERY_S)
            self._converge_now.clear()
            if not self.started.is_set():
                continue
            try:
                await self.converge()
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                log.debug("bringing SMG's workers to the wanted set: %s", exc)

    async def run(self) -> None:
        """Keep SMG running: restart with backoff, one log line per outage."""
        self.options.workdir.mkdir(parents=True, exist_ok=True)
        self.options.workdir.chmod(0o700)  # the secrets file lives here
        self.write_secrets()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3))
        backoff = BACKOFF_START_S
        converging = asyncio.create_task(self._converging())
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
                answered = self.started.is_set()
                self.started.clear()
                self._asked.clear()  # a new SMG starts with no workers
                self._leaving.clear()
                if time.monotonic() - t0 > 30:
                    backoff = BACKOFF_START_S  # it ran well: a new outage
                moved = ""
                if not answered:
                    # Never up: most likely another process took a port between our
                    # pick and SMG's bind (CI saw one held for good). Fresh ones each try.
                    self._listen_on(free_loopback_port())
                    self.metrics_port = free_loopback_port()
                    moved = f" on port {self.port}"
                log.warning(
                    "SMG exited with code %s (log: %s); restarting%s in %.1fs",
                    code,
                    log_path,
                    moved,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_CAP_S, backoff * 2)
        finally:
            converging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await converging
            await self.stop()
            await self._session.close()

    async def _watch(self, proc: asyncio.subprocess.Process) -> int:
        exited = asyncio.create_task(proc.wait())
        while not self.started.is_set() and not exited.done():
            if await self._answers():
                self.started.set()
                self._converge_now.set()
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
        """End SMG now. On a SIGTERM it keeps its port open 5 s for load balancers to
        notice (smg 1.13: "load-balancer propagation window", not an option); the front,
        its one client, has let its requests end before this (gateway/main.py), so
        nothing is in flight to wait for."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
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
