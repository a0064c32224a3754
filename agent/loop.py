"""The report loop: observe, POST the report, hand the reply's assignments to
the engines, sleep a jittered interval; repeat until told to stop.

When the controller is away the loop backs off with jitter (capped at about
30 s) and logs once when the outage starts and once when it ends, never once
per try. It never exits because the controller is down: the node keeps its
engines running and reports again when it can.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import aiohttp
from pydantic import ValidationError

from llmgw import api
from llmgw.agent.report import ReportBuilder
from llmgw.leader import Endpoints, aiohttp_request, leader_of, split_urls
from llmgw.tls import is_verify_failure, verify_hint
from llmgw.wire import NodeReport, ReplicaReport, ReportReply, ShardAssignment

log = logging.getLogger(__name__)

REPORT_PATH = api.agent_report().path  # the catalogue (llmgw.api) names every path
BACKOFF_CAP_S = 30.0


class Engines(Protocol):
    """What the loop needs from the engine supervisor (agent/engines.py)."""

    def reports(self) -> list[ReplicaReport]: ...

    async def apply(
        self,
        assignments: Sequence[ShardAssignment],
        local_weights: Mapping[str, str],
        local_adapters: Mapping[str, str] | None = None,
    ) -> None: ...

    async def close(self) -> None: ...


class Feed(Protocol):
    """What the loop runs beside itself: the assignments feed (agent/assignments_feed.py)."""

    async def run(self, stop: asyncio.Event, session: aiohttp.ClientSession) -> None: ...


class Enrollment(Protocol):
    """Obtains this node's credential on first contact (agent/enroll.py)."""

    async def credential(self, session: aiohttp.ClientSession) -> str: ...


class ReportError(Exception):
    """A report that did not land; `kind` groups tries into one outage."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def connection_error(controller: str, exc: BaseException) -> ReportError:
    """A failed connection; a certificate that does not verify says what to do."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError) or is_verify_failure(exc):
        return ReportError("tls", verify_hint(controller, exc))
    return ReportError("unreachable", f"{type(exc).__name__}: {exc}")


def next_delay(interval_s: float, failures: int, rng: random.Random, cap_s: float) -> float:
    """Seconds until the next try.

    Healthy: the interval +-10%, so a fleet started at once spreads out.
    After n failures: min(cap, interval * 2^(n-1)), scaled by 0.5..1 (jitter,
    so agents do not all return at the same instant after a controller restart).
    """
    if failures <= 0:
        return interval_s * rng.uniform(0.9, 1.1)
    ceiling = min(cap_s, interval_s * 2 ** min(failures - 1, 16))
    return ceiling * rng.uniform(0.5, 1.0)


