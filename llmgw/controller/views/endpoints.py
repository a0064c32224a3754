"""The gateway's side of the controller: the endpoint feed, gateway status, the stop gate.

* The endpoint feed (`GET /v1/endpoints?since=CURSOR[&wait=S]`) derives from the
  fleet's change log: which replicas serve, where their rank-0 engine listens,
  and which are `stopping` (out of routing, finishing requests).
* Gateways post their status every second (`POST /v1/gateways/status`): the
  cursor they have applied and their requests in flight per replica.
* The stop gate lets the reconcile loop stop a replica only once every gateway
  heard from in the last `LIVE_S` seconds has applied the change that marked it
  stopping and has nothing in flight to it, or after the stop grace. So no
  gateway can send a request to an engine that is already stopping (the race
  Kubernetes answers with `preStop: sleep`).
* An apply that declares a model answers once every live gateway has applied it
  (`Gateways.caught_up`): from then on each answers the model with a 503 and
  `Retry-After` (its explainer, routed by SMG), never SMG's 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, NamedTuple

from llmgw.controller.core import cursors
from llmgw.controller.core.changes import Change, ChangeKind
from llmgw.controller.core.records import ReplicaRecord
from llmgw.controller.state.facts import Facts
from llmgw.controller.state.replicas import count_by_model
from llmgw.controller.views.follow import Follower, replay
from llmgw.controller.views.model_views import replica_statuses, unplaceable_reasons
from llmgw.errors import BadCursor, TooManyGateways
from llmgw.wire import (
    GATEWAY_IN_FLIGHT_DEFAULT,
    Endpoint,
    EndpointsDelta,
    EventReason,
    GatewayStatus,
    GatewayView,
    NodeState,
    ReplicaState,
    ShardState,
    Unserved,
    UnservedKind,
)

log = logging.getLogger("llmgw.controller")

LIVE_S = 10.0  # a gateway that reported this recently must let go before a stop
# A term this young has not heard its gateways yet (they post a status every second):
# no gateway is not yet "no gateway", and a stop waits (a takeover that finished a
# drain 0.3 s in stopped the original before the gateway moved off it).
FIRST_STATUS_S = 2.5
# The longest an apply that declares a model waits for the live gateways to route it
# (about one SMG registration, under a second; well inside ctl's 10 s read timeout).
CATCH_UP_S = 5.0
FORGET_S = 60.0  # a gateway silent this long is forgotten (its name, its maps)
MAX_NAMES_PER_TOKEN = 32  # gateway names one token may hold at once
MAX_GATEWAYS = 256  # gateway names held at once, all tokens together
CLAMPED_EVENT_EVERY_S = 60.0  # while a gateway's figures stay clamped, one event a minute
# A status body may be this big, plus STATUS_BYTES_PER_REPLICA for each replica
# that exists (a status keeps nothing else): a legit entry is under 200 bytes a
# replica, and parsing a 1 MiB status costs the event loop tens of milliseconds.
STATUS_BYTES_BASE = 64 * 1024
STATUS_BYTES_PER_REPLICA = 1024
MAX_WAIT_S = 30.0  # the longest long poll

_SERVING_STATES = (ReplicaState.READY, ReplicaState.DRAINING)


def endpoint_of(fleet: Facts, rec: ReplicaRecord, now: float) -> Endpoint | None:
    """Where a replica is served, or None while it is not in routing."""
    # One going to sleep is a stopping endpoint until the gateways let go of it.
    falling_asleep = rec.state is ReplicaState.SLEEPING and rec.asleep_since is None
    if rec.state not in _SERVING_STATES and not falling_asleep:
        return None
    leader = rec.shards[0].node
    entry = fleet.nodes.get(leader)
    if entry is None or not entry.address:
        return None
    if fleet.state_of(leader, now) is NodeState.UNREACHABLE:
        return None  # at once: not after the replacement delay
    shard = next((s for s in entry.shards if s.replica_id == rec.id and s.rank == 0), None)
    if shard is None or shard.port is None or shard.state is ShardState.FAILED:
        return None
    host = f"[{entry.address}]" if ":" in entry.address else entry.address
    fabrics = entry.digest.fabrics
    held = fleet.adapter_holds.get(rec.id)
    # Routed by name only where the engine says it holds it and it is not leaving.
    adapters = (
        sorted(n for n, h in held.items() if h.leaving is None and n in shard.adapters)
        if held
        else []
    )
    return Endpoint(
        adapters=adapters,
        replica_id=rec.id,
        model=rec.model,
        url=f"http://{host}:{shard.port}",
        node=leader,
        fabric=fabrics[0] if fabrics else None,
        state="stopping" if rec.id in fleet.stopping else "serving",
        engine_key=rec.engine_key,
    )


class _FeedChanges:
    """The replicas whose endpoint may have moved after a gateway's cursor: a
    follower of the log for one answer of the feed (follow.py)."""

    follows: ClassVar[frozenset[ChangeKind]] = frozenset(
        {ChangeKind.REPLICA, ChangeKind.NODE, ChangeKind.ASSIGNMENTS, ChangeKind.LISTENING}
    )

    def __init__(self, facts: Facts) -> None:
        self._facts = facts
        self.ids: set[str] | None = set()  # None: every replica (a full answer)

    def changed(self, change: Change, now: float) -> None:
        if self.ids is None:
            return
        if change.kind is ChangeKind.REPLICA:
            self.ids.add(change.key)
        else:  # where a node's replicas are served from
            self.ids.update(r.id for r in self._facts.replicas_on(change.key))

    # A replica gone is sent as removed; a node gone took its replicas with it.
    removed = changed

    def resync(self, revision: int, now: float) -> None:
        self.ids = None


def endpoints_since(
    fleet: Facts, run: str, since: str, *, with_keys: bool = True
) -> EndpointsDelta:
    """The endpoints that changed after cursor `since` of this term's `run`; each with
    its engine key only `with_keys` (a gateway's token: every other reader gets URLs
    that serve nothing without it)."""
    after = cursors.parse(since, run)
    now = fleet.clock()
    fleet.advance_time(now)
    records = fleet.records
    changes = _FeedChanges(fleet)
    revision = replay(fleet, -1 if after is None else after, changes, now)
    changed = changes.ids
    endpoints: list[Endpoint] = []
    removed: list[str] = []
    ids = sorted(records) if changed is None else sorted(changed)
    for rid in ids:
        rec = records.get(rid)
        ep = None if rec is None else endpoint_of(fleet, rec, now)
        if ep is not None:
            endpoints.append(ep if with_keys else ep.keyless())
        elif changed is not None:
            removed.append(rid)
    return EndpointsDelta.build(
        cursor=cursors.cursor(run, revision),
        full=changed is None,
        endpoints=endpoints,
        removed=removed,
        unserved=unserved_reasons(fleet, now),
        adapters={name: spec.base for name, spec in fleet.adapters.items()},
    )


# A model whose replicas failed fewer times than this, with its next try scheduled,
# is on its way (not_ready: requests a gateway holds wait on); then unplaceable.
RETRIES_HELD = 3


def _retrying(fleet: Facts, model: str) -> bool:
    """Unplaceable only by its failures (not the scheduler's verdict), and few yet:
    a replica killed in the middle of a wake is placed again in seconds."""
    backoff = fleet.backoffs.get(model)
    return (
        model not in fleet.decisions.unplaceable
        and backoff is not None
        and backoff.failures < RETRIES_HELD
    )


def unserved_reasons(fleet: Facts, now: float) -> dict[str, Unserved]:
    """Each declared model with no serving endpoint, and why; and each adapter whose
    files no node's storage holds complete (never served: its requests get the 503 of
    a model that cannot be placed, not a wait for a load that cannot happen). An
    adapter given by an absolute path is not judged here: no agent scans a path."""
    out = _adapters_nowhere(fleet)
    out.update(_models_unserved(fleet, now))
    return out


def _adapters_nowhere(fleet: Facts) -> dict[str, Unserved]:
    # A path is handed to the engine as it is (nothing scans it): its load says.
    missing = {s.source for s in fleet.adapters.values() if not s.source.startswith("/")}
    for entry in fleet.nodes.values():  # on every answer of the feed: stop once all found
        if not missing:
            return {}
        missing -= entry.digest.adapters
    return {
        name: Unserved(
            kind=UnservedKind.UNPLACEABLE,
            message=f"adapter {name}: {spec.source} is complete on no node's storage "
            "(adapter_config.json naming a LoRA, and its weights whole)",
        )
        for name, spec in fleet.adapters.items()
        if spec.source in missing
    }


def _models_unserved(fleet: Facts, now: float) -> dict[str, Unserved]:
    serving: set[str] = set()
    for rec in fleet.records.values():
        if rec.model not in serving:
            ep = endpoint_of(fleet, rec, now)
            if ep is not None and ep.state == "serving":
                serving.add(rec.model)
    unserved = [name for name in fleet.models if name not in serving]
    if not unserved:  # the steady state, on every answer of the feed: nothing to count
        return {}
    counts = count_by_model(replica_statuses(fleet).values())
    # Decided awake, by the record: its engines may say ready a pass before the loop
    # makes it ready and routes it (a held request must not read "not ready" then).
    turning = Counter(r.model for r in fleet.records.values() if r.state is ReplicaState.WAKING)
    reasons = unplaceable_reasons(fleet)
    out = {}
    for name in unserved:
        unplaceable = reasons.get(name)
        n = counts[name][ReplicaState.STARTING]
        spec = fleet.models[name]
        asleep, woken = counts[name][ReplicaState.SLEEPING], turning[name]
        room = fleet.decisions.making_room.get(name)
        if room is not None:  # held while idle replicas sleep to make room for it
            out[name] = Unserved(kind=UnservedKind.ASLEEP, message=room)
        elif unplaceable is not None and _retrying(fleet, name):
            out[name] = Unserved(kind=UnservedKind.NOT_READY, message=unplaceable)
        elif unplaceable is not None:
            out[name] = Unserved(kind=UnservedKind.UNPLACEABLE, message=unplaceable)
        elif woken or asleep:  # the warm tier: held while the same replica wakes
            message = (
                f"{woken} replica{'s' if woken != 1 else ''} waking"
                if woken
                else f"{asleep} replica{'s' if asleep != 1 else ''} asleep, woken by its "
                "first request"
            )
            out[name] = Unserved(kind=UnservedKind.ASLEEP, message=message)
        elif spec.min_replicas == 0 and spec.most_replicas >= 1:  # sleeps at zero, wakes
            waking = f"waking, {n} replica{'s' if n != 1 else ''} starting" if n else ""
            out[name] = Unserved(
                kind=UnservedKind.ASLEEP, message=waking or "woken by its first request"
            )
        elif n:
            out[name] = Unserved(
                kind=UnservedKind.NOT_READY, message=f"{n} replica{'s' if n > 1 else ''} starting"
            )
        else:
            out[name] = Unserved(kind=UnservedKind.NOT_READY, message="no replica is serving yet")
    return out


class FeedHold:
    """Why a controller that just began to lead (a start, a takeover) does not publish
    the serving endpoints yet, or None once it may.

    Replicas are durable but where they listen comes from agent reports, which a new
    leader has not had yet: a full answer now would tell every gateway that nothing
    serves. So it waits until each node leading a replica in routing has reported,
    or has turned unreachable (one grace period), and gateways keep routing as they
    were meanwhile. Once open it stays open for the term (each term builds its
    own), so a poll does not scan every replica."""

    def __init__(self, fleet: Facts) -> None:
        self._facts = fleet
        self._open = False

    def reason(self) -> str | None:
        if self._open:
            return None
        why = _waiting_for_reports(self._facts)
        self._open = why is None
        return why


def _waiting_for_reports(fleet: Facts) -> str | None:
    now = fleet.clock()
    waiting = set()
    for rec in fleet.records.values():
        if rec.state not in (ReplicaState.READY, ReplicaState.DRAINING):
            continue
        node = rec.shards[0].node
        entry = fleet.nodes.get(node)
        if entry is None or entry.received_at is not None:
            continue
        if fleet.state_of(node, now) is not NodeState.UNREACHABLE:
            waiting.add(node)
    if not waiting:
        return None
    names = ", ".join(sorted(waiting)[:5]) + (" …" if len(waiting) > 5 else "")
    return (
        f"this controller began to lead {now - fleet.liveness.started_at:.0f} s ago and waits for "
        f"{len(waiting)} node(s) serving replicas to report ({names}); keep routing as is "
        "and ask again"
    )


@dataclass
class GatewaySeen:
    name: str
    cursor: str  # what it has applied: "EPOCH.REVISION" (`applied` reads it)
    in_flight: dict[str, int]
    requests: dict[str, int]
    at: float  # monotonic
    by: str = ""  # the token's identity that posted it
    rejected: dict[str, str] = field(default_factory=dict)  # replica id -> why left out
    held: dict[str, int] = field(default_factory=dict)  # model asleep -> requests it holds
    routed: str = ""  # a later cursor whose new workers SMG routes to ("": `cursor`)
    clamped_said: float | None = None  # when the event said its figures were clamped
    released: frozenset[str] = frozenset()  # stopping replicas its SMG no longer routes to
    adapter_in_flight: dict[str, int] = field(default_factory=dict)  # adapter -> now
    adapter_requests: dict[str, int] = field(default_factory=dict)  # adapter -> in all
    # In flight as it said, before `clamp` (`in_flight` when nothing was): what its
    # next status's changes apply to, with `requests`.
    said_in_flight: dict[str, int] = field(default_factory=dict)
    taken: tuple[str, int] | None = None  # (stream, seq) its changes may build on
    adapters_at: str = ""  # a later cursor its adapter routing follows ("": `cursor`)
    adapter_busy: frozenset[tuple[str, str]] = frozenset()  # (replica, adapter) in flight
    held_age: dict[str, float] = field(default_factory=dict)  # model -> s it has held some

    def applied(self, run: str) -> int | None:
        """The revision it has applied, in the term of `run`; None for a cursor of
        another term (one posted before a takeover means nothing now)."""
        return _revision(self.cursor, run)

    def adapters_follow(self, run: str) -> int | None:
        """The revision its adapter routing follows (its explainer's, ahead of SMG)."""
        return _latest(self.applied(run), _revision(self.adapters_at, run))

    def routes(self, run: str) -> int | None:
        """The revision whose new workers (a new model's explainer) SMG routes to."""
        return _latest(self.applied(run), _revision(self.routed, run))


def clamp(
    in_flight: dict[str, int], held: dict[str, int], limit: int
) -> tuple[dict[str, int], dict[str, int], int | None]:
    """A gateway's requests in flight (per replica) and held (per model), scaled down
    together to at most `limit` in all: SMG admits no more at once, so a gateway
    that says more (a misused gateway token, a bug) cannot push a model to its
    maximum. The third value is what it said when that was more (else None)."""
    said = sum(in_flight.values()) + sum(held.values())
    if said <= limit:
        return in_flight, held, None

    def scaled(figures: dict[str, int]) -> dict[str, int]:
        return {k: n * limit // said for k, n in figures.items()}

    return scaled(in_flight), scaled(held), said


def _figures(
    old: GatewaySeen | None, status: GatewayStatus, records: Mapping[str, object]
) -> tuple[dict[str, int], dict[str, int]] | None:
    """A status's in flight (as said) and requests per replica that exists: whole, or
    its changes applied to the status they build on; None when that is not the one
    taken last (GatewayStatusReply.full)."""
    if status.base is None:
        return (
            {rid: n for rid, n in status.in_flight.items() if rid in records},
            {rid: n for rid, n in status.requests.items() if rid in records},
        )
    if old is None or old.taken != (status.stream, status.base):
        return None
    in_flight, requests = dict(old.said_in_flight), dict(old.requests)
    for rid in status.gone:
        in_flight.pop(rid, None)
        requests.pop(rid, None)
    in_flight.update((rid, n) for rid, n in status.in_flight.items() if rid in records)
    requests.update((rid, n) for rid, n in status.requests.items() if rid in records)
    return in_flight, requests


def _latest(*revisions: int | None) -> int | None:
    """The latest of the revisions known (None: none is)."""
    return max((r for r in revisions if r is not None), default=None)


def _revision(cursor: str, run: str) -> int | None:
    try:
        return cursors.parse(cursor, run)
    except BadCursor:
        return None


class Gateways(Follower):
    """The gateways that report, as last heard (soft state: rebuilt within a second).

    Everything here is keyed by what a gateway token chooses, so it is bounded:
    a name silent for FORGET_S is forgotten, one token holds at most
    MAX_NAMES_PER_TOKEN names (MAX_GATEWAYS in all), a status keeps entries only
    for replicas that exist, and one bigger than those could fill is not read.
    What a status said of a replica (or a sleeping model) removed since goes as
    the log says, rather than at the gateway's next status (follow.py)."""

    follows = frozenset({ChangeKind.REPLICA, ChangeKind.MODEL})

    def __init__(self, facts: Facts, run: str) -> None:
        super().__init__(facts)
        self.run = run  # the term's: what an applied cursor is read against
        self.seen: dict[str, GatewaySeen] = {}
        self._heard = asyncio.Event()

    def changed(self, change: Change, now: float) -> None:
        """What a status said of a replica or model that still exists stands."""

    def removed(self, change: Change, now: float) -> None:
        key = change.key
        for g in self.seen.values():
            if change.kind is ChangeKind.MODEL:
                g.held.pop(key, None)
                g.held_age.pop(key, None)
            else:
                g.in_flight.pop(key, None)
                g.said_in_flight.pop(key, None)
                g.requests.pop(key, None)
                g.rejected.pop(key, None)
                g.released -= {key}
                g.adapter_busy = frozenset(b for b in g.adapter_busy if b[0] != key)

    def resync(self, revision: int, now: float) -> None:
        records, models = self._facts.records, self._facts.models
        for g in self.seen.values():
            for by_replica in (g.in_flight, g.said_in_flight, g.requests, g.rejected):
                for rid in [r for r in by_replica if r not in records]:
                    del by_replica[rid]
            for model in [m for m in g.held if m not in models]:
                del g.held[model]
            g.held_age = {m: t for m, t in g.held_age.items() if m in g.held}
            g.released = frozenset(r for r in g.released if r in records)
            g.adapter_busy = frozenset(b for b in g.adapter_busy if b[0] in records)

    def holds(self, key: str) -> bool:
        return any(
            key in g.in_flight
            or key in g.requests
            or key in g.rejected
            or key in g.held
            or key in g.released
            or any(rid == key for rid, _ in g.adapter_busy)
            for g in self.seen.values()
        )

    def status_bytes(self) -> int:
        """The largest status body worth reading now (413 past it, before parsing)."""
        return STATUS_BYTES_BASE + STATUS_BYTES_PER_REPLICA * len(self._facts.records)

    def report(self, status: GatewayStatus, by: str = "") -> bool:
        """Take a gateway's status; False when its changes (`base`) apply to no
        status taken from it: its figures stay as they were until a whole one."""
        now = self._facts.clock()
        self.expire(now)
        old = self.seen.get(status.name)
        if old is None:
            mine = sum(1 for g in self.seen.values() if g.by == by)
            if mine >= MAX_NAMES_PER_TOKEN or len(self.seen) >= MAX_GATEWAYS:
                raise TooManyGateways(
                    f"too many gateway names ({mine} for this token, {len(self.seen)} in all; "
                    f"at most {MAX_NAMES_PER_TOKEN} per token, {MAX_GATEWAYS} in all): reuse a "
                    f"name, or wait: a name is forgotten {FORGET_S:g} s after its last status"
                )
        records = self._facts.records
        figures = _figures(old, status, records)
        said_in_flight, requests = figures or (
            (old.said_in_flight, old.requests) if old and old.taken else ({}, {})
        )
        before = old.requests if old else {}
        # New requests since its last status; a gateway's first status only sets the base.
        # Changes name every replica whose count moved, so only they are looked at.
        moved = status.requests if figures is not None and status.base is not None else requests
        self._facts.note_requests(
            (
                rid
                for rid, n in moved.items()
                if rid in requests and n > before.get(rid, 0 if old else n)
            ),
            now,
        )
        limit = status.max_in_flight or GATEWAY_IN_FLIGHT_DEFAULT
        in_flight, held, claimed = clamp(
            said_in_flight,
            {
                m: n
                for m, n in status.held.items()
                if n and (m in self._facts.models or m in self._facts.adapters)
            },
            limit,
        )
        said = old.clamped_said if old else None
        if claimed is None:
            said = None
        elif said is None or now - said >= CLAMPED_EVENT_EVERY_S:
            said = now
            self._facts.event(
                f"gateway/{status.name}",
                EventReason.GATEWAY_CLAMPED,
                f"gateway {status.name} said {claimed} requests were in flight or held, more "
                f"than the {limit} it admits at once (llmgw gateway --max-in-flight): counted "
                f"as {limit}; its token may be misused, or the gateway is broken",
            )
        self.seen[status.name] = GatewaySeen(
            status.name,
            status.cursor,
            in_flight,
            requests,
            now,
            by,
            {rid: why for rid, why in status.rejected.items() if rid in records},
            held,
            status.routed,
            said,
            frozenset(rid for rid in status.released if rid in records),
            {a: n for a, n in status.adapter_in_flight.items() if a in self._facts.adapters},
            {a: n for a, n in status.adapter_requests.items() if a in self._facts.adapters},
            said_in_flight,
            (status.stream, status.seq)
            if figures is not None and status.stream and status.seq
            else None,
            status.adapters_at,
            frozenset(
                (rid, name)
                for rid, names in status.adapter_busy.items()
                if rid in records
                for name in names
            ),
            {m: t for m, t in status.held_age.items() if m in held},
        )
        self._heard.set()
        self._heard = asyncio.Event()
        return figures is not None

    async def caught_up(self, revision: int, what: str, timeout_s: float = CATCH_UP_S) -> None:
        """Wait until the SMG of each gateway live now routes to the workers the feed
        added by `revision` (a new model's explainer), at most `timeout_s`; past it,
        say which do not. `what`: the change waited for, in the warning."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        waiting = {g.name for g in self.live(self._facts.clock())}
        while True:
            waiting = {n for n in waiting if not self._routes(n, revision)}
            left = deadline - loop.time()
            if not waiting or left <= 0:
                break
            heard = self._heard
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(heard.wait(), left)
        if waiting:
            log.warning(
                "%s: gateway(s) %s have not applied it %g s later; they answer 404 for a "
                "new model until they do",
                what, ", ".join(sorted(waiting)), timeout_s,
            )  # fmt: skip

    def _routes(self, name: str, revision: int) -> bool:
        g = self.seen.get(name)
        if g is None:
            return True  # forgotten: nothing to wait for
        routes = g.routes(self.run)
        return routes is not None and routes >= revision

    def expire(self, now: float) -> None:
        for name in [n for n, g in self.seen.items() if now - g.at > FORGET_S]:
            del self.seen[name]

    def live(self, now: float) -> list[GatewaySeen]:
        self.catch_up(now)
        return [g for g in self.seen.values() if now - g.at <= LIVE_S]

    def in_flight(self, now: float) -> dict[str, int]:
        """Requests in flight per replica, summed over the live gateways (the
        traffic view counts them when they exceed the engine's own count)."""
        out: dict[str, int] = {}
        for g in self.live(now):
            for rid, n in g.in_flight.items():
                out[rid] = out.get(rid, 0) + n
        return out

    def held(self, now: float) -> dict[str, int]:
        """Requests the live gateways hold per model asleep, waiting for it to wake."""
        out: dict[str, int] = {}
        for g in self.live(now):
            for model, n in g.held.items():
                out[model] = out.get(model, 0) + n
        return out

    def held_age(self, now: float) -> dict[str, float]:
        """Per model with requests held: the longest any live gateway has held some,
        as of its last status."""
        out: dict[str, float] = {}
        for g in self.live(now):
            for model, seconds in g.held_age.items():
                out[model] = max(out.get(model, 0.0), seconds + (now - g.at))
        return out

    def adapter_traffic(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Per adapter, over the live gateways: requests in flight, and forwarded in all."""
        in_flight: dict[str, int] = {}
        requests: dict[str, int] = {}
        for g in self.live(now):
            for name, n in g.adapter_in_flight.items():
                in_flight[name] = in_flight.get(name, 0) + n
            for name, n in g.adapter_requests.items():
                requests[name] = requests.get(name, 0) + n
        return in_flight, requests

    def views(self) -> list[GatewayView]:
        now = self._facts.clock()
        self.expire(now)
        self.catch_up(now)
        return [
            GatewayView(
                name=g.name,
                cursor=g.cursor,
                age_s=round(now - g.at, 1),
                in_flight=sum(g.in_flight.values()),
                requests=sum(g.requests.values()),
                rejected=dict(g.rejected),
            )
            for g in sorted(self.seen.values(), key=lambda g: g.name)
        ]


class LiveGateway(NamedTuple):
    """What the stop gate reads of one live gateway."""

    applied: int | None  # the revision it applied in this term (None: none)
    in_flight: Mapping[str, int]  # its requests in flight per replica
    released: frozenset[str] = frozenset()  # stopping replicas its SMG no longer routes to
    adapters_follow: int | None = None  # the revision its adapter routing follows
    adapter_busy: frozenset[tuple[str, str]] = frozenset()  # (replica, adapter) in flight

    def lets_adapter_go(self, rid: str, name: str, revision: int) -> bool:
        """It routes `name` to `rid` no more (out at `revision`) and has no request for
        it there in flight. Its explainer routes adapters, so that is its own cursor,
        not SMG's: a removal SMG takes seconds over does not hold an unload."""
        follows = _latest(self.applied, self.adapters_follow)
        return follows is not None and follows >= revision and (rid, name) not in self.adapter_busy

    def let_go(self, rid: str, revision: int | None, force: bool) -> bool:
        """It routes nothing more to `rid` (marked stopping at `revision`) and has
        nothing in flight to it (unless `force`). Routing is over once it applied the
        mark, or once its SMG dropped the replica's worker: whichever comes first, so a
        slow change of another model never holds this stop."""
        routed = rid not in self.released and (
            revision is None or self.applied is None or self.applied < revision
        )
        return not routed and (force or not self.in_flight.get(rid))


@dataclass(frozen=True)
class GateView:
    """The stop gate (`StopGate`) as a value: which replicas the live
    gateways have let go of. Asking marks nothing: a plan's `Stopping` does."""

    now: float
    grace_s: float
    live: tuple[LiveGateway, ...] = ()  # each live gateway
    stopping: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    in_flight: Mapping[str, int] = field(default_factory=dict)  # summed over live gateways
    held: Mapping[str, int] = field(default_factory=dict)  # per model asleep (and adapter)
    held_age: Mapping[str, float] = field(default_factory=dict)  # seconds some have been held
    adapter_in_flight: Mapping[str, int] = field(default_factory=dict)  # via the gateways
    adapter_requests: Mapping[str, int] = field(default_factory=dict)  # forwarded in all
    unheard: bool = False  # the term is younger than FIRST_STATUS_S and no gateway is live

    def adapter_let_go(self, rid: str, name: str, revision: int) -> bool:
        """Whether every live gateway has let go of adapter `name` on replica `rid`,
        routed elsewhere since `revision` (True with none live)."""
        return all(g.lets_adapter_go(rid, name, revision) for g in self.live)

    def lets_go(self, ids: Iterable[str], *, force: bool = False) -> list[str]:
        """Of replicas that must stop, those the gateways have let go of. One not
        marked stopping yet is marked by the plan at a revision no gateway can
        have applied, so only no gateway at all (or no grace) lets it go now."""
        out = []
        for rid in ids:
            mark = self.stopping.get(rid)
            revision, marked_at = mark if mark is not None else (None, self.now)
            if (
                (not self.live and not self.unheard)
                or self.now - marked_at >= self.grace_s
                or (mark is not None and all(g.let_go(rid, revision, force) for g in self.live))
            ):
                out.append(rid)
        return out


class StopGate:
    """Decides when a replica that must stop may be stopped (see the module docstring)."""

    def __init__(self, facts: Facts, gateways: Gateways) -> None:
        self.facts = facts
        self.gateways = gateways

    def view(self, now: float) -> GateView:
        """The gate as a value, for the reconcile loop to decide on: `GateView.lets_go`
        answers as `ready_to_stop` would, without marking anything."""
        gateways = self.gateways
        live = tuple(
            LiveGateway(
                g.applied(gateways.run),
                MappingProxyType(dict(g.in_flight)),
                g.released,
                g.adapters_follow(gateways.run),
                g.adapter_busy,
            )
            for g in gateways.live(now)
        )
        young = now - self.facts.liveness.started_at < FIRST_STATUS_S
        return GateView(
            now=now,
            grace_s=self.facts.settings.stop_grace_s,
            live=live,
            unheard=young and not live,
            stopping=dict(self.facts.stopping),
            in_flight=gateways.in_flight(now),
            held=gateways.held(now),
            held_age=gateways.held_age(now),
            adapter_in_flight=gateways.adapter_traffic(now)[0],
            adapter_requests=gateways.adapter_traffic(now)[1],
        )

    def ready_to_stop(self, ids: Iterable[str], *, force: bool = False) -> list[str]:
        """Mark each replica stopping (once); return those every live gateway let go of.

        `force`: a forced drain waits for the gateways to stop routing to the
        replica, not for its requests in flight to finish."""
        ids = list(ids)
        for rid in ids:
            self.facts.mark_stopping(rid)
        return self.view(self.facts.clock()).lets_go(ids, force=force)
