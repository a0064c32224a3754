"""Rolling a changed spec out: new replicas first, old ones through the stop handshake.

`plan_rollout` is pure: the reconcile loop (`llmgw.controller.loop.rolling.roll`) calls it once per
pass for each model that has replicas of an older revision, with the model's
replicas as they are, and then places and stops what it says. Nothing here is
remembered between passes: a controller killed mid-rollout starts again from the
replicas in the store, each with the revision it runs, so nothing is placed twice.

The counts, for a model whose spec asks for `desired` replicas:

- *new*: live replicas of the current revision, *new ready* those serving;
- *old*: replicas of an older revision that still serve or start;
- *leaving*: old replicas taken out of routing, waiting for the gateways to let go.

The rules, as Kubernetes' rolling update (`maxSurge`, `maxUnavailable`):

- a new replica is placed while new + old + leaving < desired + `max_surge` and
  new < desired (leaving ones still hold their cards, so they count);
- an old replica leaves while new ready + old - 1 >= desired - `max_unavailable`;
  an old one that is only starting serves nothing and leaves at once;
- a stalled rollout (a replica of the new revision failed) stops no old replica;
  new ones are still tried, as the model's backoff allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmgw.controller.core.records import ReplicaRecord
from llmgw.wire import ModelSpec, ReplicaState

__all__ = ["RolloutPlan", "plan_rollout"]


@dataclass(frozen=True)
class RolloutPlan:
    place: int = 0  # new replicas to place now
    leave: list[str] = field(default_factory=list)  # old replicas to take out of routing


def plan_rollout(
    spec: ModelSpec,
    desired: int,
    new: Sequence[ReplicaRecord],
    old: Sequence[ReplicaRecord],
    leaving: int,
    *,
    stalled: bool,
) -> RolloutPlan:
    """What one pass does for `spec`'s rollout to `desired` replicas (what demand
    asks for now: `Facts.desired_replicas`). `new` and `old`: the model's live
    replicas of the current and of older revisions (none failed, none leaving);
    `leaving`: how many old ones are out of routing already."""
    new_ready = sum(r.state is ReplicaState.READY for r in new)
    serving = sorted(
        (r for r in old if r.state is not ReplicaState.STARTING),
        key=lambda r: (r.created_at, r.id),
    )
    leave: list[str] = []
    if not stalled:
        leave = sorted(r.id for r in old if r.state is ReplicaState.STARTING)
        floor = desired - spec.max_unavailable
        while serving and new_ready + len(serving) - 1 >= floor:
            leave.append(serving.pop(0).id)
    holding = len(new) + len(old) + leaving  # replicas holding cards, leaving ones too
    place = max(0, min(desired + spec.max_surge - holding, desired - len(new)))
    return RolloutPlan(place=place, leave=leave)
