"""Failed cards: which replicas they hit, and the cordon of their nodes.

Called by the reconcile loop once per pass (`Reconciler.steps`), with the
fleet's facts as the agents last reported them. A card counts as failed when
its agent reports it `unhealthy`: a fatal Xid, uncorrectable ECC, a failed or
pending row remap, a lost card or one fallen off the bus (`llmgw.agent.gpus`), or the
simulated fault of fake GPUs. A card whose health is `unknown` never acts.

What happens then (DESIGN, "Change, faults and demand"):

- a replica with a shard on a failed card is replaced as one replica of a drain
  is (the reconcile loop places the stand-in and stops the original);
- the node is cordoned, recorded as done by llmgw, with the card and its
  reason, once per new fault (`FaultCordons`), unless the controller runs with
  `--no-cordon-on-gpu-fault`. It stays cordoned after the card recovers, until
  an operator uncordons it, as Slurm's node health check leaves a node drained.
"""

from __future__ import annotations

import logging

from llmgw.controller.core.nodes import CardFault, Faults
from llmgw.controller.core.records import ReplicaRecord
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.plans import Cordon, Plan, Planner
from llmgw.controller.state.facts import Facts
from llmgw.wire import AdminFlag, EventReason

log = logging.getLogger("llmgw.faults")

FAULT_REASON_MAX = 200


def card_faults(facts: Facts) -> dict[str, dict[str, CardFault]]:
    """Every failed card, by node and UUID, as last reported."""
    return {
        name: {f.uuid: f for f in entry.faults}
        for name, entry in facts.nodes.items()
        if entry.faults
    }


def fault_under(record: ReplicaRecord, faults: Faults) -> CardFault | None:
    """The first failed card one of the replica's shards runs on, if any."""
    for shard in record.shards:
        on_node = faults.get(shard.node)
        if on_node:
            for uuid in shard.gpus:
                if uuid in on_node:
                    return on_node[uuid]
    return None


def cordon_reason(cards: list[CardFault]) -> str:
    first = cards[0].describe()
    more = f" (+{len(cards) - 1} more)" if len(cards) > 1 else ""
    return f"card fault: {first}"[: FAULT_REASON_MAX - len(more)] + more


class FaultCordons:
    """Cordons nodes whose cards fail. Owns which faults it has acted on, so a
    fault cordons once: an operator who uncordons the node while the card is
    still failed is not overruled, and a card that recovers and fails again
    cordons again. A new controller (restart, failover) starts with no memory,
    and cordons again a node that has a failed card and is not cordoned.

    `plan` decides on a snapshot; `acted` is told once the plan is applied (a
    failed write leaves the faults unacted on, to be tried again)."""

    def __init__(self) -> None:
        self._acted: dict[str, frozenset[str]] = {}  # node -> failed cards seen

    def plan(self, snap: FleetSnapshot) -> Plan:
        plan = Planner(snap.records)
        for node, cards in snap.faults.items():
            new = sorted(
                (cards[u] for u in frozenset(cards) - self._acted.get(node, frozenset())),
                key=lambda f: f.gpu_index,
            )
            if new:
                reason = cordon_reason(new)
                if not snap.settings.cordon_on_gpu_fault:
                    done = "not cordoned (--no-cordon-on-gpu-fault)"
                elif snap.admin_info(node).flag is not AdminFlag.NONE:
                    done = "cordoned already: its reason stays"  # the operator's words
                else:
                    log.warning("cordoning %s: %s", node, reason)
                    plan.add(Cordon(node, reason))
                    done = "cordoned"
                plan.event(f"node/{node}", EventReason.GPU_FAULT, f"{reason}: {done}")
        return plan.plan()

    def acted(self, faults: Faults) -> None:
        """The plan for `faults` was applied: each is acted on."""
        self._acted = {node: frozenset(cards) for node, cards in faults.items()}
