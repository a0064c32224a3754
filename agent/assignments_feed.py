"""This node's assignments as they change: a long poll beside the report loop.

A report's reply carries the node's assignments, so a change (wake a sleeping
replica, put one to sleep, start one) reached the agent only at its next report,
up to `--interval` (5 s by default) after the controller decided it, and a model
switch on a card is two such changes. The feed long-polls
`GET /v1/agent/assignments/NODE` with the ETag of the reply it has, so the
controller answers the moment the reply changes, and hands the new assignments to
the engines at once.

The reports still bring their replies (ReportLoop.apply says which it applies): a
controller without the route, a failing poll or a lost wake-up costs the speed,
never the assignments.
"""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp
from pydantic import ValidationError

from llmgw import api
from llmgw.agent.loop import ReportLoop
from llmgw.leader import aiohttp_request, leader_of
from llmgw.wire import ReportReply, reply_version

log = logging.getLogger(__name__)

WAIT_S = 30.0  # the longest the controller holds a poll (its MAX_WAIT_S)


class AssignmentFeed:
    def __init__(self, reports: ReportLoop, wait_s: float = WAIT_S) -> None:
        self.reports = reports
        self.wait_s = wait_s
        self.applied = 0  # replies it handed to the engines
        self._have = ""  # the ETag of the reply applied last
        self._rng = random.Random()

    async def run(self, stop: asyncio.Event, session: aiohttp.ClientSession) -> None:
        await self.reports.reported.wait()  # the controller knows the node from then on
        failures = 0
        while not stop.is_set():
            try:
                changed = await self._poll(session)
            except Exception as exc:  # whatever it is, the reports carry them meanwhile
                if failures == 0:
                    expected = (aiohttp.ClientError, TimeoutError, ValidationError, _Refused)
                    log.info(
                        "assignments feed: %s; the reports carry them meanwhile",
                        exc,
                        exc_info=not isinstance(exc, expected),
                    )
                failures += 1
                # A report interval (at most 5 s), then longer while it keeps failing, at
                # most 30 s: the reports carry the assignments meanwhile.
                base = min(5.0, self.reports.builder.interval_s)
                pause = min(30.0, base * 2 ** min(failures - 1, 5))
                await asyncio.sleep(pause * self._rng.uniform(0.5, 1.0))
                continue
            failures = 0
            if changed is not None:
                await self.reports.apply(changed)
                self.applied += 1

    async def _poll(self, session: aiohttp.ClientSession) -> ReportReply | None:
        """The reply once it changed (None: the poll ended with no change)."""
        call = api.agent_assignments(self.reports.builder.node, self.wait_s)
        headers = {"If-None-Match": f'"{self._have}"'} if self._have else {}
        if self.reports.token:
            headers["Authorization"] = f"Bearer {self.reports.token}"
        _, status, raw = await aiohttp_request(
            session,
            self.reports.endpoints,
            "GET",
            call.path,
            params=call.params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.wait_s + 10),
        )
        if leader_of(status, {}, raw)[0]:
            raise _Refused("no controller leads right now")
        if status == 304:
            return None
        if status != 200:
            raise _Refused(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
        reply = ReportReply.model_validate_json(raw)
        self._have = reply_version(raw)
        return reply


class _Refused(Exception):
    """The controller answered, not with a reply."""
