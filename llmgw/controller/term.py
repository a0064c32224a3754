"""`Term`: everything one leadership term builds, and nothing that outlives it.

A start or a takeover builds a whole new term from the store, and the leadership
swaps to it (leadership.py); nothing is re-initialised in place, so nothing from
an earlier term (a gateway's applied cursor, a cached reply, a capacity version)
can be read against this one's revisions. The reconcile loop's memory is its
`Reconciler`'s, built anew for each term.

    Term
    ├── facts        the one writer (facts.py): store, then memory, then the change log
    ├── rows         node rows, `?since=`, node detail (node_rows.py)    *
    ├── totals       the summary's running sums (summary.py)             *
    ├── replies      agents' report replies (replies.py)                 *
    ├── gateways     the gateways' statuses (endpoints.py)               *
    ├── feed_hold    whether a new leader publishes the feed yet (endpoints.py)
    ├── stop_gate    when a replica may stop (endpoints.py)
    ├── credentials  issued node credentials and enrollment tokens (credentials.py)
    ├── client_keys  tenants' client keys and the gateways' feed of them (client_keys.py)
    ├── limits       tenants' limits, on the same feed (limits.py)
    └── usage        tokens metered per tenant and model, and the limits' shared counts (usage.py)

    *: a follower of the change log with its own cache (follow.py; `followers`)

A report goes to the facts, and its answer comes from a view (`ingest_json`).
Capacity, what placement reads, is the log itself: its version is the newest
change of a kind placement reads, so it needs no counter beside the log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmgw.controller.core import cursors
from llmgw.controller.core.adapter_use import AdapterMemory
from llmgw.controller.core.changes import ChangeKind
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.state.client_keys import ClientKeys
from llmgw.controller.state.credentials import UNREPORTED_TTL_S, Credentials
from llmgw.controller.state.facts import Facts
from llmgw.controller.state.limits import Limits
from llmgw.controller.state.replicas import ReplicaStatus
from llmgw.controller.state.usage import Usage
from llmgw.controller.store.base import StateStore
from llmgw.controller.views import model_views
from llmgw.controller.views.endpoints import FeedHold, Gateways, StopGate, endpoints_since
from llmgw.controller.views.follow import Follower
from llmgw.controller.views.node_rows import NodeRows
from llmgw.controller.views.replies import Replies, assignments_for
from llmgw.controller.views.summary import Totals, build_summary
from llmgw.wire import (
    EndpointsDelta,
    EventReason,
    FleetSummary,
    ModelView,
    NodeReport,
    ReplicaView,
    ReportReply,
    ShardAssignment,
)

# What placement reads: a node's facts, its flag, the cards assigned on it (by
# node); the specs and the replicas (the whole fleet).
NODE_CAPACITY = (ChangeKind.NODE, ChangeKind.ADMIN, ChangeKind.ASSIGNMENTS)
CAPACITY = (*NODE_CAPACITY, ChangeKind.MODEL, ChangeKind.REPLICA)


@dataclass(frozen=True)
class Term:
    run: str  # in every cursor this term issues (cursors.py)
    facts: Facts
    rows: NodeRows
    totals: Totals
    replies: Replies
    gateways: Gateways
    feed_hold: FeedHold
    stop_gate: StopGate
    credentials: Credentials
    client_keys: ClientKeys
    limits: Limits
    usage: Usage
    # What the adapter step remembers across passes; the adapters' view reads it too.
    adapter_use: AdapterMemory = field(default_factory=AdapterMemory)
    # Set when something the loop waits on happened (an engine turned ready, asleep or
    # failed; a gateway holds requests or let go of a replica): its next pass runs
    # now, not at its interval (Reconciler.run). A model switch is several such steps.
    decide_soon: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def begin(
        cls,
        store: StateStore,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        after: Term | None = None,
    ) -> Term:
        """A new term from what the store holds now. `after`: the term before it
        in this process, whose counters go on (counters never go back)."""
        facts = Facts(store, settings, clock=clock, wall=wall)
        if after is not None:
            facts.carry_counts(after.facts)
        run = cursors.new_run()
        gateways = Gateways(facts, run)
        client_keys = ClientKeys(store, run)
        limits = Limits(store, client_keys.touch)
        usage = Usage(store, run, limits)
        if after is not None:
            usage.carry(after.usage)
        return cls(
            run=run,
            facts=facts,
            rows=NodeRows(facts, run),
            totals=Totals(facts),
            replies=Replies(facts),
            gateways=gateways,
            feed_hold=FeedHold(facts),
            stop_gate=StopGate(facts, gateways),
            credentials=Credentials(store, settings.tokens),
            client_keys=client_keys,
            limits=limits,
            usage=usage,
        )

    def next_term(self) -> Term:
        """The term a takeover after this one builds: this term's last events saved
        first, then everything read again from the store (which another controller
        may have written meanwhile); the same clocks, the counters going on."""
        facts = self.facts
        facts.flush_events()
        return Term.begin(
            facts.store, facts.settings, clock=facts.clock, wall=facts.wall, after=self
        )

    def expire_credentials(self, now: float) -> None:
        """Drop the credentials never reported with (`Credentials.expire`): an event
        for each, and its node awaits no approval any more."""
        for node in self.credentials.expire(now):
            self.facts.approvals.drop(node)
            self.facts.event(
                f"node/{node}",
                EventReason.CREDENTIAL_EXPIRED,
                f"its credential was never used to report within {UNREPORTED_TTL_S / 3600:g} h"
                " of its enrollment: dropped (the node enrolls again with a valid token)",
            )

    @property
    def followers(self) -> Mapping[str, Follower]:
        """The views that follow the change log, each keeping its own cache, by name."""
        return {
            "rows": self.rows,
            "totals": self.totals,
            "replies": self.replies,
            "gateways": self.gateways,
        }

    # -- an agent's report: the facts take it, a view answers ----------------------------

    def ingest(self, report: NodeReport, raw: bytes | None = None) -> ReportReply:
        """Take a node's report (`raw`: its body as received) and answer it."""
        return self.replies.reply(report.node, self._take(report, raw))

    def ingest_json(self, report: NodeReport, raw: bytes | None = None) -> bytes:
        """`ingest`, the answer serialised (most are the node's last, kept encoded)."""
        return self.replies.reply_json(report.node, self._take(report, raw))

    def _take(self, report: NodeReport, raw: bytes | None) -> float:
        now, engines_moved = self.facts.ingest(report, raw)
        if engines_moved:
            self.decide_soon.set()
        return now

    # -- reads composed of several views -------------------------------------------------

    def summary(self, gateway_in_flight: Mapping[str, int] | None = None) -> FleetSummary:
        """`gateway_in_flight`: requests the gateways hold per replica (`Gateways.in_flight`)."""
        facts = self.facts
        now = facts.clock()
        admin = facts.admin
        return build_summary(
            self.totals.current(now),
            {**facts.approvals.pending, **admin} if facts.approvals.pending else admin,
            facts.nodes,
            model_views.replica_statuses(facts),
            facts.models,
            model_views.unplaceable_reasons(facts),
            now,
            facts.wall(),
            gateway_in_flight,
            model_views.waking(facts, now),
            facts.settings.idle_after_s,
        )

    def endpoints_since(self, since: str, *, with_keys: bool = True) -> EndpointsDelta:
        """The endpoint feed after cursor `since` (`GET /v1/endpoints`); engine keys
        only `with_keys`."""
        return endpoints_since(self.facts, self.run, since, with_keys=with_keys)

    def model_views(self) -> list[ModelView]:
        now = self.facts.clock()
        return model_views.model_views(
            self.facts, self.gateways.held(now), self.gateways.held_age(now)
        )

    def replica_views(self) -> list[ReplicaView]:
        return model_views.replica_views(self.facts)

    def replica_statuses(self) -> dict[str, ReplicaStatus]:
        return model_views.replica_statuses(self.facts)

    @property
    def unplaceable_reasons(self) -> Mapping[str, str]:
        return model_views.unplaceable_reasons(self.facts)

    def assignments_for(self, node: str) -> list[ShardAssignment]:
        return assignments_for(self.facts, node)

    # -- capacity: what placement reads, as the log says it changed --------------------------

    @property
    def capacity_version(self) -> int:
        """Moves whenever something placement reads may have changed: a node's facts
        (state, cards, fabrics, weights held), its flag, the cards assigned on it, a
        node forgotten, replicas placed or removed, model specs. The reconcile loop
        tries a model that cannot be placed again only once this has moved."""
        self.facts.advance_time()
        return self.facts.log.newest(*CAPACITY)

    def capacity_changed_at(self, node: str) -> int:
        """The `capacity_version` of the last change to what placement reads of this
        node (0: none this term)."""
        log = self.facts.log
        return max(log.latest(kind, node) for kind in NODE_CAPACITY)
