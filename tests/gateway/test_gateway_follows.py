"""The gateway applies every change of an endpoint, and one bad entry never blocks
the others (issue 21 item 3, issue 25 item 1). Real gateway, SMG and engines;
the controller side is either the real controller fed by a scripted node (which
chooses the engine's port) or a fake that sends entries a real one refuses."""

from __future__ import annotations

import signal
import subprocess

import httpx
import pytest

from tests.e2e.procs import Cluster, _stop, free_port, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway
from tests.gateway.scripted import (
    FakeController,
    ScriptedNode,
    endpoint,
    engine,
    wait_engine,
)
from tests.gateway.test_gateway_e2e import gw_workers

pytestmark = pytest.mark.slow


def ask(gw: Gateway, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=10)


def test_same_replica_new_port_is_routed_to_the_new_engine(cluster: Cluster) -> None:
    """An engine restarted in place: same replica id, new URL. SMG must route to the
    new one; before, the feed never said so and the gateway kept the old URL for ever."""
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    port_a, port_b = free_port(), free_port()
    engines: list[subprocess.Popen[bytes]] = [engine("chat", port_a, c.env())]
    node = ScriptedNode(c.url, "n1")
    node.port_for = lambda rid: port_a
    node.start()
    try:
        c.apply([{"name": "chat", "source": "org/chat", "min_replicas": 1, "engine": "fake"}])
        wait_engine(port_a)
        gw = Gateway(c)
        gw.start()
        gw.wait_serving("chat")
        (rid,) = [r["id"] for r in c.get("/v1/replicas")]
        # The model's explainer stays beside the engine until SMG routes to the engine.
        wait_until(
            lambda: gw_workers(gw) == [f"http://127.0.0.1:{port_a}"],
            timeout=10,
            what="the engine alone in SMG's manifest",
            diagnose=gw.logs,
        )

        engines.append(engine("chat", port_b, c.env()))
        wait_engine(port_b)
        node.port_for = lambda _: port_b
        _stop(engines[0], signal.SIGKILL, timeout=5)

        def moved() -> bool:
            return gw_workers(gw) == [f"http://127.0.0.1:{port_b}"]

        wait_until(moved, timeout=20, what="the gateway to follow the new port", diagnose=gw.logs)
        assert [r["id"] for r in c.get("/v1/replicas")] == [rid]  # the same replica
        wait_until(
            lambda: ask(gw, "chat").status_code == 200,
            timeout=20,
            what="SMG routing to the new port",
            diagnose=gw.logs,
        )
        assert all(ask(gw, "chat").status_code == 200 for _ in range(5))
    finally:
        node.stop()
        for p in engines:
            _stop(p, signal.SIGKILL, timeout=5)


@pytest.mark.parametrize(
    "bad_url", ["http://[evil:1/x]:8000", "http:// :8000", "http://a/b:1", "http://x:99999"]
)
def test_one_bad_entry_is_left_out_and_reported(cluster: Cluster, bad_url: str) -> None:
    """A controller that sends one entry SMG cannot take: every other entry still
    applies, the bad one is reported in the gateway's status and logged once."""
    c = cluster
    fake = FakeController().start()
    port = free_port()
    eng = engine("chat", port, c.env())
    try:
        wait_engine(port)
        fake.set(
            [
                endpoint("bad-1", "other", bad_url),
                endpoint("good-1", "chat", f"http://127.0.0.1:{port}"),
            ]
        )
        gw = Gateway(c, controller=fake.url)
        gw.start()
        gw.wait_serving("chat")
        assert gw_workers(gw) == [f"http://127.0.0.1:{port}"]

        def reported() -> dict[str, str] | None:
            for s in reversed(fake.statuses):
                if s.get("rejected"):
                    return dict(s["rejected"])
            return None

        rejected = wait_until(reported, timeout=10, what="a status naming the bad entry")
        assert list(rejected) == ["bad-1"] and rejected["bad-1"], rejected
        # A controller that answers 204 (before changes only) is sent whole figures.
        assert all("base" not in s and "stream" not in s for s in fake.statuses)
        # A later change still applies: the bad entry blocks nothing.
        fake.set([endpoint("bad-1", "other", bad_url)])
        wait_until(lambda: gw_workers(gw) == [], timeout=20, what="the good entry removed")
        log = gw.log.read_text()
        assert log.count("bad-1") == 1, log
    finally:
        fake.stop()
        _stop(eng, signal.SIGKILL, timeout=5)


def test_a_controller_older_than_the_gateway_still_gets_its_status(cluster: Cluster) -> None:
    """A controller that does not know some optional fields of a gateway's status (it
    refuses unknown fields) still gets the status, without them: before, it refused
    every status, and the gateway's counts never reached it."""
    c = cluster
    fake = FakeController().start()
    fake.unknown_fields = frozenset({"max_in_flight", "rejected"})
    port = free_port()
    eng = engine("chat", port, c.env())
    try:
        wait_engine(port)
        fake.set(
            [
                endpoint("bad-1", "other", "http://a/b:1"),
                endpoint("good-1", "chat", f"http://127.0.0.1:{port}"),
            ]
        )
        gw = Gateway(c, controller=fake.url)
        gw.start()
        gw.wait_serving("chat")
        assert ask(gw, "chat").status_code == 200
        wait_until(
            lambda: len(fake.statuses) >= 3, timeout=10, what="statuses taken", diagnose=gw.logs
        )
        assert fake.refused, "the first status had both fields"
        assert all(not s.keys() & fake.unknown_fields for s in fake.statuses)
        assert fake.statuses[-1]["in_flight"] is not None and fake.statuses[-1]["cursor"]
        log = gw.log.read_text()
        assert log.count("does not take max_in_flight, rejected") == 1, log
    finally:
        fake.stop()
        _stop(eng, signal.SIGKILL, timeout=5)
