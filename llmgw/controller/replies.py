"""What the controller answers an agent's report: its flag, state and assignments.

Most replies repeat the node's last one word for word, so `Replies` keeps each
node's last reply, encoded, until the log says the node's facts, admin flag or
assignments changed (the revisions it was built at are its key).
"""

from __future__ import annotations

from llmgw.controller.changes import ChangeKind
from llmgw.controller.facts import Facts
from llmgw.wire import ModelSpec, NodeReport, ReplicaState, ReportReply, ShardAssignment


def rendezvous_port(replica_id: str) -> int:
    """A stable port for a multi-node replica's leader, derived from its id."""
    return 29500 + sum(replica_id.encode()) % 500


def sleep_level(spec: ModelSpec) -> int:
    """The level a replica of `spec` sleeps at. `auto` is level 2 until agents report
    their free host memory: level 1 keeps the weights there, and must not exhaust it."""
    return 2 if spec.sleep_level == "auto" else spec.sleep_level


def assignments_for(facts: Facts, node: str) -> list[ShardAssignment]:
    out = []
    for rec in facts.replicas_on(node):
        spec = facts.spec_of(rec)
        if spec is None or rec.state is ReplicaState.FAILED:
            continue
        leader = rec.shards[0].node
        leader_entry = facts.nodes.get(leader)
        leader_address = leader_entry.address if leader_entry else None
        for shard in rec.shards:
            if shard.node != node:
                continue
            out.append(
                ShardAssignment(
                    replica_id=rec.id,
                    model=rec.model,
                    source=spec.source,
                    engine=spec.engine,
                    engine_args=list(spec.engine_args),
                    gpus=list(shard.gpus),
                    rank=shard.rank,
                    nnodes=len(rec.shards),
                    leader_node=leader,
                    leader_address=leader_address,
                    port=rendezvous_port(rec.id) if len(rec.shards) > 1 else None,
                    sleep_mode=spec.sleeps,
                    # Told only once the gateways let go of it (`warm`).
                    sleep_level=sleep_level(spec) if rec.asleep_since is not None else None,
                )
            )
    return out


def reply(facts: Facts, node: str, now: float) -> ReportReply:
    return ReportReply(
        node=node,
        admin_flag=facts.admin_info(node).flag,
        state=facts.state_of(node, now),
        assignments=assignments_for(facts, node),
    )


class Replies:
    def __init__(self, facts: Facts) -> None:
        self._facts = facts
        self._last: dict[str, tuple[tuple[int, int, int], bytes]] = {}

    def ingest(self, report: NodeReport, raw: bytes | None = None) -> ReportReply:
        """Take a report (`Facts.ingest`) and answer it."""
        return reply(self._facts, report.node, self._facts.ingest(report, raw))

    def ingest_json(self, report: NodeReport, raw: bytes | None = None) -> bytes:
        """`ingest`, with the reply serialised: the node's last one while its key holds."""
        facts, node = self._facts, report.node
        now = facts.ingest(report, raw)
        log = facts.log
        key = (
            log.latest(ChangeKind.NODE, node),
            log.latest(ChangeKind.ADMIN, node),
            log.latest(ChangeKind.ASSIGNMENTS, node),
        )
        if len(self._last) > len(facts.nodes):  # a node was forgotten: its reply goes too
            for gone in self._last.keys() - facts.nodes.keys():
                del self._last[gone]
        cached = self._last.get(node)
        if cached is not None and cached[0] == key:
            return cached[1]
        body = reply(facts, node, now).model_dump_json().encode()
        self._last[node] = (key, body)
        return body
