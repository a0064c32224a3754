"""Builders for reports and fleets used by the controller tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.store import Store
from llmgw.controller.term import Term
from llmgw.wire import NodeReport

WALL_EPOCH = 1_790_000_000.0


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make_fleet(state_dir: Path, clock: FakeClock, **settings: Any) -> Term:
    return Term.begin(
        Store(state_dir),
        ControllerSettings(state_dir=state_dir, **settings),
        clock=clock,
        wall=lambda: WALL_EPOCH + clock.t,
    )


def gpu(
    node: str,
    index: int,
    cls: str = "H100-SXM-80GB",
    health: str = "healthy",
    in_use: bool = False,
    reason: str | None = None,
) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "gpu_class": cls,
        "memory_total_mib": 81920,
        "health": health,
        "health_reason": reason,
        "in_use": in_use,
    }


def report(
    node: str,
    *,
    gpus: Sequence[dict[str, Any]] | None = None,
    n_gpus: int = 8,
    fabrics: Sequence[str] = ("ib-a",),
    storage: Sequence[dict[str, Any]] | None = None,
    replicas: Sequence[dict[str, Any]] = (),
    interval_s: float = 5.0,
) -> NodeReport:
    return NodeReport.model_validate(
        {
            "node": node,
            "agent_version": "test",
            "boot_id": "boot-1",
            "interval_s": interval_s,
            "gpus": list(gpus) if gpus is not None else [gpu(node, i) for i in range(n_gpus)],
            "fabrics": list(fabrics),
            "storage_configured": storage is not None,
            "storage": list(storage or []),
            "replicas": list(replicas),
        }
    )


def location(
    path: str, models: Sequence[str], scope: str = "local", source: str = "/dev/nvme0n1"
) -> dict[str, Any]:
    return {
        "path": path,
        "fs_type": "nfs4" if scope == "shared" else "ext4",
        "scope": scope,
        "mount_source": source,
        "models": [
            {"name": m, "path": f"{path}/{m}", "size_bytes": 1000, "files": 3} for m in models
        ],
    }
