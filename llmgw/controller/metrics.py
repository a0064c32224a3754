"""The controller's `/metrics`: the fleet summary and the controller's own health.

Fleet facts are read at scrape time from the leader's term (`Term.summary()`
and its views) by a custom collector, so they can never disagree with
`/v1/summary`: there is no second bookkeeping. The controller's own health
(reconcile passes, store writes) is kept by ordinary prometheus_client
instruments, updated by small hooks at the call sites; report handling, on
every report's path, by plain counts (`ReportFigures`).

Label cardinality is bounded by what operators declare: GPU classes, fabrics,
models, gateways. Per-node series are opt-in (`--metrics-per-node`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmgw.controller.term import Term
from llmgw.wire import EventReason, ModelTraffic, NodeState, ReplicaState

GPU_BUCKETS = ("used", "free", "unschedulable", "unhealthy", "unknown")
# Report handling is a few ms; a store write can take a full fsync.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

__all__ = ["CONTENT_TYPE_LATEST", "ControllerMetrics", "FleetCollector"]


class FleetCollector(Collector):
    """Every fleet fact of the summary, computed from the state owner per scrape."""

    def __init__(
        self,
        term: Callable[[], Term | None],
        per_node: bool = False,
    ) -> None:
        self._term = term
        self._per_node = per_node

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on nothing at registration time; skip the probe collect

    def collect(self) -> Iterator[Metric]:
        fleet = self._term()
        if fleet is None:  # not leading: before startup, after shutdown, a follower
            return
        gateways = fleet.gateways
        views = gateways.views()
        s = fleet.summary(gateways.in_flight(fleet.facts.clock()))

        nodes = GaugeMetricFamily("llmgw_nodes", "Nodes by state.", labels=["state"])
        for state in NodeState:
            nodes.add_metric([state.value], getattr(s.nodes, state.value))
        yield nodes
        yield GaugeMetricFamily("llmgw_nodes_total", "Nodes known.", value=s.nodes.total)
        yield CounterMetricFamily(
            "llmgw_nodes_turned_unreachable",
            "Times a node turned unreachable (no report within its grace) in this process.",
            value=fleet.facts.turned_unreachable,
        )
        events = CounterMetricFamily(
            "llmgw_events",
            "Decisions the controller took by itself (GET /v1/events), by reason, in this process.",
            labels=["reason"],
        )
        counts = fleet.facts.event_counts
        for reason in EventReason:
            events.add_metric([reason.value], counts.get(reason, 0))
        yield events

        gpus = GaugeMetricFamily(
            "llmgw_gpus",
            "GPUs by class and bucket; every card is in exactly one bucket.",
            labels=["class", "bucket"],
        )
        gpus_total = GaugeMetricFamily("llmgw_gpus_total", "GPUs by class.", labels=["class"])
        for g in s.gpus:
            gpus_total.add_metric([g.gpu_class], g.total)
            for bucket in GPU_BUCKETS:
                gpus.add_metric([g.gpu_class, bucket], getattr(g, bucket))
        yield gpus
        yield gpus_total

        f_nodes = GaugeMetricFamily("llmgw_fabric_nodes", "Nodes in a fabric.", labels=["fabric"])
        f_weights = GaugeMetricFamily(
            "llmgw_fabric_nodes_with_weights",
            "Reachable nodes in a fabric holding any complete weights.",
            labels=["fabric"],
        )
        f_models = GaugeMetricFamily(
            "llmgw_fabric_models_present",
            "Distinct models readable in a fabric.",
            labels=["fabric"],
        )
        f_block = GaugeMetricFamily(
            "llmgw_fabric_largest_free_block",
            "Ready nodes in a fabric with every card free and healthy.",
            labels=["fabric"],
        )
        copies = GaugeMetricFamily(
            "llmgw_model_copies",
            "Copies of a model's weights in a fabric: local (nodes) or shared (filers).",
            labels=["model", "fabric", "scope"],
        )
        readers = GaugeMetricFamily(
            "llmgw_model_fabric_nodes",
            "Nodes in a fabric that can read a model.",
            labels=["model", "fabric"],
        )
        for f in s.fabrics:
            f_nodes.add_metric([f.fabric], f.nodes)
            f_weights.add_metric([f.fabric], f.nodes_with_weights)
            f_models.add_metric([f.fabric], f.models_present)
            f_block.add_metric([f.fabric], f.largest_free_block)
            for c in f.copies:
                copies.add_metric([c.model, f.fabric, "local"], c.local_copies)
                copies.add_metric([c.model, f.fabric, "shared"], c.shared_copies)
                readers.add_metric([c.model, f.fabric], c.nodes)
        yield from (f_nodes, f_weights, f_models, f_block, copies, readers)

        replicas = GaugeMetricFamily("llmgw_replicas", "Replicas by state.", labels=["state"])
        for r_state in ReplicaState:
            replicas.add_metric([r_state.value], getattr(s.replicas, r_state.value))
        yield replicas

        yield from self._models(fleet, set(s.unplaceable))
        yield from self._traffic(s.traffic)

        idle = GaugeMetricFamily(
            "llmgw_idle_replicas", "Ready replicas idle for 10 minutes or more.", labels=["model"]
        )
        idle_gpus = GaugeMetricFamily(
            "llmgw_idle_gpus", "GPUs held by idle replicas.", labels=["model"]
        )
        by_model: dict[str, list[int]] = {}
        for r in s.idle_replicas:
            acc = by_model.setdefault(r.model, [0, 0])
            acc[0] += 1
            acc[1] += r.gpus
        for model, (n, held) in sorted(by_model.items()):
            idle.add_metric([model], n)
            idle_gpus.add_metric([model], held)
        yield idle
        yield idle_gpus

        yield GaugeMetricFamily(
            "llmgw_drains_in_progress", "Nodes being drained.", value=s.nodes.draining
        )
        yield GaugeMetricFamily(
            "llmgw_drains_blocked",
            "Drains not progressing (`llmgw ctl nodes` says why).",
            value=len(fleet.facts.decisions.drain_blocked),
        )
        yield GaugeMetricFamily(
            "llmgw_nodes_awaiting_approval",
            "Enrolled nodes that get no replicas until `llmgw ctl credentials approve`.",
            value=len(fleet.facts.approvals.pending),
        )

        yield GaugeMetricFamily("llmgw_gateways", "Gateways that posted status.", value=len(views))
        gw_age = GaugeMetricFamily(
            "llmgw_gateway_report_age_seconds",
            "Seconds since a gateway last posted its status.",
            labels=["gateway"],
        )
        gw_rejected = GaugeMetricFamily(
            "llmgw_gateway_rejected_endpoints",
            "Endpoints a gateway leaves out of routing because it cannot use them.",
            labels=["gateway"],
        )
        for view in views:
            gw_age.add_metric([view.name], view.age_s)
            gw_rejected.add_metric([view.name], len(view.rejected))
        yield gw_age
        yield gw_rejected
        yield from self._tenants(fleet)
        yield from self._starts(fleet)

        if self._per_node:
            yield from self._nodes(fleet)

    def _tenants(self, fleet: Term) -> Iterator[Metric]:
        """What each tenant's requests to each model cost, every gateway's (usage.py)."""
        names = (
            ("requests", "Requests sent on to a model"),
            ("prompt_tokens", "Prompt tokens, as the answers' usage counted them"),
            ("completion_tokens", "Completion tokens (a stream cut short: those sent)"),
            ("errors", "Requests answered with an error or broken off"),
            ("rate_limited", "Requests refused over a limit (429), never sent on"),
        )
        families = [
            CounterMetricFamily(
                f"llmgw_tenant_{n}", f"{h}, per tenant and model.", labels=("tenant", "model")
            )
            for n, h in names
        ]
        for (tenant, model), counts in sorted(fleet.usage.totals.items()):
            for family, value in zip(families, counts, strict=True):
                family.add_metric((tenant, model), value)
        yield from families

    def _starts(self, fleet: Term) -> Iterator[Metric]:
        """How replicas came to serve (issue 32): counted when they reach ready."""
        starts = CounterMetricFamily(
            "llmgw_model_starts",
            "Replicas that reached ready: woken (hot, per sleep level), or an engine "
            "started where the weights were on disk (warm) or not (cold).",
            labels=["model", "kind", "level"],
        )
        last = GaugeMetricFamily(
            "llmgw_model_last_start_seconds",
            "How long the last start of each kind (and sleep level) took: a wake as its "
            "agent timed it, an engine start from placement to ready.",
            labels=["model", "kind", "level"],
        )
        for c in fleet.facts.starts.all():
            labels = (c.model, c.kind.value, str(c.level))
            starts.add_metric(labels, c.count)
            if c.last_s is not None:
                last.add_metric(labels, c.last_s)
        yield from (starts, last)

    def _models(self, fleet: Term, unplaceable: set[str]) -> Iterator[Metric]:
        ready = GaugeMetricFamily("llmgw_model_ready_replicas", "Ready replicas.", labels=["model"])
        minimum = GaugeMetricFamily(
            "llmgw_model_min_replicas", "Declared minimum.", labels=["model"]
        )
        satisfied = GaugeMetricFamily(
            "llmgw_model_satisfied", "1 when serving replicas >= minimum.", labels=["model"]
        )
        unplace = GaugeMetricFamily(
            "llmgw_model_unplaceable",
            "1 when short and the scheduler cannot place more replicas.",
            labels=["model"],
        )
        maximum = GaugeMetricFamily(
            "llmgw_model_max_replicas",
            "Declared maximum (the minimum without autoscaling).",
            labels=["model"],
        )
        desired = GaugeMetricFamily(
            "llmgw_model_desired_replicas",
            "Replicas demand asks for now, within the minimum and maximum.",
            labels=["model"],
        )
        in_flight = GaugeMetricFamily(
            "llmgw_model_autoscaler_in_flight",
            "Requests in flight as the autoscaler reads them (averaged over its scale-up window).",
            labels=["model"],
        )
        for v in fleet.model_views():
            name = v.spec.name
            ready.add_metric([name], v.ready)
            minimum.add_metric([name], v.spec.min_replicas)
            satisfied.add_metric([name], int(v.satisfied))
            unplace.add_metric([name], int(name in unplaceable))
            maximum.add_metric([name], v.spec.most_replicas)
            desired.add_metric([name], v.desired)
            in_flight.add_metric([name], v.in_flight)
        yield from (ready, minimum, satisfied, unplace, maximum, desired, in_flight)

    def _traffic(self, traffic: list[ModelTraffic]) -> Iterator[Metric]:
        """What the engines served per model (the summary's Traffic section)."""
        families = {
            "requests_per_s": GaugeMetricFamily(
                "llmgw_model_requests_per_second",
                "Requests per second over the engines' last 30 s.",
                labels=["model"],
            ),
            "in_flight": GaugeMetricFamily(
                "llmgw_model_requests_in_flight",
                "Requests running or queued.",
                labels=["model"],
            ),
            "p50_latency_s": GaugeMetricFamily(
                "llmgw_model_p50_latency_seconds",
                "Median end-to-end latency, weighted over replicas.",
                labels=["model"],
            ),
            "prefix_hit_rate": GaugeMetricFamily(
                "llmgw_model_prefix_cache_hit_ratio",
                "Prompt tokens found in the prefix cache, as a fraction.",
                labels=["model"],
            ),
        }
        for tr in traffic:
            for field, family in families.items():
                value = getattr(tr, field)
                if value is not None:
                    family.add_metric([tr.model], value)
        yield from families.values()

    def _nodes(self, fleet: Term) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "llmgw_node_state", "1 for a node's current state.", labels=["node", "state"]
        )
        age = GaugeMetricFamily(
            "llmgw_node_report_age_seconds", "Seconds since a node's last report.", labels=["node"]
        )
        node_gpus = GaugeMetricFamily(
            "llmgw_node_gpus", "A node's GPUs by bucket.", labels=["node", "bucket"]
        )
        for row in fleet.rows.rows():
            state.add_metric([row.name, row.state.value], 1)
            if row.report_age_s is not None:
                age.add_metric([row.name], row.report_age_s)
            node_gpus.add_metric([row.name, "used"], row.gpus_used)
            node_gpus.add_metric([row.name, "unhealthy"], row.gpus_unhealthy)
            node_gpus.add_metric([row.name, "unknown"], row.gpus_unknown)
            node_gpus.add_metric([row.name, "total"], row.gpus_total)
        yield from (state, age, node_gpus)


