"""Is a model directory's set of weight files complete?

A model is present only when its weights are complete (DESIGN.md, storage rule
2): otherwise placement sends work to a node whose engine then fails to load.
Each check returns None when fine, or a reason an operator can act on.

File checks are cached by (inode, size, mtime_ns), so a repeat scan of an
unchanged directory re-reads no headers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
GGUF_MAGIC = b"GGUF"
_GGUF_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$")

FileKey = tuple[int, int, int]


def file_key(st: os.stat_result) -> FileKey:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class FileCache:
    """Per-file results keyed by path, valid while (inode, size, mtime) hold."""

    entries: dict[str, tuple[FileKey, object]]
    touched: set[str]  # paths asked for since the last prune
    reads: int = 0  # how many files were actually opened (for tests and the bench)

    def __init__(self) -> None:
        self.entries = {}
        self.touched = set()
        self.reads = 0

    def get(self, path: str, st: os.stat_result, compute: Callable[[str, int], object]) -> object:
        key = (st.st_ino, st.st_size, st.st_mtime_ns)  # file_key, inlined: hot path
        self.touched.add(path)
        hit = self.entries.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        self.reads += 1
        value = compute(path, st.st_size)
        self.entries[path] = (key, value)
        return value

    def prune(self, keep: set[str]) -> None:
        if len(keep) == len(self.entries) and keep.issuperset(self.entries):
            return  # the common case: nothing went away
        for path in [p for p in self.entries if p not in keep]:
            del self.entries[path]


def check_safetensors(path: str, size: int) -> str | None:
    """8-byte LE header length, a JSON header, and a size that matches it."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return f"{name}: truncated ({size} bytes, shorter than a safetensors header)"
            length = int.from_bytes(raw, "little")
            if length > MAX_HEADER_BYTES:
                return f"{name}: not safetensors (header length {length} exceeds 100 MB)"
            if size < 8 + length:
                return f"{name}: truncated inside its header ({size} bytes)"
            header = json.loads(f.read(length))
    except OSError as exc:
        return f"{name}: unreadable ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return f"{name}: header is not valid JSON (corrupt or not safetensors)"
    if not isinstance(header, dict):
        return f"{name}: header is not a JSON object"
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            return f"{name}: tensor {key!r} has bad data_offsets"
        end = max(end, offsets[1])
    expected = 8 + length + end
    if size < expected:
        return f"{name}: truncated ({size} of {expected} bytes): download not finished?"
    if size > expected:
        return f"{name}: {size - expected} bytes more than its header describes"
    return None


def check_gguf_magic(path: str, size: int) -> str | None:
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"{name}: unreadable ({exc.strerror or exc})"
    if magic != GGUF_MAGIC:
        return f"{name}: no GGUF magic (truncated or not a GGUF file)"
    return None


def gguf_missing_parts(names: set[str]) -> list[str]:
    """Split GGUF parts (`x-00001-of-00003.gguf`) that the set lacks."""
    missing: list[str] = []
    for name in sorted(names):
        match = _GGUF_SPLIT.match(name)
        if not match:
            continue
        stem, total = match.group("stem"), int(match.group("total"))
        width = len(match.group("total"))
        for part in range(1, total + 1):
            wanted = f"{stem}-{part:0{width}d}-of-{total:0{width}d}.gguf"
            if wanted not in names and wanted not in missing:
                missing.append(wanted)
    return missing


@dataclass
class Verdict:
    """What one model directory holds."""

    complete: bool
    reason: str | None  # why not, when not
    format: str = "safetensors"
    size_bytes: int = 0
    files: int = 0


def _first(reasons: list[str]) -> str:
    more = len(reasons) - 1
    return reasons[0] + (f" (and {more} more problem(s))" if more else "")


