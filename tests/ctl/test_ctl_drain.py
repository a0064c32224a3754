"""drain: the pre-check gates scripts and --force; --wait shows one line, then a summary."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from tests.ctl.ctl_support import Controller, controller_process, ctl, ok, one_line_error


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """Two 8-card nodes; one model needing a whole node, minimum 1, running on one of them."""
    with controller_process(tmp_path_factory.mktemp("ctl-drain")) as c:
        c.report("gpu-a01")
        c.report("gpu-a02")
        c.admin("POST", "/v1/nodes/gpu-a02/cordon", {"reason": "spare"})
        spec = {"name": "org/big", "source": "org/big", "min_replicas": 1, "gpus_per_shard": 8}
        c.admin("POST", "/v1/models", {"models": [spec]})
        assert c.serve_assigned("gpu-a01")
        yield c


def drain_flag(c: Controller, node: str) -> str:
    rows = json.loads(ok(ctl(c.url, "nodes", "-o", "json")))
    return next(r["admin"]["flag"] for r in rows if r["name"] == node)


def test_dry_run_exits_1_when_a_model_falls_below_its_minimum(fleet: Controller) -> None:
    result = ctl(fleet.url, "drain", "--dry-run", "gpu-a01")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(
        "Draining gpu-a01 moves 1 replica(s).\n  below_minimum  org/big"
    )
    plan = json.loads(ctl(fleet.url, "drain", "--dry-run", "gpu-a01", "-o", "json").stdout)
    assert plan["impacts"][0]["verdict"] == "below_minimum"
    ok(ctl(fleet.url, "uncordon", "gpu-a02"))  # now there is room elsewhere
    assert ctl(fleet.url, "drain", "--dry-run", "gpu-a01").returncode == 0


def test_force_below_minimum_needs_yes(fleet: Controller) -> None:
    result = ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--force")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "llmgw ctl: --force would drop org/big below its minimum (1); add --yes to go ahead anyway"
    )
    assert drain_flag(fleet, "gpu-a01") == "none"  # nothing happened
    out = ok(ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--force", "--yes"))
    assert out == "gpu-a01 draining\n"
    assert drain_flag(fleet, "gpu-a01") in ("draining", "cordoned")


def test_force_after_below_minimum_needs_yes_too(fleet: Controller) -> None:
    """A deadline forces the drain as --force does: the same pre-check, the same --yes."""
    result = ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--force-after", "20")
    assert result.returncode == 2
    assert result.stdout.startswith(
        "Draining gpu-a01 moves 1 replica(s).\n  below_minimum  org/big"
    )
    assert result.stderr.splitlines()[-1] == (
        "llmgw ctl: --force-after would drop org/big below its minimum (1) when its deadline "
        "forces the drain; add --yes to go ahead anyway"
    )
    assert drain_flag(fleet, "gpu-a01") == "none"  # nothing happened
    out = ok(ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--force-after", "10m", "--yes"))
    assert re.fullmatch(r"gpu-a01 draining; force at \d\d:\d\d(:\d\d)? UTC\n", out), out
    assert drain_flag(fleet, "gpu-a01") == "draining"


def test_force_after_takes_a_duration(fleet: Controller) -> None:
    """One duration syntax with the console and `rollout --timeout`: 1h is an hour."""
    ok(ctl(fleet.url, "uncordon", "gpu-a02"))  # room elsewhere: no --yes needed
    before = time.time()
    ok(ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--force-after", "1h"))
    rows = json.loads(ok(ctl(fleet.url, "nodes", "gpu-a01", "-o", "json")))
    assert 3600 <= rows[0]["admin"]["force_at"] - before <= 3660
    for bad, said in (
        ("abc", "'abc' is not a duration"),
        ("8d", "at most 7d"),
        ("0s", "more than 0s"),
        ("-3", "'-3' is negative: a duration is 0 or more"),
    ):
        line = one_line_error(
            ctl(fleet.url, "drain", "gpu-a02", "--reason", "r", "--force-after", bad), 2
        )
        assert said in line, line
    # (argparse reads `-1h` after an option as an option: with `=` it is the value)
    line = one_line_error(
        ctl(fleet.url, "drain", "gpu-a02", "--reason", "r", "--force-after=-1h"), 2
    )
    assert "'-1h' is negative" in line, line


def test_wait_prints_one_line_per_change_and_the_timeout_names_force(fleet: Controller) -> None:
    result = ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--wait", "--timeout", "2")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "gpu-a01 draining"
    assert lines[1].startswith("draining gpu-a01: 0/1 drained, 1 replica(s) to move")
    progress = [line for line in lines if line.startswith("draining gpu-a01:")]
    assert len(progress) == len(set(progress)) <= 3  # a line per change, not per poll
    assert "timed out after 2s: 0/1 drained; 1 replica(s) still on gpu-a01" in result.stdout
    # piped, nothing is cut: the whole reason the drain waits for
    waiting = (
        "1 waiting: org/big: needs 1 node with 8 free GPUs of one class; no node is ready "
        "(2 cordoned, draining or unreachable)"
    )
    assert progress[-1].endswith(waiting) and "…" not in result.stdout
    assert "llmgw ctl drain gpu-a01 --reason REASON --force" in result.stdout


def test_wait_ends_with_one_summary(fleet: Controller) -> None:
    ok(ctl(fleet.url, "uncordon", "gpu-a02"))
    # the replacement on gpu-a02 becomes ready, then the old replica stops
    ok(ctl(fleet.url, "drain", "gpu-a01", "--reason", "r"))
    fleet.serve_assigned("gpu-a02")
    fleet.report("gpu-a01")  # the old shard gone
    out = ok(ctl(fleet.url, "drain", "gpu-a01", "--reason", "r", "--wait", "--timeout", "20"))
    assert out.splitlines()[-1].startswith("drained: gpu-a01 (1 node(s) in ")
    line = one_line_error(ctl(fleet.url, "drain", "gpu-a01", "gpu-a01", "--reason", "r"), 2)
    assert "twice" in line
