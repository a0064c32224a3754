"""What the controller answers an agent's report: its flag, state and assignments.

Most replies repeat the node's last one word for word, so `Replies` keeps each
node's last reply, encoded, until the log says the node's facts, admin flag or
assignments changed (follow.py).
"""

from __future__ import annotations

from llmgw.controller.core.changes import Change, ChangeKind
from llmgw.controller.state.facts import Facts
from llmgw.controller.views.follow import Follower
from llmgw.wire import ModelSpec, ReplicaState, ReportReply, ShardAssignment


def rendezvous_port(replica_id: str) -> int:
    """A stable port for a multi-node replica's leader, derived from its id."""
    return 29500 + sum(replica_id.encode()) % 500


def sleep_level(spec: ModelSpec) -> int:
    """The level a replica of `spec` sleeps at. `auto` is chosen by the agent where it
    sleeps (llmgw.agent.sleep_level: level 1 when its host memory holds the weights); 2 is
    what an agent that does not choose uses: it cannot exhaust the host's memory."""
    return 2 if spec.sleep_level == "auto" else spec.sleep_level


def adapters_for(facts: Facts, replica_id: str) -> dict[str, str]:
    """The adapters a replica's engine should hold (leaving ones too, until the
    gateways let go of them): name -> source."""
    held = facts.adapter_holds.get(replica_id, {})
    return {n: spec.source for n in sorted(held) if (spec := facts.adapters.get(n)) is not None}


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
                    adapters=adapters_for(facts, rec.id) if shard.rank == 0 else {},
                    sleep_auto=rec.asleep_since is not None and spec.sleep_level == "auto",
                    engine_key=rec.engine_key,
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


class Replies(Follower):
    """Each node's last reply, encoded, until the log says what it reads changed."""

    follows = frozenset({ChangeKind.NODE, ChangeKind.ADMIN, ChangeKind.ASSIGNMENTS})

    def __init__(self, facts: Facts) -> None:
        super().__init__(facts)
        self._last: dict[str, bytes] = {}

    def reply(self, node: str, now: float) -> ReportReply:
        """The answer to the report `node` just sent (`Facts.ingest` took it at `now`)."""
        return reply(self._facts, node, now)

    def reply_json(self, node: str, now: float) -> bytes:
        """`reply`, serialised: the node's last one while nothing it reads changed."""
        self.catch_up(now)
        body = self._last.get(node)
        if body is None:
            body = self._last[node] = reply(self._facts, node, now).model_dump_json().encode()
        return body

    def changed(self, change: Change, now: float) -> None:
        self._last.pop(change.key, None)

    def removed(self, change: Change, now: float) -> None:
        self._last.pop(change.key, None)

    def resync(self, revision: int, now: float) -> None:
        self._last.clear()

    def holds(self, key: str) -> bool:
        return key in self._last
