"""Keys from the control plane, with real processes: a controller, an agent running
fake engines, two gateways with their SMGs. Keys made with `ctl keys create` are taken
by both gateways, a tenant sees and uses only its models (the official openai client),
a revoked key is refused at both within about a second, and no key ever shows in a
process's command line or environment, nor in a log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, model, wait_cluster_ready
from tests.gateway.test_gateway_secrets import Cmdlines

pytestmark = pytest.mark.slow


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=20)


def status_with(gw: Gateway, key: str | None, model_name: str = "llama-8b") -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model_name, "prompt": "hi", "max_tokens": 1}
    try:
        r = httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers, timeout=10)
    except httpx.HTTPError:
        return 0
    return r.status_code


def test_keys_made_used_and_revoked_across_two_gateways(cluster: Cluster) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="2xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply([model("chat"), model("llama-8b")])
    gateways = [Gateway(c, name="gw-a"), Gateway(c, name="gw-b")]
    with Cmdlines(c) as cmdlines:
        for gw in gateways:
            gw.start()
        for gw in gateways:  # no key anywhere yet: open, on loopback
            gw.wait_serving("chat")
            gw.wait_serving("llama-8b")

        acme = c.ctl("keys", "create", "--tenant", "acme", "--models", "llama-*")
        beta = c.ctl("keys", "create", "--tenant", "beta", "--expires", "1h")
        acme_key, beta_key = acme.strip(), beta.strip()
        assert acme == f"{acme_key}\n" and acme_key.startswith("sk-llmgw-")

        # Once the controller holds a key, every gateway needs one.
        for gw in gateways:
            wait_until(
                lambda gw=gw: status_with(gw, None) == 401,
                timeout=5,
                what=f"{gw.name} to need a key",
                diagnose=gw.logs,
            )
            assert status_with(gw, "sk-llmgw-nope-guessed") == 401
            assert httpx.get(f"{gw.url}/health").status_code == 200, "health needs no key"
            assert httpx.get(f"{gw.url}/v1/models").status_code == 401

        # A tenant sees and uses only its models, at either gateway.
        for gw in gateways:
            acme_client = client(gw, acme_key)
            assert [m.id for m in acme_client.models.list()] == ["llama-8b"]
            answer = acme_client.chat.completions.create(
                model="llama-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert answer.choices[0].message.content
            with pytest.raises(openai.NotFoundError) as outside:
                acme_client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            with pytest.raises(openai.NotFoundError) as unknown:
                acme_client.chat.completions.create(
                    model="no-such", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            # The same 404 as an unknown model, word for word (SMG's own for the latter).
            assert outside.value.body == json.loads(
                json.dumps(unknown.value.body).replace("no-such", "chat")
            )
            assert outside.value.response.headers["x-smg-error-code"] == "model_not_found"
            assert set(outside.value.response.headers) == set(unknown.value.response.headers)
            for answer_404 in (outside, unknown):
                assert answer_404.value.response.headers["x-request-id"].startswith("chatcmpl-")
            with pytest.raises(openai.NotFoundError):
                acme_client.models.retrieve("chat")
            beta_client = client(gw, beta_key)
            assert sorted(m.id for m in beta_client.models.list()) == ["chat", "llama-8b"]
            assert status_with(gw, beta_key, "chat") == 200

        # last used: from the gateways' statuses.
        def last_used() -> float | None:
            rows = c.ctl_json("keys", "list")
            return next(r["last_used"] for r in rows if r["tenant"] == "acme")

        wait_until(lambda: last_used() is not None, timeout=10, what="acme's key's last use")

        # A revoked key is refused at both gateways within about a second.
        (acme_id,) = [r["id"] for r in c.ctl_json("keys", "list") if r["tenant"] == "acme"]
        revoked_at = time.monotonic()
        c.ctl("keys", "revoke", acme_id)
        for gw in gateways:
            wait_until(
                lambda gw=gw: status_with(gw, acme_key) == 401,
                timeout=5,
                what=f"{gw.name} to refuse the revoked key",
                diagnose=gw.logs,
            )
        took = time.monotonic() - revoked_at
        for gw in gateways:
            assert status_with(gw, beta_key) == 200, "another tenant is untouched"
        print(f"revoked key refused at both gateways {took:.2f} s after ctl keys revoke")

        # A gateway that loses the controller keeps the last keys it had.
        c.kill_controller()
        for gw in gateways:
            assert status_with(gw, beta_key) == 200
            assert status_with(gw, acme_key) == 401 and status_with(gw, None) == 401

    # Never a key in a command line, an environment or a log of any process.
    keys = [acme_key.encode(), beta_key.encode()]
    assert cmdlines.seen and any(b"smg_child" in x for x in cmdlines.seen)
    for line in cmdlines.seen:
        assert not any(k in line for k in keys), line
    for pid in c.tagged_pids():
        for part in ("cmdline", "environ"):
            try:
                raw = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            assert not any(k in raw for k in keys), (pid, part)
    logs = [
        c.root / "controller.log",
        *(p for gw in gateways for p in (gw.log, gw.work / "smg.log")),
    ]
    for log in logs:
        text = log.read_bytes()
        assert not any(k in text for k in keys), log
    for gw in gateways:
        secrets = (gw.work / "smg-secrets.json").read_bytes()
        assert not any(k in secrets for k in keys), "SMG never gets the controller's keys"
