"""Example-based tests: one rule each, chosen so that breaking the rule fails the test."""

from __future__ import annotations

import pytest

import llmgw.scheduler
from llmgw.scheduler import (
    Fill,
    NodeCapacity,
    Placement,
    Unplaceable,
    place,
    place_many,
    placer,
    placer_in_steps,
)
from llmgw.wire import ModelSpec

from ._fleet import A100, H100, node, placed, refused, spec

# -- candidates -------------------------------------------------------------------


def test_skips_nodes_that_are_not_ready() -> None:
    nodes = [node("a", 8, schedulable=False), node("b", 2, total=8)]
    assert placed(place(spec(gpus=2), nodes)).nodes == ("b",)
    assert "needs 1 node with 4 free" in refused(place(spec(gpus=4), nodes))


def test_skips_nodes_without_enough_cards_of_the_class() -> None:
    nodes = [node("a", {A100: 8}), node("b", {H100: 3}, total=8), node("c", {H100: 4}, total=8)]
    assert placed(place(spec(gpus=4), nodes)).nodes == ("c",)


def test_takes_the_first_free_cards_in_uuid_order() -> None:
    cap = NodeCapacity("a", free={H100: ("u3", "u1", "u2")}, total_cards=4)
    p = placed(place(spec(gpus=2), [cap]))
    assert p.shards[0].gpus == ("u1", "u2")
    assert p.gpu_class == H100


def test_a_shard_never_mixes_classes() -> None:
    nodes = [node("a", {A100: 2, H100: 2})]
    reason = refused(place(spec(gpus=3, cls=None), nodes))
    assert reason == (
        "needs 1 node with 3 free GPUs of one class;"
        " most free of one class on a ready node: 2 (A100-40GB on a)"
    )


def test_without_a_class_the_best_fitting_class_wins() -> None:
    # 2 of 3 A100s leaves 1; 2 of 4 H100s leaves 2: the A100s fit better.
    nodes = [node("a", {A100: 3, H100: 4})]
    p = placed(place(spec(gpus=2, cls=None), nodes))
    assert p.gpu_class == A100
    # Equal leftovers: the class name breaks the tie.
    nodes = [node("a", {A100: 2, H100: 2})]
    assert placed(place(spec(gpus=2, cls=None), nodes)).gpu_class == A100


def test_a_model_of_any_class_leaves_the_classes_others_want() -> None:
    # Both nodes fit equally: by name, the H100s would go; an H100-bound spec wants them.
    nodes = [node("a", {H100: 8}), node("b", {A100: 8})]
    assert placed(place(spec(gpus=8, cls=None), nodes)).gpu_class == H100
    assert placed(place(spec(gpus=8, cls=None), nodes, wanted={H100})).gpu_class == A100
    # A preference, never a filter: with no other class, the wanted one is used.
    assert placed(place(spec(gpus=8, cls=None), nodes[:1], wanted={H100})).nodes == ("a",)
    # After spread and weights: a holder of the weights still wins.
    holder = [node("a", {H100: 8}, holds=["m"]), node("b", {A100: 8})]
    assert placed(place(spec(gpus=8, cls=None), holder, wanted={H100})).nodes == ("a",)
    # A spec bound to the class is not deterred by wanting it.
    assert placed(place(spec(gpus=8, cls=H100), nodes, wanted={H100})).nodes == ("a",)


def test_a_multi_shard_replica_of_any_class_leaves_the_classes_others_want() -> None:
    nodes = [node(n, {H100: 8}, fabrics=["ib-a"]) for n in ("a1", "a2")]
    nodes += [node(n, {A100: 8}, fabrics=["ib-b"]) for n in ("b1", "b2")]
    many = spec(gpus=8, shards=2, cls=None)
    assert placed(place(many, nodes)).fabric == "ib-a"
    assert placed(place(many, nodes, wanted={H100})).fabric == "ib-b"


def test_a_multi_shard_replica_uses_one_class_on_all_nodes() -> None:
    nodes = [node("a", {A100: 8}, fabrics=["ib"]), node("b", {H100: 8}, fabrics=["ib"])]
    reason = refused(place(spec(gpus=8, shards=2, cls=None), nodes))
    assert reason.startswith("needs 2 nodes x 8 GPUs of one class in one fabric;")
    assert "ib 1" in reason


def test_duplicate_node_names_are_an_error() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        place(spec(), [node("a"), node("a")])


