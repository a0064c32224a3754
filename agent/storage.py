"""Storage observation: which complete model weights sit in the directories
the agent was told to look in (`--storage PATH[:local|:shared]`).

The agent observes, it does not manage. A node told nothing reports nothing
(`storage_configured` false, no locations), which ranks exactly like a node
that looked and found nothing.

Layouts found in each directory:

- plain: `<dir>/<name>/` or `<dir>/<org>/<name>/` holding `config.json` and
  weights (a GGUF-only directory needs no config.json), named by the relative
  path (`name` or `org/name`);
- Hugging Face cache: `<dir>/models--org--name/` (or `<dir>/hub/models--...`
  when pointed at the HF home), resolved through `refs/main`
  (else the only ref, else the only snapshot) to `snapshots/<commit>/`, named
  `org/name`. Any `blobs/*.incomplete` means a download is in progress.

A directory given with `--storage` that is itself a model directory is found
as one model, named by its basename.

Directories that look like a model but are not usable go to `incomplete`,
with the reason.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from llmgw.agent.adapters import AdapterVerdict, check_adapter_dir, is_adapter_dir
from llmgw.agent.mounts import Mount, classify, read_mountinfo
from llmgw.agent.weights import FileCache, Verdict, check_model_dir
from llmgw.wire import (
    AdapterFound,
    ModelFound,
    ModelIncomplete,
    ModelName,
    StorageLocation,
    StorageScope,
    printable,
)

MAX_PER_LOCATION = 4096  # the wire bounds each list
_MODEL_NAME: TypeAdapter[str] = TypeAdapter(ModelName)
_SKIP = {"lost+found"}
_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".gguf", ".incomplete")


@dataclass(frozen=True)
class StorageDir:
    path: str
    scope: StorageScope | None = None  # operator override


def parse_storage_arg(arg: str) -> StorageDir:
    """`PATH`, `PATH:local` or `PATH:shared` (a path may itself contain ':')."""
    path, sep, suffix = arg.rpartition(":")
    if sep and suffix in (StorageScope.LOCAL.value, StorageScope.SHARED.value):
        if not path:
            raise ValueError(f"--storage {arg!r}: missing the directory before ':{suffix}'")
        return StorageDir(path, StorageScope(suffix))
    if not arg:
        raise ValueError("--storage needs a directory")
    return StorageDir(arg)


def _valid_name(name: str) -> bool:
    try:
        _MODEL_NAME.validate_python(name)
    except ValidationError:
        return False
    return True


def _looks_like_model(directory: Path) -> bool:
    """Holds config.json or weight files directly (not in a subdirectory)."""
    if os.path.isfile(os.path.join(directory, "config.json")):
        return True  # the usual case, without listing the directory
    try:
        with os.scandir(directory) as it:
            return any(e.name == "config.json" or e.name.endswith(_WEIGHT_SUFFIXES) for e in it)
    except OSError:
        return False


def _subdirs(directory: Path) -> list[Path]:
    """Subdirectories (through symlinks), plus symlinks whose target is missing."""
    try:
        with os.scandir(directory) as it:
            return sorted(
                Path(e.path)
                for e in it
                if not e.name.startswith(".")
                and e.name not in _SKIP
                and (e.is_dir() or (e.is_symlink() and not os.path.exists(e.path)))
            )
    except OSError:
        return []


def _dangling(path: Path) -> Verdict | None:
    if path.is_symlink() and not path.exists():
        return Verdict(
            False, f"dangling symlink to {os.readlink(path)}: is its filesystem mounted?"
        )
    return None


def _is_empty(directory: Path) -> bool:
    try:
        with os.scandir(directory) as it:
            return next(it, None) is None
    except OSError:
        return False


@dataclass
class _Candidate:
    name: str
    path: Path  # what an engine would load
    verdict: Verdict
    adapter: AdapterVerdict | None = None  # a LoRA adapter directory (issue 33)


class StorageScanner:
    """Scans the configured directories; keeps the per-file cache across scans."""

    def __init__(
        self, dirs: Sequence[StorageDir], mountinfo: Path = Path("/proc/self/mountinfo")
    ) -> None:
        self.dirs = list(dirs)
        self.mountinfo = mountinfo
        self.cache = FileCache()
        # Told each scan's duration and how many files it looked at (agent metrics).
        self.on_scan: Callable[[float, int], None] | None = None

    @property
    def configured(self) -> bool:
        return bool(self.dirs)

    def scan(self) -> list[StorageLocation]:
        t0 = time.perf_counter()
        mounts = read_mountinfo(self.mountinfo) if self.dirs else []
        self.cache.touched.clear()
        locations = [self._scan_dir(d, mounts) for d in self.dirs]
        if self.on_scan is not None:
            self.on_scan(time.perf_counter() - t0, len(self.cache.touched))
        # Forget files that went away, so the cache cannot grow without bound.
        self.cache.prune(self.cache.touched)
        return locations

    def _scan_dir(self, sdir: StorageDir, mounts: list[Mount]) -> StorageLocation:
        placement = classify(sdir.path, mounts, sdir.scope)
        mount = placement.mount
        common: dict[str, Any] = {
            "path": sdir.path,
            "fs_type": mount.fs_type[:256] if mount else "",
            "scope": placement.scope,
            "scope_overridden": placement.overridden,
            "mount_source": mount.source[:4096] if mount else "",
            "mount_point": mount.mount_point if mount else None,
        }
        root = Path(sdir.path)
        error = None
        if not root.exists():
            error = "directory does not exist"
        elif not root.is_dir():
            error = "not a directory"
        elif not os.access(root, os.R_OK | os.X_OK):
            error = "permission denied: the agent cannot read this directory"
        if error:
            return StorageLocation(**common, error=error)

        found: list[ModelFound] = []
        incomplete: list[ModelIncomplete] = []
        adapters: list[AdapterFound] = []
        for cand in self._candidates(root):
            if cand.adapter is not None and cand.adapter.complete and _valid_name(cand.name):
                a = cand.adapter
                adapters.append(
                    AdapterFound(
                        name=cand.name,
                        path=printable(str(cand.path)),
                        rank=a.rank,
                        base=printable(a.base) if a.base else None,
                        size_bytes=a.size_bytes,
                    )
                )
            elif cand.adapter is None and cand.verdict.complete and _valid_name(cand.name):
                found.append(
                    ModelFound(
                        name=cand.name,
                        path=printable(str(cand.path)),
                        format=cand.verdict.format,
                        size_bytes=cand.verdict.size_bytes,
                        files=cand.verdict.files,
                    )
                )
            else:
                reason = cand.verdict.reason or "not usable as a model name"
                incomplete.append(
                    # A directory name may hold any byte: shown escaped, never refused.
                    ModelIncomplete(
                        name=printable(cand.name)[:256],
                        path=printable(str(cand.path)),
                        reason=printable(reason, keep_lines=True)[:4096],
                    )
                )
        return StorageLocation(
            **common,
            models=found[:MAX_PER_LOCATION],
            incomplete=incomplete[:MAX_PER_LOCATION],
            adapters=adapters[:MAX_PER_LOCATION],
        )

    def _adapter(self, name: str, path: Path) -> _Candidate:
        verdict = check_adapter_dir(path, self.cache)
        return _Candidate(name, path, Verdict(verdict.complete, verdict.reason), verdict)

    def _candidates(self, root: Path) -> Iterator[_Candidate]:
        if is_adapter_dir(root):
            yield self._adapter(root.name, root)
            return
        if _looks_like_model(root):
            # Pointed straight at one model directory: named by its basename.
            yield _Candidate(root.name, root, check_model_dir(root, self.cache))
            return
        for top in _subdirs(root):
            rel = top.name
            if (broken := _dangling(top)) is not None:
                yield _Candidate(rel, top, broken)
            elif rel.startswith("models--"):
                yield self._hf_repo(top)
            elif rel.startswith(("datasets--", "spaces--")):
                continue
            elif is_adapter_dir(top):
                yield self._adapter(rel, top)
            elif _looks_like_model(top):
                yield _Candidate(rel, top, check_model_dir(top, self.cache))
            else:
                inner = _subdirs(top)
                if not inner:
                    why = "empty directory" if _is_empty(top) else "no config.json and no weights"
                    yield _Candidate(rel, top, Verdict(False, why))
                for sub in inner:
                    name = f"{rel}/{sub.name}"
                    if (broken := _dangling(sub)) is not None:
                        yield _Candidate(name, sub, broken)
                    elif sub.name.startswith("models--"):
                        # <dir>/hub/models--org--name: pointed at the HF home, not hub/
                        yield self._hf_repo(sub)
                    elif sub.name.startswith(("datasets--", "spaces--")):
                        continue
                    elif is_adapter_dir(sub):
                        yield self._adapter(name, sub)
                    elif _looks_like_model(sub) or _is_empty(sub):
                        yield _Candidate(name, sub, check_model_dir(sub, self.cache))
                    else:
                        yield _Candidate(name, sub, Verdict(False, "no config.json and no weights"))

    def _hf_repo(self, repo: Path) -> _Candidate:
        parts = repo.name.split("--", 2)
        name = "/".join(parts[1:]) if len(parts) > 1 else repo.name
        snapshot, why = _hf_snapshot(repo)
        if snapshot is None:
            return _Candidate(name, repo, Verdict(False, why))
        try:
            partial = sorted(p.name for p in (repo / "blobs").glob("*.incomplete"))
        except OSError:
            partial = []
        if partial:
            return _Candidate(
                name,
                snapshot,
                Verdict(False, f"download in progress: {len(partial)} .incomplete blob(s)"),
            )
        return _Candidate(name, snapshot, check_model_dir(snapshot, self.cache))


_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")


def _hf_snapshot(repo: Path) -> tuple[Path | None, str]:
    """The snapshot `refs/main` points at (else the only ref, else the only snapshot)."""
    snapshots = repo / "snapshots"
    refs = repo / "refs"
    ref_files = sorted(p for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []
    chosen = refs / "main" if (refs / "main").is_file() else None
    if chosen is None and len(ref_files) == 1:
        chosen = ref_files[0]
    if chosen is not None:
        try:
            commit = chosen.read_text().strip()
        except OSError as exc:
            return None, f"cannot read {chosen.relative_to(repo)}: {exc.strerror or exc}"
        if not _COMMIT.match(commit):
            return None, f"{chosen.relative_to(repo)} does not hold a commit hash"
        target = snapshots / commit
        if not target.is_dir():
            return (
                None,
                f"{chosen.relative_to(repo)} points at snapshot {commit[:12]}, which is missing",
            )
        return target, ""
    existing = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    if len(existing) == 1:
        return existing[0], ""
    if not existing:
        return None, "no snapshot yet: download not started or not finished"
    return None, "several snapshots and no refs/main to choose one"


def local_adapters(locations: Sequence[StorageLocation]) -> Mapping[str, str]:
    """Adapter name -> a local path holding it complete (first location wins)."""
    out: dict[str, str] = {}
    for location in locations:
        for adapter in location.adapters:
            out.setdefault(adapter.name, adapter.path)
    return out


def local_weights(locations: Sequence[StorageLocation]) -> Mapping[str, str]:
    """Model name -> a local path holding complete weights (first location wins)."""
    out: dict[str, str] = {}
    for location in locations:
        for model in location.models:
            out.setdefault(model.name, model.path)
    return out
