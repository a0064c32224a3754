"""Simulated per-process GPU memory: what NVML's running-process list says on a real card.

A fake engine holds no card, so something must play the driver's part: each fake
engine started with `LLMGW_FAKE_GPU_MEMORY_DIR` in its environment writes one file,
`<dir>/<pid>.json`, with the cards it was given (CUDA_VISIBLE_DEVICES) and the MiB it
holds on each, rewritten whenever that changes (a sleep, a wake). The fake GPUs read
the directory as NVML's `nvmlDeviceGetComputeRunningProcesses` would be read. What an
engine *says* over HTTP (`/sleep` answered 200) and what it *holds* are two things, as
on a real card: the fault `--sleep-keeps-memory` answers the sleep and keeps the memory.

Files of processes that no longer run are ignored (a killed engine cannot clean up,
and the driver frees a dead process's memory). No heavy imports: the fake engine
imports this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "LLMGW_FAKE_GPU_MEMORY_DIR"


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory on one card, as NVML lists it."""

    pid: int
    gpu_uuid: str
    used_mib: int


def write(directory: Path, pid: int, gpus: Sequence[str], used_mib: int) -> None:
    """Say (atomically) that `pid` holds `used_mib` on each of `gpus`."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{pid}.json.tmp"
    tmp.write_text(json.dumps({"gpus": list(gpus), "used_mib": used_mib}), encoding="utf-8")
    os.replace(tmp, directory / f"{pid}.json")


def forget(directory: Path, pid: int) -> None:
    """The process ends: its memory is released."""
    (directory / f"{pid}.json").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(directory: Path) -> list[ProcessMemory]:
    """Every live process's memory per card, sorted by card then pid; unreadable files skipped."""
    out: list[ProcessMemory] = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return out
    for path in paths:
        if not path.stem.isdigit() or not _alive(pid := int(path.stem)):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            gpus, used = data["gpus"], data["used_mib"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(used, int) and isinstance(gpus, list):
            out.extend(ProcessMemory(pid, str(g), used) for g in gpus)
    return sorted(out, key=lambda p: (p.gpu_uuid, p.pid))