# -- fabrics -------------------------------------------------------------------------


def test_multi_shard_never_spans_fabrics() -> None:
    nodes = [node("a", fabrics=["ib-a"]), node("b", fabrics=["ib-b"])]
    assert refused(place(spec(gpus=8, shards=2), nodes)) == (
        "needs 2 nodes x 8 H100-80GB in one fabric; largest free block: ib-a 1, ib-b 1"
    )


def test_multi_shard_lands_in_the_fabric_that_fits() -> None:
    nodes = [node("a", fabrics=["ib-a"]), node("b", fabrics=["ib-b"]), node("c", fabrics=["ib-b"])]
    p = placed(place(spec(gpus=8, shards=2), nodes))
    assert p.fabric == "ib-b"
    assert p.nodes == ("b", "c")
    assert [s.rank for s in p.shards] == [0, 1]


def test_nodes_without_a_fabric_host_single_shards_only() -> None:
    nodes = [node("a"), node("b")]
    assert refused(place(spec(gpus=8, shards=2), nodes)) == (
        "needs 2 nodes x 8 H100-80GB in one fabric; no ready node is in a fabric (2 would fit)"
    )
    p = placed(place(spec(gpus=8), nodes))
    assert p.fabric is None
    assert p.nodes == ("a",)


def test_a_node_in_two_fabrics_counts_in_each() -> None:
    nodes = [
        node("a", fabrics=["ib-a", "ib-b"]),
        node("b", fabrics=["ib-b"]),
        node("c", fabrics=["ib-c"]),
    ]
    assert placed(place(spec(gpus=8, shards=2), nodes)).fabric == "ib-b"


# -- spread ---------------------------------------------------------------------------


def test_two_replicas_on_an_idle_fleet_land_on_two_nodes() -> None:
    # Issue 21's repro: min_replicas 2 on four idle nodes with 2 cards each put
    # both on the first node (packing alone fills a started node first).
    nodes = [node(f"n{i}", 2) for i in range(4)]
    fill = placer(nodes)(spec(min_replicas=2), 2)
    assert [p.nodes for p in fill.placed] == [("n0",), ("n1",)]
    both = place_many([spec(), spec()], nodes)
    assert [placed(p).nodes for p in both] == [("n0",), ("n1",)]


def test_a_node_running_the_model_ranks_after_one_that_does_not() -> None:
    # "a" packs better and holds the weights, but already runs a replica.
    nodes = [node("a", 1, total=8, holds=["m"], runs=["m"]), node("b", 8)]
    assert placed(place(spec(), nodes)).nodes == ("b",)
    # A replica of another model on "a" changes nothing.
    others = [node("a", 1, total=8, holds=["m"], runs=["x"]), node("b", 8)]
    assert placed(place(spec(), others)).nodes == ("a",)


def test_spread_is_a_preference_not_a_filter() -> None:
    nodes = [node("a", 2, runs=["m"]), node("b", 0, total=8)]
    assert placed(place(spec(), nodes)).nodes == ("a",)
    # Among nodes that all run it, weights then packing decide as before.
    both = [node("a", 8, runs=["m"]), node("b", 2, total=8, runs=["m"], holds=["m"])]
    assert placed(place(spec(), both)).nodes == ("b",)
    assert placed(place(spec("other"), both)).nodes == ("b",)


def test_a_third_replica_on_two_nodes_doubles_up_by_packing() -> None:
    nodes = [node("a", 4), node("b", 4)]
    first, second, third = place_many([spec(), spec(), spec()], nodes)
    assert (placed(first).nodes, placed(second).nodes) == (("a",), ("b",))
    assert placed(third).nodes in {("a",), ("b",)}


def test_multi_shard_prefers_the_fabric_with_fewest_nodes_running_the_model() -> None:
    nodes = [
        # ib-a holds the weights and packs better, but a1 runs a replica already
        node("a1", 4, total=8, fabrics=["ib-a"], holds=["m"], runs=["m"]),
        node("a2", 4, total=8, fabrics=["ib-a"], holds=["m"]),
        node("b1", 8, fabrics=["ib-b"]),
        node("b2", 8, fabrics=["ib-b"]),
    ]
    p = placed(place(spec(gpus=4, shards=2), nodes))
    assert (p.fabric, p.nodes) == ("ib-b", ("b1", "b2"))


