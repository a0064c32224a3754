"""Scale to zero and wake end to end (issue 22 item 3): a real controller, agents
with fake cards and engines, the gateway with its SMG child.

A model declared with min 0 sleeps at zero replicas; its first request is held
by the gateway, wakes one replica and is answered by it (200, never a 404 or a
503); with nothing asked for `scale_down_after_s` it goes back to zero, and the
next request wakes it again. A model that cannot wake within the gateway's
`--wake-timeout` gets a 503 with Retry-After and the reason.

Both run on one controller and two agents (`fleet`, started once for the module),
each with a model and a gateway of its own, so that either also runs alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, model, wait_cluster_ready

pytestmark = pytest.mark.slow

NODES = ["gpu1", "gpu2"]


def sleepy(name: str, load_seconds: str = "0.3") -> dict[str, Any]:
    spec = model(name, min_replicas=0)
    args = list(spec["engine_args"])
    args[args.index("--load-seconds") + 1] = load_seconds
    return {**spec, "engine_args": args, "max_replicas": 1, "scale_down_after_s": 3}


def ask(gw: Gateway, name: str, timeout: float = 60) -> httpx.Response:
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=timeout)


def listed(gw: Gateway, name: str) -> bool:
    """Whether the gateway lists `name` in /v1/models (False while it starts)."""
    try:
        return name in {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def replicas(c: Cluster, name: str) -> list[dict[str, Any]]:
    return [r for r in c.get("/v1/replicas") if r["model"] == name]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The controller and two agents with two cards each, for the module's tests."""
    c = Cluster(tmp_path_factory.mktemp("wake") / "cluster")
    try:
        c.start_controller(*CONTROLLER_ARGS)
        for name in NODES:
            c.start_agent(name, gpus="2xH100-80GB")
        wait_cluster_ready(c, NODES)
        yield c
    finally:
        c.close()


def test_a_model_at_zero_answers_its_first_request_and_goes_back_to_zero(
    fleet: Cluster,
) -> None:
    c = fleet
    c.apply([sleepy("nap")])
    gw = Gateway(c)
    gw.start()
    # Declared and asleep: listed, never a 404.
    wait_until(lambda: listed(gw, "nap"), timeout=30, what="the sleeping model listed")
    assert replicas(c, "nap") == []
    assert "asleep" in c.ctl("models")
    # Two requests at once: both held, one replica woken, both answered by it.
    answers: list[httpx.Response] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: answers.append(ask(gw, "nap"))) for _ in range(2)]
    for t in threads:
        t.start()
    waking = wait_until(
        lambda: next((w for w in c.get("/v1/summary")["waking"] if w["model"] == "nap"), None),
        timeout=20,
        what="the model waking in the summary",
    )
    assert waking["held"] >= 1, waking
    for t in threads:
        t.join(timeout=60)
    woke_s = time.monotonic() - started
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert len(replicas(c, "nap")) == 1
    # Nothing asked for 3 s (and the 10 s window): back to zero, through the handshake.
    wait_until(lambda: replicas(c, "nap") == [], timeout=60, what="back to zero replicas")
    events = c.ctl("events", "--for", "model/nap")
    assert "ScaledUp" in events and "ScaledDown" in events, events
    # And awake again at the next request, streamed this time.
    body = {"model": "nap", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines
    print(f"woken and answered in {woke_s:.1f}s")
    gw.stop()


def in_flight(c: Cluster, name: str) -> float:
    """The autoscaler's in-flight figure for `name` (its short window's mean)."""
    return next(m["in_flight"] for m in c.get("/v1/models") if m["spec"]["name"] == name)


def test_requests_held_through_a_wake_are_counted_once(fleet: Cluster) -> None:
    """Issue 35 item 5: three clients, each with one request that lasts 4 s, sent to a
    model asleep at zero. Held, then sent on to the woken replica, whose engine counts
    them too: the autoscaler's figure never exceeds the three that exist (it read
    six: the gateway still called them held while the engine counted them)."""
    c = fleet
    spec = sleepy("trio")
    spec["engine_args"] = [*spec["engine_args"], "--latency", "4"]
    c.apply([{**spec, "target_in_flight": 8}])
    gw = Gateway(c, name="gw-trio")
    gw.start()
    wait_until(lambda: listed(gw, "trio"), timeout=30, what="the sleeping model listed")
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: answers.append(ask(gw, "trio"))) for _ in range(3)]
    for t in threads:
        t.start()
    seen: list[float] = []
    while any(t.is_alive() for t in threads):
        seen.append(in_flight(c, "trio"))
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=60)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert max(seen) >= 2, seen  # the figure saw them (held, then in the engine)
    assert max(seen) <= 3, seen  # and never counted one twice
    gw.stop()


def test_a_model_that_cannot_wake_in_time_gets_a_503_with_the_reason(fleet: Cluster) -> None:
    c = fleet
    c.apply([sleepy("slow", load_seconds="30")])
    gw = Gateway(c, "--wake-timeout", "3", name="gw-short-wait")
    gw.start()
    wait_until(lambda: listed(gw, "slow"), timeout=30, what="the sleeping model listed")
    r = ask(gw, "slow")
    assert r.status_code == 503, r.text
    assert r.headers.get("Retry-After"), r.headers
    error = r.json()["error"]
    assert error["code"] == "model_waking" and "no replica serves it yet" in error["message"]
    gw.stop()
