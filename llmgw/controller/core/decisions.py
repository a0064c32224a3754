"""`Decisions`: what the reconcile loop decided and every view shows, soft state.

Why a model cannot be placed, why a rollout waits or stalled, what the autoscaler
asked for, why a drain waits, for which model room is being made (the warm tier), which
replicas wait to hand their adapters over before they stop. None of it is durable: a new term's loop decides
it all again within a pass. Part of the facts (`Facts.decisions`): each change
is appended to the same change log, so the views that show it follow it.

Who writes: the reconcile loop's steps, and `Facts` when what a decision is
about goes (a model deleted, a node forgotten or flagged again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from llmgw.controller.core.autoscale import Decision
from llmgw.controller.core.changes import ChangeKind, ChangeLog
from llmgw.wire import EventReason, RolloutState

Note = tuple[RolloutState, str]


class Decisions:
    def __init__(self, log: ChangeLog, event: Callable[[str, EventReason, str], None]) -> None:
        self._log = log
        self._event = event
        self._unplaceable: dict[str, str] = {}  # model -> why it gets no new replica
        self._rollout_notes: dict[str, Note] = {}  # model -> why its rollout waits or stalled
        self._scaling: dict[str, Decision] = {}  # autoscaled model -> the autoscaler's answer
        self._drain_blocked: dict[str, str] = {}  # node -> why its drain waits
        # model -> how room is being made for its held requests (idle replicas put to
        # sleep): it waits for room, it is not unplaceable (`loop.warm`).
        self._making_room: dict[str, str] = {}
        # replica -> (since, last asked): it must stop, and stays in routing until the
        # adapters only it holds load on another replica of its base (`loop.placing`).
        self._handing_over: dict[str, tuple[float, float]] = {}

    @property
    def unplaceable(self) -> Mapping[str, str]:
        """The scheduler's reasons only; `model_views.unplaceable_reasons` adds failures."""
        return MappingProxyType(self._unplaceable)

    @property
    def making_room(self) -> Mapping[str, str]:
        return MappingProxyType(self._making_room)

    @property
    def handing_over(self) -> Mapping[str, tuple[float, float]]:
        return MappingProxyType(self._handing_over)

    @property
    def drain_blocked(self) -> Mapping[str, str]:
        return MappingProxyType(self._drain_blocked)

    @property
    def scalings(self) -> Mapping[str, Decision]:
        return MappingProxyType(self._scaling)

    def rollout_note(self, model: str) -> Note | None:
        return self._rollout_notes.get(model)

    def scaling(self, model: str) -> Decision | None:
        return self._scaling.get(model)

    def set_unplaceable(self, model: str, reason: str | None) -> None:
        """Why `model` cannot be placed (None: it can, or needs nothing)."""
        if self._unplaceable.get(model) == reason:
            return
        if reason is not None and model not in self._unplaceable:  # not each new number
            self._event(f"model/{model}", EventReason.UNPLACEABLE, reason)
        if reason is None:
            del self._unplaceable[model]
        else:
            self._unplaceable[model] = reason
        self._log.append(ChangeKind.UNPLACEABLE, model)

    def set_making_room(self, model: str, how: str | None) -> None:
        """How room is being made for `model`'s held requests (None: it is not)."""
        if self._making_room.get(model) == how:
            return
        if how is None:
            del self._making_room[model]
        else:
            self._making_room[model] = how
        self._log.append(ChangeKind.UNPLACEABLE, model)  # its unserved reason changes

    def set_handing_over(self, replica: str, since: tuple[float, float] | None) -> None:
        """(since, last asked) while `replica` waits to hand its adapters over (None: done)."""
        if since is None:
            if self._handing_over.pop(replica, None) is not None:
                self._log.append(ChangeKind.REPLICA, replica)
            return
        first = replica not in self._handing_over
        self._handing_over[replica] = since
        if first:
            self._log.append(ChangeKind.REPLICA, replica)

    def set_rollout_note(self, model: str, note: Note | None) -> None:
        """Why a rollout waits or stalled (None: it does neither)."""
        if self._rollout_notes.get(model) == note:
            return
        if note is None:
            self._rollout_notes.pop(model, None)
        else:
            self._rollout_notes[model] = note
        self._log.append(ChangeKind.MODEL, model)

    def set_scaling(self, model: str, decision: Decision) -> None:
        """The autoscaler's answer for `model` (each pass); a change of the desired
        count is a change of the model's view."""
        old = self._scaling.get(model)
        self._scaling[model] = decision
        if old is None or old.desired != decision.desired:
            self._log.append(ChangeKind.MODEL, model)

    def forget_scaling(self, keep: Iterable[str]) -> None:
        for model in self._scaling.keys() - set(keep):
            del self._scaling[model]

    def set_drain_blocked(self, node: str, why: str | None) -> None:
        """Why a drain of `node` is not progressing (None: it is, or it is over)."""
        if self._drain_blocked.get(node) == (why or None):
            return
        if why:
            self._drain_blocked[node] = why
        else:
            self._drain_blocked.pop(node, None)
        self._log.append(ChangeKind.ADMIN, node)

    # -- what goes when what a decision is about goes (Facts calls these) ----------------

    def new_rollout(self, model: str) -> None:
        """A new revision: a new rollout, with nothing said of it yet."""
        self._rollout_notes.pop(model, None)

    def model_deleted(self, model: str) -> None:
        self._rollout_notes.pop(model, None)
        self.set_unplaceable(model, None)
        self.set_making_room(model, None)

    def node_flagged(self, node: str) -> bool:
        """A new flag, or the node forgotten: its drain's wait is over. True: there was one."""
        return self._drain_blocked.pop(node, None) is not None
