"""LoRA adapters end to end (issue 33): a real controller, two agents with fake cards
and fake engines that load adapters as vLLM does, the gateway with its SMG child.

The issue's scale: a hundred adapters on one base of four replicas that each hold at
most eight (`--max-cpu-loras 8`), so the adapters must take turns in 32 slots, under
skewed traffic: one hot adapter asked by many clients at once, the others once each.
Every request is answered by its adapter's name; no engine is ever asked for an
adapter it does not hold (their access logs show no 404); the hot adapter spreads
over several replicas; no replica holds more than its eight; the cold ones are
unloaded once idle."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.agent.sample_models import write_adapter
from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, ENGINE_ARGS, Gateway, wait_cluster_ready

pytestmark = pytest.mark.slow

NODES = ["gpu1", "gpu2"]
ADAPTERS = [f"lora{i}" for i in range(100)]
HOT = "lora0"
SLOTS = 8


def base() -> dict[str, Any]:
    args = [*ENGINE_ARGS, "--enable-lora", "--max-loras", "8", "--max-cpu-loras", str(SLOTS)]
    args += ["--lora-load-seconds", "0.2"]
    args[args.index("--token-interval") + 1] = "0.05"
    return {
        "name": "base",
        "source": "org/base",
        "min_replicas": 4,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": args,
        "target_in_flight": 2,
    }


def ask(gw: Gateway, name: str, out: list[tuple[str, int, str]]) -> None:
    body = {"model": name, "prompt": "hello there", "max_tokens": 4}
    r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=60)
    out.append((name, r.status_code, r.json().get("model", r.text) if r.is_success else r.text))


def parent_of(gw: Gateway, name: str) -> str | None:
    """The parent `/v1/models` names for `name` (None while the gateway starts)."""
    try:
        listed = httpx.get(f"{gw.url}/v1/models").json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return next((m.get("parent") for m in listed if m["id"] == name), None)


def holders(c: Cluster) -> dict[str, list[str]]:
    return {a["spec"]["name"]: a["loaded_on"] + a["loading_on"] for a in c.get("/v1/adapters")}


def test_many_adapters_on_a_few_replicas_under_skewed_traffic(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    storage = tmp_path / "adapters"
    for name in ADAPTERS:
        write_adapter(storage / "acme" / name, base="org/base")
    c.start_controller(*CONTROLLER_ARGS, "--adapter-idle-after", "4s")
    for node in NODES:
        c.start_agent(node, gpus="2xH100-80GB", extra=["--storage", str(storage)])
    wait_cluster_ready(c, NODES)
    adapters = [{"name": n, "base": "base", "source": f"acme/{n}"} for n in ADAPTERS]
    c.apply([base(), *adapters])
    wait_until(
        lambda: sum(r["state"] == "ready" for r in c.get("/v1/replicas")) == 4,
        timeout=30,
        what="4 ready replicas of the base",
        diagnose=c.logs,
    )
    assert "+ lora0" in c.ctl("models")
    gw = Gateway(c)
    gw.start()
    wait_until(lambda: parent_of(gw, HOT) == "base", timeout=30, what="adapters listed")

    answers: list[tuple[str, int, str]] = []
    most_held: Counter[str] = Counter()  # replica -> most adapters seen held at once
    hot_spread = 0
    stop = threading.Event()

    def hot_client() -> None:
        while not stop.is_set():
            ask(gw, HOT, answers)

    cold_s: list[float] = []

    def cold_client(names: list[str]) -> None:
        for name in names:
            t0 = time.monotonic()
            ask(gw, name, answers)
            cold_s.append(time.monotonic() - t0)

    hot = [threading.Thread(target=hot_client) for _ in range(8)]
    cold = [threading.Thread(target=cold_client, args=(ADAPTERS[1 + i :: 3],)) for i in range(3)]
    for t in hot + cold:
        t.start()
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in cold) and time.monotonic() < deadline:
        held = holders(c)
        per_replica = Counter(r for reps in held.values() for r in reps)
        for rid, n in per_replica.items():
            most_held[rid] = max(most_held[rid], n)
        hot_spread = max(hot_spread, len(held.get(HOT, [])))
        time.sleep(0.2)
    stop.set()
    for t in hot + cold:
        t.join(timeout=60)

    # Every request answered, by its adapter's name.
    wrong = [a for a in answers if a[1] != 200 or a[2] != a[0]]
    assert not wrong, wrong[:5]
    assert {a[0] for a in answers} == set(ADAPTERS), "every adapter was asked for"
    # The hot adapter spread; no replica held more than its slots.
    assert hot_spread >= 2, hot_spread
    assert most_held and max(most_held.values()) <= SLOTS, most_held
    # No engine was ever asked for an adapter it does not hold.
    logs = [p.read_text(errors="replace") for p in c.root.rglob("*-0.log")]
    assert logs, "engine logs"
    refused = [
        line for log in logs for line in log.splitlines() if re.search(r"completions.* 404$", line)
    ]
    assert not refused, refused[:5]
    # Idle: unloaded everywhere, through the gateways' handshake.
    wait_until(
        lambda: not any(holders(c).values()),
        timeout=30,
        what="idle adapters unloaded",
    )
    events = c.ctl("events")
    assert "AdapterLoaded" in events and "AdapterUnloaded" in events, events
    print(
        f"{len(answers)} answers; hot adapter on up to {hot_spread} replicas; most held "
        f"{dict(most_held)}; cold requests {min(cold_s):.1f}-{max(cold_s):.1f}s"
    )
    gw.stop()


def test_a_drained_holder_hands_its_adapter_over_before_it_stops(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 33 item 2: the only replica holding an adapter is drained under the
    adapter's traffic. It stays in routing until another replica of the base has the
    adapter loaded, and only then stops: the events say so in that order, and no
    request fails (without the hand-over, the holder stopped first and requests
    failed or waited for the load)."""
    c = cluster
    storage = tmp_path / "adapters"
    write_adapter(storage / "acme" / "sql", base="org/base")
    c.start_controller(*CONTROLLER_ARGS, "--adapter-idle-after", "600s")
    for node in NODES:
        c.start_agent(node, gpus="2xH100-80GB", extra=["--storage", str(storage)])
    wait_cluster_ready(c, NODES)
    spec = {**base(), "min_replicas": 2}
    args = spec["engine_args"]
    # Slower than a stand-in's start (0.3 s): the holder must wait for the other load.
    args[args.index("--lora-load-seconds") + 1] = "3"
    c.apply([spec, {"name": "sql", "base": "base", "source": "acme/sql"}])
    wait_until(
        lambda: sum(r["state"] == "ready" for r in c.get("/v1/replicas")) == 2,
        timeout=30,
        what="2 ready replicas of the base",
        diagnose=c.logs,
    )
    gw = Gateway(c)
    gw.start()
    wait_until(lambda: parent_of(gw, "sql") == "base", timeout=30, what="adapter listed")
    answers: list[tuple[str, int, str]] = []
    ask(gw, "sql", answers)
    (holder,) = holders(c)["sql"]
    node = next(r for r in c.get("/v1/replicas") if r["id"] == holder)["shards"][0]["node"]

    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            ask(gw, "sql", answers)

    asking = threading.Thread(target=client)  # one: under the target, it does not spread
    asking.start()
    try:
        c.ctl("drain", node, "--reason", "maintenance")
        wait_until(
            lambda: holder not in {r["id"] for r in c.get("/v1/replicas")},
            timeout=60,
            what=f"{holder} stopped",
            diagnose=c.logs,
        )
        before = len(answers)
        wait_until(lambda: len(answers) >= before + 4, timeout=20, what="answers after it")
    finally:
        stop.set()
        asking.join(timeout=60)
    gw.stop()

    wrong = [a for a in answers if a[1] != 200 or a[2] != "sql"]
    assert not wrong, wrong[:5]
    said = [(e["reason"], e["message"]) for e in c.get("/v1/events")["events"]]

    def first(reason: str, words: str) -> int:
        return next(i for i, (r, m) in enumerate(said) if r == reason and words in m)

    loaded = first("AdapterLoaded", "loaded on replica ")
    loaded_elsewhere = next(
        i for i, (r, m) in enumerate(said) if r == "AdapterLoaded" and holder not in m
    )
    moved = first("Moved", f"{holder} stopped")
    assert loaded < loaded_elsewhere < moved, said
    handing = first("HandingOverAdapters", holder)  # its stand-in served first: it waited
    assert loaded < handing < loaded_elsewhere, said
