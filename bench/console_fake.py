"""A deterministic fake controller behind `httpx.MockTransport`, for
`bench/bench_console.py` only (the console tests run against the real
controller, tests/console/console_fixtures.py): it serves 2,000 precomputed
rows without a controller's own cost in the figures. It keeps node rows,
derives the summary from them (so a cordon shows in the header totals, as
with the real controller), and records every request it receives so tests
can assert on exactly what reached "the controller".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmgw.client import AdminClient
from llmgw.wire import (
    AdminEvent,
    AdminFlag,
    AdminInfo,
    DrainImpact,
    DrainPlan,
    FabricModelCopies,
    FabricSummary,
    FleetSummary,
    GpuClassCounts,
    GpuHealth,
    GpuReport,
    IdleReplica,
    ModelCounts,
    ModelFound,
    ModelIncomplete,
    NodeCounts,
    NodeDetail,
    NodeRow,
    NodesDelta,
    NodeState,
    ReasonGroup,
    ReplicaCounts,
    ReplicaReport,
    ShardState,
    StorageLocation,
    StorageScope,
)

URL = "http://controller.test:7460"
NOW = 1_767_000_000.0  # the frozen "controller clock" of every fixture
ALICE_AT = NOW - 3 * 86400 - 4 * 3600
BOB_AT = NOW - 2 * 3600 - 13 * 60


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    query: str = ""


def _admin(flag: AdminFlag, reason: str, by: str, at: float, drained: bool = False) -> AdminInfo:
    return AdminInfo(flag=flag, reason=reason, by=by, at=at, drained=drained)


def _row(
    name: str,
    gpu_class: str,
    gpus: int,
    used: int,
    fabrics: list[str],
    models: list[str],
    *,
    state: NodeState = NodeState.READY,
    admin: AdminInfo | None = None,
    unhealthy: int = 0,
    unknown: int = 0,
    age: float | None = 2.0,
    replicas: int = 0,
    drain_blocked: str | None = None,
) -> NodeRow:
    return NodeRow(
        name=name,
        state=state,
        admin=admin or AdminInfo(),
        report_age_s=age,
        classes={gpu_class: gpus},
        gpus_total=gpus,
        gpus_used=used,
        gpus_unhealthy=unhealthy,
        gpus_unknown=unknown,
        fabrics=fabrics,
        models=models,
        replicas=replicas,
        drain_blocked=drain_blocked,
    )


H100 = "H100-SXM-80GB"
A100 = "A100-SXM-40GB"
L40S = "L40S-48GB"
LLAMA = "meta-llama/Llama-3.1-70B"
MIXTRAL = "mistralai/Mixtral-8x7B"
QWEN = "Qwen/Qwen2.5-7B"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
EMBED = "BAAI/bge-small"


def small_fleet() -> list[NodeRow]:
    """Twelve nodes that show every state and every kind of trouble once."""
    cordon = _admin(AdminFlag.CORDONED, "RMA: fan tray 2 failing", "alice", ALICE_AT)
    drain = _admin(AdminFlag.DRAINING, "kernel 6.8 upgrade", "bob", BOB_AT)
    lost = _admin(AdminFlag.CORDONED, "PSU swap", "carol", ALICE_AT)
    shared_a = [LLAMA, DEEPSEEK, QWEN]
    return [
        _row("gpu-a01", H100, 8, 8, ["ib-a"], shared_a, replicas=1),
        _row("gpu-a02", H100, 8, 8, ["ib-a"], shared_a, replicas=1),
        _row("gpu-a03", H100, 8, 0, ["ib-a"], shared_a, state=NodeState.CORDONED, admin=cordon),
        _row("gpu-a04", H100, 8, 1, ["ib-a"], shared_a, replicas=1),
        _row(
            "gpu-a05",
            H100,
            8,
            8,
            ["ib-a"],
            shared_a,
            state=NodeState.DRAINING,
            admin=drain,
            replicas=1,
            drain_blocked="llama-70b-r2: no free 8×H100 node in ib-a",
        ),
        _row("gpu-a06", H100, 8, 0, ["ib-a"], shared_a, unhealthy=2),
        _row("gpu-b01", A100, 8, 4, ["ib-b"], [MIXTRAL, QWEN], replicas=1),
        _row("gpu-b02", A100, 8, 4, ["ib-b"], [MIXTRAL], unknown=1, replicas=1),
        _row("gpu-b03", A100, 8, 0, ["ib-b"], [MIXTRAL]),
        _row(
            "gpu-b04",
            A100,
            8,
            0,
            ["ib-b"],
            [],
            state=NodeState.UNREACHABLE,
            admin=lost,
            age=95.0,
        ),
        _row("l40-01", L40S, 4, 1, [], [EMBED], replicas=1),
        _row("l40-02", L40S, 4, 0, [], [EMBED]),
    ]


def big_fleet(n: int) -> list[NodeRow]:
    """`n` nodes in four fabrics with a sprinkling of trouble, for the bench."""
    rows: list[NodeRow] = []
    for i in range(n):
        fabric = f"ib-{'abcd'[i % 4]}"
        cls = H100 if i % 3 else A100
        state, admin = NodeState.READY, None
        if i % 50 == 7:
            state = NodeState.CORDONED
            admin = _admin(AdminFlag.CORDONED, f"ticket OPS-{i}", "alice", ALICE_AT)
        elif i % 97 == 11:
            state = NodeState.UNREACHABLE
        rows.append(
            _row(
                f"node-{i:05d}",
                cls,
                8,
                (i * 7) % 9,
                [fabric],
                [LLAMA] if i % 4 == 0 else [QWEN],
                state=state,
                admin=admin,
                unhealthy=1 if i % 41 == 3 else 0,
                age=2.0 if state != NodeState.UNREACHABLE else 120.0,
                replicas=1 if (i * 7) % 9 else 0,
            )
        )
    return rows


SMALL_COPIES = {
    "ib-a": [
        FabricModelCopies(model=DEEPSEEK, local_copies=0, shared_copies=1, nodes=6),
        FabricModelCopies(model=LLAMA, local_copies=0, shared_copies=1, nodes=6),
        FabricModelCopies(model=QWEN, local_copies=0, shared_copies=1, nodes=6),
    ],
    "ib-b": [
        FabricModelCopies(model=MIXTRAL, local_copies=3, shared_copies=0, nodes=3),
        FabricModelCopies(model=QWEN, local_copies=1, shared_copies=0, nodes=1),
    ],
}


def _without_age(row: NodeRow) -> dict[str, Any]:
    return row.model_dump(exclude={"report_age_s"})


@dataclass
class FakeController:
    """State plus a request handler; `transport` plugs into `AdminClient`."""

    rows: dict[str, NodeRow]
    copies: dict[str, list[FabricModelCopies]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    down: bool = False
    status_error: int | None = None
    crash: bool = False  # the handler raises a non-transport error (a bug)
    history: dict[str, list[AdminEvent]] = field(default_factory=dict)
    _json_cache: dict[str, bytes] = field(default_factory=dict)
    # GET /v1/nodes?since=: the rows as each issued cursor saw them, so a delta
    # is a plain diff however a test changed `rows`. `epoch` changes on restart.
    epoch: str = "run1"
    _seen: dict[int, dict[str, NodeRow]] = field(default_factory=dict)
    last_delta_bytes = 0  # size of the delta churn() prepared (for the bench)

    @classmethod
    def small(cls) -> FakeController:
        rows = {r.name: r for r in small_fleet()}
        history = {
            "gpu-a03": [
                AdminEvent(
                    node="gpu-a03",
                    action="drain",
                    reason="RMA: fan tray 2 failing",
                    by="alice",
                    at=ALICE_AT - 600,
                ),
                AdminEvent(
                    node="gpu-a03",
                    action="drained",
                    reason=None,
                    by="controller",
                    at=ALICE_AT - 300,
                ),
                AdminEvent(
                    node="gpu-a03",
                    action="cordon",
                    reason="RMA: fan tray 2 failing",
                    by="alice",
                    at=ALICE_AT,
                ),
            ]
        }
        return cls(rows=rows, copies=dict(SMALL_COPIES), history=history)

    @classmethod
    def big(cls, n: int = 2000) -> FakeController:
        copies = {
            f"ib-{x}": [
                FabricModelCopies(model=LLAMA, local_copies=0, shared_copies=1, nodes=n // 4),
                FabricModelCopies(model=QWEN, local_copies=n // 8, shared_copies=0, nodes=n // 8),
            ]
            for x in "abcd"
        }
        return cls(rows={r.name: r for r in big_fleet(n)}, copies=copies)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    def client(self) -> AdminClient:
        return AdminClient(URL, transport=self.transport)

    @property
    def mutations(self) -> list[Recorded]:
        """Requests that change state (the drain pre-check is a dry run)."""
        return [r for r in self.requests if r.method != "GET" and r.path != "/v1/drain-plan"]

    def put(self, row: NodeRow) -> None:
        self.rows[row.name] = row
        self._json_cache.clear()

    def remove(self, name: str) -> None:
        del self.rows[name]
        self._json_cache.clear()

    # -- what the bench changes between refreshes -------------------------------

    def churn(self, fraction: float, step: int) -> int:
        """Change `fraction` of rows (GPU use and replicas), deterministically."""
        names = sorted(self.rows)
        every = max(1, round(1 / fraction))
        changed = 0
        for i, name in enumerate(names):
            if (i + step) % every:
                continue
            row = self.rows[name]
            used = (row.gpus_used + 1) % (row.gpus_total + 1 - row.gpus_unhealthy)
            self.rows[name] = row.model_copy(update={"gpus_used": used, "replicas": used // 4})
            changed += 1
        self._json_cache.clear()
        # Encode now, as a real controller would in its own process, so the
        # bench times the console and not this fake.
        self.handler_json("/v1/summary")
        self.last_delta_bytes = len(self.handler_json(f"/v1/nodes?since={self.last_cursor}"))
        self.requests.clear()
        return changed

    # -- HTTP -------------------------------------------------------------------

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        query = request.url.query.decode()
        self.requests.append(Recorded(request.method, request.url.path, body, query))
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.crash:
            raise RuntimeError("boom")
        if self.status_error:
            return _error(self.status_error, "controller is restarting")
        path = request.url.path
        if request.method == "GET":
            if path == "/v1/summary":
                return self._cached(
                    "summary", lambda: self.summary().model_dump(mode="json", by_alias=True)
                )
            if path == "/v1/nodes" and "since" in request.url.params:
                since = request.url.params["since"]
                return self._cached(
                    f"nodes?since={since}",
                    lambda: self.nodes_delta(since).model_dump(mode="json"),
                )
            if path == "/v1/nodes":
                return self._cached(
                    "nodes", lambda: [r.model_dump(mode="json") for r in self.rows.values()]
                )
            if m := re.fullmatch(r"/v1/nodes/([^/]+)", path):
                if m[1] not in self.rows:
                    return _error(404, f"no node named {m[1]!r}")
                return _json(self.detail(m[1]).model_dump(mode="json"))
        if request.method == "POST":
            if path == "/v1/drain-plan" and body:
                return _json(self.drain_plan(body["nodes"]).model_dump(mode="json"))
            if m := re.fullmatch(r"/v1/nodes/([^/]+)/(cordon|uncordon|drain)", path):
                return self._mutate(m[1], m[2], body or {})
        return _error(404, f"no route {request.method} {path}")

    def handler_json(self, path: str) -> bytes:
        """The body this fake serves for a GET (the bench's baseline input)."""
        return self.handler(httpx.Request("GET", URL + path)).content

    def _cached(self, key: str, build: Any) -> httpx.Response:
        # The bench serves 2,000 rows every cycle; encoding them once per change
        # keeps the fake out of the figures.
        if key not in self._json_cache:
            self._json_cache[key] = json.dumps(build()).encode()
        return httpx.Response(
            200, content=self._json_cache[key], headers={"content-type": "application/json"}
        )

    def _mutate(self, name: str, action: str, body: dict[str, Any]) -> httpx.Response:
        row = self.rows.get(name)
        if row is None:
            return _error(404, f"no node named {name!r}")
        reason = str(body.get("reason", "")).strip()
        if action != "uncordon" and not reason:
            return _error(422, "a reason is required", [{"loc": "reason", "msg": "empty"}])
        if action == "cordon":
            admin = AdminInfo(flag=AdminFlag.CORDONED, reason=reason, by="tester", at=NOW)
            state = NodeState.CORDONED
        elif action == "drain":
            admin = AdminInfo(flag=AdminFlag.DRAINING, reason=reason, by="tester", at=NOW)
            state = NodeState.DRAINING
        else:
            admin, state = AdminInfo(), NodeState.READY
        if row.state == NodeState.UNREACHABLE:
            state = NodeState.UNREACHABLE
        new = row.model_copy(update={"admin": admin, "state": state})
        self.rows[name] = new
        self.history.setdefault(name, []).append(
            AdminEvent(node=name, action=action, reason=reason or None, by="tester", at=NOW)
        )
        self._json_cache.clear()
        return _json(new.model_dump(mode="json"))

    # -- derived views ------------------------------------------------------------

    @property
    def last_cursor(self) -> str:
        return f"{self.epoch}.{max(self._seen)}" if self._seen else ""

    def restart(self) -> None:
        """As a controller restart looks to clients: old cursors mean nothing."""
        self.epoch += "'"
        self._seen.clear()
        self._json_cache.clear()

    def nodes_delta(self, since: str) -> NodesDelta:
        epoch, _, revision = since.partition(".")
        base = self._seen.get(int(revision)) if epoch == self.epoch else None
        issued = max(self._seen, default=0) + 1
        self._seen[issued] = dict(self.rows)
        for old in sorted(self._seen)[:-8]:  # a console only ever asks since its last
            del self._seen[old]
        ages = {name: row.report_age_s for name, row in self.rows.items()}
        cursor = f"{self.epoch}.{issued}"
        if base is None:
            return NodesDelta(
                cursor=cursor, full=True, nodes=list(self.rows.values()), report_ages=ages
            )
        changed = [
            row
            for name, row in self.rows.items()
            if (old := base.get(name)) is None or _without_age(old) != _without_age(row)
        ]
        removed = [name for name in base if name not in self.rows]
        return NodesDelta(
            cursor=cursor, full=False, nodes=changed, removed=removed, report_ages=ages
        )

    def summary(self) -> FleetSummary:
        rows = list(self.rows.values())
        states = Counter(r.state for r in rows)
        per_class: dict[str, dict[str, int]] = {}
        for r in rows:
            for cls, n in r.classes.items():
                c = per_class.setdefault(
                    cls, dict(total=0, used=0, unhealthy=0, unknown=0, unschedulable=0, free=0)
                )
                idle = n - r.gpus_used - r.gpus_unhealthy - r.gpus_unknown
                c["total"] += n
                c["used"] += r.gpus_used
                c["unhealthy"] += r.gpus_unhealthy
                c["unknown"] += r.gpus_unknown
                c["free" if r.state == NodeState.READY else "unschedulable"] += idle
        fabrics = []
        for fab in sorted({f for r in rows for f in r.fabrics}):
            members = [r for r in rows if fab in r.fabrics]
            free_block = sum(
                1
                for r in members
                if r.state == NodeState.READY
                and r.gpus_used == 0
                and r.gpus_unhealthy == 0
                and r.gpus_unknown == 0
            )
            fabrics.append(
                FabricSummary(
                    fabric=fab,
                    nodes=len(members),
                    nodes_with_weights=sum(1 for r in members if r.models),
                    models_present=len({m for r in members for m in r.models}),
                    largest_free_block=free_block,
                    copies=self.copies.get(fab, []),
                )
            )
        groups: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            if r.admin.reason:
                groups.setdefault((r.admin.reason, r.admin.flag), []).append(r.name)
        return FleetSummary(
            nodes=NodeCounts(
                total=len(rows),
                ready=states[NodeState.READY],
                cordoned=states[NodeState.CORDONED],
                draining=states[NodeState.DRAINING],
                unreachable=states[NodeState.UNREACHABLE],
            ),
            gpus=[
                GpuClassCounts.model_validate({"class": k, **v})
                for k, v in sorted(per_class.items())
            ],
            fabrics=fabrics,
            replicas=ReplicaCounts(ready=7, starting=1, draining=1, failed=1),
            models=ModelCounts(total=5, satisfied=3, short=2),
            unplaceable=[DEEPSEEK, EMBED],
            unplaceable_reasons={
                DEEPSEEK: "needs 2 nodes × 8 H100-SXM-80GB in one fabric; "
                "largest free block: ib-a 1, ib-b 0",
                EMBED: "needs 1 × L40S-48GB; every L40S node is busy or cordoned",
            },
            idle_replicas=[
                IdleReplica(id="qwen-7b-r3", model=QWEN, idle_seconds=7980.0, gpus=1),
                IdleReplica(id="llama-70b-r1", model=LLAMA, idle_seconds=2710.0, gpus=8),
                IdleReplica(id="mixtral-r2", model=MIXTRAL, idle_seconds=905.0, gpus=4),
            ],
            reasons=[
                ReasonGroup(reason=k[0], flag=AdminFlag(k[1]), by=None, at=None, nodes=v)
                for k, v in sorted(groups.items())
            ],
            generated_at=NOW,
        )

    def detail(self, name: str) -> NodeDetail:
        row = self.rows[name]
        cls = next(iter(row.classes), "unknown")
        gpus = []
        for i in range(row.gpus_total):
            health, reason = GpuHealth.HEALTHY, None
            if i >= row.gpus_total - row.gpus_unhealthy:
                health = GpuHealth.UNHEALTHY
                reason = "Xid 79: GPU has fallen off the bus" if i % 2 else "uncorrectable ECC"
            elif i >= row.gpus_total - row.gpus_unhealthy - row.gpus_unknown:
                health, reason = GpuHealth.UNKNOWN, "NVML: GPU is lost"
            used = i < row.gpus_used
            gpus.append(
                GpuReport(
                    uuid=f"GPU-5f2c{i:02d}-{name}",
                    index=i,
                    name=cls.replace("-", " "),
                    gpu_class=cls,
                    memory_total_mib=81559 if "80" in cls else 40960,
                    memory_used_mib=70000 if used else 3,
                    utilization_pct=87 if used else 0,
                    in_use=used,
                    health=health,
                    health_reason=reason,
                )
            )
        storage: list[StorageLocation] = []
        if "ib-a" in row.fabrics:
            storage.append(
                StorageLocation(
                    path="/models",
                    fs_type="lustre",
                    scope=StorageScope.SHARED,
                    mount_source="10.0.0.5@o2ib:/models",
                    mount_point="/models",
                    models=[
                        ModelFound(name=m, path=f"/models/{m}", size_bytes=140 * 2**30, files=30)
                        for m in row.models
                    ],
                    incomplete=[
                        ModelIncomplete(
                            name="meta-llama/Llama-3.1-405B",
                            path="/models/meta-llama/Llama-3.1-405B",
                            reason="3 of 191 shards missing (.incomplete files)",
                        ),
                    ],
                )
            )
        storage.append(
            StorageLocation(
                path="/nvme/models",
                fs_type="xfs",
                scope=StorageScope.LOCAL,
                mount_point="/nvme",
                models=[
                    ModelFound(name=m, path=f"/nvme/models/{m}", size_bytes=15 * 2**30, files=4)
                    for m in row.models
                    if "ib-a" not in row.fabrics
                ],
                incomplete=[
                    ModelIncomplete(
                        name="scratch", path="/nvme/models/scratch", reason="empty directory"
                    ),
                ],
            )
        )
        replicas = [
            ReplicaReport(
                id=f"{name}-r{k}",
                model=row.models[0] if row.models else QWEN,
                rank=0,
                state=ShardState.READY,
                gpus=[g.uuid for g in gpus[: max(1, row.gpus_used)]],
                port=8000 + k,
                idle_seconds=42.0 * (k + 1),
            )
            for k in range(row.replicas)
        ]
        return NodeDetail(
            row=row,
            gpus=gpus,
            storage_configured=True,
            storage=storage,
            replicas=replicas,
            history=self.history.get(name, []),
            agent_version="0.1.0",
            address=f"10.1.0.{sorted(self.rows).index(name) + 10}",
        )

    def drain_plan(self, nodes: list[str]) -> DrainPlan:
        impacts = [
            DrainImpact(
                model=LLAMA,
                min_replicas=3,
                ready_now=3,
                replicas_on_nodes=1,
                replaceable=0,
                verdict="below_minimum",
                reason="no free 8×H100-SXM-80GB node in ib-a",
            ),
            DrainImpact(
                model=QWEN,
                min_replicas=1,
                ready_now=2,
                replicas_on_nodes=1,
                replaceable=1,
                verdict="ok",
            ),
        ]
        return DrainPlan(nodes=nodes, replicas_to_move=2, impacts=impacts)


def _json(data: Any) -> httpx.Response:
    return httpx.Response(200, json=data)


def _error(status: int, message: str, detail: list[dict[str, Any]] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": message, "detail": detail or []})
