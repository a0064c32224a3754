"""Simulated GPUs for machines without them (`--fake-gpus`, `llmgw demo`).

Kept apart from `llmgw.agent.gpus`, the only module that touches NVML.
"""

from __future__ import annotations

import logging
import re
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent import fake_process_memory
from llmgw.agent.fake_process_memory import ProcessMemory
from llmgw.agent.gpus import GpuScan
from llmgw.wire import GpuHealth, GpuReport

log = logging.getLogger("llmgw.agent.fake_gpus")


@dataclass(frozen=True)
class FakeGroup:
    count: int
    gpu_class: str
    memory_mib: int
    unhealthy: frozenset[int] = frozenset()
    busy: frozenset[int] = frozenset()


def parse_fake_spec(spec: str) -> FakeGroup:
    """`COUNTxCLASS[,unhealthy=I,J...][,busy=I,J...]`, e.g. `8xH100-80GB,unhealthy=3`.

    Indices are 0-based within the group. The memory comes from a trailing
    `-NNGB` in the class (80 GiB otherwise).
    """
    head, *options = spec.split(",")
    match = re.fullmatch(r"(\d+)x([A-Za-z0-9][A-Za-z0-9._-]*)", head.strip())
    if not match:
        raise ValueError(f"--fake-gpus {spec!r}: expected COUNTxCLASS, e.g. 8xH100-80GB")
    count, cls = int(match.group(1)), match.group(2)
    if not 0 < count <= 256:
        raise ValueError(f"--fake-gpus {spec!r}: COUNT must be 1..256")
    mem = re.search(r"-(\d+)GB$", cls)
    memory_mib = int(mem.group(1)) * 1024 if mem else 80 * 1024
    sets: dict[str, set[int]] = {"unhealthy": set(), "busy": set()}
    current: str | None = None
    for option in options:
        option = option.strip()
        key, eq, value = option.partition("=")
        if eq:
            if key not in sets:
                raise ValueError(f"--fake-gpus {spec!r}: unknown option {key!r}")
            current, option = key, value
        if current is None or not option.isdigit():
            raise ValueError(f"--fake-gpus {spec!r}: expected unhealthy=I,J or busy=I,J")
        index = int(option)
        if index >= count:
            raise ValueError(f"--fake-gpus {spec!r}: index {index} is not below {count}")
        sets[current].add(index)
    return FakeGroup(count, cls, memory_mib, frozenset(sets["unhealthy"]), frozenset(sets["busy"]))


@dataclass
class FakeGpus:
    """Simulated cards, for machines without GPUs (and `llmgw demo`).

    UUIDs derive from the node name, so a restarted fake node keeps its cards.
    `unhealthy` and `in_use` can be changed at run time by the demo.
    """

    node: str
    groups: Sequence[FakeGroup]
    unhealthy: set[str] = field(default_factory=set)
    in_use: set[str] = field(default_factory=set)
    # Cards something runs on now (the demo: its engines' assigned cards), shown
    # busy with memory used, as NVML shows a card an engine holds.
    busy: Callable[[], Iterable[str]] | None = None
    # Where fake engines say what they hold (llmgw.agent.fake_process_memory): a card's used
    # memory is then the sum of its processes', as NVML counts it.
    memory_dir: Path | None = None
    _cards: list[tuple[str, str, int]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        index = 0
        for group in self.groups:
            for i in range(group.count):
                uid = "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{self.node}/gpu/{index}"))
                self._cards.append((uid, group.gpu_class, group.memory_mib))
                if i in group.unhealthy:
                    self.unhealthy.add(uid)
                if i in group.busy:
                    self.in_use.add(uid)
                index += 1

    @property
    def uuids(self) -> list[str]:
        return [uid for uid, _, _ in self._cards]

    def processes(self) -> list[ProcessMemory]:
        """Per process and card, the memory fake engines hold (NVML's running processes)."""
        if self.memory_dir is None:
            return []
        return [p for p in fake_process_memory.read(self.memory_dir) if p.gpu_uuid in self._uuids]

    @property
    def _uuids(self) -> frozenset[str]:
        return frozenset(self.uuids)

    def scan(self) -> GpuScan:
        gpus = []
        running = set(self.busy()) if self.busy is not None else set()
        held: dict[str, int] = {}
        for p in self.processes():
            held[p.gpu_uuid] = held.get(p.gpu_uuid, 0) + p.used_mib
        for index, (uid, cls, mem) in enumerate(self._cards):
            bad = uid in self.unhealthy
            busy = uid in self.in_use or uid in running or uid in held
            used = min(mem, held[uid]) if uid in held else mem * 9 // 10 if busy else 0
            gpus.append(
                GpuReport(
                    uuid=uid,
                    index=index,
                    name=f"simulated {cls}",
                    gpu_class=cls,
                    memory_total_mib=mem,
                    memory_used_mib=used,
                    utilization_pct=80 if busy else 0,
                    in_use=busy,
                    health=GpuHealth.UNHEALTHY if bad else GpuHealth.HEALTHY,
                    health_reason="simulated fault (--fake-gpus unhealthy=...)" if bad else None,
                )
            )
        return GpuScan(gpus)

    def close(self) -> None:
        return None


def read_fake_file(path: Path) -> list[FakeGroup]:
    """A fake-GPU file: one `--fake-gpus` spec per line; blank lines and `#`
    comments are skipped. ValueError (naming the file and line) when it is not."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--fake-gpus @{path}: cannot read it: {exc}") from exc
    groups = []
    for number, line in enumerate(text.splitlines(), 1):
        spec = line.split("#", 1)[0].strip()
        if spec:
            try:
                groups.append(parse_fake_spec(spec))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from exc
    if not groups:
        raise ValueError(f"--fake-gpus @{path}: no spec in it (one per line, e.g. 8xH100-80GB)")
    return groups


class FakeGpuFile:
    """`--fake-gpus @FILE`: simulated cards whose spec is read from FILE at every
    scan, so a test or a demo can fail a card (`unhealthy=3`) while the agent
    runs. A file that turns unreadable or invalid keeps the last good cards and
    is said once, until it reads well again. A card keeps its UUID across
    rewrites (UUIDs derive from the node and the card's index)."""

    def __init__(
        self,
        node: str,
        path: Path,
        busy: Callable[[], Iterable[str]] | None = None,
        memory_dir: Path | None = None,
    ) -> None:
        self.node, self.path, self.busy, self.memory_dir = node, path, busy, memory_dir
        self._groups = read_fake_file(path)  # the first reading must be good
        self._cards = FakeGpus(node, self._groups, busy=busy, memory_dir=memory_dir)
        self._problem: str | None = None

    def scan(self) -> GpuScan:
        try:
            groups = read_fake_file(self.path)
        except ValueError as exc:
            if str(exc) != self._problem:
                log.warning("%s; keeping the cards read before", exc)
                self._problem = str(exc)
        else:
            if self._problem is not None:
                log.info("--fake-gpus @%s reads well again", self.path)
                self._problem = None
            if groups != self._groups:
                self._groups = groups
                self._cards = FakeGpus(
                    self.node, groups, busy=self.busy, memory_dir=self.memory_dir
                )
        return self._cards.scan()

    def processes(self) -> list[ProcessMemory]:
        return self._cards.processes()

    def close(self) -> None:
        return None
