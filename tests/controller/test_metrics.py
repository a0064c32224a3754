"""`/metrics` tells the same facts as `/v1/summary`, for a fleet built through the API."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from fleet_factories import gpu, location, report
from prometheus_client.parser import text_string_to_metric_families

from llmgw.controller.core.auth import Role, Tokens
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.http.keys import term_of
from llmgw.controller.loop.reconcile import Reconciler
from llmgw.wire import EventReason

AGENT, ADMIN, READ, SCRAPE = "agent-secret", "admin-secret", "read-secret", "metrics-secret"
ClientFactory = Callable[..., Awaitable[TestClient]]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


GATEWAY = "gateway-secret"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def settings(tmp_path: Path, **kw: Any) -> ControllerSettings:
    tokens = Tokens(
        (
            (AGENT, "agent", Role.AGENT),
            (ADMIN, "alice", Role.ADMIN),
            (READ, "reader", Role.READ),
            (SCRAPE, "prometheus", Role.METRICS),
            (GATEWAY, "gw", Role.GATEWAY),
        )
    )
    # The test drives reconcile passes itself, so nothing moves between two reads.
    return ControllerSettings(
        state_dir=tmp_path,
        tokens=tokens,
        reconcile_interval_s=86_400,
        reconcile_on_news=False,
        **kw,
    )


async def post_report(client: TestClient, body: Any) -> None:
    resp = await client.post("/v1/agent/report", data=body.model_dump_json(), headers=auth(AGENT))
    assert resp.status == 200, await resp.text()


async def build_fleet(client: TestClient) -> None:
    """Two fabrics, two GPU classes, every GPU bucket, every node state but
    unreachable, local and shared weights, a satisfied, a short-but-starting and
    an unplaceable model, and an idle replica."""
    shared = location("/mnt/filer", ["llama-70b"], scope="shared", source="filer:/models")
    reports = {
        "a1": report(
            "a1",
            fabrics=["ib-a"],
            gpus=[gpu("a1", 0, in_use=True), gpu("a1", 1, health="unhealthy", reason="Xid 79")]
            + [gpu("a1", i) for i in range(2, 8)],
            storage=[location("/nvme", ["qwen-7b"]), shared],
        ),
        "a2": report("a2", fabrics=["ib-a"], storage=[shared]),
        "a3": report("a3", fabrics=["ib-a", "ib-b"]),
        "b1": report(
            "b1",
            fabrics=["ib-b"],
            gpus=[gpu("b1", i, cls="A100-SXM-40GB") for i in range(3)]
            + [gpu("b1", 3, cls="A100-SXM-40GB", health="unknown")],
            storage=[location("/nvme", ["qwen-7b"])],
        ),
        "b2": report("b2", fabrics=["ib-b"]),
    }
    for body in reports.values():
        await post_report(client, body)
    r = await client.post("/v1/nodes/b2/cordon", json={"reason": "bad fan"}, headers=auth(ADMIN))
    assert r.status == 200
    models = [
        {"name": "qwen-7b", "source": "Qwen/Qwen-7B", "min_replicas": 1, "gpus_per_shard": 1},
        {"name": "llama-70b", "source": "meta/llama", "min_replicas": 1, "gpus_per_shard": 4},
        {"name": "huge", "source": "x/huge", "min_replicas": 1, "gpus_per_shard": 8, "shards": 4},
    ]
    r = await client.post("/v1/models", json={"models": models}, headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    Reconciler(term_of(client.app)).tick()
    # The qwen replica comes up and has been idle an hour; llama stays starting.
    replicas = await (await client.get("/v1/replicas", headers=auth(READ))).json()
    qwen = next(r for r in replicas if r["model"] == "qwen-7b")
    (shard,) = qwen["shards"]
    node = reports[shard["node"]]
    running = {
        "id": qwen["id"],
        "model": "qwen-7b",
        "state": "ready",
        "gpus": shard["gpus"],
        "idle_seconds": 3600.0,
        "traffic": {"requests_per_s": 0.0, "in_flight": 0, "prefix_hit_rate": 0.5},
    }
    await post_report(client, node.model_validate({**node.model_dump(), "replicas": [running]}))
    # Drained after the pass, so the drain is still in progress.
    r = await client.post("/v1/nodes/a3/drain", json={"reason": "reimage"}, headers=auth(ADMIN))
    assert r.status == 200


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def one(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def family(found: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in found.items() if n == name}


@pytest.fixture
async def client(aiohttp_client: ClientFactory, tmp_path: Path) -> TestClient:
    c = await aiohttp_client(create_app(settings(tmp_path)))
    await build_fleet(c)
    return c


async def test_metrics_equal_the_summary(client: TestClient) -> None:
    summary = await (await client.get("/v1/summary", headers=auth(READ))).json()
    resp = await client.get("/metrics", headers=auth(SCRAPE))
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    m = samples(await resp.text())

    # The fleet is what the test built, so the comparison below cannot pass on empties.
    # a1's Xid 79 card cordoned it (by llmgw); b2 an operator cordoned.
    assert summary["nodes"] == {
        "total": 5, "ready": 2, "cordoned": 2, "draining": 1, "unreachable": 0
    }  # fmt: skip
    assert summary["unplaceable"] == ["huge"] and len(summary["idle_replicas"]) == 1

    for state, n in summary["nodes"].items():
        name, labels = (
            ("llmgw_nodes_total", {}) if state == "total" else ("llmgw_nodes", {"state": state})
        )
        assert one(m, name, **labels) == n, state
    assert len(family(m, "llmgw_gpus")) == 5 * len(summary["gpus"]) == 10
    for c in summary["gpus"]:
        assert one(m, "llmgw_gpus_total", **{"class": c["class"]}) == c["total"]
        for bucket in ("used", "free", "unschedulable", "unhealthy", "unknown"):
            assert one(m, "llmgw_gpus", **{"class": c["class"], "bucket": bucket}) == c[bucket]
    assert (
        {dict(k)["fabric"] for k in family(m, "llmgw_fabric_nodes")}
        == {f["fabric"] for f in summary["fabrics"]}
        == {"ib-a", "ib-b"}
    )
    copies = 0
    for f in summary["fabrics"]:
        fab = f["fabric"]
        assert one(m, "llmgw_fabric_nodes", fabric=fab) == f["nodes"]
        assert one(m, "llmgw_fabric_nodes_with_weights", fabric=fab) == f["nodes_with_weights"]
        assert one(m, "llmgw_fabric_models_present", fabric=fab) == f["models_present"]
        assert one(m, "llmgw_fabric_largest_free_block", fabric=fab) == f["largest_free_block"]
        for c in f["copies"]:
            copies += 1
            where = {"model": c["model"], "fabric": fab}
            assert one(m, "llmgw_model_copies", scope="local", **where) == c["local_copies"]
            assert one(m, "llmgw_model_copies", scope="shared", **where) == c["shared_copies"]
            assert one(m, "llmgw_model_fabric_nodes", **where) == c["nodes"]
    assert copies == len(family(m, "llmgw_model_fabric_nodes")) >= 3
    for state, n in summary["replicas"].items():
        assert one(m, "llmgw_replicas", state=state) == n

    views = await (await client.get("/v1/models", headers=auth(READ))).json()
    assert len(family(m, "llmgw_model_ready_replicas")) == summary["models"]["total"] == 3
    for v in views:
        name = v["spec"]["name"]
        assert one(m, "llmgw_model_ready_replicas", model=name) == v["ready"]
        assert one(m, "llmgw_model_min_replicas", model=name) == v["spec"]["min_replicas"]
        assert one(m, "llmgw_model_satisfied", model=name) == int(v["satisfied"])
        assert one(m, "llmgw_model_unplaceable", model=name) == int(name in summary["unplaceable"])
    satisfied = sum(v for v in family(m, "llmgw_model_satisfied").values())
    assert satisfied == summary["models"]["satisfied"]

    (idle,) = summary["idle_replicas"]
    assert family(m, "llmgw_idle_replicas") == {frozenset({("model", idle["model"])}): 1}
    assert family(m, "llmgw_idle_gpus") == {frozenset({("model", idle["model"])}): idle["gpus"]}
    (traffic,) = summary["traffic"]
    where = {"model": traffic["model"]}
    assert one(m, "llmgw_model_requests_per_second", **where) == traffic["requests_per_s"]
    assert one(m, "llmgw_model_requests_in_flight", **where) == traffic["in_flight"]
    assert one(m, "llmgw_model_prefix_cache_hit_ratio", **where) == traffic["prefix_hit_rate"]
    assert family(m, "llmgw_model_p50_latency_seconds") == {}  # unknown: no sample, not 0
    assert one(m, "llmgw_drains_in_progress") == summary["nodes"]["draining"]
    assert one(m, "llmgw_gateways") == 0  # no gateway tracking yet: an empty family
    assert family(m, "llmgw_gateway_report_age_seconds") == {}
    # No per-node series unless asked for.
    assert not any(n.startswith("llmgw_node_") for n, _ in m)


async def test_gateways_and_their_in_flight_show_as_the_summary_counts_them(
    client: TestClient,
) -> None:
    replicas = await (await client.get("/v1/replicas", headers=auth(READ))).json()
    qwen = next(r for r in replicas if r["model"] == "qwen-7b")
    status = {"name": "gw-a", "cursor": "", "in_flight": {qwen["id"]: 4}}
    r = await client.post("/v1/gateways/status", json=status, headers=auth(GATEWAY))
    assert r.status == 200
    m = samples(await (await client.get("/metrics", headers=auth(READ))).text())
    summary = await (await client.get("/v1/summary", headers=auth(READ))).json()
    assert one(m, "llmgw_gateways") == 1
    assert set(family(m, "llmgw_gateway_report_age_seconds")) == {frozenset({("gateway", "gw-a")})}
    (traffic,) = summary["traffic"]
    assert traffic["in_flight"] == 4  # the gateway holds more than the engine reports
    assert one(m, "llmgw_model_requests_in_flight", model="qwen-7b") == 4


async def test_controller_health_metrics(client: TestClient) -> None:
    m = samples(await (await client.get("/metrics", headers=auth(READ))).text())
    assert one(m, "llmgw_reports_total", outcome="ok") == 6
    assert one(m, "llmgw_report_seconds_count") == 6
    assert one(m, "llmgw_store_write_seconds_count") > 0
    assert one(m, "llmgw_store_write_errors_total") == 0
    assert one(m, "llmgw_leader") == 1 and one(m, "llmgw_leader_epoch") == 0
    bad = await client.post("/v1/agent/report", data=b"{}", headers=auth(AGENT))
    assert bad.status == 400
    m = samples(await (await client.get("/metrics", headers=auth(READ))).text())
    assert one(m, "llmgw_reports_total", outcome="rejected") == 1


async def test_turns_to_unreachable_are_a_counter(client: TestClient) -> None:
    text = await (await client.get("/metrics", headers=auth(READ))).text()
    assert "# TYPE llmgw_nodes_turned_unreachable_total counter" in text
    assert one(samples(text), "llmgw_nodes_turned_unreachable_total") == 0
    fleet = term_of(client.app)
    fleet.facts.turned_unreachable = 3  # counted by Term (test_summary)
    m = samples(await (await client.get("/metrics", headers=auth(READ))).text())
    assert one(m, "llmgw_nodes_turned_unreachable_total") == 3


async def test_metrics_auth(client: TestClient) -> None:
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers=auth("nope"))).status == 401
    for token in (READ, ADMIN, SCRAPE):
        assert (await client.get("/metrics", headers=auth(token))).status == 200
    # A metrics token scrapes and does nothing else.
    assert (await client.get("/v1/summary", headers=auth(SCRAPE))).status == 403
    r = await client.post("/v1/nodes/a1/cordon", json={"reason": "x"}, headers=auth(SCRAPE))
    assert r.status == 403


async def test_per_node_series_are_opt_in(aiohttp_client: ClientFactory, tmp_path: Path) -> None:
    c = await aiohttp_client(create_app(settings(tmp_path, metrics_per_node=True)))
    await build_fleet(c)
    m = samples(await (await c.get("/metrics", headers=auth(READ))).text())
    assert one(m, "llmgw_node_state", node="b2", state="cordoned") == 1
    assert one(m, "llmgw_node_gpus", node="a1", bucket="unhealthy") == 1
    assert len(family(m, "llmgw_node_state")) == 5


async def test_metrics_listen_serves_loopback_without_token(
    aiohttp_client: ClientFactory, tmp_path: Path, unused_tcp_port: int
) -> None:
    import aiohttp

    c = await aiohttp_client(
        create_app(settings(tmp_path, metrics_listen=f"127.0.0.1:{unused_tcp_port}"))
    )
    await build_fleet(c)
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{unused_tcp_port}/metrics") as r,
    ):
        assert r.status == 200
        m = samples(await r.text())
    assert one(m, "llmgw_nodes_total") == 5


def test_metrics_listen_refuses_a_public_address(tmp_path: Path) -> None:
    from llmgw.controller.main import parser, settings_from_args

    args = parser().parse_args(["--state-dir", str(tmp_path), "--metrics-listen", "0.0.0.0:9460"])
    with pytest.raises(ValueError, match="loopback"):
        settings_from_args(args)
    ok = parser().parse_args(
        ["--state-dir", str(tmp_path), "--metrics-listen", "127.0.0.1:9460", "--metrics-per-node"]
    )
    s = settings_from_args(ok)
    assert s.metrics_listen == "127.0.0.1:9460" and s.metrics_per_node


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llmgw.json"
RULES = DASHBOARD.parents[1] / "prometheus" / "llmgw-rules.yml"


async def exported(client: TestClient) -> set[str]:
    """Every llmgw series name the controller's /metrics has."""
    text = await (await client.get("/metrics", headers=auth(READ))).text()
    names = {name for name, _ in samples(text)}
    # Families declared without a sample now (a p50 before any request) count too.
    names |= set(re.findall(r"^# TYPE (llmgw_[a-z0-9_]+) ", text, re.M))
    assert {"llmgw_reports_total", "llmgw_report_seconds_bucket", "llmgw_gpus"} <= names
    return names


