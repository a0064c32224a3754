"""An engine or GPU class no node has: apply warns (and applies), and every
view gives the one reason the controller holds (issue 11, defect 5)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.ctl.ctl_support import Controller, controller_process, ctl, ok

ENGINES = ("fake", "sglang", "vllm")


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-models")) as c:
        c.report("gpu-a01", n_gpus=2, engines=ENGINES)
        c.report("gpu-a02", n_gpus=2, engines=ENGINES)
        yield c


def spec(name: str, **kw: Any) -> str:
    extra = "".join(f"  {k}: {v}\n" for k, v in kw.items())
    return f"- name: {name}\n  source: {name}\n  min_replicas: 1\n{extra}"


def test_apply_warns_about_an_engine_no_node_has_and_applies(fleet: Controller) -> None:
    result = ctl(fleet.url, "apply", "-f", "-", input=spec("org/tf", engine="tensorflow"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "model org/tf applied (ready 0/1)\n"
    assert result.stderr == (
        "llmgw ctl: warning: model org/tf uses engine 'tensorflow', which no reporting "
        "node's agent knows (engines reported: fake, sglang, vllm); add it to the agents' "
        "--engine-templates, or fix the spec\n"
    )
    assert json.loads(ok(ctl(fleet.url, "status", "-o", "json")))["engines"] == {
        "fake": 2,
        "sglang": 2,
        "vllm": 2,
    }


def test_apply_warns_about_a_gpu_class_no_node_has(fleet: Controller) -> None:
    result = ctl(fleet.url, "apply", "-f", "-", input=spec("org/b", gpu_class="B200-180GB"))
    assert result.returncode == 0, result.stderr
    assert "wants GPU class B200-180GB, which no reporting node has" in result.stderr
    assert "(classes reported: H100-SXM-80GB)" in result.stderr
    # A spec every node can serve: no warning at all.
    quiet = ctl(fleet.url, "apply", "-f", "-", input=spec("org/ok", gpu_class="H100-SXM-80GB"))
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_dry_run_warns_as_the_apply_does_and_applies_nothing(fleet: Controller) -> None:
    """The dry run is where a typo in a class or an engine is best caught."""
    text = spec("org/b", gpu_class="B200-180GB") + spec("org/tf", engine="tensorflow")
    dry = ctl(fleet.url, "apply", "-f", "-", "--dry-run", input=text)
    assert dry.returncode == 0, dry.stderr
    assert ok(ctl(fleet.url, "models", "-o", "name")) == ""  # nothing written
    real = ctl(fleet.url, "apply", "-f", "-", input=text)
    assert real.returncode == 0, real.stderr
    warnings = [line for line in real.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 2 and "B200-180GB" in warnings[0] and "tensorflow" in warnings[1]
    assert dry.stderr.splitlines() == warnings
    assert "org/b" in dry.stdout and "applied" not in dry.stdout


def test_every_view_gives_the_same_reason(fleet: Controller) -> None:
    ok(ctl(fleet.url, "apply", "-f", "-", input=spec("org/tf", engine="tensorflow")))
    # The agent that got the replica cannot start it, and says why.
    deadline = time.monotonic() + 15
    failed = ""
    while not failed and time.monotonic() < deadline:
        for node in ("gpu-a01", "gpu-a02"):
            reply = fleet.report(node, n_gpus=2, engines=ENGINES)
            for a in reply["assignments"]:
                failed = (
                    f"no engine template named 'tensorflow' on this node; known: "
                    f"{', '.join(ENGINES)}"
                )
                fleet.report(
                    node,
                    n_gpus=2,
                    engines=ENGINES,
                    replicas=[
                        {
                            "id": a["replica_id"],
                            "model": a["model"],
                            "rank": a["rank"],
                            "state": "failed",
                            "gpus": a["gpus"],
                            "exit_code": 1,
                            "error": failed,
                        }
                    ],
                )
        time.sleep(0.2)
    assert failed, "no replica was placed"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        summary = json.loads(ok(ctl(fleet.url, "status", "-o", "json")))
        if "org/tf" in summary["unplaceable_reasons"]:
            break
        time.sleep(0.2)
    reason = summary["unplaceable_reasons"]["org/tf"]
    assert reason.startswith(f"its replicas fail: {failed}")
    # ctl models and ctl status say exactly that (piped: one line per row)
    models = ok(ctl(fleet.url, "models"))
    (row,) = [line for line in models.splitlines() if line.startswith("org/tf")]
    assert row.endswith(f"short: {reason}")
    status = ok(ctl(fleet.url, "status"))
    (line,) = [line for line in status.splitlines() if line.startswith("org/tf")]
    assert line.endswith(reason)
    views = json.loads(ok(ctl(fleet.url, "models", "-o", "json")))
    assert [m["unplaceable_reason"] for m in views] == [reason]
