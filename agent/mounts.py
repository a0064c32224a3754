"""The mount table: which mount holds a directory, and is it shared or local.

Local storage must never be mistaken for shared (DESIGN.md, storage rule 3):
a filesystem type we do not know counts as local, and an operator override on
the directory wins over anything we read here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmgw.wire import StorageScope

# Network and cluster filesystems: a directory on one of these can be read by
# other nodes mounting the same source.
SHARED_FS_TYPES: frozenset[str] = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "fhgfs",
        "ceph",
        "glusterfs",
        "wekafs",
        "9p",
        "virtiofs",
        "gfs2",
        "ocfs2",
    }
)

# FUSE filesystems that front network storage. Other FUSE types (lxcfs,
# fuse-overlayfs, bindfs, ...) are local views and stay local.
SHARED_FUSE_TYPES: frozenset[str] = frozenset(
    {
        "juicefs",
        "s3fs",
        "rclone",
        "gcsfuse",
        "sshfs",
        "ceph-fuse",
        "ceph",
        "glusterfs",
        "goofys",
        "mountpoint-s3",
        "blobfuse2",
        "blobfuse",
        "alluxio-fuse",
        "lustre",
        "beegfs",
    }
)


@dataclass(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    mount_point: str
    fs_type: str
    source: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """Decode mountinfo's octal escapes (`\\040` is a space, `\\134` a backslash)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/self/mountinfo (proc(5)); lines we cannot read are skipped."""
    mounts: list[Mount] = []
    for line in text.split("\n"):  # not splitlines(): \x1e or \x85 may be in a path
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)  # optional fields end at a lone "-"
            mounts.append(
                Mount(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    mount_point=unescape(fields[4]),
                    fs_type=unescape(fields[sep + 1]),
                    source=unescape(fields[sep + 2]),
                )
            )
        except (ValueError, IndexError):
            continue
    return mounts


def read_mountinfo(path: Path = Path("/proc/self/mountinfo")) -> list[Mount]:
    try:
        return parse_mountinfo(path.read_text(errors="surrogateescape"))
    except OSError:
        return []


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point + "/")


def find_mount(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount holding `path` (already a realpath).

    The longest mount point that is a whole-component prefix (so /data2 is not
    under /data). When several mounts stack on one mount point, the topmost
    hides the others: the one no other mount there is stacked on, and of
    those, the latest in the table.
    """
    candidates = [m for m in mounts if _under(path, m.mount_point)]
    if not candidates:
        return None
    longest = max(len(m.mount_point) for m in candidates)
    stack = [m for m in candidates if len(m.mount_point) == longest]
    below = {m.parent_id for m in stack}
    top = [m for m in stack if m.mount_id not in below] or stack
    return top[-1]


def is_shared_type(fs_type: str) -> bool:
    if fs_type in SHARED_FS_TYPES:
        return True
    kind, dot, sub = fs_type.partition(".")
    return kind in ("fuse", "fuseblk") and bool(dot) and sub in SHARED_FUSE_TYPES


@dataclass(frozen=True)
class MountPlacement:
    """Where a storage directory lives, as the report states it."""

    realpath: str
    mount: Mount | None
    scope: StorageScope
    overridden: bool


def classify(
    directory: str, mounts: Iterable[Mount], override: StorageScope | None = None
) -> MountPlacement:
    real = os.path.realpath(directory)
    mount = find_mount(real, mounts)
    if override is not None:
        return MountPlacement(real, mount, override, True)
    shared = mount is not None and is_shared_type(mount.fs_type)
    return MountPlacement(real, mount, StorageScope.SHARED if shared else StorageScope.LOCAL, False)