def check_model_dir(directory: Path, cache: FileCache) -> Verdict:
    """Check one model directory (a plain one, or an HF snapshot)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return Verdict(False, f"cannot list the directory: {exc.strerror or exc}")
    try:
        return _check_listed(directory, fd, cache)
    finally:
        os.close(fd)


def _check_listed(directory: Path | str, fd: int, cache: FileCache) -> Verdict:
    try:
        entries = os.listdir(fd)
    except OSError as exc:
        return Verdict(False, f"cannot list the directory: {exc.strerror or exc}")
    if not entries:
        return Verdict(False, "empty directory: no config.json and no weight files")

    # One pass: the stat (the cost floor of a scan) and the sorting by kind.
    # This loop runs once per file per scan, so it stays lean: names and
    # stat relative to the open directory, no per-entry objects.
    prefix = os.path.join(directory, "")
    names: set[str] = set()
    stats: dict[str, os.stat_result] = {}  # weight files and indexes only
    dangling: list[str] = []
    incomplete: list[str] = []
    indexes: list[str] = []
    shards: list[str] = []
    ggufs: list[str] = []
    size = 0
    stat = os.stat
    for name in entries:
        try:
            st = stat(name, dir_fd=fd)  # follows symlinks, as an engine would
        except OSError:
            with contextlib.suppress(OSError):
                if os.lstat(name, dir_fd=fd).st_mode & 0o170000 == 0o120000:
                    dangling.append(name)
            continue
        if st.st_mode & 0o170000 == 0o040000:  # a directory
            if name == ".cache":
                incomplete += _local_dir_downloads(Path(directory))
            continue
        names.add(name)
        size += st.st_size
        if name.endswith(".safetensors"):
            shards.append(name)
        elif name.endswith(".safetensors.index.json"):
            indexes.append(name)
        elif name.endswith(".gguf"):
            ggufs.append(name)
        elif name.endswith(".incomplete"):
            incomplete.append(name)
            continue
        else:
            continue
        stats[name] = st
    files = len(names)
    indexes.sort()
    shards.sort()
    ggufs.sort()

    if incomplete:
        return Verdict(
            False,
            f"download in progress: {sorted(incomplete)[0]} is still there",
            size_bytes=size,
            files=files,
        )
    if dangling:
        return Verdict(
            False,
            f"dangling symlink {sorted(dangling)[0]}: its target is missing",
            size_bytes=size,
            files=files,
        )

    has_config = "config.json" in names

    if indexes or shards:
        if not has_config:
            return Verdict(
                False, "safetensors weights but no config.json", size_bytes=size, files=files
            )
        wanted: set[str] = set(shards)
        for index in indexes:
            named = cache.get(prefix + index, stats[index], _index_shards)
            if isinstance(named, str):
                return Verdict(False, named, size_bytes=size, files=files)
            assert isinstance(named, frozenset)
            missing = sorted(s for s in named if s not in names)
            if missing:
                return Verdict(
                    False,
                    f"missing shard {missing[0]}: {index} names {len(named)} shard(s), "
                    f"{len(missing)} absent",
                    size_bytes=size,
                    files=files,
                )
            odd = sorted(s for s in named if s not in stats)
            if odd:  # e.g. an index naming .bin files
                return Verdict(
                    False,
                    f"{index} names {odd[0]}, which is not a .safetensors file",
                    size_bytes=size,
                    files=files,
                )
            wanted |= named
        reasons = []
        for shard in sorted(wanted):
            problem = cache.get(prefix + shard, stats[shard], check_safetensors)
            if problem is not None:
                reasons.append(str(problem))
        if reasons:
            return Verdict(False, _first(reasons), size_bytes=size, files=files)
        return Verdict(True, None, "safetensors", size, files)

    if ggufs:
        missing = gguf_missing_parts(names)
        if missing:
            return Verdict(
                False,
                f"missing GGUF part {missing[0]}",
                format="gguf",
                size_bytes=size,
                files=files,
            )
        reasons = [
            str(problem)
            for g in ggufs
            if (problem := cache.get(prefix + g, stats[g], check_gguf_magic)) is not None
        ]
        if reasons:
            return Verdict(False, _first(reasons), "gguf", size, files)
        return Verdict(True, None, "gguf", size, files)

    if any(n.endswith((".bin", ".pt", ".pth")) for n in names):
        return Verdict(
            False,
            "only PyTorch pickle weights (.bin/.pt): llmgw verifies safetensors and GGUF only",
            size_bytes=size,
            files=files,
        )
    if has_config:
        return Verdict(
            False,
            "config.json but no weight files (.safetensors or .gguf)",
            size_bytes=size,
            files=files,
        )
    return Verdict(False, "no config.json and no weight files", size_bytes=size, files=files)


def _local_dir_downloads(directory: Path) -> list[str]:
    """`huggingface-cli download --local-dir` keeps partial files under .cache/."""
    base = directory / ".cache" / "huggingface" / "download"
    found: list[str] = []
    try:
        for root, _dirs, files in os.walk(base):
            found += [
                os.path.relpath(os.path.join(root, f), directory)
                for f in files
                if f.endswith(".incomplete")
            ]
    except OSError:
        pass
    return found


def _index_shards(path: str, size: int) -> frozenset[str] | str:
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            index = json.load(f)
    except OSError as exc:
        return f"{name}: unreadable ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return f"{name}: not valid JSON (truncated?)"
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return f"{name}: has no weight_map"
    shards = {v for v in weight_map.values() if isinstance(v, str)}
    # A shard name must be a plain file name in the same directory.
    if any("/" in s or s in ("", ".", "..") for s in shards):
        return f"{name}: names a shard outside the model directory"
    return frozenset(shards)
