"""Metering and limits with real processes: a controller, an agent running a fake
engine, two gateways with their SMGs, keys made with `ctl keys create`.

Tokens are metered exactly, as the engine counted them (its own vLLM counters),
for a whole answer, a stream whose client asked no usage (and sees none) and a
stream its client left after two tokens, across both gateways; `ctl usage` shows
them and they survive a controller restart. A tenant over its requests per minute,
then one over its token budget, gets 429 with Retry-After at both gateways (the
second gateway counting what the first let through), while a tenant without
limits is served. No key shows in `ps`."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, ENGINE_ARGS, Gateway, wait_cluster_ready

pytestmark = pytest.mark.slow

# A token each 0.4 s: a client that leaves after two has left long before the third.
SLOW = [*ENGINE_ARGS[: ENGINE_ARGS.index("--token-interval")], "--token-interval", "0.4"]
MODEL = {
    "name": "m",
    "source": "org/m",
    "min_replicas": 1,
    "gpus_per_shard": 1,
    "engine": "fake",
    "engine_args": SLOW,
}
MESSAGES = [{"role": "user", "content": "one two three"}]  # 4 prompt tokens at the engine


def engine_tokens(c: Cluster) -> tuple[int, int]:
    (endpoint,) = c.get("/v1/endpoints")["endpoints"]
    text = httpx.get(f"{endpoint['url']}/metrics", timeout=5).text
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return int(found["vllm:prompt_tokens_total"]), int(found["vllm:generation_tokens_total"])


def post(gw: Gateway, key: str, max_tokens: int = 1) -> httpx.Response:
    body = {"model": "m", "prompt": "a", "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers, timeout=20)


def usage_of(c: Cluster, tenant: str) -> dict[str, Any] | None:
    rows = c.ctl_json("usage", "--since", "1h")
    return next((r for r in rows if r["tenant"] == tenant and r["model"] == "m"), None)


def test_metered_exactly_limited_at_both_gateways_and_kept(cluster: Cluster) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="1xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply([MODEL])
    a, b = Gateway(c, name="gw-a"), Gateway(c, name="gw-b")
    try:
        for gw in (a, b):
            gw.start()
        for gw in (a, b):
            gw.wait_serving("m")  # open (no key yet): not metered
        keys = {t: c.ctl("keys", "create", "--tenant", t).strip() for t in ("acme", "beta", "free")}
        for gw in (a, b):
            wait_until(lambda gw=gw: post(gw, "none").status_code == 401, timeout=5, what="keys")
        prompt0, completion0 = engine_tokens(c)

        # -- metered exactly -----------------------------------------------------------------
        acme_a = openai.OpenAI(base_url=f"{a.url}/v1", api_key=keys["acme"], max_retries=0)
        acme_b = openai.OpenAI(base_url=f"{b.url}/v1", api_key=keys["acme"], max_retries=0)
        whole = acme_a.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        assert whole.usage is not None and whole.usage.completion_tokens == 3
        chunks = list(
            acme_b.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, stream=True)  # type: ignore[arg-type]
        )
        assert chunks and all(ch.choices and ch.usage is None for ch in chunks), "no usage asked"
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 30, "stream": True}
        headers = {"Authorization": f"Bearer {keys['acme']}"}
        with httpx.stream(
            "POST", f"{a.url}/v1/chat/completions", json=body, headers=headers, timeout=20
        ) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: {")
                if got == 2:
                    break  # the client leaves after two tokens
        time.sleep(1.0)  # past the engine's next token: the cut reached it
        prompt, completion = engine_tokens(c)
        assert (prompt - prompt0, completion - completion0) == (12, 3 + 3 + 2)

        def metered() -> dict[str, Any] | None:
            row = usage_of(c, "acme")
            return row if row is not None and row["requests"] == 3 else None

        row = wait_until(metered, timeout=10, what="acme's usage at the controller")
        assert row == {
            "tenant": "acme",
            "model": "m",
            "requests": 3,
            "prompt_tokens": 12,
            "completion_tokens": 8,
            "errors": 0,
            "rate_limited": 0,
        }
        csv = c.ctl("usage", "--by", "tenant", "-o", "csv").splitlines()
        assert csv[0] == "tenant,model,requests,prompt_tokens,completion_tokens,errors,rate_limited"
        assert "acme,,3,12,8,0,0" in csv

        # -- limits hold across both gateways ------------------------------------------------
        c.ctl("limits", "set", "acme", "--rpm", "2")  # one more each 30 s: none in this test
        budget = 3  # beta's tokens today: a request of 1 prompt and 1 completion token, twice
        c.ctl("limits", "set", "beta", "--budget", str(budget), "--per", "day")
        assert {r["tenant"] for r in c.ctl_json("limits", "list")} == {"acme", "beta"}
        time.sleep(1.0)  # the keys feed brings them to each gateway in one round trip
        assert post(a, keys["acme"]).status_code == 200
        time.sleep(2.5)  # gw-b hears of it with the controller's next answer
        statuses = [post(b, keys["acme"]).status_code for _ in range(2)]
        assert statuses == [200, 429], statuses  # its own bucket alone would take 2
        time.sleep(2.5)  # ... and gw-a of gw-b's
        over = post(a, keys["acme"])
        assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1
        assert over.json()["error"]["code"] == "rate_limit_exceeded"
        assert over.headers["x-llmgw-limit"] == "rpm"
        # A budget: spent at one gateway, refused at both until midnight UTC.
        assert post(a, keys["beta"]).status_code == 200
        assert post(a, keys["beta"]).status_code == 200  # 4 tokens: over its 3 from now
        time.sleep(2.5)
        for gw in (a, b):
            refused = post(gw, keys["beta"])
            assert refused.status_code == 429 and refused.headers["x-llmgw-limit"] == "budget"
            assert int(refused.headers["Retry-After"]) <= 86_400
        for gw in (a, b):
            assert post(gw, keys["free"]).status_code == 200, "a tenant without limits"
        wait_until(
            lambda: (
                (usage_of(c, "acme") or {}).get("rate_limited") == 2
                and (usage_of(c, "free") or {}).get("requests") == 2
            ),
            timeout=10,
            what="the refusals and the last requests counted",
        )

        # -- kept across a restart -----------------------------------------------------------
        before = c.ctl_json("usage", "--since", "1h")
        c.kill_controller()
        c.start_controller()
        assert c.ctl_json("usage", "--since", "1h") == before
        metrics = c.http.get("/metrics").text  # this term's counters start again
        assert "llmgw_tenant_requests_total" in metrics

        # -- never a key in ps --------------------------------------------------------------
        ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        assert "smg" in ps or "gateway" in ps
        for key in keys.values():
            assert key not in ps
    finally:
        a.stop()
        b.stop()