def test_within_the_fabric_nodes_running_none_go_first() -> None:
    nodes = [
        node("a", 2, total=8, fabrics=["ib"], holds=["m"], runs=["m"]),
        node("b", 2, total=8, fabrics=["ib"]),
        node("z", 8, fabrics=["ib"]),
    ]
    assert placed(place(spec(gpus=2, shards=2), nodes)).nodes == ("b", "z")
    # Two whole replicas of a 2-shard model on four nodes: four distinct nodes.
    four = [node(f"n{i}", 8, fabrics=["ib"]) for i in range(4)]
    got = place_many([spec(gpus=8, shards=2), spec(gpus=4, shards=2)], four)
    assert set(placed(got[0]).nodes).isdisjoint(placed(got[1]).nodes)


def test_spread_finds_the_few_free_nodes_among_many_running_the_model() -> None:
    # The index walks buckets for a model running on most nodes: every placement
    # still skips them, and the answer agrees with the node running none.
    nodes = [node(f"n{i:03d}", 8, runs=["m"]) for i in range(100)] + [node("z", 8)]
    assert placed(place(spec(), nodes)).nodes == ("z",)


# -- weights --------------------------------------------------------------------------


def test_single_shard_prefers_a_holder_over_a_better_fit() -> None:
    nodes = [node("a", 2, total=8), node("b", 8, holds=["m"])]
    assert placed(place(spec(gpus=2), nodes)).nodes == ("b",)


def test_weights_are_a_preference_not_a_filter() -> None:
    nodes = [node("a", 1, total=8, holds=["m"]), node("b", 8)]
    assert placed(place(spec(gpus=2), nodes)).nodes == ("b",)
    cordoned_holder = [node("a", 8, holds=["m"], schedulable=False), node("b", 8)]
    assert placed(place(spec(gpus=2), cordoned_holder)).nodes == ("b",)


def test_multi_shard_prefers_the_fabric_with_most_holders() -> None:
    nodes = [
        # ib-a would pack better (partly used nodes), but holds no weights
        node("a1", 4, total=8, fabrics=["ib-a"]),
        node("a2", 4, total=8, fabrics=["ib-a"]),
        node("b1", 8, fabrics=["ib-b"], holds=["m"]),
        node("b2", 8, fabrics=["ib-b"]),
        node("b3", 8, fabrics=["ib-b"]),
    ]
    p = placed(place(spec(gpus=4, shards=2), nodes))
    assert p.fabric == "ib-b"
    assert p.nodes == ("b1", "b2")  # the holder first, as rank 0


def test_holders_beyond_the_shard_count_do_not_outweigh_packing() -> None:
    # Both fabrics can give 2 holders for a 2-shard replica; ib-a has 3, which
    # buys nothing more, so packing decides: ib-b uses partly used nodes.
    nodes = [
        *(node(f"a{i}", 8, fabrics=["ib-a"], holds=["m"]) for i in range(3)),
        *(node(f"b{i}", 4, total=8, fabrics=["ib-b"], holds=["m"]) for i in range(2)),
    ]
    assert placed(place(spec(gpus=4, shards=2), nodes)).fabric == "ib-b"


def test_within_the_fabric_holders_go_first() -> None:
    nodes = [
        node("a", 2, total=8, fabrics=["ib"]),
        node("b", 2, total=8, fabrics=["ib"]),
        node("z", 8, fabrics=["ib"], holds=["m"]),
    ]
    assert placed(place(spec(gpus=2, shards=2), nodes)).nodes == ("z", "a")


# -- packing ---------------------------------------------------------------------------


def test_single_shard_takes_the_least_leftover() -> None:
    nodes = [node("a", 6, total=8), node("b", 3, total=8), node("c", 5, total=8)]
    assert placed(place(spec(gpus=3), nodes)).nodes == ("b",)


def test_entirely_free_nodes_stay_free() -> None:
    # "big" would leave 4 free (more than "small"), yet is kept whole: breaking a
    # free block costs a future multi-node replica its landing place.
    nodes = [node("big", 8), node("part", 12, total=16)]
    assert placed(place(spec(gpus=4), nodes)).nodes == ("part",)


def test_leftover_counts_every_class_on_the_node() -> None:
    nodes = [node("a", {H100: 2, A100: 4}, total=8), node("b", {H100: 2}, total=8)]
    assert placed(place(spec(gpus=2), nodes)).nodes == ("b",)


