"""Every storage rule, with real files on disk."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from llmgw.agent.sample_models import write_model, write_safetensors
from llmgw.agent.storage import StorageDir, StorageScanner, local_weights, parse_storage_arg
from llmgw.agent.weights import check_safetensors
from llmgw.wire import StorageLocation, StorageScope


def scan_one(directory: Path, scope: StorageScope | None = None) -> StorageLocation:
    (location,) = StorageScanner([StorageDir(str(directory), scope)]).scan()
    return location


def found(location: StorageLocation) -> dict[str, str]:
    return {m.name: m.path for m in location.models}


def reasons(location: StorageLocation) -> dict[str, str]:
    return {m.name: m.reason for m in location.incomplete}


# -- configuration ----------------------------------------------------------------


def test_not_configured_reports_nothing() -> None:
    scanner = StorageScanner([])
    assert not scanner.configured
    assert scanner.scan() == []


@pytest.mark.parametrize(
    ("arg", "path", "scope"),
    [
        ("/models", "/models", None),
        ("/models:shared", "/models", StorageScope.SHARED),
        ("/models:local", "/models", StorageScope.LOCAL),
        ("/odd:name", "/odd:name", None),
        ("/odd:name:shared", "/odd:name", StorageScope.SHARED),
    ],
)
def test_storage_argument(arg: str, path: str, scope: StorageScope | None) -> None:
    assert parse_storage_arg(arg) == StorageDir(path, scope)


@pytest.mark.parametrize("arg", ["", ":shared"])
def test_bad_storage_argument(arg: str) -> None:
    with pytest.raises(ValueError, match="--storage"):
        parse_storage_arg(arg)


def test_missing_directory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    location = scan_one(tmp_path / "nope")
    assert location.error == "directory does not exist" and location.models == []
    (tmp_path / "file").write_text("x")
    assert scan_one(tmp_path / "file").error == "not a directory"


def test_empty_storage_directory_finds_nothing(tmp_path: Path) -> None:
    location = scan_one(tmp_path)
    assert location.error is None and location.models == [] and location.incomplete == []


# -- layouts ------------------------------------------------------------------------


def test_plain_layouts_named_by_relative_path(tmp_path: Path) -> None:
    write_model(tmp_path / "tiny")
    write_model(tmp_path / "meta-llama" / "Llama-3-8B", shards=3)
    write_model(tmp_path / "meta-llama" / "Llama-3-70B", shards=2)
    location = scan_one(tmp_path)
    assert found(location) == {
        "tiny": str(tmp_path / "tiny"),
        "meta-llama/Llama-3-8B": str(tmp_path / "meta-llama" / "Llama-3-8B"),
        "meta-llama/Llama-3-70B": str(tmp_path / "meta-llama" / "Llama-3-70B"),
    }
    assert location.incomplete == []
    m = next(m for m in location.models if m.name == "meta-llama/Llama-3-8B")
    assert m.format == "safetensors" and m.files == 5  # config, index, 3 shards
    assert m.size_bytes == sum(p.stat().st_size for p in Path(m.path).iterdir())


def test_storage_pointed_at_one_model_directory(tmp_path: Path) -> None:
    write_model(tmp_path / "Llama-3-8B", shards=2)
    location = scan_one(tmp_path / "Llama-3-8B")
    assert found(location) == {"Llama-3-8B": str(tmp_path / "Llama-3-8B")}


def test_hidden_and_lost_found_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "lost+found").mkdir()
    (tmp_path / ".trash").mkdir()
    write_model(tmp_path / ".trash" / "old")
    location = scan_one(tmp_path)
    assert location.models == [] and location.incomplete == []


def hf_repo(
    cache: Path, repo: str, commit: str = "a" * 40, *, ref: bool = True, shards: int = 2
) -> Path:
    """The Hugging Face hub cache layout: blobs, snapshot symlinks, refs."""
    base = cache / ("models--" + repo.replace("/", "--"))
    staging = cache.parent / ".staging" / repo  # hidden: never scanned
    write_model(staging, shards=shards)
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (base / "blobs").mkdir(exist_ok=True)
    for i, f in enumerate(sorted(staging.iterdir())):
        blob = base / "blobs" / f"{i:064x}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    if ref:
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(commit)
    return snapshot


def test_hf_cache_resolved_through_refs(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = hf_repo(cache, "Qwen/Qwen2-7B")
    # an older snapshot that refs/main does not point at
    (cache / "models--Qwen--Qwen2-7B" / "snapshots" / ("b" * 40)).mkdir()
    location = scan_one(cache)
    assert found(location) == {"Qwen/Qwen2-7B": str(snapshot)}


def test_hf_home_with_hub_inside(tmp_path: Path) -> None:
    snapshot = hf_repo(tmp_path / "huggingface" / "hub", "org/m")
    (tmp_path / "huggingface" / "hub" / "datasets--org--d").mkdir()
    location = scan_one(tmp_path / "huggingface")
    assert found(location) == {"org/m": str(snapshot)}
    assert location.incomplete == []


def test_hf_cache_without_refs_uses_the_only_snapshot(tmp_path: Path) -> None:
    snapshot = hf_repo(tmp_path / "hub", "org/m", ref=False)
    assert found(scan_one(tmp_path / "hub")) == {"org/m": str(snapshot)}


def test_hf_download_in_progress_is_not_present(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    hf_repo(cache, "org/m")
    (cache / "models--org--m" / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"x")
    location = scan_one(cache)
    assert location.models == []
    assert "download in progress" in reasons(location)["org/m"]


def test_hf_ref_to_missing_snapshot(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    base = cache / "models--org--m"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("c" * 40)
    assert "missing" in reasons(scan_one(cache))["org/m"]


def test_hf_repo_with_no_snapshot_yet(tmp_path: Path) -> None:
    (tmp_path / "hub" / "models--org--m" / "blobs").mkdir(parents=True)
    assert "no snapshot yet" in reasons(scan_one(tmp_path / "hub"))["org/m"]


def test_hf_dangling_snapshot_link_is_not_present(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = hf_repo(cache, "org/m")
    os.unlink(os.path.realpath(snapshot / "model-00002-of-00002.safetensors"))
    assert "dangling symlink" in reasons(scan_one(cache))["org/m"]


# -- completeness ---------------------------------------------------------------------


def test_empty_directory_is_not_weights(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "org" / "empty").mkdir(parents=True)
    location = scan_one(tmp_path)
    assert location.models == []
    assert "empty directory" in reasons(location)["empty"]
    assert "empty directory" in reasons(location)["org/empty"]


def test_config_only_is_not_weights(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert reasons(scan_one(tmp_path)) == {
        "m": "config.json but no weight files (.safetensors or .gguf)"
    }


def test_weights_without_config_are_not_present(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "m" / "model.safetensors")
    assert "no config.json" in reasons(scan_one(tmp_path))["m"]


def test_missing_shard(tmp_path: Path) -> None:
    files = write_model(tmp_path / "m", shards=4)
    files[2].unlink()
    reason = reasons(scan_one(tmp_path))["m"]
    assert "missing shard model-00003-of-00004.safetensors" in reason
    assert "4 shard(s), 1 absent" in reason


def test_truncated_shard(tmp_path: Path) -> None:
    files = write_model(tmp_path / "m", shards=2, tensor_bytes=4096)
    size = files[1].stat().st_size
    os.truncate(files[1], size - 100)
    reason = reasons(scan_one(tmp_path))["m"]
    assert "truncated" in reason and files[1].name in reason


def test_single_file_truncated_in_header(tmp_path: Path) -> None:
    (path,) = write_model(tmp_path / "m")
    os.truncate(path, 20)
    assert "truncated inside its header" in reasons(scan_one(tmp_path))["m"]


def test_file_longer_than_header_says(tmp_path: Path) -> None:
    (path,) = write_model(tmp_path / "m")
    with open(path, "ab") as f:
        f.write(b"\0" * 10)
    assert "10 bytes more than its header describes" in reasons(scan_one(tmp_path))["m"]


def raw_safetensors(path: Path, length: int, header: bytes, data: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", length) + header + b"\0" * data)


@pytest.mark.parametrize(
    ("length", "header", "words"),
    [
        (200_000_000, b"{}", "exceeds 100 MB"),
        (8, b"not json", "not valid JSON"),
        (2, b"[]", "not a JSON object"),
        (
            len(b'{"t":{"data_offsets":[8,4]}}'),
            b'{"t":{"data_offsets":[8,4]}}',
            "bad data_offsets",
        ),
    ],
)
def test_bad_headers(tmp_path: Path, length: int, header: bytes, words: str) -> None:
    path = tmp_path / "x.safetensors"
    raw_safetensors(path, length, header)
    problem = check_safetensors(str(path), path.stat().st_size)
    assert problem is not None and words in problem


def test_short_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"abc")
    problem = check_safetensors(str(path), 3)
    assert problem is not None and "shorter than a safetensors header" in problem


def test_header_only_file_with_no_tensors_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    raw_safetensors(path, 2, b"{}")
    assert check_safetensors(str(path), path.stat().st_size) is None


def test_incomplete_file_means_download_in_progress(tmp_path: Path) -> None:
    write_model(tmp_path / "m")
    (tmp_path / "m" / "model-00002.safetensors.incomplete").write_bytes(b"")
    assert "download in progress" in reasons(scan_one(tmp_path))["m"]


def test_local_dir_download_in_progress(tmp_path: Path) -> None:
    write_model(tmp_path / "m")
    partial = tmp_path / "m" / ".cache" / "huggingface" / "download"
    partial.mkdir(parents=True)
    (partial / "model.safetensors.abc123.incomplete").write_bytes(b"")
    assert "download in progress" in reasons(scan_one(tmp_path))["m"]


def test_dangling_symlink(tmp_path: Path) -> None:
    write_model(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").symlink_to(tmp_path / "gone")
    assert "dangling symlink tokenizer.json" in reasons(scan_one(tmp_path))["m"]


def test_dangling_symlinked_model_directory(tmp_path: Path) -> None:
    write_model(tmp_path / "models" / "here")
    (tmp_path / "models" / "gone").symlink_to(tmp_path / "unmounted" / "gone")
    (tmp_path / "models" / "org").mkdir()
    (tmp_path / "models" / "org" / "gone").symlink_to(tmp_path / "unmounted" / "x")
    (tmp_path / "models" / "linked").symlink_to(tmp_path / "models" / "here")
    location = scan_one(tmp_path / "models")
    assert set(found(location)) == {"here", "linked"}
    assert "dangling symlink" in reasons(location)["gone"]
    assert "dangling symlink" in reasons(location)["org/gone"]


def test_index_naming_a_path_outside_is_refused(tmp_path: Path) -> None:
    write_model(tmp_path / "m", shards=2)
    index = {"weight_map": {"a": "../../etc/passwd"}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "outside the model directory" in reasons(scan_one(tmp_path))["m"]


def test_index_naming_a_non_safetensors_file(tmp_path: Path) -> None:
    write_model(tmp_path / "m", shards=2)
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"\0")
    index = {"weight_map": {"a": "pytorch_model.bin"}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "not a .safetensors file" in reasons(scan_one(tmp_path))["m"]


def test_garbled_index(tmp_path: Path) -> None:
    write_model(tmp_path / "m", shards=2)
    (tmp_path / "m" / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert "not valid JSON" in reasons(scan_one(tmp_path))["m"]


def test_pickle_only_weights_are_not_verified(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"\0" * 10)
    assert "PyTorch pickle" in reasons(scan_one(tmp_path))["m"]


def test_unusable_model_name_is_reported(tmp_path: Path) -> None:
    write_model(tmp_path / "my model")  # a space: not a model name the wire accepts
    location = scan_one(tmp_path)
    assert location.models == [] and "my model" in reasons(location)


# -- GGUF --------------------------------------------------------------------------------------


def gguf(path: Path, magic: bytes = b"GGUF") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(magic + b"\x03\0\0\0" + b"\0" * 32)


def test_gguf_single_file(tmp_path: Path) -> None:
    gguf(tmp_path / "llama-q4" / "llama-q4_k_m.gguf")
    location = scan_one(tmp_path)
    assert found(location) == {"llama-q4": str(tmp_path / "llama-q4")}
    assert location.models[0].format == "gguf"


def test_gguf_without_magic(tmp_path: Path) -> None:
    gguf(tmp_path / "m" / "x.gguf", magic=b"\0\0\0\0")
    assert "no GGUF magic" in reasons(scan_one(tmp_path))["m"]


def test_gguf_split_parts(tmp_path: Path) -> None:
    for i in (1, 2, 3):
        gguf(tmp_path / "m" / f"big-q8-0000{i}-of-00003.gguf")
    assert "m" in found(scan_one(tmp_path))
    (tmp_path / "m" / "big-q8-00002-of-00003.gguf").unlink()
    assert reasons(scan_one(tmp_path))["m"] == "missing GGUF part big-q8-00002-of-00003.gguf"


# -- scope and mount source --------------------------------------------------------------


def test_location_reports_scope_type_and_mount_source(tmp_path: Path) -> None:
    models = tmp_path / "filer"
    models.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"31 22 0:45 / {models} rw - nfs4 filer1:/export/models rw\n"
    )
    scanner = StorageScanner(
        [
            StorageDir(str(models)),
            StorageDir(str(tmp_path)),
            StorageDir(str(models), StorageScope.LOCAL),
        ],
        mountinfo,
    )
    shared, local, forced = scanner.scan()
    assert (shared.scope, shared.fs_type, shared.mount_source, shared.mount_point) == (
        StorageScope.SHARED,
        "nfs4",
        "filer1:/export/models",
        str(models),
    )
    assert not shared.scope_overridden
    assert (local.scope, local.fs_type, local.mount_source) == (
        StorageScope.LOCAL,
        "ext4",
        "/dev/sda1",
    )
    assert forced.scope is StorageScope.LOCAL and forced.scope_overridden


def test_local_weights_map_first_location_wins(tmp_path: Path) -> None:
    write_model(tmp_path / "a" / "m")
    write_model(tmp_path / "b" / "m")
    write_model(tmp_path / "b" / "n")
    locations = StorageScanner(
        [StorageDir(str(tmp_path / "a")), StorageDir(str(tmp_path / "b"))]
    ).scan()
    assert local_weights(locations) == {
        "m": str(tmp_path / "a" / "m"),
        "n": str(tmp_path / "b" / "n"),
    }


# -- cache ------------------------------------------------------------------------------------


def test_repeat_scan_reads_no_headers(tmp_path: Path) -> None:
    for i in range(3):
        write_model(tmp_path / f"m{i}", shards=4)
    scanner = StorageScanner([StorageDir(str(tmp_path))])
    first = scanner.scan()
    assert scanner.cache.reads == 3 * (1 + 4)  # each index and each shard once
    assert scanner.scan() == first
    assert scanner.cache.reads == 15


def test_changed_file_is_read_again(tmp_path: Path) -> None:
    files = write_model(tmp_path / "m", shards=2)
    scanner = StorageScanner([StorageDir(str(tmp_path))])
    assert found(scanner.scan()[0])
    reads = scanner.cache.reads
    os.truncate(files[0], files[0].stat().st_size - 4)  # same inode, new size
    location = scanner.scan()[0]
    assert scanner.cache.reads == reads + 1
    assert "truncated" in reasons(location)["m"]
    # Replaced by a complete file with the same name: a new inode, read again.
    tmp = files[0].with_suffix(".tmp")
    write_safetensors(tmp)
    tmp.replace(files[0])
    assert found(scanner.scan()[0]) == {"m": str(tmp_path / "m")}


def test_cache_forgets_deleted_files(tmp_path: Path) -> None:
    write_model(tmp_path / "m", shards=2)
    write_model(tmp_path / "gone", shards=2)
    scanner = StorageScanner([StorageDir(str(tmp_path))])
    scanner.scan()
    assert len(scanner.cache.entries) == 6
    for f in (tmp_path / "gone").iterdir():
        f.unlink()
    (tmp_path / "gone").rmdir()
    scanner.scan()
    assert len(scanner.cache.entries) == 3