async def test_alert_rules_use_only_exported_metrics(client: TestClient) -> None:
    import yaml

    have = await exported(client)
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    for rule in rules:
        used = set(re.findall(r"\bllmgw_[a-z0-9_]+", rule["expr"]))
        assert used, rule["alert"]
        assert used <= have, f"{rule['alert']}: {sorted(used - have)} not exported"


async def test_dashboard_uses_only_exported_metrics(client: TestClient) -> None:
    import json

    exported_names = await exported(client)
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    titles = " ".join(p["title"] for p in panels)
    for part in ("state", "class", "Fabrics", "Weights matrix", "idle", "Unplaceable"):
        assert part.lower() in titles.lower(), part
    exprs = [variables["job"]["definition"]]
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        exprs += [t["expr"] for t in p["targets"]]
    for expr in exprs:
        used = set(re.findall(r"\bllmgw_[a-z0-9_]+", expr))
        assert used, expr
        assert used <= exported_names, f"{expr}: {sorted(used - exported_names)} not exported"


async def test_events_are_counted_by_reason(client: TestClient) -> None:
    """The fleet built above placed replicas and found a model that cannot fit."""
    m = samples(await (await client.get("/metrics", headers=auth(SCRAPE))).text())
    counted = family(m, "llmgw_events_total")
    assert len(counted) == len(EventReason)  # every reason, zero or not
    assert one(m, "llmgw_events_total", reason="Placed") >= 1
    assert one(m, "llmgw_events_total", reason="Unplaceable") == 1  # "huge", once
    assert one(m, "llmgw_events_total", reason="GpuFault") == 1  # a1's Xid 79 card
