"""The reconcile loop's memory across passes, one invariant at a time
(`llmgw.controller.loop.loop_memory`); the loop's behaviour is test_reconcile's."""

from __future__ import annotations

from llmgw.controller.loop.loop_memory import Look, LoopMemory, Picture
from llmgw.scheduler import Fill, NodeCapacity
from llmgw.wire import ModelSpec

SPEC = ModelSpec(name="llama", source="meta/llama-8b", min_replicas=1, gpus_per_shard=4)


def nothing(spec: ModelSpec, count: int) -> Fill:
    return Fill((), None)


def test_a_model_that_did_not_fit_waits_for_capacity_or_a_new_spec() -> None:
    memory = LoopMemory()
    memory.note_capacity_seen(10)  # something else moved capacity at 10
    memory.note_did_not_fit(SPEC, 10)
    assert memory.look_again(SPEC, 10) is Look.NOT_YET
    assert memory.look_again(SPEC.model_copy(update={"min_replicas": 2}), 10) is Look.NOW
    # Only this loop's commits since: it still does not fit, so it goes last.
    memory.note_committed(11)
    memory.note_capacity_seen(11)
    assert memory.look_again(SPEC, 11) is Look.LAST
    # Something else moved capacity: it may fit now.
    memory.note_capacity_seen(12)
    assert memory.look_again(SPEC, 12) is Look.NOW
    memory.note_fits("llama")
    assert memory.look_again(SPEC, 10) is Look.NOW
    memory.note_did_not_fit(SPEC, 12)
    memory.forget_models({"other"})
    assert memory.look_again(SPEC, 12) is Look.NOW


def test_a_picture_passes_to_the_next_pass_only_while_it_matches() -> None:
    memory = LoopMemory()
    picture = Picture(nothing, basis=5)
    picture.committed(6)  # its own placements: it follows them
    memory.keep_picture(picture, 6)
    assert memory.take_picture(7) is None  # moved since
    memory.keep_picture(picture, 6)
    assert memory.take_picture(6) is picture
    assert memory.take_picture(6) is None  # handed over once
    picture.moved_under()
    picture.committed(8)
    assert picture.basis == 6  # a stale picture matches nothing after
    memory.keep_picture(picture, 6)
    assert memory.take_picture(6) is None


def test_kept_node_entries_hold_while_the_node_and_the_models_are_the_same() -> None:
    memory = LoopMemory()
    a = NodeCapacity(name="a", free={}, total_cards=0)
    b = NodeCapacity(name="b", free={}, total_cards=0)
    weights = (("llama", "meta/llama-8b"),)
    memory.keep_nodes_for(weights, {"a", "b"})
    memory.keep_node(a, 3)
    memory.keep_node(b, 4)
    assert memory.node_current("a", 3) and not memory.node_current("a", 5)
    memory.keep_nodes_for(weights, {"b"})  # a forgotten
    assert memory.kept_nodes(["a", "b"]) == [b]
    memory.keep_nodes_for((), {"b"})  # other models: who holds what may differ
    assert memory.kept_nodes(["b"]) == []


def test_the_next_pass_starts_where_the_last_stopped() -> None:
    memory = LoopMemory()
    names = ["a", "b", "c"]
    assert memory.in_turn(names) == names
    memory.resume_at("b")
    assert memory.in_turn(names) == ["b", "c", "a"]
    memory.resume_at("b", got_one=True)
    assert memory.in_turn(names) == ["c", "a", "b"]
    memory.resume_at(None)
    assert memory.in_turn(names) == names


def test_reclaim_and_blocked_stand_ins_are_weighed_and_logged_once() -> None:
    memory = LoopMemory()
    assert not memory.reclaim_hopeless(SPEC, 1)
    memory.note_reclaim_hopeless(SPEC, 1)
    assert memory.reclaim_hopeless(SPEC, 1) and not memory.reclaim_hopeless(SPEC, 2)
    assert memory.note_fault_blocked({"r1": "no room"}) == {"r1": "no room"}
    assert memory.note_fault_blocked({"r1": "no room"}) == {}
    assert memory.note_fault_blocked({}) == {}
    assert memory.note_fault_blocked({"r1": "no room"}) == {"r1": "no room"}