def test_multi_shard_prefers_the_fabric_that_consumes_no_free_block() -> None:
    nodes = [
        node("a1", fabrics=["ib-a"]),
        node("a2", fabrics=["ib-a"]),
        node("b1", 4, total=8, fabrics=["ib-b"]),
        node("b2", 4, total=8, fabrics=["ib-b"]),
    ]
    assert placed(place(spec(gpus=4, shards=2), nodes)).fabric == "ib-b"


def test_multi_shard_best_fit_keeps_the_largest_block_intact() -> None:
    # Both fabrics must give up two free nodes; taking them from the smaller
    # block leaves ib-a's four intact for a bigger replica later.
    nodes = [
        *(node(f"a{i}", fabrics=["ib-a"]) for i in range(4)),
        *(node(f"b{i}", fabrics=["ib-b"]) for i in range(2)),
    ]
    p = placed(place(spec(gpus=8, shards=2), nodes))
    assert p.fabric == "ib-b"
    assert refused(place(spec(gpus=8, shards=3), [*nodes[:2], *nodes[4:]])).endswith(
        "largest free block: ib-a 2, ib-b 2"
    )


def test_ties_break_by_name_whatever_the_input_order() -> None:
    nodes = [node("c", 8), node("a", 8), node("b", 8)]
    assert placed(place(spec(gpus=8), nodes)).nodes == ("a",)
    assert placed(place(spec(gpus=8), nodes[::-1])).nodes == ("a",)
    fabrics = [node("x", fabrics=["ib-b"]), node("y", fabrics=["ib-b"])]
    fabrics += [node("p", fabrics=["ib-a"]), node("q", fabrics=["ib-a"])]
    assert placed(place(spec(gpus=8, shards=2), fabrics)).fabric == "ib-a"


# -- place_many --------------------------------------------------------------------


def test_place_many_allocates_as_it_goes() -> None:
    nodes = [node("a", 4, total=8)]
    results = place_many([spec(gpus=2), spec(gpus=2), spec(gpus=1)], nodes)
    first, second = placed(results[0]), placed(results[1])
    assert set(first.shards[0].gpus).isdisjoint(second.shards[0].gpus)
    assert refused(results[2]) == (
        "needs 1 node with 1 free H100-80GB; no ready node has a free one"
    )


def test_place_many_keeps_request_order_and_an_unplaceable_takes_nothing() -> None:
    nodes = [node("a", 4, total=8)]
    results = place_many([spec("big", gpus=8), spec("small", gpus=4)], nodes)
    assert [r.model for r in results] == ["big", "small"]
    refused(results[0])
    assert placed(results[1]).shards[0].gpus == tuple(f"a/{H100}/{i}" for i in range(4))


def test_a_placement_breaks_the_free_block_for_the_next() -> None:
    nodes = [node("a", fabrics=["ib"]), node("b", fabrics=["ib"])]
    results = place_many([spec(gpus=1), spec(gpus=8, shards=2)], nodes)
    assert refused(results[1]) == (
        "needs 2 nodes x 8 H100-80GB in one fabric; largest free block: ib 1"
    )


