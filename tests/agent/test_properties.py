"""Properties of the pure parts: mount table, classes, completeness."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent.gpus import gpu_class
from llmgw.agent.mounts import Mount, find_mount, parse_mountinfo
from llmgw.agent.sample_models import write_safetensors
from llmgw.agent.weights import check_safetensors

component = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="/\0"),
    min_size=1,
    max_size=8,
).filter(lambda c: c not in (".", ".."))
paths = st.lists(component, min_size=1, max_size=4).map(lambda cs: "/" + "/".join(cs))


def escape(text: str) -> str:
    for ch, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        text = text.replace(ch, code)
    return text


@given(point=paths, source=paths, fs_type=st.sampled_from(["nfs4", "ext4", "fuse.s3fs"]))
def test_mountinfo_round_trips_any_path(point: str, source: str, fs_type: str) -> None:
    line = f"36 35 98:0 / {escape(point)} rw,noatime master:1 - {fs_type} {escape(source)} rw"
    (mount,) = parse_mountinfo(line)
    assert (mount.mount_point, mount.source, mount.fs_type) == (point, source, fs_type)


@given(points=st.lists(paths, max_size=8), path=paths)
def test_found_mount_is_the_longest_whole_component_prefix(points: list[str], path: str) -> None:
    mounts = [Mount(1, 0, "/", "ext4", "root")]
    mounts += [Mount(i + 2, 1, p, "nfs", f"s{i}") for i, p in enumerate(points)]
    found = find_mount(path, mounts)
    assert found is not None
    prefixes = [
        m.mount_point
        for m in mounts
        if m.mount_point == "/" or path == m.mount_point or path.startswith(m.mount_point + "/")
    ]
    assert found.mount_point in prefixes
    assert len(found.mount_point) == max(len(p) for p in prefixes)


@given(
    name=st.text(max_size=60),
    mib=st.integers(min_value=0, max_value=10**7),
)
def test_class_is_always_a_valid_wire_class(name: str, mib: int) -> None:
    cls = gpu_class(name, mib)
    assert 1 <= len(cls) <= 64
    assert re.fullmatch(r"[A-Z0-9.\-]+GB", cls) or len(cls) == 64


@settings(max_examples=40, deadline=None)
@given(tensors=st.integers(0, 6), nbytes=st.integers(4, 256), cut=st.integers(1, 64))
def test_any_truncation_of_a_valid_file_is_caught(tensors: int, nbytes: int, cut: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.safetensors"
        size = write_safetensors(path, tensors, nbytes)
        assert check_safetensors(str(path), size) is None
        short = max(0, size - cut)
        os.truncate(path, short)
        assert check_safetensors(str(path), short) is not None
