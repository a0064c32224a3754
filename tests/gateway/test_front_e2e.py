"""What an OpenAI client meets through a real `llmgw gateway` (its front, SMG behind
it, a controller, an agent and fake engines): issue 35 items 3 and 11, issue 36
items 3 and 7."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.agent.metrics import parse_engine_metrics
from llmgw.listen import raise_open_files
from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, Load, model, wait_cluster_ready

pytestmark = pytest.mark.slow

KEY = "sk-acme-00000001"
MiB = 2**20


def start(c: Cluster, *extra: str) -> Gateway:
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="2xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    c.apply([model("chat")])
    keys = c.root / "keys"
    keys.write_text(f"acme {KEY}\n")
    gw = Gateway(c, "--api-key-file", str(keys), *extra)
    gw.start()
    gw.wait_serving("chat", headers={"Authorization": f"Bearer {KEY}"})
    return gw


def test_large_bodies_unknown_models_wrong_keys_and_smg_killed(cluster: Cluster) -> None:
    gw = start(cluster, "--max-body", "4MiB")
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0)
    hello = [{"role": "user", "content": "hi"}]
    # Over --max-body: OpenAI's error shape, not a bare 413.
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x" * (5 * MiB)}]
        )
    assert refused.value.status_code == 413 and refused.value.code == "request_too_large"
    assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
    # A model nobody declared does not exist, in OpenAI's words.
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=hello)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    assert "The model `no-such-model` does not exist" in missing.value.message
    # A wrong key, then a right one, on one kept-alive connection, 100 times.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=gw.url, limits=limits, timeout=20) as http:
        for i in range(200):
            r = http.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": hello, "max_tokens": 1},
                headers={"Authorization": f"Bearer {KEY if i % 2 else 'sk-wrong-key'}"},
            )
            assert r.status_code == (200 if i % 2 else 401), (i, r.text)
    # SMG killed under load: the front holds what SMG never took until it is back.
    load = Load(gw.url, "chat", headers={"Authorization": f"Bearer {KEY}"}).start(clients=4)
    try:
        wait_until(lambda: load.ok >= 8, timeout=20, what="requests before the kill")
        assert gw.proc is not None
        for _ in range(2):
            children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text()
            os.kill(int(children.split()[0]), signal.SIGKILL)
            wait_until(
                lambda before=load.ok: load.ok >= before + 20,  # type: ignore[misc]
                timeout=30,
                what="requests after the kill",
            )
    finally:
        load.stop()
    # Only the requests SMG had taken when it died may fail (a 503 to retry, or a
    # stream cut), at most one per client per kill (the one SMG was answering). Each
    # client sends its next request at once, so without the front's retry a refused
    # connection, or the restarted SMG's 404 before it registers its workers, would
    # fail its requests for the whole restart.
    assert len(load.failures) <= 4 * 2, load.failures


def test_past_the_hold_bound_the_answer_is_model_waking(cluster: Cluster) -> None:
    """1,000 requests held for a model at zero that cannot wake in time (it loads
    for a minute); the next ones get the documented 503, not SMG's breaker's. The
    gateway starts under a soft open-files limit of 1,024 and raises it itself."""
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="2xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    spec = model("nap", min_replicas=0)
    args = list(spec["engine_args"])
    args[args.index("--load-seconds") + 1] = "120"
    c.apply([{**spec, "engine_args": args, "max_replicas": 1}])
    gw = Gateway(c, "--wake-timeout", "100s")
    # Under systemd's default soft limit a gateway that kept it ran out of descriptors
    # at about 500 held clients (one to the client, one to SMG each): a ReadError.
    gw.start(open_files=1024)
    raise_open_files()  # this test's own thousand connections
    body = {"model": "nap", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    url = f"{gw.url}/v1/chat/completions"

    def listed() -> bool:
        try:
            return "nap" in {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    wait_until(listed, timeout=30, what="the sleeping model listed")

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=1100)
        async with httpx.AsyncClient(limits=limits, timeout=60) as http:
            held = [asyncio.create_task(http.post(url, json=body)) for _ in range(1000)]

            def all_held() -> bool:
                gwrow = c.get("/v1/summary")
                return any(w["model"] == "nap" and w["held"] >= 1000 for w in gwrow["waking"])

            while not await asyncio.to_thread(all_held):
                assert not any(t.done() for t in held), [t.result().text for t in held if t.done()][
                    :3
                ]
                await asyncio.sleep(0.5)
            over = [await http.post(url, json=body) for _ in range(30)]
            for t in held:
                t.cancel()
            return over

    over = asyncio.run(flood())
    for r in over:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_waking", r.text
        assert "1000 requests are held" in r.json()["error"]["message"]
        assert r.headers["Retry-After"] == "5"


def test_held_requests_whose_clients_left_are_dropped(cluster: Cluster) -> None:
    """Issue 36 item 2: 1,000 clients give up while their model wakes; none is sent
    to the engine once it serves, and none is counted as held."""
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    c.start_agent("gpu1", gpus="2xH100-80GB")
    wait_cluster_ready(c, ["gpu1"])
    spec = model("nap", min_replicas=0)
    # The engine loads until the clients have left: a wake that finished first (a busy
    # machine taking seconds to hold 1,000) would rightly serve clients still there.
    loaded = c.root / "nap-may-load"
    args = [*spec["engine_args"], "--loaded-after", str(loaded)]
    c.apply([{**spec, "engine_args": args, "max_replicas": 1, "scale_down_after_s": 600}])
    gw = Gateway(c, "--wake-timeout", "100s")
    # Under systemd's default soft limit a gateway that kept it ran out of descriptors
    # at about 500 held clients (one to the client, one to SMG each): a ReadError.
    gw.start(open_files=1024)
    raise_open_files()  # this test's own thousand connections
    body = {"model": "nap", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    url = f"{gw.url}/v1/chat/completions"

    def held() -> int:
        return sum(w["held"] for w in c.get("/v1/summary")["waking"] if w["model"] == "nap")

    def listed() -> bool:
        try:
            return "nap" in {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    wait_until(listed, timeout=30, what="the sleeping model listed")

    async def give_up() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1100)) as http:
            tasks = [
                asyncio.create_task(http.post(url, json=body, timeout=60)) for _ in range(1000)
            ]
            await asyncio.to_thread(
                wait_until, lambda: held() >= 1000, timeout=60, what="1,000 requests held"
            )
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(give_up())
    wait_until(lambda: held() == 0, timeout=20, what="nothing held once the clients left")
    loaded.touch()
    (replica,) = wait_until(
        lambda: [r for r in c.get("/v1/replicas") if r["model"] == "nap" and r.get("url")] or None,
        timeout=60,
        what="the woken replica in routing",
    )
    # One request of ours, sent once (wait_serving would send again after a slow
    # answer, and the engine would count both).
    ours = httpx.post(url, json=body, timeout=90)
    assert ours.status_code == 200, ours.text

    def sent() -> float:
        text = httpx.get(f"{replica['url']}/metrics", timeout=5).text
        sample = parse_engine_metrics(text)
        return sample.counters.get("vllm:request_success_total", 0.0) if sample else 0.0

    assert sent() == 1, f"only our own request reached the engine, not {sent():g}"
