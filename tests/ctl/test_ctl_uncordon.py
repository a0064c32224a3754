"""`ctl uncordon` of a node llmgw cordoned for a card that is still unhealthy is
refused, naming the card, unless `--force` (as Slurm's health-check drains come
back): the check is the controller's, so every client meets it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.ctl.ctl_support import (
    ADMIN,
    AGENT,
    Controller,
    controller_process,
    ctl,
    ok,
    one_line_error,
    report,
)

XID = "fatal Xid 79 (GPU has fallen off the bus): reset the GPU or reboot the node"


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-uncordon")) as c:
        c.report("gpu-a01", n_gpus=4)
        yield c


def report_card(c: Controller, healthy: bool) -> None:
    """gpu-a01 with its card 3 failed (or healthy again)."""
    body = report("gpu-a01", n_gpus=4)
    if not healthy:
        body["gpus"][3].update(health="unhealthy", health_reason=XID)
    resp = c.http.post("/v1/agent/report", json=body, headers={"Authorization": f"Bearer {AGENT}"})
    resp.raise_for_status()


def admin_of(c: Controller) -> dict[str, Any]:
    rows = json.loads(ok(ctl(c.url, "nodes", "gpu-a01", "-o", "json")))
    admin: dict[str, Any] = rows[0]["admin"]
    return admin


def cordoned_by_llmgw(c: Controller) -> dict[str, Any]:
    report_card(c, healthy=False)
    deadline = time.monotonic() + 15
    while (admin := admin_of(c))["flag"] != "cordoned":
        assert time.monotonic() < deadline, admin
        time.sleep(0.1)
    assert admin["by"] == "llmgw" and "GPU 3" in admin["reason"]
    return admin


def test_uncordon_is_refused_while_the_card_is_unhealthy_and_says_which(
    fleet: Controller,
) -> None:
    before = cordoned_by_llmgw(fleet)
    line = one_line_error(ctl(fleet.url, "uncordon", "gpu-a01"), 1)
    assert line.startswith("llmgw ctl: gpu-a01: "), line
    assert "GPU 3 (GPU-gpu-…): fatal Xid 79" in line, line
    assert "--force" in line, line
    assert admin_of(fleet) == before  # nothing changed
    # Any client meets the same refusal: it is the controller's (409).
    resp = httpx.post(
        f"{fleet.url}/v1/nodes/gpu-a01/uncordon",
        json={},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert resp.status_code == 409 and "GPU 3" in resp.json()["error"]


def test_force_uncordons_anyway(fleet: Controller) -> None:
    cordoned_by_llmgw(fleet)
    assert ok(ctl(fleet.url, "uncordon", "gpu-a01", "--force")) == "gpu-a01 uncordoned\n"
    assert admin_of(fleet)["flag"] == "none"


def test_once_the_card_is_healthy_a_plain_uncordon_works(fleet: Controller) -> None:
    cordoned_by_llmgw(fleet)
    report_card(fleet, healthy=True)
    assert ok(ctl(fleet.url, "uncordon", "gpu-a01")) == "gpu-a01 uncordoned\n"


def test_an_operators_cordon_comes_off_without_force(fleet: Controller) -> None:
    """Only llmgw's own cordon for a card holds: an operator's is theirs to lift."""
    ok(ctl(fleet.url, "cordon", "gpu-a01", "--reason", "maintenance"))
    report_card(fleet, healthy=False)
    assert ok(ctl(fleet.url, "uncordon", "gpu-a01")) == "gpu-a01 uncordoned\n"
