"""The agent's own `/metrics` (`llmgw agent --metrics-listen`), off by default.

Not to be confused with `llmgw.agent.metrics`, which parses the ENGINES' metrics.
What the node holds (models present and incomplete, engines by state) is read
at scrape time from the last report the loop built, so it says exactly what
the controller was told; scan and send timings come from small hooks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from llmgw.agent.loop import ReportLoop
from llmgw.agent.storage import StorageScanner
from llmgw.agent.storage_watch import StorageWatch
from llmgw.controller.core.settings import split_listen
from llmgw.listen import PortInUse, start_site

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


# Incompleteness reasons name files and counts; the label is one of these kinds,
# the first whose phrase appears in the reason, so its values stay a fixed set.
REASON_KINDS = (
    ("download in progress", "download in progress"),
    ("dangling symlink", "dangling symlink"),
    ("missing shard", "missing shard"),
    ("missing gguf part", "missing shard"),
    ("outside the model directory", "shard outside model"),
    ("truncated", "truncated"),
    ("bytes more than", "size mismatch"),
    ("gguf magic", "bad gguf"),
    ("header", "bad header"),
    ("not safetensors", "bad header"),
    ("cannot list", "unreadable"),
    ("empty directory", "empty"),
    ("no config.json", "no weights"),
    ("model name", "bad name"),
)


def reason_kind(reason: str) -> str:
    """A bounded label for an incompleteness reason."""
    text = reason.lower()
    return next((kind for phrase, kind in REASON_KINDS if phrase in text), "other")


class _ReportCollector(Collector):
    def __init__(self, loop: ReportLoop) -> None:
        self._loop = loop

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        loop = self._loop
        failures = CounterMetricFamily(
            "llmgw_agent_report_failures", "Reports not accepted, by kind.", labels=["kind"]
        )
        for kind in ("unreachable", "auth", "http", "reply", "build"):
            failures.add_metric([kind], loop.failed[kind])
        yield failures
        yield CounterMetricFamily("llmgw_agent_reports_sent", "Reports accepted.", value=loop.sent)
        since = GaugeMetricFamily(
            "llmgw_agent_seconds_since_last_report",
            "Seconds since the controller last accepted a report (absent before the first).",
        )
        if loop.last_success is not None:
            since.add_metric([], time.monotonic() - loop.last_success)
        yield since
        report = loop.last_report
        present = GaugeMetricFamily(
            "llmgw_agent_models_present",
            "Complete models found, per storage scope.",
            labels=["scope"],
        )
        incomplete = GaugeMetricFamily(
            "llmgw_agent_models_incomplete",
            "Directories that look like a model but are not usable, by reason.",
            labels=["reason"],
        )
        engines = GaugeMetricFamily(
            "llmgw_agent_engines", "Engines (shards) this agent runs, by state.", labels=["state"]
        )
        if report is not None:
            scopes: Counter[str] = Counter()
            reasons: Counter[str] = Counter()
            for loc in report.storage:
                scopes[loc.scope.value] += len(loc.models)
                for inc in loc.incomplete:
                    reasons[reason_kind(inc.reason)] += 1
            for scope, n in sorted(scopes.items()):
                present.add_metric([scope], n)
            for reason, n in sorted(reasons.items()):
                incomplete.add_metric([reason], n)
            states = Counter(r.state.value for r in report.replicas)
            for state, n in sorted(states.items()):
                engines.add_metric([state], n)
        yield from (present, incomplete, engines)
        yield from _supervisor_metrics(loop.engines)


def _supervisor_metrics(supervisor: object) -> Iterator[Metric]:
    """Engines the supervisor killed, by reason, and how late its own loop runs."""
    kills = getattr(supervisor, "kills", None)
    if isinstance(kills, dict):
        family = CounterMetricFamily(
            "llmgw_agent_engine_kills",
            "Engines the agent killed, by reason (hung: work and no tokens; unhealthy: "
            "/health failing; start_timeout; start_stalled: no output and no CPU while starting; "
            "wake_failed: a sleeping engine that did not wake).",
            labels=["reason"],
        )
        for reason, n in sorted(kills.items()):
            family.add_metric([reason], n)
        yield family
    lag = getattr(supervisor, "loop_lag", None)
    if lag is not None:
        yield GaugeMetricFamily(
            "llmgw_agent_loop_late_seconds",
            "How late the engine monitor's timers fired, at worst, over its last checks.",
            value=lag.worst_s(),
        )


class AgentTelemetry:
    def __init__(self, loop: ReportLoop) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.scan_seconds = Histogram(
            "llmgw_agent_storage_scan_seconds",
            "Duration of one storage directory scan.",
            buckets=BUCKETS,
            registry=r,
        )
        self.files = Histogram(
            "llmgw_agent_storage_files_scanned",
            "Files one storage scan looked at.",
            buckets=(10, 100, 1_000, 10_000, 100_000, 1_000_000),
            registry=r,
        )
        self.send_seconds = Histogram(
            "llmgw_agent_report_send_seconds",
            "Time from sending a report to the controller's accepted reply.",
            buckets=BUCKETS,
            registry=r,
        )
        r.register(_ReportCollector(loop))
        loop.on_sent = self.send_seconds.observe
        storage = loop.builder.storage
        if isinstance(storage, StorageWatch):
            storage.observe_scans(self.observe_scan)
        elif isinstance(storage, StorageScanner):
            storage.on_scan = self.observe_scan

    def observe_scan(self, seconds: float, files: int) -> None:
        self.scan_seconds.observe(seconds)
        self.files.observe(files)

    async def serve(self, listen: str) -> web.AppRunner:
        """Start `GET /metrics` on HOST:PORT; the caller cleans the runner up.
        `PortInUse` when the address is taken."""

        async def scrape(request: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        app = web.Application()
        app.router.add_get("/metrics", scrape)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = split_listen(listen)
        try:
            await start_site(runner, host, port, "--metrics-listen")
        except PortInUse:
            await runner.cleanup()
            raise
        return runner
