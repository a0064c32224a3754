"""`sleep_level: auto` (issue 32): which level an engine sleeps at, decided by the agent
of the node where it sleeps, when it sleeps, from two readings of that node.

Level 1 moves the weights to host memory (pinned) and wakes in well under a second;
level 2 drops them and reloads them from disk on waking (seconds). Level 1 is chosen
when this node's share of the weights fits in `HEADROOM` of the host memory available
now (/proc/meminfo's MemAvailable, the kernel's estimate of what can be had without
swapping): the weights are sized as the model's weight files on this node's disk (as
loaded, the same bytes in the same dtype), divided by the replica's nodes. Engines
already asleep at level 1 hold their weights in host memory, so MemAvailable counts
them already. Anything unknown (weights not on this node's disk, no /proc/meminfo)
chooses level 2: it never exhausts the host's memory, it only wakes slower.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADROOM = 0.8  # of MemAvailable: the rest for the page cache, the agent, other engines
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
GIB = 1024**3


def weights_bytes(path: str | None) -> int | None:
    """Bytes of the weight files under a model directory (None: not a directory here,
    or no weight file in it)."""
    if not path or not os.path.isdir(path):
        return None
    total, found = 0, False
    for root, _, files in os.walk(path):
        for name in files:
            if name.endswith(WEIGHT_SUFFIXES):
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    continue
                found = True
    return total if found else None


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def choose(weights: int | None, nnodes: int, available: int | None) -> tuple[int, str]:
    """(level, what it was based on, in words for the log)."""
    if weights is None:
        return 2, "level 2: the weights' size is not known on this node"
    if available is None:
        return 2, "level 2: the host's available memory is not known"
    share = weights / max(1, nnodes)
    fits = share <= HEADROOM * available
    return (1 if fits else 2), (
        f"level {1 if fits else 2}: this node's share of the weights, {share / GIB:.1f} GiB, "
        f"{'fits' if fits else 'does not fit'} in {HEADROOM:.0%} of the "
        f"{available / GIB:.1f} GiB of host memory available"
    )