def test_a_placer_stops_at_the_first_replica_that_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Capacity only shrinks, so after one replica does not fit the rest are not
    tried: 10,000 asked of a model with room for three costs four attempts."""
    attempts: list[str] = []
    real = llmgw.scheduler._Allocation.place

    def counting(self: llmgw.scheduler._Allocation, s: ModelSpec) -> Placement | Unplaceable:
        attempts.append(s.name)
        return real(self, s)

    monkeypatch.setattr(llmgw.scheduler._Allocation, "place", counting)
    nodes = [node("a", 4, total=8), node("b", 2, total=8)]
    fill = placer(nodes)(spec(gpus=2), 10_000)
    assert len(attempts) == 4
    assert [p.nodes for p in fill.placed] == [("b",), ("a",), ("a",)]
    # The same answers, replica for replica, as asking place_many for each.
    expected = place_many([spec(gpus=2)] * 4, nodes)
    assert list(fill.placed) == expected[:3]
    assert fill.unplaceable == expected[3]


def test_a_placer_built_in_steps_answers_as_one_built_at_once() -> None:
    nodes = [
        node(f"n{i:02d}", 1 + i % 8, total=8, fabrics=[f"ib-{i % 3}"]) for i in reversed(range(25))
    ]
    requests = [spec("a", gpus=3), spec("b", gpus=8, shards=2), spec("c", gpus=7, shards=3)]
    steps = placer_in_steps(nodes, step=10)
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as done:
            stepped = done.value
            break
    assert yields == 3
    at_once = placer(nodes)
    assert [stepped(r, 4) for r in requests] == [at_once(r, 4) for r in requests]
    with pytest.raises(ValueError, match="appears twice"):
        list(placer_in_steps([node("x"), *nodes[:12], node("x")], step=5))


def test_a_placers_calls_see_what_the_earlier_took() -> None:
    place_up_to = placer([node("a", 4, total=8)])
    assert place_up_to(spec("x", gpus=1), 0) == Fill((), None)
    first = place_up_to(spec("x", gpus=3), 5)
    assert len(first.placed) == 1 and first.unplaceable is not None
    second = place_up_to(spec("y", gpus=1), 1)
    assert second.unplaceable is None
    assert set(second.placed[0].shards[0].gpus).isdisjoint(first.placed[0].shards[0].gpus)
    assert refused(place_up_to(spec("z", gpus=1), 3).unplaceable or second.placed[0]) == (
        "needs 1 node with 1 free H100-80GB; no ready node has a free one"
    )


def test_a_shape_that_did_not_fit_is_refused_alike_until_cards_are_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans: list[str] = []
    real = llmgw.scheduler._Allocation._why_single

    def counting(self: llmgw.scheduler._Allocation, s: ModelSpec) -> str:
        scans.append(s.name)
        return real(self, s)

    monkeypatch.setattr(llmgw.scheduler._Allocation, "_why_single", counting)
    nodes = [node("a", 4, total=8), node("b", 6, total=8)]
    big = [spec(name, gpus=7) for name in ("x", "y")]
    results = place_many([*big, spec("small", gpus=5), spec("z", gpus=7)], nodes)
    assert scans == ["x", "z"]  # "y" is refused like "x"; a placement in between forgets it
    assert [r.model for r in results] == ["x", "y", "small", "z"]
    assert refused(results[0]) == refused(results[1]) == refused(place(big[1], nodes))
    assert refused(results[3]) == refused(place_many([spec(gpus=5), spec(gpus=7)], nodes)[1])
    assert refused(results[0]) != refused(results[3])  # most free: 6 on b, then 4 on a


# -- reasons ---------------------------------------------------------------------------


def test_reason_names_the_missing_class_and_what_there_is() -> None:
    nodes = [node("a", {A100: 8}), node("b", {"B200-192GB": 8}, schedulable=False)]
    assert refused(place(spec(cls="B200-192GB"), nodes)) == (
        "needs 1 node with 1 free B200-192GB; no ready node has GPUs of class B200-192GB"
        " (1 node that is not ready has them); ready nodes have A100-40GB"
    )


def test_reason_gives_the_most_free_on_a_ready_node() -> None:
    nodes = [
        node("a", {A100: 2}, total=8),
        node("b", {A100: 1}, total=8),
        node("c", {A100: 8}, schedulable=False),
    ]
    assert refused(place(spec(gpus=4, cls=A100), nodes)) == (
        "needs 1 node with 4 free A100-40GB; most free on a ready node: 2 (a)"
    )


def test_reason_when_nothing_is_ready() -> None:
    nodes = [node("a", schedulable=False)]
    assert refused(place(spec(), nodes)) == (
        "needs 1 node with 1 free H100-80GB; no node is ready (1 cordoned, draining or unreachable)"
    )
    assert (
        refused(place(spec(), [])) == "needs 1 node with 1 free H100-80GB; the fleet has no nodes"
    )


def test_reason_counts_fitting_nodes_when_they_are_not_free_blocks() -> None:
    nodes = [
        node("a1", 4, total=8, fabrics=["ib-a"]),
        node("b1", 4, total=8, fabrics=["ib-b"]),
        node("b2", 2, total=8, fabrics=["ib-b"]),
        node("loose", 8),
    ]
    assert refused(place(spec(gpus=4, shards=2), nodes)) == (
        "needs 2 nodes x 4 H100-80GB in one fabric; ready nodes with 4 free: ib-a 1, ib-b 1;"
        " 1 node outside any fabric would fit"
    )


def test_reason_lists_at_most_six_fabrics() -> None:
    nodes = [node(f"n{i}", fabrics=[f"ib-{i}"]) for i in range(8)]
    reason = refused(place(spec(gpus=8, shards=2), nodes))
    assert reason.endswith("ib-5 1 and 2 more")
