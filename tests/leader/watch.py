"""A watcher beside an HA cluster: it samples, every fraction of a second, who
leads and what the leader says about nodes and replicas, and notes every breach
of a failover's promises as it happens (a check made only after the failover
would miss a node that flipped unreachable and back)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def active_per_model(replicas: list[dict[str, Any]]) -> collections.Counter[str]:
    """Replicas per model, a draining original and its stand-in counted once (as
    the controller does); failed ones are not counted."""
    replaced = {r["replaces"] for r in replicas if r.get("replaces")}
    return collections.Counter(
        r["model"] for r in replicas if r["state"] != "failed" and r["id"] not in replaced
    )


def shared_gpus(replicas: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(node, GPU) -> the replicas holding it, where more than one does."""
    holders: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for r in replicas:
        for s in r["shards"]:
            for gpu in s["gpus"]:
                holders[(s["node"], gpu)].append(r["id"])
    return {k: v for k, v in holders.items() if len(v) > 1}


@dataclass
class Sample:
    at: float  # monotonic
    leader: int | None  # index of the controller that said it leads
    epoch: int | None


@dataclass
class FailoverWatch:
    """Samples `urls` every `every` seconds on a thread of its own (with clients of
    its own: the test's clients are used from the test's thread)."""

    urls: list[str]
    nodes: int  # how many nodes the leader must list
    every: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    listed: list[float] = field(default_factory=list)  # when a leader's listings came back
    breaches: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> FailoverWatch:
        self._thread = threading.Thread(target=self._run, name="failover-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        clients = [httpx.Client(base_url=u, timeout=1.0) for u in self.urls]
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                self._sample(clients)
                self._stop.wait(max(0.0, self.every - (time.monotonic() - started)))
        finally:
            for c in clients:
                c.close()

    def _sample(self, clients: list[httpx.Client]) -> None:
        at = time.monotonic()
        leaders: list[tuple[int, int]] = []
        for i, client in enumerate(clients):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                health = client.get("/healthz").json()
                if health["role"] == "leader":
                    leaders.append((i, int(health["epoch"])))
        if len(leaders) > 1:
            self.breaches.append(f"{at:.2f}: two controllers lead at once: {leaders}")
        if not leaders:
            self.samples.append(Sample(at, None, None))
            return
        i, epoch = leaders[0]
        self.samples.append(Sample(at, i, epoch))
        try:
            nodes = clients[i].get("/v1/nodes").raise_for_status().json()
            replicas = clients[i].get("/v1/replicas").raise_for_status().json()
            models = clients[i].get("/v1/models").raise_for_status().json()
        except httpx.HTTPError:
            return  # stepped down between the calls: the next sample asks the next leader
        self.listed.append(time.monotonic())
        self._check(at, epoch, nodes, replicas, models)

    def _check(
        self,
        at: float,
        epoch: int,
        nodes: list[dict[str, Any]],
        replicas: list[dict[str, Any]],
        models: list[dict[str, Any]],
    ) -> None:
        where = f"{at:.2f} (epoch {epoch})"
        if len(nodes) != self.nodes:
            self.breaches.append(f"{where}: {len(nodes)} nodes listed, not {self.nodes}")
        for row in nodes:
            if row["state"] == "unreachable":
                self.breaches.append(
                    f"{where}: node {row['name']} unreachable (report age {row['report_age_s']})"
                )
        declared = {m["spec"]["name"]: m["spec"]["min_replicas"] for m in models}
        for model, count in active_per_model(replicas).items():
            if count > declared.get(model, 0):
                self.breaches.append(
                    f"{where}: {count} replicas of {model}, declared {declared.get(model)}"
                )
        for gpu, holders in shared_gpus(replicas).items():
            self.breaches.append(f"{where}: GPU {gpu} assigned to {holders}")

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without a leader's listing between `start` and `end`."""
        times = [start, *(t for t in self.listed if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))

    def first_leader_after(self, t: float) -> Sample | None:
        return next((s for s in self.samples if s.at > t and s.leader is not None), None)
