"""The follower's apply against a stand-in SMG whose timing the test sets (issue 24
item 5): SMG takes 5.2-6.3 s to drop a removed worker, which is no failure; a
worker it never drops is one, said once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

import pytest

from llmgw.gateway import sync
from llmgw.gateway.sync import Follower
from llmgw.wire import Endpoint, Unserved, UnservedKind


class SlowSmg:
    """Lists an added worker at once and routes to it `route_after_s` later (SMG's
    registration); lists a removed worker as not routed (SMG's draining) at once and
    drops it `remove_after_s` after the manifest changes."""

    def __init__(self, remove_after_s: float, route_after_s: float = 0.0) -> None:
        self.remove_after_s = remove_after_s
        self.route_after_s = route_after_s
        self.listed: dict[str, float | None] = {}  # url -> when it goes (None: stays)
        self.routes_from: dict[str, float] = {}  # url -> when SMG routes to it
        self.manifests: list[set[str]] = []
        self.written_at: list[float] = []  # when each manifest was written
        self.started = asyncio.Event()
        self.started.set()

    def ours(self, url: str) -> bool:
        return any(url in m for m in self.manifests)

    def write_workers(self, urls: Iterable[str]) -> None:
        wanted = set(urls)
        self.manifests.append(wanted)
        now = time.monotonic()
        self.written_at.append(now)
        for u in wanted:
            if u not in self.listed:
                self.routes_from[u] = now + self.route_after_s
            self.listed[u] = None
        for u, gone in self.listed.items():
            if u not in wanted and gone is None:
                self.listed[u] = now + self.remove_after_s

    async def workers(self) -> dict[str, bool]:
        now = time.monotonic()
        self.listed = {u: g for u, g in self.listed.items() if g is None or g > now}
        return {u: g is None and self.routes_from[u] <= now for u, g in self.listed.items()}


def follower(smg: SlowSmg) -> Follower:
    return Follower("http://127.0.0.1:1", None, "gw", smg)  # type: ignore[arg-type]


async def test_a_removal_that_takes_six_seconds_is_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    smg = SlowSmg(remove_after_s=6.3)
    f = follower(smg)
    await f._apply({"http://a:1": "m", "http://b:1": "m"})
    caplog.set_level(logging.INFO, logger="llmgw.gateway")
    t0 = time.monotonic()
    await f._apply({"http://b:1": "m"})  # raised TimeoutError at 5 s before
    assert 6.0 < time.monotonic() - t0 < 8
    assert await smg.workers() == {"http://b:1": True}
    assert "failing" not in caplog.text


async def test_a_removal_that_never_happens_is_said_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "REMOVE_TIMEOUT_S", 0.3)
    smg = SlowSmg(remove_after_s=3600)
    f = follower(smg)
    await f._apply({"http://a:1": "m", "http://b:1": "m"})
    f.endpoints = {}
    caplog.set_level(logging.INFO, logger="llmgw.gateway")
    f.changed.set()
    loop = asyncio.create_task(f._apply_loop())
    await asyncio.sleep(2.5)  # several tries
    loop.cancel()
    failing = [r for r in caplog.records if "failing" in r.getMessage()]
    assert len(failing) == 1, caplog.text
    assert "still lists removed workers" in failing[0].getMessage()


async def test_an_explainer_stays_until_smg_routes_to_the_engines_that_replace_it() -> None:
    """A model served at last: its explainer (which sends a request on to a serving engine)
    leaves only once SMG routes to the engine, or SMG has no worker for the model while
    it registers the engine ("all workers are unavailable", seen in CI)."""
    smg = SlowSmg(remove_after_s=0.1, route_after_s=0.5)
    f = follower(smg)
    f.explainer.port = 9
    explainer = f.explainer.url_for("chat")
    await f._apply({explainer: "chat"})
    await f._apply({"http://engine:1": "chat"})
    first, last = smg.manifests[1], smg.manifests[-1]
    assert first == {explainer, "http://engine:1"}, smg.manifests
    assert last == {"http://engine:1"}
    assert await smg.workers() == {"http://engine:1": True}


async def test_an_old_worker_stays_while_it_alone_carries_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SMG registering the new engine past ADD_TIMEOUT_S (a saturated gateway host):
    the explainer, the model's only routed worker, stays until SMG routes to the
    engine; removed at ADD_TIMEOUT_S, the model had no worker in between."""
    monkeypatch.setattr(sync, "ADD_TIMEOUT_S", 0.1)
    smg = SlowSmg(remove_after_s=0.1)
    f = follower(smg)
    f.explainer.port = 9
    explainer = f.explainer.url_for("chat")
    await f._apply({explainer: "chat"})
    smg.route_after_s = 0.6
    await f._apply({"http://engine:1": "chat"})
    assert smg.manifests[-1] == {"http://engine:1"}
    assert smg.written_at[-1] >= smg.routes_from["http://engine:1"], "removed before routable"


async def test_a_model_routed_elsewhere_does_not_wait_for_its_new_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain's old replica leaves after ADD_TIMEOUT_S when its model keeps another
    worker SMG routes to: only a model left with none is waited for."""
    monkeypatch.setattr(sync, "ADD_TIMEOUT_S", 0.1)
    smg = SlowSmg(remove_after_s=0.05, route_after_s=0)
    f = follower(smg)
    await f._apply({"http://old:1": "chat", "http://other:1": "chat"})
    smg.route_after_s = 3600  # the stand-in never becomes routable
    t0 = time.monotonic()
    await f._apply({"http://other:1": "chat", "http://new:1": "chat"})
    assert time.monotonic() - t0 < 2
    assert smg.manifests[-1] == {"http://other:1", "http://new:1"}


async def test_a_new_worker_never_routed_is_given_up_on_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sync, "ADD_TIMEOUT_S", 0.1)
    monkeypatch.setattr(sync, "CARRY_TIMEOUT_S", 0.3)
    smg = SlowSmg(remove_after_s=0.05, route_after_s=0)
    f = follower(smg)
    await f._apply({"http://old:1": "chat"})
    smg.route_after_s = 3600
    caplog.set_level(logging.WARNING, logger="llmgw.gateway")
    await f._apply({"http://new:1": "chat"})
    assert smg.manifests[-1] == {"http://new:1"}
    assert "SMG does not route to the new workers of chat" in caplog.text


async def test_a_new_worker_counts_as_applied_once_smg_routes_to_it() -> None:
    """Applied means routed: a new model's explainer answers its 503 from then on,
    where SMG said the model did not exist (issue 35 item 1)."""
    smg = SlowSmg(remove_after_s=0.1, route_after_s=0.3)
    f = follower(smg)
    assert await f._apply({"http://e:1": "m"})
    assert await smg.workers() == {"http://e:1": True}


async def test_a_new_model_is_added_while_a_removal_waits() -> None:
    """SMG takes 5-6 s to drop a removed worker: a model declared meanwhile gets its
    explainer at once, not after that, and the worker on its way out stays out."""
    smg = SlowSmg(remove_after_s=1.5)
    f = follower(smg)
    f.explainer.port = 9
    assert await f._apply({"http://a:1": "m", "http://b:1": "m"})
    removal = asyncio.create_task(f._apply({"http://b:1": "m"}))
    await asyncio.sleep(0.2)
    f.usable = [Endpoint(replica_id="b", model="m", url="http://b:1", node="n", fabric=None,
                         state="serving")]  # fmt: skip
    f.unserved = {"new": Unserved(kind=UnservedKind.NOT_READY, message="1 replica starting")}
    f.changed.set()
    assert await removal is False  # given up for the change, not done
    assert "http://a:1" in await smg.workers()  # SMG still drops it
    assert await f._apply(f.serving())
    explainer = f.explainer.url_for("new")
    assert smg.manifests[-1] == {"http://b:1", explainer}
    assert all("http://a:1" not in m for m in smg.manifests[1:]), smg.manifests
    assert await smg.workers() == {"http://b:1": True, explainer: True}


async def test_a_stopping_replica_is_released_once_smg_drops_it_whatever_else_waits() -> None:
    """The status names the stopping replicas SMG no longer routes to, while another
    model's new worker still keeps the apply (and so the cursor) waiting: the stop of
    the first waits for no other model (issue 36)."""
    smg = SlowSmg(remove_after_s=0.3, route_after_s=60.0)  # "b:2" never routed meanwhile
    f = follower(smg)
    await f._apply({"http://a:1": "a", "http://b:1": "b"})
    f.endpoints = {
        "a1": Endpoint(replica_id="a1", model="a", url="http://a:1", node="n", fabric=None,
                       state="stopping"),
        "b1": Endpoint(replica_id="b1", model="b", url="http://b:1", node="n", fabric=None,
                       state="serving"),
    }  # fmt: skip
    assert await f._released() == [], "SMG still lists a:1"
    # A's replica leaves and B gets a second worker SMG is slow to route: one apply.
    applying = asyncio.create_task(f._apply({"http://b:1": "b", "http://b:2": "b"}))
    await asyncio.sleep(0.6)
    assert not applying.done(), "the apply (and the cursor) wait on b:2"
    assert await f._released() == ["a1"]
    applying.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await applying


async def test_a_stopping_replica_is_released_while_smg_still_lists_it_draining() -> None:
    """SMG lists a removed worker draining (not routed) at once and drops it about 5 s
    later; it sends it nothing new from the first, so the status says the replica
    released then, and is posted at once: a switch waited 5-6 s on the drop."""
    smg = SlowSmg(remove_after_s=5.0)
    f = follower(smg)
    await f._apply({"http://a:1": "a", "http://b:1": "b"})
    f.endpoints = {
        "a1": Endpoint(replica_id="a1", model="a", url="http://a:1", node="n", fabric=None,
                       state="stopping"),
    }  # fmt: skip
    f.nudge.clear()
    applying = asyncio.create_task(f._apply({"http://b:1": "b"}))
    await asyncio.wait_for(f.nudge.wait(), 1.0)
    assert "http://a:1" in await smg.workers(), "still listed, draining"
    assert await f._released() == ["a1"]
    applying.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await applying


async def test_a_second_replica_leaves_routing_while_the_first_one_s_worker_is_dropped() -> None:
    """Two replicas leave routing a second apart, each of a model that others still
    serve (so no explainer is added): SMG drops the first's worker about 5 s after it
    is asked to, and the second's leaves routing at once, not after that, its release
    posted then."""
    smg = SlowSmg(remove_after_s=5.0)
    f = follower(smg)
    f.explainer.port = 9
    await f._apply({"http://a:1": "a", "http://b:1": "b", "http://c:1": "c"})
    first = asyncio.create_task(f._apply({"http://b:1": "b", "http://c:1": "c"}))
    await asyncio.sleep(0.3)
    f.usable = [Endpoint(replica_id="c1", model="c", url="http://c:1", node="n", fabric=None,
                         state="serving")]  # fmt: skip
    f.endpoints = {
        "b1": Endpoint(replica_id="b1", model="b", url="http://b:1", node="n", fabric=None,
                       state="stopping"),
    }  # fmt: skip
    f.changed.set()
    assert await asyncio.wait_for(first, 1.0) is False, "given up for the change, not done"
    f.nudge.clear()
    began = time.monotonic()
    second = asyncio.create_task(f._apply(f.serving()))
    await asyncio.wait_for(f.nudge.wait(), 1.0)
    assert await f._released() == ["b1"]
    assert smg.manifests[-1] == {"http://c:1"} and time.monotonic() - began < 1.0
    assert {"http://a:1", "http://b:1"} <= (await smg.workers()).keys(), "both still draining"
    second.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second


async def test_an_answer_ending_while_requests_are_held_posts_the_status_now() -> None:
    """A switch waits for the awake model's replica to read idle at the controller: an
    answer's end posts the status at once while something is held, not a second later;
    with nothing held it waits for the second, as before."""
    f = follower(SlowSmg(remove_after_s=5.0))
    f.nudge.clear()
    f.answered()
    assert not f.nudge.is_set(), "nothing held: no early status"
    f.explainer.held["b"] += 1
    f.answered()
    assert f.nudge.is_set()