def cancel_if_asked() -> None:
    """End the task if it was cancelled and something it awaited swallowed that.

    A library that catches CancelledError (or turns it into a timeout) would
    otherwise keep a cancelled loop running for ever.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class ReportLoop:
    def __init__(
        self,
        builder: ReportBuilder,
        controller: str,
        *,
        token: str | None = None,
        engines: Engines | None = None,
        enrollment: Enrollment | None = None,
        rng: random.Random | None = None,
        backoff_cap_s: float = BACKOFF_CAP_S,
        timeout_s: float = 10.0,
        build_timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.builder = builder
        # Several controllers (`--controller A,B`): reports go to the leader.
        self.endpoints = Endpoints(split_urls(controller))
        self.token = token
        self.engines = engines
        self.ssl_context = ssl_context  # https: verifies the controller's certificate
        self.enrollment = enrollment
        self.rng = rng or random.Random()
        self.backoff_cap_s = backoff_cap_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.failures = 0  # consecutive
        self.sent = 0  # reports the controller accepted
        # What agent metrics read: the last report built, the last send, failures by kind.
        self.last_report: NodeReport | None = None
        self.on_sent: Callable[[float], None] | None = None  # told each accepted send's latency
        self.last_success: float | None = None  # monotonic
        self.failed: collections.Counter[str] = collections.Counter()
        self.last_reply: ReportReply | None = None
        self._outage_kind: str | None = None
        self._outage_started = 0.0
        self._build_error: str | None = None
        self.build_timeout_s = build_timeout_s
        self._building: asyncio.Future[NodeReport] | None = None
        self._build_started = 0.0
        # Assignments as they change (agent/assignments_feed.py), beside the reports'.
        self.feed: Feed | None = None
        self.applied_at = 0.0  # monotonic: when a reply was last handed to the engines
        self._applying = asyncio.Lock()
        self.reported = asyncio.Event()  # a report was taken: the controller knows the node

    @property
    def controller(self) -> str:
        """The controller reports go to first: the leader, as last seen."""
        return self.endpoints.current

    @property
    def url(self) -> str:
        return self.controller + REPORT_PATH

    # -- one cycle --

    async def build(self) -> NodeReport:
        """Observe, in a worker thread: NVML and filesystem reads block.

        A hung driver can block NVML for minutes. The report then fails (and
        says so, once) instead of piling up one stuck thread per cycle: the
        next cycle waits on the same build.
        """
        if self._building is None or self._building.done():
            replicas = self.engines.reports() if self.engines is not None else []
            self._building = asyncio.ensure_future(asyncio.to_thread(self.builder.build, replicas))
            self._build_started = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns the result of a
            # future that finishes as the task is cancelled, and the cancel is lost.
            async with asyncio.timeout(self.build_timeout_s):
                return await asyncio.shield(self._building)
        except TimeoutError:
            took = time.monotonic() - self._build_started
            raise ReportError(
                "stuck",
                f"observing the node has not finished after {took:.0f} s "
                "(NVML or a filesystem not answering?)",
            ) from None

    async def post(self, session: aiohttp.ClientSession, report: NodeReport) -> ReportReply:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = report.model_dump_json(exclude_none=True)
        try:
            _, status, raw = await aiohttp_request(
                session,
                self.endpoints,
                "POST",
                REPORT_PATH,
                data=body,
                headers=headers,
                timeout=self.timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise connection_error(self.controller, exc) from exc
        text = raw.decode("utf-8", "replace")
        if leader_of(status, {}, raw)[0]:
            # A failover under way: no backoff, the next report goes at the interval.
            raise ReportError("leader", f"no controller leads right now: {text[:300]}")
        if status in (401, 403):
            raise ReportError(
                "auth",
                f"HTTP {status}: {text[:300]}; check --token-file, LLMGW_AGENT_TOKEN or "
                "STATE_DIR/credential (a revoked credential: delete the file to enroll again)",
            )
        if status >= 400:
            raise ReportError("http", f"HTTP {status}: {text[:500]}")
        try:
            return ReportReply.model_validate_json(text)
        except ValidationError as exc:
            raise ReportError("reply", f"unreadable reply: {exc.errors()[:1]}") from exc

    async def cycle(self, session: aiohttp.ClientSession) -> ReportReply:
        report = await self.build()
        if self.token is None and self.enrollment is not None:
            self.token = await self.enrollment.credential(session)
        self.last_report = report
        t0 = time.perf_counter()
        sent = time.monotonic()
        reply = await self.post(session, report)
        if self.on_sent is not None:
            self.on_sent(time.perf_counter() - t0)
        self.last_success = time.monotonic()
        self.reported.set()
        if self.last_reply is None or self.last_reply.state != reply.state:
            log.info("controller says node %s is %s", reply.node, reply.state.value)
        self.last_reply = reply
        self.sent += 1
        await self.apply(reply, unless_applied_since=sent)
        return reply

    async def apply(self, reply: ReportReply, unless_applied_since: float | None = None) -> None:
        """Hand a reply's assignments to the engines (a report's, or the feed's).

        A report's reply is not applied when the feed applied one while the report
        was on its way: which of the two is newer is not known, and the feed's
        next answer or the next report brings the newest. Otherwise a report's reply
        is at least as new as anything applied, so the reports alone always bring
        the engines to the controller's word (a feed that fails, or a controller
        without it, only loses the speed)."""
        if self.engines is None:
            return
        async with self._applying:
            if unless_applied_since is not None and self.applied_at > unless_applied_since:
                return
            self.applied_at = time.monotonic()
            try:
                await self.engines.apply(
                    reply.assignments,
                    self.builder.local_weights(),
                    self.builder.local_adapters(),
                )
            except Exception:  # one bad assignment must not stop reporting
                log.exception("engines could not apply the controller's assignments")

    # -- the loop --

    async def run(self, stop: asyncio.Event, session: aiohttp.ClientSession | None = None) -> None:
        own = session is None
        session = session or aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl_context)
            if self.ssl_context is not None
            else None
        )
        feed = (
            asyncio.create_task(self.feed.run(stop, session), name="assignments-feed")
            if self.feed is not None
            else None
        )
        try:
            while not stop.is_set():
                await self._one(session)
                delay = next_delay(
                    self.builder.interval_s, self.failures, self.rng, self.backoff_cap_s
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._until_stop_or_news(stop)
                cancel_if_asked()
        finally:
            if feed is not None:
                feed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed
            if own:
                await session.close()

    async def _until_stop_or_news(self, stop: asyncio.Event) -> None:
        """Wait for `stop`, or for the engines to have news a report should carry now
        (an adapter loaded: routing to it waits on that report)."""
        soon: asyncio.Event | None = getattr(self.engines, "report_soon", None)
        if soon is None:
            await stop.wait()
            return
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(soon.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        soon.clear()

    async def _one(self, session: aiohttp.ClientSession) -> None:
        try:
            await self.cycle(session)
        except ReportError as exc:
            self.failed[exc.kind] += 1
            self._failed(exc)
            return
        except Exception as exc:
            # A report we could not even build (a bug, an odd reading): say so
            # once, with the traceback, and keep going. A daemon that exits
            # here would take the node's liveness with it.
            message = f"{type(exc).__name__}: {exc}"
            self.failed["build"] += 1
            if message != self._build_error:
                log.exception("could not build the report: %s", message)
                self._build_error = message
            self.failures += 1
            return
        self._build_error = None
        if self._outage_kind is not None:
            took = time.monotonic() - self._outage_started
            log.info(
                "controller %s reachable again after %.0f s (%d failed tries)",
                self.url,
                took,
                self.failures,
            )
        self._outage_kind = None
        self.failures = 0

    def _failed(self, exc: ReportError) -> None:
        if exc.kind != "leader":  # a failover is not a reason to back off
            self.failures += 1
        if self._outage_kind == exc.kind:
            return  # already said: once per outage, not once per try
        if self._outage_kind is None:
            self._outage_started = time.monotonic()
        self._outage_kind = exc.kind
        what = {
            "unreachable": "cannot reach the controller",
            "auth": "the controller rejected the agent token",
            "http": "the controller refused the report",
            "reply": "the controller's reply was not understood",
            "stuck": "no report sent",
            "leader": "no controller leads (a failover?)",
        }.get(exc.kind, "report failed")
        log.warning(
            "%s at %s: %s; retrying with backoff (at most %.0f s apart), "
            "engines keep running; logged once per outage",
            what,
            self.url,
            exc,
            self.backoff_cap_s,
        )
