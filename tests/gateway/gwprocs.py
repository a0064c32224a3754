"""A `llmgw gateway` process (with its SMG child) beside a `tests.e2e.procs.Cluster`,
and a client that keeps requests going through it."""

from __future__ import annotations

import json
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.procs import Cluster, _stop, _tail, free_port, llmgw, wait_until

# Engines on loopback that take a moment per request, so requests overlap a drain.
ENGINE_ARGS = [
    "--load-seconds",
    "0.3",
    "--host",
    "127.0.0.1",
    "--latency",
    "0.05",
    "--token-interval",
    "0.1",
]  # a request of 8 tokens takes about 0.8 s: longer than an agent takes to stop an engine
CONTROLLER_ARGS = ["--reconcile-interval", "0.5", "--backoff-base", "1", "--stop-grace", "20"]


def model(name: str, min_replicas: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "min_replicas": min_replicas,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": ENGINE_ARGS,
    }


def _soft_open_files(soft: int) -> Callable[[], None]:
    def lower() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return lower


class Gateway:
    def __init__(
        self, cluster: Cluster, *extra: str, name: str = "gw-test", controller: str | None = None
    ) -> None:
        self.cluster = cluster
        self.controller = controller or cluster.url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.log = cluster.root / f"gateway-{name}.log"
        self.work = cluster.root / f"gateway-{name}"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None, *, open_files: int | None = None) -> None:
        """`open_files`: the soft RLIMIT_NOFILE the gateway starts under (systemd's
        default is 1,024) instead of the test's own."""
        argv = llmgw(
            "gateway",
            "--controller",
            self.controller,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--name",
            self.name,
            "--work-dir",
            str(self.work),
            *self.extra,
        )
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.cluster.env(), **(env or {})},
                start_new_session=True,
                preexec_fn=None if open_files is None else _soft_open_files(open_files),
            )

    def logs(self) -> str:
        smg = _tail(self.work / "smg.log", 30)
        return f"{self.cluster.logs()}\n--- gateway ---\n{_tail(self.log)}\n--- smg ---\n{smg}"

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, 9, timeout=10)

    def wait_serving(self, model: str, headers: dict[str, str] | None = None) -> None:
        def ok() -> bool:
            try:
                r = httpx.post(
                    f"{self.url}/v1/completions",
                    json={"model": model, "prompt": "hello", "max_tokens": 1},
                    headers=headers,
                    timeout=5,
                )
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        wait_until(ok, timeout=40, what=f"the gateway to serve {model}", diagnose=self.logs)


@dataclass
class Load:
    """Streaming and whole requests, one after another on two threads, until stopped."""

    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, clients: int = 2) -> Load:
        """`clients` threads, each sending one request after another (every other
        one streamed)."""
        for i in range(clients):
            t = threading.Thread(target=self._run, args=(i % 2 == 1,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self, stream: bool) -> None:
        with httpx.Client(timeout=httpx.Timeout(20.0), headers=self.headers) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                body = {
                    "model": self.model,
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "max_tokens": 8,
                    "stream": stream,
                }
                try:
                    err = self._one(http, body, stream)
                except httpx.HTTPError as exc:
                    err = f"{type(exc).__name__}: {exc}"
                if err:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} stream={stream} {err}")
                else:
                    self.ok += 1

    def _one(self, http: httpx.Client, body: dict[str, Any], stream: bool) -> str | None:
        url = f"{self.url}/v1/chat/completions"
        if not stream:
            r = http.post(url, json=body)
            if r.status_code != 200:
                return f"{r.status_code} {r.text[:200]}"
            return None if r.json()["choices"][0]["message"]["content"] else "empty answer"
        with http.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return f"{r.status_code} {r.read()[:200]!r}"
            events = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"stream cut short after {len(events)} events"
        # SMG reports an upstream cut as an error event, then still sends [DONE].
        errors = [e for e in events[:-1] if "error" in json.loads(e)]
        if errors:
            return f"stream error after {len(events) - 1 - len(errors)} chunks: {errors[0][:200]}"
        return None


def wait_cluster_ready(c: Cluster, names: list[str]) -> None:
    def all_ready() -> bool:
        return c.get("/v1/summary")["nodes"]["ready"] == len(names)

    wait_until(all_ready, timeout=30, what=f"{len(names)} ready nodes", diagnose=c.logs)


def one_card_serving(c: Cluster, specs: list[dict[str, Any]], *gateway_args: str) -> Gateway:
    """A controller (CONTROLLER_ARGS), one agent `gpu1` with one card, `specs` applied and a
    gateway started that serves the first of them: what most one-node tests begin with."""
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="1xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply(specs)
    gw = Gateway(c, *gateway_args)
    gw.start()
    gw.wait_serving(specs[0]["name"])
    return gw


def root_of(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@contextmanager
def gateway_fleet(path: Path, nodes: list[str]) -> Iterator[tuple[Cluster, Gateway]]:
    """A controller (CONTROLLER_ARGS), an agent with two cards per node and a round-robin
    gateway: what a module's tests share when each loads a model of its own."""
    c = Cluster(path)
    try:
        c.start_controller(*CONTROLLER_ARGS)
        for name in nodes:
            c.start_agent(name, gpus="2xH100-80GB")
        wait_cluster_ready(c, nodes)
        gw = Gateway(c, "--policy", "round_robin")
        gw.start()
        yield c, gw
        gw.stop()
    finally:
        c.close()
