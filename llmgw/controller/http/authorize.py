"""The node authorizer: a report may speak only for its sender's node and its
own shards, as Kubernetes' node authorizer limits a kubelet.

A node credential reports as its node only. Whatever the credential (a shared
token too), every shard a report carries must belong to a replica assigned to
the reporting node at that rank: otherwise one node could mark another node's
replica failed (the controller would stop it and back the model off) or ready
(the model would look satisfied while nothing runs). A shard of a replica the
controller does not know (an engine left over after a forget) is let through:
it is not assigned to anyone, and the reply tells the agent to stop it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from llmgw.controller.core.auth import Identity
from llmgw.controller.core.records import ReplicaRecord
from llmgw.wire import NodeReport

log = logging.getLogger("llmgw.controller.http.authorize")


def report_refusal(
    identity: Identity, report: NodeReport, records: Mapping[str, ReplicaRecord]
) -> str | None:
    """Why this report may not be taken, or None when it may."""
    if identity.node is not None and report.node != identity.node:
        return (
            f"this credential speaks for node {identity.node!r}; "
            f"a report naming {report.node!r} is refused"
        )
    for shard in report.replicas:
        rec = records.get(shard.id)
        if rec is None:
            continue
        owners = [s.node for s in rec.shards if s.rank == shard.rank]
        if owners != [report.node]:
            return (
                f"replica {shard.id} rank {shard.rank} is not assigned to node "
                f"{report.node!r}; a node reports only its own shards"
            )
    return None


class RefusalLog:
    """Logs the first refused report per node, not every one of them."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(self, who: str, why: str) -> None:
        if who in self._seen:
            return
        if len(self._seen) < 100_000:  # bounded: names come from the network
            self._seen.add(who)
        log.warning("refused a report from %s: %s (further refusals not logged)", who, why)
