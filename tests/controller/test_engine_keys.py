"""Engine keys (issue 36 item 1), in process: each replica gets a key of its own when it
is placed, kept in its record across a restart, handed to its agent in the assignment
and to gateways (only) in the endpoint feed; a replacement has a new one; read tokens
see URLs and no key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.keys import term_of
from llmgw.controller.loop.reconcile import Reconciler
from llmgw.controller.store.sqlite import Store
from llmgw.controller.term import Term
from llmgw.wire import AdminFlag, ModelSpec
from tests.controller.fleet_factories import FakeClock, make_fleet, report

MODEL = ModelSpec(name="llama", source="meta/llama", min_replicas=1, gpus_per_shard=8)
GATEWAY, ADMIN, READ, AGENT = "gateway-secret", "admin-secret", "read-secret", "agent-secret"


def step(term: Term, nodes: list[str], down: frozenset[str] = frozenset()) -> None:
    """Every node reports its assigned shards ready; one reconcile pass."""
    for i, node in enumerate(nodes):
        if node in down:
            continue
        shards = [
            {"id": a.replica_id, "model": a.model, "rank": a.rank, "state": "ready"}
            | {"gpus": a.gpus, "port": 8000 + i, "idle_seconds": 0.0}
            for a in term.assignments_for(node)
        ]
        rep = report(node, replicas=shards).model_copy(update={"address": f"10.0.0.{i + 1}"})
        term.ingest(rep)
    Reconciler(term, term.stop_gate).tick()


def test_a_replica_has_a_key_its_agent_and_the_feed_carry(tmp_path: Path) -> None:
    clock = FakeClock()
    term = make_fleet(tmp_path, clock)
    term.facts.put_models([MODEL])
    for _ in range(2):
        clock.advance(1.0)
        step(term, ["gpu1", "gpu2"])
    (rec,) = term.facts.records.values()
    assert rec.engine_key and len(rec.engine_key) >= 40  # 32 random bytes
    assert rec.engine_key not in repr(rec)
    (a,) = term.assignments_for(rec.nodes[0])
    assert a.engine_key == rec.engine_key and rec.engine_key not in repr(a)
    (ep,) = term.endpoints_since("").endpoints
    assert ep.engine_key == rec.engine_key and rec.engine_key not in repr(ep)
    (bare,) = term.endpoints_since("", with_keys=False).endpoints
    assert bare.engine_key is None and bare.url == ep.url
    assert rec.engine_key not in term.endpoints_since("", with_keys=False).model_dump_json()
    # Durable: a controller started on the same state has the same key.
    again = Term.begin(Store(tmp_path), ControllerSettings(state_dir=tmp_path), clock=clock)
    assert again.facts.records[rec.id].engine_key == rec.engine_key


def test_a_replacement_has_a_new_key(tmp_path: Path) -> None:
    clock = FakeClock()
    term = make_fleet(tmp_path, clock)
    term.facts.put_models([MODEL])
    for _ in range(2):
        clock.advance(1.0)
        step(term, ["gpu1", "gpu2"])
    (old,) = term.facts.records.values()
    term.facts.set_flag(old.nodes[0], AdminFlag.DRAINING, "bios", "ops")
    for _ in range(6):
        clock.advance(1.0)
        step(term, ["gpu1", "gpu2"])
    new = [r for r in term.facts.records.values() if r.id != old.id]
    assert new and all(r.engine_key and r.engine_key != old.engine_key for r in new)


def test_store_keeps_the_key_and_none_for_older_replicas(tmp_path: Path) -> None:
    clock = FakeClock()
    term = make_fleet(tmp_path, clock)
    term.facts.put_models([MODEL])
    clock.advance(1.0)
    step(term, ["gpu1"])
    (rec,) = term.facts.records.values()
    store = Store(tmp_path)
    assert store.replicas()[rec.id].engine_key == rec.engine_key
    store.put_replicas([replace(rec, id="older-1", engine_key=None)])
    assert store.replicas()["older-1"].engine_key is None


async def test_only_a_gateway_token_reads_engine_keys(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    tokens = Tokens(
        (
            (GATEWAY, "gw", Role.GATEWAY),
            (ADMIN, "alice", Role.ADMIN),
            (READ, "reader", Role.READ),
            (AGENT, "agent", Role.AGENT),
        )
    )
    client: TestClient = await aiohttp_client(
        create_app(ControllerSettings(state_dir=tmp_path, tokens=tokens))
    )
    term = term_of(client.app)
    term.facts.put_models([MODEL])
    for _ in range(3):
        step(term, ["gpu1"])
    (rec,) = term.facts.records.values()
    key = rec.engine_key
    assert key

    async def get(path: str, token: str) -> tuple[int, str]:
        resp = await client.get(path, headers={"Authorization": f"Bearer {token}"})
        return resp.status, await resp.text()

    status, body = await get("/v1/endpoints", GATEWAY)
    assert status == 200 and key in body
    for token in (READ, ADMIN, AGENT):
        status, body = await get("/v1/endpoints", token)
        assert status == 200 and "http://10.0.0.1:8000" in body and key not in body, token
    status, body = await get("/v1/replicas", READ)
    assert status == 200 and "http://10.0.0.1:8000" in body and key not in body
    for path in ("/v1/models", "/v1/events", "/v1/summary", "/metrics"):
        status, body = await get(path, ADMIN)
        assert status == 200 and key not in body, path


async def test_engine_args_may_not_give_an_api_key(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """A key on the command line would override the replica's (the gateways' would be
    refused) and be readable by every local user: refused, nothing stored."""
    client: TestClient = await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path)))
    for args in (["--api-key", "x"], ["--api-key=x"]):
        spec = {"name": "m", "source": "org/m", "engine_args": args}
        resp = await client.post("/v1/models", json={"models": [spec]})
        assert resp.status == 400 and "--api-key" in (await resp.json())["error"], args
    assert await (await client.get("/v1/models")).json() == []
