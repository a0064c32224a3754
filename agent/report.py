"""Build one NodeReport from what the agent observes right now."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from llmgw import __version__
from llmgw.agent.fabric import node_fabrics
from llmgw.agent.gpus import GpuSource
from llmgw.agent.storage import local_adapters, local_weights
from llmgw.wire import NodeReport, ReplicaReport, StorageLocation

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class StorageSource(Protocol):
    """A StorageScanner, or a StorageWatch that scans in worker threads."""

    @property
    def configured(self) -> bool: ...

    def scan(self) -> list[StorageLocation]: ...


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id: changes on every reboot, so the controller can tell."""
    try:
        return path.read_text().strip()[:256] or "unknown"
    except OSError:
        return "unknown"


@dataclass
class ReportBuilder:
    """Observes GPUs, fabrics and storage, and states them as one report.

    Blocking (NVML, sysfs and filesystem reads): the loop runs `build` in a
    worker thread.
    """

    node: str
    gpus: GpuSource
    storage: StorageSource
    interval_s: float = 5.0
    fabrics: Sequence[str] = ()  # configured; derived from sysfs when empty
    sysfs_root: Path = Path("/sys")
    address: str | None = None
    boot_id: str = field(default_factory=read_boot_id)
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    last_storage: list[StorageLocation] = field(default_factory=list)
    engines: Sequence[str] | None = None  # template names the engine supervisor has

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    def build(self, replicas: Sequence[ReplicaReport] = ()) -> NodeReport:
        scan = self.gpus.scan()
        self.last_storage = self.storage.scan() if self.storage.configured else []
        return NodeReport(
            node=self.node,
            agent_version=__version__,
            boot_id=self.boot_id,
            interval_s=self.interval_s,
            uptime_s=max(0.0, self.clock() - self.started),
            address=self.address,
            gpus=scan.gpus,
            gpu_error=scan.error,
            fabrics=node_fabrics(self.fabrics, self.sysfs_root)[:16],
            storage_configured=self.storage.configured,
            storage=self.last_storage,
            replicas=list(replicas),
            engines=None if self.engines is None else sorted(self.engines)[:64],
        )

    def local_adapters(self) -> Mapping[str, str]:
        """Adapter name -> local path, from the latest storage scan."""
        return local_adapters(self.last_storage)

    def local_weights(self) -> Mapping[str, str]:
        """Model name -> local path, from the latest storage scan."""
        return local_weights(self.last_storage)