class ReportFigures(Collector):
    """Agent reports by outcome (`llmgw_reports_total`) and the time each took
    (`llmgw_report_seconds`), as a Counter and a Histogram would expose them.

    Plain numbers bumped on the event loop (one thread: nothing to lock), read at
    a scrape: prometheus_client's Counter and Histogram take a lock for each of
    the three increments a report made (bench/README.md, issue 20)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float, outcome: str | None) -> None:
        """One report, `seconds` to handle; `outcome` None: not read to the end (a slow
        or vanished client, a body over the limit), timed but not counted."""
        if outcome is not None:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def collect(self) -> Iterator[Metric]:
        reports = CounterMetricFamily("llmgw_reports", "Agent reports handled.", labels=["outcome"])
        for outcome, n in self.outcomes.items():
            reports.add_metric([outcome], n)
        cumulative, total = [], 0
        for bound, n in zip([*LATENCY_BUCKETS, float("inf")], self.buckets, strict=True):
            total += n
            cumulative.append((floatToGoString(bound), total))
        seconds = HistogramMetricFamily(
            "llmgw_report_seconds", "Time to handle one agent report.", labels=[]
        )
        seconds.add_metric([], cumulative, self.sum)
        yield from (reports, seconds)


class ControllerMetrics:
    """One registry per controller app (tests run several in one process)."""

    def __init__(self, per_node: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.term: Term | None = None  # the leadership's, while it leads
        self.registry.register(FleetCollector(lambda: self.term, per_node))
        r = self.registry
        self.reports = ReportFigures()
        r.register(self.reports)
        self.reconcile_seconds = Histogram(
            "llmgw_reconcile_seconds",
            "Event-loop time one reconcile pass held (its slices, not the yields between them).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "llmgw_reconcile_errors", "Reconcile passes that raised.", registry=r
        )
        self.store_write_seconds = Histogram(
            "llmgw_store_write_seconds",
            "Duration of one durable store transaction.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_write_errors = Counter(
            "llmgw_store_write_errors", "Store transactions that failed.", registry=r
        )
        self.leader = Gauge(
            "llmgw_leader", "1 when this controller leads (takes reports and writes).", registry=r
        )
        self.epoch = Gauge(
            "llmgw_leader_epoch", "The leadership epoch (0 with SQLite).", registry=r
        )
        # SQLite: one controller, always the leader, no epochs.
        self.leader.set(1)
        self.epoch.set(0)

    def observe_reconcile(self, seconds: float, failed: bool) -> None:
        self.reconcile_seconds.observe(seconds)
        if failed:
            self.reconcile_errors.inc()

    def observe_store_write(self, seconds: float, failed: bool) -> None:
        self.store_write_seconds.observe(seconds)
        if failed:
            self.store_write_errors.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
