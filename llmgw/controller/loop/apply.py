"""Where the reconcile loop meets the facts: a snapshot taken, a plan applied.

`take_snapshot` reads a term's facts (and the stop gate) into a `FleetSnapshot`
for a step to decide on; `apply` carries out the step's `Plan` through `Facts`,
action by action, in the order the step decided. Steps neither read nor write
the facts otherwise. Two drivers call these: `Reconciler.steps`, between steps,
and the shortfall step's filling, which also builds its picture from the term
across yields (`llmgw.controller.loop.picture`) and reads its capacity version to
notice moves between slices.
"""

from __future__ import annotations

from llmgw.controller.core.admin_flags import BY_LLMGW
from llmgw.controller.loop.faults import card_faults
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.plans import (
    BackOff,
    ClearBackoff,
    Cordon,
    DrainBlocked,
    DropAdapter,
    Event,
    ForceDrain,
    ForgetScaling,
    HandingOver,
    HoldAdapter,
    MakingRoom,
    MarkDrained,
    Plan,
    Put,
    ReleaseAdapter,
    Remove,
    RolloutNote,
    Scaling,
    Started,
    Stopping,
    Unplaceable,
)
from llmgw.controller.state.facts import Facts
from llmgw.controller.term import Term
from llmgw.controller.views import model_views
from llmgw.controller.views.endpoints import StopGate
from llmgw.wire import AdminFlag

__all__ = ["apply", "take_snapshot"]


def take_snapshot(term: Term, gate: StopGate | None) -> FleetSnapshot:
    """The term's facts now, as a step decides on them."""
    facts = term.facts
    now, wall = facts.clock(), facts.wall()
    models = dict(facts.models)
    records = dict(facts.records)
    return FleetSnapshot(
        now=now,
        wall=wall,
        settings=facts.settings,
        models=models,
        revisions={name: facts.model_revision(name) for name in models},
        desired={name: facts.desired_replicas(name) for name in models},
        backoffs=dict(facts.backoffs),
        records=records,
        statuses=model_views.replica_statuses(facts, last_known=False),
        # Read only for models backing off (`outcomes._steady`): not copied every
        # snapshot of a pass for a fleet where none does.
        ready_since=dict(facts.ready_since) if facts.backoffs else {},
        outdated=frozenset(rid for rid, rec in records.items() if not facts.up_to_date(rec)),
        nodes=dict(facts.nodes),
        admin=dict(facts.admin),
        pending=dict(facts.approvals.pending),
        liveness=facts.liveness,
        faults=card_faults(facts),
        rollout_notes={
            name: note for name in models if (note := facts.decisions.rollout_note(name))
        },
        unplaceable=model_views.unplaceable_reasons(facts),
        placement_reasons=dict(facts.decisions.unplaceable),
        making_room=dict(facts.decisions.making_room),
        handing_over=dict(facts.decisions.handing_over),
        capacity_version=term.capacity_version,
        revision=facts.revision,
        gate=None if gate is None else gate.view(now),
        adapters=dict(facts.adapters),
        adapter_holds={rid: dict(held) for rid, held in facts.adapter_holds.items()},
    )


def apply(facts: Facts, plan: Plan) -> None:
    """Carry out `plan` through the one writer, in the order it was decided."""
    for action in plan.actions:
        match action:
            case Put(records):
                facts.put_replicas(records)
            case Remove(ids):
                facts.remove_replicas(ids)
            case Stopping(ids):
                for rid in ids:
                    facts.mark_stopping(rid)
            case Event(obj, reason, message):
                facts.event(obj, reason, message)
            case RolloutNote(model, note):
                facts.decisions.set_rollout_note(model, note)
            case BackOff(model, why, at):
                facts.back_off(model, why, at)
            case ClearBackoff(model):
                facts.clear_backoff(model)
            case Unplaceable(model, why):
                facts.decisions.set_unplaceable(model, why)
            case MakingRoom(model, how):
                facts.decisions.set_making_room(model, how)
            case HandingOver(rid, since):
                facts.decisions.set_handing_over(rid, since)
            case Started(model, kind, level, seconds):
                facts.count_start(model, kind, level, seconds, facts.wall())
            case Scaling(model, decision):
                facts.decisions.set_scaling(model, decision)
            case ForgetScaling(keep):
                facts.decisions.forget_scaling(keep)
            case DrainBlocked(node, why):
                facts.decisions.set_drain_blocked(node, why)
            case MarkDrained(node):
                facts.mark_drained(node)
            case ForceDrain(node, why):
                facts.force_drain(node, why)
            case Cordon(node, reason):
                facts.set_flag(node, AdminFlag.CORDONED, reason, BY_LLMGW)
            case HoldAdapter(rid, name):
                facts.loras.hold(rid, name)
            case ReleaseAdapter(rid, name):
                facts.loras.release(rid, name)
            case DropAdapter(rid, name):
                facts.loras.drop(rid, name)
