"""What the reconcile loop remembers from one pass to the next: one object.

Who holds it: one `Reconciler`, for one leadership term (DESIGN, "Controller
state": a term is built whole and replaced, never re-initialised). Who reads and
writes it: the steps of a pass (`llmgw.controller.loop.shortfalls`, `picture`,
`drains`, `demand`), through the methods below, each of which keeps one of the
invariants of `LoopMemory`. It reads nothing of the fleet itself: the steps hand
it what they read (capacity versions, specs, node names), so what it concludes
holds for exactly what it was told. Nothing here is durable: a new term starts
with a new one and, at worst, looks at each model once more.

Capacity versions come from `Term.capacity_version` and
`Term.capacity_changed_at`, which every change to what placement reads
moves (the newest revision of such a change in the term's log); a new term builds
a new memory, so a version is never read against another term's.

One word, one meaning: a `Picture` is *stale* when something other than this
loop has moved capacity since the version it was built at (its placements are
then checked against the fleet before they are committed). Node entries kept
from an older snapshot are *out of date*, not stale.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from llmgw.controller.core.autoscale import Autoscaler
from llmgw.controller.loop.faults import FaultCordons
from llmgw.scheduler import Fill, NodeCapacity
from llmgw.wire import ModelSpec

__all__ = ["Look", "LoopMemory", "Picture"]


@dataclass
class Picture:
    """The fleet as placement sees it: a placer over one snapshot, which matched
    the fleet at capacity version `basis`. Each call of `place_up_to` takes the
    cards it hands out, so the placer follows this loop's own placements (the
    filling step moves `basis` on after committing them, `committed`); it does
    not follow anyone else's: then it is `stale` (`moved_under`), for good."""

    place_up_to: Callable[[ModelSpec, int], Fill]
    basis: int
    stale: bool = False

    def committed(self, version: int) -> None:
        """This loop committed what the placer handed out, which left the fleet at
        `version`: unless stale, the picture matches it."""
        if not self.stale:
            self.basis = version

    def moved_under(self) -> None:
        """Something other than this loop moved capacity since `basis`."""
        self.stale = True


class Look(enum.Enum):
    """Whether a short model is looked at in this pass (`LoopMemory.look_again`)."""

    NOW = "now"  # in its turn: it may fit
    LAST = "last"  # after every model that may fit: only its reason's numbers may change
    NOT_YET = "not yet"  # nothing it needs has changed since it did not fit


class _Tried(NamedTuple):
    """A model that did not fit: the spec tried, and the capacity version of the
    fleet it was tried on."""

    spec: ModelSpec
    version: int


class _Kept(NamedTuple):
    """A node's entry in the last snapshot, and the node's capacity version then."""

    changed_at: int
    capacity: NodeCapacity


