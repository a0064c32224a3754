from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.mounts import (
    Mount,
    classify,
    find_mount,
    is_shared_type,
    parse_mountinfo,
    unescape,
)
from llmgw.wire import StorageScope

# A realistic mount table: root on ext4, a docker overlay, NFS, Lustre, FUSE
# filesystems (network and local), a path with a space, and a stacked mount.
MOUNTINFO = """\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
30 22 259:3 / /data rw,relatime shared:5 - xfs /dev/nvme1n1 rw
31 22 0:45 / /data2 rw,relatime shared:6 - nfs4 filer1:/export/models rw,vers=4.2
40 22 0:50 / /lustre rw,relatime shared:7 - lustre 10.0.0.1@o2ib:/scratch rw,flock
41 22 0:51 / /mnt/juice rw,relatime shared:8 - fuse.juicefs redis://meta:6379/1 rw
42 22 0:52 / /var/lib/lxcfs rw,relatime shared:9 - fuse.lxcfs lxcfs rw
43 22 0:53 / /mnt/my\\040models rw,relatime shared:10 - nfs filer2:/exp\\040ort rw
50 22 0:60 / /stack rw,relatime shared:11 - ext4 /dev/sdb1 rw
51 50 0:61 / /stack rw,relatime shared:12 - nfs filer3:/stacked rw
60 22 0:70 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw,lowerdir=/a
61 22 0:71 /sub /mnt/s3 rw - fuse.s3fs s3fs rw
62 22 0:72 / /mnt/weird rw - wibblefs thing rw
garbage line that is not mountinfo
"""


@pytest.fixture
def mounts() -> list[Mount]:
    return parse_mountinfo(MOUNTINFO)


def test_parses_fields_and_skips_garbage(mounts: list[Mount]) -> None:
    assert len(mounts) == 13
    nfs = next(m for m in mounts if m.mount_point == "/data2")
    assert (nfs.fs_type, nfs.source, nfs.mount_id, nfs.parent_id) == (
        "nfs4",
        "filer1:/export/models",
        31,
        22,
    )


def test_octal_escapes_are_decoded(mounts: list[Mount]) -> None:
    assert unescape(r"a\040b\011c\134d\012e") == "a b\tc\\d\ne"
    m = find_mount("/mnt/my models/llama", mounts)
    assert m is not None and m.mount_point == "/mnt/my models" and m.source == "filer2:/exp ort"


@pytest.mark.parametrize(
    ("path", "mount_point", "fs_type"),
    [
        ("/data/models", "/data", "xfs"),
        ("/data", "/data", "xfs"),
        ("/data2/models", "/data2", "nfs4"),  # /data is not a prefix of /data2
        ("/datax/models", "/", "ext4"),
        ("/lustre/team/m", "/lustre", "lustre"),
        ("/stack/m", "/stack", "nfs"),  # topmost of the stacked mounts
        (
            "/var/lib/docker/overlay2/abc/merged/models",
            "/var/lib/docker/overlay2/abc/merged",
            "overlay",
        ),
        ("/", "/", "ext4"),
    ],
)
def test_longest_whole_component_prefix(
    mounts: list[Mount],
    path: str,
    mount_point: str,
    fs_type: str,
) -> None:
    m = find_mount(path, mounts)
    assert m is not None and (m.mount_point, m.fs_type) == (mount_point, fs_type)


def test_stacked_mount_topmost_even_when_listed_first() -> None:
    text = (
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "51 50 0:61 / /stack rw - nfs filer3:/top rw\n"
        "50 22 0:60 / /stack rw - ext4 /dev/sdb1 rw\n"
    )
    m = find_mount("/stack/x", parse_mountinfo(text))
    assert m is not None and m.source == "filer3:/top"


@pytest.mark.parametrize(
    ("fs_type", "shared"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("lustre", True),
        ("gpfs", True),
        ("beegfs", True),
        ("cifs", True),
        ("smb3", True),
        ("ceph", True),
        ("wekafs", True),
        ("virtiofs", True),
        ("9p", True),
        ("fuse.juicefs", True),
        ("fuse.s3fs", True),
        ("fuse.rclone", True),
        ("fuse.gcsfuse", True),
        ("fuse.sshfs", True),
        ("fuse.ceph-fuse", True),
        ("ext4", False),
        ("xfs", False),
        ("btrfs", False),
        ("zfs", False),
        ("overlay", False),
        ("tmpfs", False),
        ("fuse", False),
        ("fuse.lxcfs", False),
        ("fuse.fuse-overlayfs", False),
        ("wibblefs", False),  # unknown counts as local
        ("", False),
    ],
)
def test_shared_types(fs_type: str, shared: bool) -> None:
    assert is_shared_type(fs_type) is shared


def test_classify_uses_the_realpath(tmp_path: Path) -> None:
    # A symlink on local disk pointing into the NFS mount is on the NFS mount.
    table = parse_mountinfo(
        f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n31 22 0:45 / {tmp_path}/filer rw - nfs f:/e rw\n"
    )
    (tmp_path / "filer" / "models").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "filer" / "models")
    placed = classify(str(tmp_path / "link"), table)
    assert placed.scope is StorageScope.SHARED and placed.mount is not None
    assert placed.mount.source == "f:/e" and placed.realpath == str(tmp_path / "filer" / "models")


def test_operator_override_wins(mounts: list[Mount]) -> None:
    assert classify("/data2/m", mounts).scope is StorageScope.SHARED
    forced = classify("/data2/m", mounts, StorageScope.LOCAL)
    assert forced.scope is StorageScope.LOCAL and forced.overridden
    assert forced.mount is not None and forced.mount.source == "filer1:/export/models"
    assert classify("/data/m", mounts, StorageScope.SHARED).scope is StorageScope.SHARED
    assert classify("/mnt/weird/m", mounts).scope is StorageScope.LOCAL


def test_no_mount_table_is_local() -> None:
    placed = classify("/anything", [])
    assert placed.scope is StorageScope.LOCAL and placed.mount is None
