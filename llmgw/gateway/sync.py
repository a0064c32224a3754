"""Keep SMG's workers equal to the controller's serving endpoints; report status.

The follower long-polls `GET /v1/endpoints?since=CURSOR&wait=S`, so it learns
a change as soon as the controller makes it. Applying a change to SMG is two
steps when workers both come and go (a drain, a model served at last): first
the new workers are added beside the old ones (explainers included), and only
once SMG routes to them are the old ones removed, so a model never has zero
workers in between. A cursor counts as applied only once SMG's own worker list
shows it; that applied cursor, and the requests in flight per replica read after
it, are what the status posts every second tell the controller, whose stop gate
waits for them. A cursor is `routed` as soon as SMG routes to the workers it adds
(SMG takes 5-6 s to drop a removed one): an apply that declares a model waits for
that, so that no gateway answers 404 for it once the apply has answered. A change
that adds workers while a removal is pending is written at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable

import aiohttp

from llmgw.api import error_message
from llmgw.gateway.entries import Entries
from llmgw.gateway.explain import WAKE_TIMEOUT_S, Explainer
from llmgw.gateway.front import MAX_BODY
from llmgw.gateway.keyring import Keyring
from llmgw.gateway.limits import Limiter
from llmgw.gateway.metering import Meter
from llmgw.gateway.smg import Smg
from llmgw.gateway.status_fields import OFFER_AGAIN_S, StatusFields
from llmgw.gateway.status_figures import StatusFigures
from llmgw.leader import Endpoints, aiohttp_request, split_urls
from llmgw.wire import ClientKeysFeed, Endpoint, EndpointsDelta, Unserved, UsageAnswer, printable

log = logging.getLogger("llmgw.gateway")

POLL_WAIT_S = 10.0
STATUS_EVERY_S = 1.0
# A status sent early (a request held, an answer ended while others are held) goes this
# long after the news: SMG counts an answer's request done as it drops the answer's body,
# just after the front sees its end; and a burst of answers makes one status, not many.
EARLY_STATUS_DELAY_S = 0.03
ADD_TIMEOUT_S = 5.0  # a new worker SMG cannot reach yet must not hold up the rest
# ... unless the workers leaving are the only ones SMG routes a model to: they stay
# until it routes to the model's new ones (a registration slow on a busy host), up to
# this bound, past which the model would wait on a worker SMG may never reach.
CARRY_TIMEOUT_S = 30.0
# SMG drops a removed worker from /workers 5-6.3 s after it is asked to, by its manifest
# or its API (measured with smg 1.13, fake and vLLM engines alike): a removal waits that
# long as a matter of course, and only past this bound is it a failure.
REMOVE_TIMEOUT_S = 20.0
RELEASE_WAIT_S = 2.0  # for SMG to list a removed worker draining, before the status says so
EVICT_EVERY_S = 1.0  # how often SMG's workers are checked for ones llmgw did not add
# How often the metered counts go to the controller, and so how late a gateway hears
# what the others spent against a limit (gateway/limits.py: the overshoot bound).
USAGE_EVERY_S = 1.0
USAGE_ROWS = 20_000  # (tenant, model) counts per batch at most (wire.UsageBatch's bound)


class Outage:
    """Log a failure once when it starts and once when it ends, not every retry."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s failing: %s (retrying quietly)", self.what, exc or type(exc).__name__)

    def ok(self) -> None:
        if self.since is not None:
            log.warning("%s back after %.1fs", self.what, time.monotonic() - self.since)
            self.since = None