@dataclass
class LoopMemory:
    """Everything the reconcile loop remembers across passes.

    Invariants (each kept by the methods named):

    1. A model noted as not fitting, with the same spec, did not fit on the
       fleet as of its version; while the capacity version is still that one,
       trying again gives the same answer, so it is not tried (`look_again`,
       `note_did_not_fit`, `note_fits`, `forget_models`).
    2. Capacity moved only by this loop's own commits only takes cards away, so
       a model that did not fit at or after the last version something else
       moved (`moved_at`) still does not fit: it is looked at only after every
       model that may fit, for its reason's numbers (`look_again`). `expected`
       is the version right after this loop's last commit; any other version
       seen means something else moved capacity (`note_committed`,
       `note_capacity_seen`).
    3. A picture is handed over to the next pass only when it is not stale and
       matches the fleet's capacity version at the end of the pass, and that
       pass takes it only at the same version, once (`keep_picture`,
       `take_picture`).
    4. A kept node entry is what `snapshot` says of that node while its
       `capacity_changed_at` is the one it was built at and the declared
       models' (name, source) are the same (`keep_nodes_for`, `node_current`,
       `keep_node`, `kept_nodes`).
    5. A pass that did not reach every short model leaves where it stopped: the
       next starts there, or just after that model when it got a replica
       (`resume_at`, `in_turn`).
    6. A short model that no reclaim could make fit is not weighed again while
       neither its spec nor the capacity has changed (`reclaim_hopeless`,
       `note_reclaim_hopeless`).
    7. Why a stand-in for a replica on a failed card cannot be placed is logged
       once per change of reason (`note_fault_blocked`).

    The fault cordons and the autoscaler keep their own memories, with their
    own invariants (`llmgw.controller.loop.faults`, `llmgw.controller.core.autoscale`).
    """

    cordons: FaultCordons = field(default_factory=FaultCordons)
    autoscaler: Autoscaler = field(default_factory=Autoscaler)
    _did_not_fit: dict[str, _Tried] = field(default_factory=dict, init=False)
    _expected: int = field(default=-1, init=False)  # the version after this loop's last commit
    _moved_at: int = field(default=0, init=False)  # when something else last moved capacity
    _picture: Picture | None = field(default=None, init=False)
    _kept: dict[str, _Kept] = field(default_factory=dict, init=False)
    _kept_weights: tuple[tuple[str, str], ...] = field(default=(), init=False)
    _resume: tuple[str, bool] | None = field(default=None, init=False)  # (model, just after it)
    _reclaim_tried: tuple[ModelSpec, int] | None = field(default=None, init=False)
    _fault_blocked: dict[str, str] = field(default_factory=dict, init=False)

    # -- 1, 2: models that did not fit, and who moved capacity ------------------------

    def look_again(self, spec: ModelSpec, version: int) -> Look:
        """Whether to look at short model `spec` with the fleet at `version`."""
        tried = self._did_not_fit.get(spec.name)
        if tried is None or tried.spec != spec:
            return Look.NOW
        if tried.version == version:
            return Look.NOT_YET
        if tried.version >= self._moved_at:
            return Look.LAST  # still does not fit
        return Look.NOW

    def note_did_not_fit(self, spec: ModelSpec, basis: int) -> None:
        """`spec` did not fit on the picture of the fleet at `basis`: any placement
        committed since moves the version, so it is looked at once more then."""
        self._did_not_fit[spec.name] = _Tried(spec, basis)

    def note_fits(self, model: str) -> None:
        """`model` got all it missed, or misses nothing."""
        self._did_not_fit.pop(model, None)

    def forget_models(self, declared: Collection[str]) -> None:
        """Models no longer declared leave no memory."""
        for gone in self._did_not_fit.keys() - declared:
            del self._did_not_fit[gone]

    def note_capacity_seen(self, version: int) -> None:
        """The fleet is at `version`; unless this loop's last commit made it so,
        something else moved capacity."""
        if version != self._expected:
            self._moved_at = version

    def note_committed(self, version: int) -> None:
        """This loop committed placements, which left the fleet at `version`."""
        self._expected = version

    # -- 3: the picture handed from one pass to the next ---------------------------

    def take_picture(self, version: int) -> Picture | None:
        """The last pass's picture when it still matches the fleet at `version`;
        either way it is no longer kept."""
        picture, self._picture = self._picture, None
        return picture if picture is not None and picture.basis == version else None

    def keep_picture(self, picture: Picture | None, version: int) -> None:
        """Keep this pass's picture for the next while it matches the fleet at `version`."""
        fresh = picture is not None and not picture.stale and picture.basis == version
        self._picture = picture if fresh else None

    # -- 4: node entries kept from the last snapshot --------------------------------

    def keep_nodes_for(self, weights: tuple[tuple[str, str], ...], nodes: Collection[str]) -> None:
        """Keep entries only of `nodes`, and only while the models' (name, source)
        are `weights` (which node holds which model may differ otherwise)."""
        if weights != self._kept_weights:
            self._kept.clear()
            self._kept_weights = weights
        for gone in self._kept.keys() - nodes:
            del self._kept[gone]

    def node_current(self, name: str, changed_at: int) -> bool:
        """Whether the entry kept for node `name` was built at `changed_at`."""
        kept = self._kept.get(name)
        return kept is not None and kept.changed_at == changed_at

    def keep_node(self, capacity: NodeCapacity, changed_at: int) -> None:
        self._kept[capacity.name] = _Kept(changed_at, capacity)

    def kept_nodes(self, names: Iterable[str]) -> list[NodeCapacity]:
        """The kept entries of `names`, in that order (those not kept left out)."""
        kept = self._kept
        return [kept[name].capacity for name in names if name in kept]

    # -- 5: where the next pass starts -------------------------------------------------

    def in_turn(self, names: list[str]) -> list[str]:
        """`names` (sorted) from where the last pass stopped, round."""
        first = 0
        if self._resume is not None:
            name, after = self._resume
            first = (bisect.bisect_right if after else bisect.bisect_left)(names, name)
        return names[first:] + names[:first]

    def resume_at(self, model: str | None, got_one: bool = False) -> None:
        """The next pass starts at `model` (just after it when it got a replica);
        None: this pass reached every model."""
        self._resume = None if model is None else (model, got_one)

    # -- 6: reclaim ----------------------------------------------------------------------

    def reclaim_hopeless(self, spec: ModelSpec, version: int) -> bool:
        """Whether no reclaim could make `spec` fit, with the capacity as at `version`."""
        return self._reclaim_tried == (spec, version)

    def note_reclaim_hopeless(self, spec: ModelSpec, version: int) -> None:
        self._reclaim_tried = (spec, version)

    # -- 7: stand-ins for failed cards ----------------------------------------------

    def note_fault_blocked(self, blocked: Mapping[str, str]) -> dict[str, str]:
        """Replicas on failed cards with no stand-in, and why; answers those whose
        reason is new (to log). Replicas not named are blocked no more."""
        new = {rid: why for rid, why in blocked.items() if self._fault_blocked.get(rid) != why}
        self._fault_blocked = dict(blocked)
        return new
