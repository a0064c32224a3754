"""Failed cards: which replicas they hit, and the cordon of their nodes.

Called by the reconcile loop once per pass (`Reconciler.steps`), with the
fleet's facts as the agents last reported them. A card counts as failed when
its agent reports it `unhealthy`: a fatal Xid, uncorrectable ECC, a failed or
pending row remap, a lost card or one fallen off the bus (`agent.gpus`), or the
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
from collections.abc import Mapping

from llmgw.controller.admin_flags import BY_LLMGW
from llmgw.controller.facts import Facts
from llmgw.controller.nodes import CardFault
from llmgw.controller.store import ReplicaRecord
from llmgw.wire import AdminFlag, EventReason

log = logging.getLogger("llmgw.faults")

FAULT_REASON_MAX = 200

Faults = Mapping[str, Mapping[str, CardFault]]  # node -> card uuid -> fault


def card_faults(fleet: Facts) -> dict[str, dict[str, CardFault]]:
    """Every failed card, by node and UUID, as last reported."""
    return {
        name: {f.uuid: f for f in entry.faults}
        for name, entry in fleet.nodes.items()
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
    and cordons again a node that has a failed card and is not cordoned."""

    def __init__(self) -> None:
        self._acted: dict[str, frozenset[str]] = {}  # node -> failed cards seen

    def cordon(self, fleet: Facts, faults: Faults) -> None:
        for gone in self._acted.keys() - faults.keys():
            del self._acted[gone]  # every card recovered (or the node was forgotten)
        for node, cards in faults.items():
            now_failed = frozenset(cards)
            new = sorted(
                (cards[u] for u in now_failed - self._acted.get(node, frozenset())),
                key=lambda f: f.gpu_index,
            )
            if new:
                reason = cordon_reason(new)
                if not fleet.settings.cordon_on_gpu_fault:
                    done = "not cordoned (--no-cordon-on-gpu-fault)"
                elif fleet.admin_info(node).flag is not AdminFlag.NONE:
                    done = "cordoned already: its reason stays"  # the operator's words
                else:
                    log.warning("cordoning %s: %s", node, reason)
                    fleet.set_flag(node, AdminFlag.CORDONED, reason, BY_LLMGW)
                    done = "cordoned"
                fleet.event(f"node/{node}", EventReason.GPU_FAULT, f"{reason}: {done}")
            self._acted[node] = now_failed  # after the cordon: a failed write is tried again