class Follower:
    def __init__(
        self,
        controller: str,
        token: str | None,
        name: str,
        smg: Smg,
        wake_timeout_s: float = WAKE_TIMEOUT_S,
        keyring: Keyring | None = None,
        max_body: int = MAX_BODY,
        meter: Meter | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        # Several controllers (`--controller A,B`): follow the one that leads.
        self.controllers = Endpoints(split_urls(controller))
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.name = name
        self.smg = smg
        self.nudge = asyncio.Event()  # post the status now: a model was just woken
        self.figures = StatusFigures()  # in flight and requests per replica: whole or changes
        self.fields = StatusFields()  # optional fields an older controller refused
        self.explainer = Explainer(wake_timeout_s, on_hold=self.nudge.set, max_body=max_body)
        self.entries = Entries()  # which endpoints SMG can take; the rest reported
        self.endpoints: dict[str, Endpoint] = {}
        self.usable: list[Endpoint] = []  # the endpoints SMG can take (`entries`)
        self.unserved: dict[str, Unserved] = {}
        self.adapters: dict[str, str] = {}  # declared LoRA adapter -> its base
        # Every model the controller declared: served, unserved or stopping. One set,
        # updated in place, that the front reads (SMG's 404 for one is a 503).
        self.declared: set[str] = set()
        self.cursor = ""  # the latest answer's
        self.model_of: dict[str, str] = {}  # worker URL -> its model, for those in SMG
        self.written: set[str] = set()  # the worker URLs SMG was last told to have
        self.applied = ""  # the latest SMG has been seen to follow
        # The latest whose new workers SMG routes to, removals maybe pending (>= applied):
        # a model declared then is answered by its explainer, never SMG's 404.
        self.routed = ""
        self.changed = asyncio.Event()
        self.keyring = keyring  # follows the controller's client keys (their digests)
        self.meter = meter  # what the front metered, posted each second
        self.limiter = limiter  # tenants' limits, from the keys feed; shared counts back

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=POLL_WAIT_S + 10)
        await self.explainer.start()
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as http:
                loops = [self._poll(http), self._apply_loop(), self._status(http)]
                if self.keyring is not None:
                    loops.append(self._poll_keys(http))
                if self.meter is not None:
                    loops.append(self._post_usage(http))
                await asyncio.gather(*loops, self._evict_loop())
        finally:
            await self.explainer.stop()

    # -- following the controller ----------------------------------------------------

    async def _poll(self, http: aiohttp.ClientSession) -> None:
        outage = Outage(f"controller {','.join(self.controllers.urls)}")
        while True:
            wait = POLL_WAIT_S if self.cursor else 0
            params = {"since": self.cursor, "wait": str(wait)}
            try:
                _, status, body = await aiohttp_request(
                    http, self.controllers, "GET", "/v1/endpoints", params=params
                )
                if status >= 400:
                    raise RuntimeError(f"{status}: {error_message(body, str(status))}")
                delta = EndpointsDelta.model_validate_json(body)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                outage.failed(exc)
                await asyncio.sleep(1.0)
                continue
            outage.ok()
            self._take(delta)

    def _take(self, delta: EndpointsDelta) -> None:
        if delta.full:
            self.endpoints = {}
        for rid in delta.removed:
            self.endpoints.pop(rid, None)
        for ep in delta.endpoints:
            self.endpoints[ep.replica_id] = ep
        unserved = delta.reasons()
        if unserved != self.unserved:
            self.unserved = unserved
            self.changed.set()
        if delta.cursor != self.cursor:
            self.cursor = delta.cursor
            self.changed.set()
        if delta.adapters != self.adapters:
            self.adapters = dict(delta.adapters)
            self.changed.set()
        self.declared.clear()
        self.declared.update(unserved, self.adapters, (e.model for e in self.endpoints.values()))
        self.usable = self.entries.usable(self.endpoints.values())
        serving: dict[str, list[str]] = {}
        for e in self.usable:
            if e.state == "serving":
                serving.setdefault(e.model, []).append(e.url)
                for adapter in e.adapters:  # routed by the explainer, by name
                    serving.setdefault(adapter, []).append(e.url)
        self.explainer.set_serving(serving)
        self.explainer.set_keys({e.url: e.engine_key for e in self.usable if e.engine_key})

    async def _poll_keys(self, http: aiohttp.ClientSession) -> None:
        """Follow the controller's client keys: every key's digest, long-polled, so a
        key made or revoked takes effect here within one round trip. Kept as they are
        while no controller answers (keyring.py)."""
        assert self.keyring is not None
        outage = Outage("client keys from the controller")
        cursor = ""
        while True:
            params = {"since": cursor, "wait": str(POLL_WAIT_S if cursor else 0)}
            try:
                _, status, body = await aiohttp_request(
                    http, self.controllers, "GET", "/v1/keys/feed", params=params
                )
                if status == 404:  # a controller from before client keys: it has none
                    feed = ClientKeysFeed(cursor="", keys=[])
                elif status >= 400:
                    raise RuntimeError(f"{status}: {error_message(body, str(status))}")
                else:
                    feed = ClientKeysFeed.model_validate_json(body)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                outage.failed(exc)
                await asyncio.sleep(1.0)
                continue
            outage.ok()
            self.keyring.set_controller_keys(feed.keys)
            if self.limiter is not None:
                self.limiter.set_limits(feed.limits)
            if not feed.cursor:
                await asyncio.sleep(POLL_WAIT_S)
            cursor = feed.cursor

    async def _post_usage(self, http: aiohttp.ClientSession) -> None:
        """Each second, what the front metered since to the controller, which adds it
        to the store and answers what the other gateways spent against each limit.
        A batch not answered is sent again as it was (its `seq` counts it once);
        what is metered meanwhile waits for the next."""
        assert self.meter is not None
        meter, limiter = self.meter, self.limiter
        outage = Outage("usage to the controller")
        run, seq = secrets.token_hex(8), 0
        batch: dict[str, object] | None = None
        while True:
            await asyncio.sleep(USAGE_EVERY_S)
            if batch is None:
                if not meter and not limiter:
                    continue  # nothing to count, no limit to hear about
                seq += 1
                rows = [
                    {"tenant": t, "model": m, **{k: getattr(c, k) for k in c.__slots__}}
                    for (t, m), c in meter.cut(USAGE_ROWS).items()
                ]
                if limiter is not None:
                    limiter.cut()
                batch = {"name": self.name, "run": run, "seq": seq, "rows": rows}
            try:
                _, status, answer = await aiohttp_request(
                    http, self.controllers, "POST", "/v1/gateways/usage", json=batch
                )
                if status in (400, 404, 413):  # refused as it is: sending it again won't do
                    log.warning(
                        "the controller refused a usage batch (%d: %s): its counts are lost",
                        status,
                        error_message(answer, str(status)),
                    )
                    batch = None
                    continue
                if status >= 400:
                    raise RuntimeError(f"{status}: {error_message(answer, str(status))}")
                shared = UsageAnswer.model_validate_json(answer)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                outage.failed(exc)
                continue
            outage.ok()
            batch = None
            if limiter is not None:
                limiter.shared(shared)

    # -- applying to SMG -----------------------------------------------------------------

    def serving(self) -> dict[str, str]:
        """SMG's workers, URL -> model: the serving engines, and an explainer per
        unserved model."""
        self.explainer.set_unserved(self.unserved)
        self.explainer.set_adapters(self.adapters)
        return self._wanted()

    def _wanted(self) -> dict[str, str]:
        """What `serving()` would answer now, telling the explainer nothing."""
        engines = {e.url: e.model for e in self.usable if e.state == "serving"}
        adapters = {self.explainer.url_for(a): a for a in self.adapters}
        return engines | {self.explainer.url_for(m): m for m in self.unserved} | adapters

    async def _apply_loop(self) -> None:
        outage = Outage("SMG worker sync")
        while True:
            await self.changed.wait()
            self.changed.clear()
            cursor = self.cursor
            try:
                await self.smg.started.wait()
                done = await self._apply(self.serving(), cursor)
            except (aiohttp.ClientError, TimeoutError) as exc:
                outage.failed(exc)
                self.changed.set()  # try again shortly
                await asyncio.sleep(0.5)
                continue
            outage.ok()
            if done:
                self.applied = self.routed = cursor

    async def _apply(self, serving: dict[str, str], cursor: str = "") -> bool:
        """Make SMG's workers `serving` (URL -> model), adding before removing: True
        once SMG routes to each new worker and lists none removed; False when another
        change came first (it is applied at once, not after the removals: SMG takes
        5-6 s to drop one, and neither a new model nor another leaving replica must
        wait for that).
        `cursor` (the feed's, for `serving`) is `routed` once SMG routes to the new
        workers."""
        self.model_of.update(serving)
        current = await self.smg.workers()
        adding = serving.keys() - current.keys()
        # Workers SMG was told to have that leave now (not those left earlier, which SMG
        # may still list: they stay out).
        leaving = (current.keys() & self.written) - serving.keys()
        if adding and leaving:
            # Add first: the old workers leave only once the new ones take requests. An
            # explainer too: the model's one worker in SMG until then, it sends what it is
            # given to the new engines (removed at once, SMG answered "all workers are
            # unavailable" while it registered them). Only workers of a model that gains
            # new ones stay: another model's leave at once, so that their stop waits
            # for nothing of this model's (the status says them released).
            gaining = {serving[u] for u in adding}
            self._write(serving.keys() | {u for u in leaving if self.model_of.get(u) in gaining})
            added_at = time.monotonic()
            await self._until(lambda w: all(w.get(u) for u in adding), ADD_TIMEOUT_S)
            if not await self._until(lambda w: not self.alone(w, serving), CARRY_TIMEOUT_S):
                models = ", ".join(sorted(self.alone(await self.smg.workers(), serving)))
                if models:
                    log.warning(
                        "SMG does not route to the new workers of %s %.0f s after they were "
                        "added: removing the old ones anyway (503 for it until SMG does)",
                        printable(models),
                        time.monotonic() - added_at,
                    )
        self._write(serving.keys())
        self.model_of = {u: m for u, m in self.model_of.items() if u in serving}
        # Applied means routed: a model's explainer, say, answers its 503 from then on
        # (before, SMG says the model does not exist).
        if (
            await self._until(
                lambda w: all(w.get(u) for u in adding) or self._more_to_add(serving),
                ADD_TIMEOUT_S,
            )
            and cursor
            and not self._more_to_add(serving)
        ):
            self.routed = cursor
            self.nudge.set()  # an apply that declared a model waits on it
        # SMG routes nothing more to a removed worker once it lists it draining (within
        # a few tenths of a second; gone about 5 s later): the status says the stopping
        # ones released then (`_released`), for their stop, a sleep or a switch waits
        # on it, rather than at its next second.
        if leaving and await self._until(
            lambda w: not any(w.get(u) for u in leaving) or self._more_to_add(serving),
            RELEASE_WAIT_S,
        ):
            self.nudge.set()
        # Any change ends this wait, a removal too: another replica leaving routing a
        # second after this one (going to sleep or stopping while its model's others
        # serve, so no explainer is added for it) must leave now, not once SMG has
        # dropped this one's worker 5 s later.
        if not await self._until(
            lambda w: not w.keys() - serving.keys() or self._more_to_apply(serving),
            REMOVE_TIMEOUT_S,
        ):
            raise TimeoutError(
                f"SMG still lists removed workers {REMOVE_TIMEOUT_S:g} s after they were removed"
            )
        return not self._more_to_apply(serving)

    def _write(self, urls: Iterable[str]) -> None:
        """SMG's wanted workers: each engine with its replica's key (explainers: none)."""
        self.written = set(urls)
        keys = {e.url: e.engine_key for e in self.endpoints.values()}
        self.smg.write_workers({u: keys.get(u) for u in self.written})

    def _more_to_add(self, written: dict[str, str]) -> bool:
        """Whether a change since `written` adds workers (so it is worth writing now)."""
        return self.changed.is_set() and bool(self._wanted().keys() - written.keys())

    def _more_to_apply(self, written: dict[str, str]) -> bool:
        """Whether a change since `written` adds or removes workers."""
        return self.changed.is_set() and self._wanted().keys() != written.keys()

    def alone(self, workers: dict[str, bool], serving: dict[str, str]) -> set[str]:
        """Models still served that SMG routes only through workers now leaving
        (`workers`: SMG's, URL -> whether it routes there)."""
        routed = {serving[u] for u, ok in workers.items() if ok and u in serving}
        still_served = set(serving.values())
        return {
            m
            for u, ok in workers.items()
            if ok and u not in serving
            if (m := self.model_of.get(u, "")) in still_served and m not in routed
        }

    async def _until(self, done: Callable[[dict[str, bool]], bool], timeout_s: float) -> bool:
        """Whether SMG's worker list came to satisfy `done` within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not done(await self.smg.workers()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- workers llmgw did not put there -------------------------------------------------

    async def _evict_loop(self) -> None:
        """Remove from SMG any worker this gateway did not add: only the
        controller's endpoints serve through it (one added with a leaked admin key
        would take a share of every model's requests)."""
        asked: dict[str, float] = {}  # URL -> when its removal was last asked
        while True:
            await asyncio.sleep(EVICT_EVERY_S)
            if not self.smg.started.is_set():
                continue
            try:
                workers = await self.smg.registered()
                now = time.monotonic()
                for w in workers:
                    if self.smg.ours(w.url) or now - asked.get(w.url, -1e9) < 10:
                        continue
                    if w.url not in asked:
                        log.warning(
                            "SMG worker %s was not added by llmgw: removing it", printable(w.url)
                        )
                    asked[w.url] = now
                    await self.smg.remove(w.id)
                listed = {w.url for w in workers}
                asked = {u: t for u, t in asked.items() if u in listed or now - t < 60}
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                log.debug("checking SMG's workers: %s", exc)

    # -- status ---------------------------------------------------------------------------------

    def answered(self) -> None:
        """An answer through SMG ended (the front's hook). While requests are held, a
        model switch waits for the replica that answered to read idle at the controller:
        the status goes now, not at its next second."""
        if self.explainer.held:
            self.nudge.set()

    async def _released(self) -> list[str]:
        """Replicas the feed says are stopping whose workers SMG no longer routes to
        (it lists them draining, or no longer lists them) and the wanted set no longer
        has: this gateway sends nothing more to them, whatever else it is still
        applying. None while SMG does not answer. (Measured with smg 1.13: a removed
        worker is listed draining 0.15 s after the change and gets no new request from
        then on; it leaves the list about 5 s later, which a stop waited for.)"""
        stopping = {e.url: rid for rid, e in self.endpoints.items() if e.state == "stopping"}
        if not stopping:
            return []
        try:
            listed = await self.smg.workers()
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
            return []
        return sorted(
            rid for url, rid in stopping.items() if not listed.get(url) and url not in self.written
        )

    async def _status(self, http: aiohttp.ClientSession) -> None:
        outage = Outage("gateway status to the controller")
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.nudge.wait(), STATUS_EVERY_S)
            if self.nudge.is_set():
                await asyncio.sleep(EARLY_STATUS_DELAY_S)
            self.nudge.clear()
            cursor = self.applied  # in flight is read after it was applied
            adapters_at = self.cursor  # the explainer routes adapters by it already
            by_url = {e.url: rid for rid, e in self.endpoints.items()}
            in_flight: dict[str, int] = {}
            requests: dict[str, int] = {}
            try:
                load = await self.smg.load()
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
                load = None  # SMG is down: nothing is in flight through it
            sent, sent_requests = self.explainer.sent, self.explainer.sent_requests
            for url, rid in by_url.items():
                # Through SMG, and held requests sent on by the explainer (past SMG's count).
                ours, ours_in_all = sent.get(url, 0), sent_requests.get(url, 0)
                if load is not None:
                    ours += load.in_flight.get(url, 0)
                    ours_in_all += load.requests.get(url, 0)
                if load is not None or ours_in_all:
                    in_flight[rid] = ours
                    requests[rid] = ours_in_all
            released = await self._released()
            body: dict[str, object] = {
                "name": self.name,
                "cursor": cursor,
                **self.figures.body(in_flight, requests),
                "max_in_flight": self.smg.options.max_in_flight,
            }
            if self.entries.rejected:  # only when there are: older controllers refuse it
                body["rejected"] = dict(self.entries.rejected)
            if self.explainer.held:  # the same
                body["held"] = dict(self.explainer.held)
                body["held_age"] = self.explainer.held_ages()
            if released:  # the same
                body["released"] = released
            if self.explainer.adapter_requests:  # the same
                body["adapter_in_flight"] = dict(self.explainer.adapter_in_flight)
                body["adapter_requests"] = dict(self.explainer.adapter_requests)
                if adapters_at != cursor:
                    body["adapters_at"] = adapters_at
                busy = self.explainer.adapters_in_flight_at()
                if busy:
                    body["adapter_busy"] = {
                        by_url[url]: sorted(names) for url, names in busy.items() if url in by_url
                    }
            if self.routed != cursor:  # the same (only while removals are pending)
                body["routed"] = self.routed
            used = self.keyring.take_used() if self.keyring is not None else {}
            if used:  # the same
                body["keys_used"] = used
            self.fields.strip(body, time.monotonic())
            try:
                _, status, answer = await aiohttp_request(
                    http, self.controllers, "POST", "/v1/gateways/status", json=body
                )
                dropped = self.fields.take_refusal(status, answer, body, time.monotonic())
                if dropped:
                    log.warning(
                        "the controller does not take %s in a gateway's status (it is older "
                        "than this gateway: upgrade controllers first); sent without, and "
                        "offered again in %g s",
                        ", ".join(dropped),
                        OFFER_AGAIN_S,
                    )
                    self.nudge.set()  # the status again at once, without them
                    continue
                if status >= 400:
                    raise RuntimeError(f"{status}: {error_message(answer, str(status))}")
            except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
                outage.failed(exc)
                continue
            outage.ok()
            if self.figures.answered(answer):
                self.nudge.set()  # its changes were not taken: the whole figures, now
