"""What the controller answers an agent's report: its flag, state and assignments.

Most replies repeat the node's last one word for word, so `Replies` keeps each
node's last reply, encoded, until the log says the node's facts, admin flag or
assignments changed (follow.py).

An agent also long-polls its reply (`GET /v1/agent/assignments`): a change of its
assignments reaches it at once, not at its next report (a wake waited up to two
report intervals, 5 s each by default). Each waiting agent waits on its own node's
event, set as the log says its reply changed; one task follows the log for all of
them while any waits, so a change wakes only the agents it concerns.
"""

from __future__ import annotations

import asyncio
import contextlib

from llmgw.controller.core.changes import Change, ChangeKind
from llmgw.controller.state.facts import Facts
from llmgw.controller.views.follow import Follower
from llmgw.wire import ModelSpec, ReplicaState, ReportReply, ShardAssignment, reply_version


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
                    gpu_memory_share=spec.gpu_memory_share,
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
        self._waiting: dict[str, asyncio.Event] = {}  # node -> set when its reply changed
        self._waiters = 0
        self._pump: asyncio.Task[None] | None = None

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

    async def changed_reply(self, node: str, have: str, wait_s: float) -> tuple[str, bytes]:
        """(version, reply) of `node`, once its version is not `have` or after `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            entry = self._facts.nodes.get(node)
            if entry is not None and entry.received_at is not None:
                body = self.reply_json(node, self._facts.clock())
                version = reply_version(body)
            else:
                # Not heard from this term (a restart, a takeover): its address, and so
                # its assignments' leader addresses, are not known yet, and an answer
                # now would restart its engines. Its report answers it meanwhile.
                body, version = b"", have
            left = deadline - loop.time()
            if version != have or left <= 0 or self._facts.log.closed:
                return version, body  # (closed: the front middleware answers 503)
            event = self._waiting.setdefault(node, asyncio.Event())
            self._waiters += 1
            self._ensure_pump()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
            finally:
                self._waiters -= 1
                if not self._waiters:
                    self._waiting.clear()

    def _ensure_pump(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._follow(), name="replies-follow")

    async def _follow(self) -> None:
        """While agents wait: catch up with the log as it moves (which sets their events)."""
        revision = self._facts.revision
        while self._waiters:
            revision = await self._facts.wait_changed(revision, 5.0)
            if self._facts.log.closed:
                for node in list(self._waiting):
                    self._wake(node)
                return
            self.catch_up(self._facts.clock())

    def changed(self, change: Change, now: float) -> None:
        self._last.pop(change.key, None)
        self._wake(change.key)

    def removed(self, change: Change, now: float) -> None:
        self._last.pop(change.key, None)
        self._wake(change.key)

    def resync(self, revision: int, now: float) -> None:
        self._last.clear()
        for node in list(self._waiting):
            self._wake(node)

    def _wake(self, node: str) -> None:
        event = self._waiting.pop(node, None)
        if event is not None:
            event.set()

    def holds(self, key: str) -> bool:
        return key in self._last
