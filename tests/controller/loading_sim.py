"""A simulated fleet whose engines take a report to load and whose cards can fail."""

from __future__ import annotations

from fleet_factories import gpu, report
from test_reconcile import Sim

from llmgw.wire import ReplicaState

# An engine given this argument exits as it starts (a bad new revision).
BROKEN = "--exit-at-start"


class LoadingSim(Sim):
    """The reconcile tests' fleet, whose engines report starting once, then ready
    (engines on a dead card of a `failing` node, and those given `BROKEN`, fail), and whose
    cards can fail (`health`: node -> index -> (health, reason))."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.health: dict[str, dict[int, tuple[str, str]]] = {}
        self.loaded: set[str] = set()  # replicas whose engine has reported once

    def report(self, node: str, ready: bool = True) -> None:
        bad = self.health.get(node, {})
        dead = {f"GPU-{node}-{i}" for i, (h, _) in bad.items() if h == "unhealthy"}
        shards = []
        for a in self.fleet.assignments_for(node):
            died = node in self.failing and bool(dead & set(a.gpus))
            broken = BROKEN in a.engine_args and a.replica_id in self.loaded
            error = "CUDA error: an illegal memory access" if died else None
            if broken:
                error = "engine exited with code 2: unknown argument --exit-at-start"
            state = "failed" if died or broken else "starting"
            if state == "starting" and a.replica_id in self.loaded:
                state = "ready"
            self.loaded.add(a.replica_id)
            shard = {
                "id": a.replica_id,
                "model": a.model,
                "rank": a.rank,
                "state": state,
                "gpus": a.gpus,
                "idle_seconds": 0.0,
                "error": error,
            }
            if state == "ready" and a.rank == 0:
                traffic = self.traffic(a.replica_id, a.model)
                if traffic is not None:
                    shard["traffic"] = traffic
            shards.append(shard)
        gpus = [
            gpu(node, i, health=bad[i][0], reason=bad[i][1]) if i in bad else gpu(node, i)
            for i in range(8)
        ]
        self.fleet.ingest(report(node, gpus=gpus, replicas=shards))

    def traffic(self, replica_id: str, model: str) -> dict[str, object] | None:
        """What a ready engine reports it served (None: nothing to say)."""
        return None

    def on(self, node: str) -> list[tuple[str, ReplicaState]]:
        return sorted((r.id, r.state) for r in self.fleet.facts.records.values() if node in r.nodes)
