"""The small things a reader trips over (issue 23 item 14): what storage did not
count and why, text columns left-aligned, an empty list said on stderr, a delete
that says only what happens, one line per model."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from llmgw import api, render
from tests.ctl.ctl_support import AGENT, Controller, controller_process, ctl, ok, report

STORAGE = [
    {
        "path": "/models",
        "fs_type": "lustre",
        "scope": "shared",
        "mount_source": "filer1@tcp:/models",
        "models": [
            {"name": "org/a", "path": "/models/org/a", "size_bytes": 1},
            {"name": "org/bb", "path": "/models/org/bb", "size_bytes": 1},
        ],
        "incomplete": [
            {
                "name": "org/c",
                "path": "/models/org/c",
                "reason": "model-00002-of-00002.safetensors is missing\n(index names 2 shards)",
            }
        ],
    },
    {"path": "/scratch", "fs_type": "ext4", "error": "the directory does not exist"},
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-polish")) as c:
        body = {**report("gpu-a01"), "storage_configured": True, "storage": STORAGE}
        c.http.post(
            "/v1/agent/report", json=body, headers={"Authorization": f"Bearer {AGENT}"}
        ).raise_for_status()
        c.report("gpu-a02")
        c.admin("POST", "/v1/nodes/gpu-a01/cordon", {"reason": "keep its report"})
        spec = {"name": "org/tiny", "source": "org/tiny", "min_replicas": 1}
        c.admin("POST", "/v1/models", {"models": [spec]})
        assert c.serve_assigned("gpu-a02")
        yield c


def test_node_storage_says_what_was_not_counted_and_why(fleet: Controller) -> None:
    out = ok(ctl(fleet.url, "node", "gpu-a01"))
    storage = out.split("\nStorage\n", 1)[1].split("\n\n", 1)[0]
    assert storage == (
        "PATH       SCOPE    FILESYSTEM   SOURCE               MODELS         NOT COUNTED\n"
        "/models    shared   lustre       filer1@tcp:/models   org/a,org/bb   "
        "org/c: model-00002-of-00002.safetensors is missing\n"
        "/scratch   local    ext4         -                    -              "
        "cannot read: the directory does not exist"
    )


def test_replicas_left_aligns_its_nodes(fleet: Controller) -> None:
    header, row = ok(ctl(fleet.url, "replicas")).splitlines()
    assert row.index("gpu-a02") == header.index("NODES")


def test_an_empty_credentials_list_says_so_on_stderr(fleet: Controller) -> None:
    result = ctl(fleet.url, "credentials", "list")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "no credentials found\n")


def test_delete_says_replicas_stop_only_when_there_are_some(fleet: Controller) -> None:
    spec = "- name: org/none\n  source: org/none\n  min_replicas: 0\n"
    ok(ctl(fleet.url, "apply", "-f", "-", input=spec))
    assert ok(ctl(fleet.url, "delete", "model", "org/none")) == "model org/none deleted\n"
    assert ok(ctl(fleet.url, "delete", "model", "org/tiny")) == (
        "model org/tiny deleted; its 1 replica(s) are being stopped\n"
    )


def test_models_status_is_one_line() -> None:
    """An engine's failure reason is its cause, then an excerpt: ctl models shows the cause."""
    view = {
        "spec": {
            "name": "org/x",
            "source": "org/x",
            "min_replicas": 1,
            "gpus_per_shard": 1,
            "shards": 1,
            "gpu_class": None,
            "engine": "vllm",
        },
        "ready": 0,
        "starting": 0,
        "failed": 1,
        "satisfied": False,
        "unplaceable_reason": "its replicas fail: CUDA error: out of memory\n  File x.py\n",
    }
    models = [api.view(json.dumps(view).encode())]
    text = render.models_table(models).format()
    assert text.splitlines()[1].endswith("short: its replicas fail: CUDA error: out of memory")
    assert "\\n" not in text
