"""The gateway's 503 for a declared model nothing serves: `code` is a string, as
in OpenAI's errors, and a model that cannot be placed is not promised a replica
"yet" (issue 23 item 12). What the gateway does is chosen by the reason's kind,
never by its words (issue 31 item 3), and a controller that sends the words alone
(one release back) is still understood."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pytest_aiohttp import AiohttpServer

from llmgw.agent.fake_engine import FakeConfig, make_app
from llmgw.gateway.explain import Explainer
from llmgw.wire import EndpointsDelta, Unserved, UnservedKind

NOT_READY, UNPLACEABLE, ASLEEP = (
    UnservedKind.NOT_READY,
    UnservedKind.UNPLACEABLE,
    UnservedKind.ASLEEP,
)


@pytest.mark.parametrize(
    ("why", "code", "says", "never", "retry"),
    [
        (
            Unserved(kind=NOT_READY, message="2 replicas starting"),
            "model_not_ready",
            "no replica serves it yet: 2 replicas",
            "",
            True,
        ),
        (
            Unserved(kind=UNPLACEABLE, message="needs 1 node x 8 H100"),
            "model_unplaceable",
            "is declared but cannot be placed: needs",
            "yet",
            False,
        ),
    ],
)
async def test_the_503_says_what_holds_the_model(
    why: Unserved, code: str, says: str, never: str, retry: bool
) -> None:
    e = Explainer()
    await e.start()
    try:
        (url,) = e.set_unserved({"m": why})
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/v1/chat/completions", json={"model": "m"})
        assert r.status_code == 503
        if retry:
            assert r.headers["Retry-After"] == "5" and "x-should-retry" not in r.headers
        else:  # waiting cannot help: no invitation to retry (issue 35 item 4)
            assert "Retry-After" not in r.headers and r.headers["x-should-retry"] == "false"
        error = r.json()["error"]
        assert error["code"] == code and isinstance(error["code"], str)
        assert says in error["message"]
        assert not never or never not in error["message"]
    finally:
        await e.stop()


async def test_a_model_unserved_again_gets_a_worker_url_of_its_own() -> None:
    """SMG keeps a removed worker's URL about 5 s while it drains and takes no new
    worker under it meanwhile: a model asleep again within seconds of waking would have
    had no worker, its requests waiting in the front where nothing counts them (so
    nothing woke it; bench_density's slowest requests). Each spell unserved has its
    own URL; one the model keeps while unserved; the old one still answers for it."""
    e = Explainer()
    await e.start()
    try:
        asleep = Unserved(kind=UnservedKind.NOT_READY, message="1 replica waking")
        (first,) = e.set_unserved({"m": asleep})
        assert e.set_unserved({"m": asleep, "n": asleep}).keys() >= {first}, "kept"
        e.set_unserved({"n": asleep})  # m served
        (again,) = e.set_unserved({"m": asleep}).keys() - {e.url_for("n")}
        assert again != first and e.owns(again) and e.owns(first)
        async with httpx.AsyncClient() as http:
            for url in (first, again):
                r = await http.post(f"{url}/v1/chat/completions", json={"model": "m"})
                assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
                assert (await http.get(f"{url}/v1/models")).json()["data"][0]["id"] == "m"
    finally:
        await e.stop()


async def test_the_kind_decides_not_the_words() -> None:
    """A model whose message happens to read like another kind's is answered by its
    kind: "asleep: ..." as the words of a model that cannot be placed is no wake."""
    e = Explainer()
    await e.start()
    try:
        (url,) = e.set_unserved({"m": Unserved(kind=UNPLACEABLE, message="asleep: no")})
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{url}/v1/chat/completions", json={"model": "m"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unplaceable"
        assert e.held == {}
    finally:
        await e.stop()


async def test_a_held_request_sent_on_is_the_replicas_in_flight_not_held(
    aiohttp_server: AiohttpServer,
) -> None:
    """Issue 35: three requests held through a wake; sent on, each is counted as the
    woken replica's in flight (the engine counts it too) and no longer as held, so
    that the controller's figure (the gateways' or the engines', not both) stays 3."""
    engine = await aiohttp_server(make_app(FakeConfig(model="nap", load_seconds=0, latency_s=1.0)))
    url_engine = str(engine.make_url("")).rstrip("/")
    e = Explainer(wake_timeout_s=10)
    await e.start()
    try:
        (url,) = e.set_unserved({"nap": Unserved(kind=ASLEEP, message="woken")})
        body = {"model": "nap", "prompt": "x", "max_tokens": 1}
        async with httpx.AsyncClient(timeout=10) as http:
            asking = [
                asyncio.create_task(http.post(f"{url}/v1/completions", json=body)) for _ in range(3)
            ]
            for _ in range(500):
                if e.held.get("nap") == 3:
                    break
                await asyncio.sleep(0.01)
            assert e.held == {"nap": 3} and e.sent == {}
            e.set_serving({"nap": [url_engine]})
            for _ in range(500):
                if e.sent.get(url_engine) == 3:
                    break
                await asyncio.sleep(0.01)
            # In the engine now (latency 1 s): the replica's, not held; 3 in all, not 6.
            assert e.held == {} and e.sent == {url_engine: 3}
            assert e.sent_requests == {url_engine: 3}
            answers = await asyncio.wait_for(asyncio.gather(*asking), 10)
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert e.held == {} and e.sent == {} and e.sent_requests == {url_engine: 3}
        e.set_serving({})  # no longer served there: its count is let go
        assert e.sent_requests == {}
    finally:
        await e.stop()


def delta(**fields: object) -> EndpointsDelta:
    return EndpointsDelta.model_validate(
        {"cursor": "r.1", "full": True, "endpoints": [], "removed": [], **fields}
    )


def test_the_feed_says_each_reason_twice_and_a_new_gateway_reads_the_kind() -> None:
    reasons = {
        "a": Unserved(kind=UNPLACEABLE, message="needs 8 cards"),
        "b": Unserved(kind=ASLEEP, message="woken by its first request"),
        "c": Unserved(kind=NOT_READY, message="1 replica starting"),
    }
    sent = EndpointsDelta.build("r.1", True, [], [], reasons)
    wire = sent.model_dump_json()
    # What a 0.1 gateway reads: the words with their old prefixes.
    assert sent.unserved == {
        "a": "cannot be placed: needs 8 cards",
        "b": "asleep: woken by its first request",
        "c": "1 replica starting",
    }
    assert EndpointsDelta.model_validate_json(wire).reasons() == reasons


def test_a_new_gateway_reads_an_older_controllers_words() -> None:
    older = delta(
        unserved={
            "a": "cannot be placed: needs 8 cards",
            "b": "asleep: waking, 1 replica starting",
            "c": "no replica is serving yet",
        }
    )
    assert older.reasons() == {
        "a": Unserved(kind=UNPLACEABLE, message="needs 8 cards"),
        "b": Unserved(kind=ASLEEP, message="waking, 1 replica starting"),
        "c": Unserved(kind=NOT_READY, message="no replica is serving yet"),
    }


def test_a_kind_from_a_newer_controller_reads_as_not_ready() -> None:
    newer = delta(unserved_reasons={"a": {"kind": "quarantined", "message": "held back"}})
    assert newer.reasons() == {"a": Unserved(kind=NOT_READY, message="held back")}
