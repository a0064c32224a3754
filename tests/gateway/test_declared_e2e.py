"""A declared model is never a 404 (issue 35 item 1): from the moment `ctl apply`
returns, every live gateway answers a new model with 503 and `Retry-After` until
a replica serves it, then 200. The official `openai` client, retries off, asks
both gateways every 0.1 s from that moment on."""

from __future__ import annotations

import time

import openai
import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import (
    CONTROLLER_ARGS,
    ENGINE_ARGS,
    Gateway,
    model,
    wait_cluster_ready,
)

pytestmark = pytest.mark.slow


def test_a_new_model_is_a_503_from_the_moment_apply_returns_never_a_404(
    cluster: Cluster,
) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="2xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply([model("chat")])
    gateways = [Gateway(c, name="gw-a"), Gateway(c, name="gw-b")]
    for gw in gateways:
        gw.start()
    for gw in gateways:
        gw.wait_serving("chat")
    wait_until(
        lambda: (
            sorted(g["name"] for g in c.get("/v1/gateways") if g["age_s"] < 2) == ["gw-a", "gw-b"]
        ),
        timeout=10,
        what="both gateways live",
    )
    clients = [
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=10)
        for gw in gateways
    ]

    def ask(client: openai.OpenAI) -> str:
        """`served`, or the 503's code: anything else fails the test."""
        try:
            client.completions.create(model="new", prompt="hello", max_tokens=1)
        except openai.InternalServerError as exc:
            assert exc.status_code == 503, exc
            return str(exc.code)
        return "served"

    # Its engine loads for 3 s: apply returns well before it can serve. Applied as
    # `ctl apply` does, with no process exit between its answer and the first question.
    slow = {**model("new"), "engine_args": [*ENGINE_ARGS, "--load-seconds", "3"]}
    c.http.post("/v1/models", json={"models": [model("chat"), slow]}, timeout=10).raise_for_status()
    # The first answers, the moment apply returned: the explainer's 503, with Retry-After.
    for client in clients:
        raw = client.completions.with_raw_response
        try:
            raw.create(model="new", prompt="hello", max_tokens=1)
        except openai.InternalServerError as exc:
            assert exc.code == "model_not_ready", exc
            assert exc.response.headers["Retry-After"], exc.response.headers
        else:
            pytest.fail("served before any replica could be ready")
    seen: dict[str, set[str]] = {gw.name: set() for gw in gateways}
    deadline = time.monotonic() + 60
    while not all("served" in s for s in seen.values()):
        assert time.monotonic() < deadline, f"not served in 60 s: {seen}\n{gateways[0].logs()}"
        for gw, client in zip(gateways, clients, strict=True):
            try:
                seen[gw.name].add(ask(client))
            except openai.NotFoundError as exc:  # what this test is about
                pytest.fail(f"{gw.name} answered 404 for a declared model: {exc}")
        time.sleep(0.1)
    for gw in gateways:
        gw.stop()
