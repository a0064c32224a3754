"""Did a sleep free the memory? (issue 32 item 3)

vLLM's `/sleep` has answered 200 while the memory stayed held (vllm #47654) and freed
a fraction of it (#32714), so the agent does not take the answer's word: it reads what
the engine's processes hold on each of its cards (NVML's running processes, through
`GpuSource.processes`; the fake cards read the fake engines' files) just before the
sleep and again after it.

The rule, per card: asleep it holds at most `1 - min_freed` of what it held awake
(the template's `SleepMode.min_freed`, 0.9 by default: a 16 GiB engine may keep
1.6 GiB, which a CUDA context and vLLM's level-1 leftovers fit in). Every card must
pass: placement shares cards one by one. A card on which none of the engine's
processes were seen awake cannot be judged (NVML lists host PIDs, which a container
with its own PID namespace does not see), and neither can an engine none of whose
cards could be: the sleep is then taken at its word, and said so once in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.agent.engine_proc import group_of
from llmgw.agent.fake_process_memory import ProcessMemory

CardMemory = Callable[[], Sequence[ProcessMemory]]


def held_by_group(
    processes: Iterable[ProcessMemory], group: int, gpus: Sequence[str]
) -> dict[str, int]:
    """MiB the processes of one process group hold on each of `gpus` (0: none seen)."""
    held = dict.fromkeys(gpus, 0)
    groups: dict[int, int | None] = {}
    for p in processes:
        if p.gpu_uuid not in held:
            continue
        if p.pid not in groups:
            groups[p.pid] = group_of(p.pid)
        if groups[p.pid] == group:
            held[p.gpu_uuid] += p.used_mib
    return held


@dataclass(frozen=True)
class MemoryKept:
    """A sleep that did not free what it should have, on one card: the figures."""

    gpu_uuid: str
    awake_mib: int
    asleep_mib: int
    min_freed: float

    @property
    def message(self) -> str:
        freed = 1 - self.asleep_mib / self.awake_mib
        return (
            f"its sleep answered 200 but its processes still hold {self.asleep_mib} MiB of "
            f"{self.awake_mib} MiB on {self.gpu_uuid} ({freed:.0%} freed; at least "
            f"{self.min_freed:.0%} must be)"
        )


def judge(
    awake: Mapping[str, int], asleep: Mapping[str, int], min_freed: float
) -> MemoryKept | None:
    """The first card (by uuid) on which too little was freed; None: every card
    that can be judged freed enough."""
    for uuid in sorted(awake):
        before = awake[uuid]
        if before <= 0:
            continue  # nothing of the engine seen there awake: cannot judge
        after = asleep.get(uuid, 0)
        if after > before * (1 - min_freed):
            return MemoryKept(uuid, before, after, min_freed)
    return None


def judgeable(awake: Mapping[str, int]) -> bool:
    return any(v > 0 for v in awake.values())
