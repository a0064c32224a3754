"""The drain pre-check: what draining some nodes would do to each model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.scheduler import RunningReplica, plan_drain

from ._fleet import A100, H100, node, spec


def replica(rid: str, model: str, *nodes: str, ready: bool = True) -> RunningReplica:
    return RunningReplica(id=rid, model=model, nodes=nodes, ready=ready)


def test_ok_when_every_replacement_fits_elsewhere() -> None:
    nodes = [node("a", 0, total=8), node("b", 8)]
    plan = plan_drain([spec("m", gpus=8)], [replica("r1", "m", "a")], nodes, {"a"})
    assert plan.nodes == ["a"]
    assert plan.replicas_to_move == 1
    [impact] = plan.impacts
    assert (impact.model, impact.verdict, impact.reason) == ("m", "ok", None)
    assert (impact.replicas_on_nodes, impact.replaceable, impact.ready_now) == (1, 1, 1)


def test_the_drained_nodes_are_not_candidates() -> None:
    # "a" still has free cards, but it is being drained: the replacement cannot go there.
    nodes = [node("a", 8, total=16)]
    plan = plan_drain([spec("m", gpus=8)], [replica("r1", "m", "a")], nodes, {"a"})
    [impact] = plan.impacts
    assert impact.verdict == "below_minimum"
    assert impact.reason == (
        "replacements that fit elsewhere: 0 of 1; ready replicas would fall to 0 of minimum 1:"
        " needs 1 node with 8 free H100-80GB; no node is ready"
        " (1 cordoned, draining or unreachable)"
    )


def test_unplaceable_when_the_minimum_holds_without_the_replacement() -> None:
    nodes = [node("a", 0, total=8), node("b", 0, total=8)]
    replicas = [replica("r1", "m", "a"), replica("r2", "m", "b")]
    plan = plan_drain([spec("m", gpus=8, min_replicas=1)], replicas, nodes, {"a"})
    [impact] = plan.impacts
    assert impact.verdict == "unplaceable"
    assert impact.reason is not None
    assert impact.reason.startswith(
        "replacements that fit elsewhere: 0 of 1; the drain would wait for the rest: needs"
    )


def test_replicas_that_are_not_ready_do_not_count_toward_the_minimum() -> None:
    nodes = [node("a", 0, total=8), node("b", 0, total=8)]
    replicas = [replica("r1", "m", "a"), replica("r2", "m", "b", ready=False)]
    plan = plan_drain([spec("m", gpus=8, min_replicas=1)], replicas, nodes, {"a"})
    assert plan.impacts[0].verdict == "below_minimum"


def test_replacements_allocate_one_after_another() -> None:
    # One free node, two models that each need it: only the first (by name) gets it.
    nodes = [node("a", 0, total=8), node("b", 0, total=8), node("free", 8)]
    replicas = [replica("r1", "alpha", "a"), replica("r2", "beta", "b")]
    specs = [spec("alpha", gpus=8), spec("beta", gpus=8)]
    plan = plan_drain(specs, replicas, nodes, {"a", "b"})
    assert [(i.model, i.verdict) for i in plan.impacts] == [
        ("beta", "below_minimum"),
        ("alpha", "ok"),
    ]
    assert plan.replicas_to_move == 2


def test_a_multi_node_replica_moves_when_any_of_its_nodes_drains() -> None:
    nodes = [node(n, 0, total=8, fabrics=["ib"]) for n in ("a", "b")]
    nodes += [node(n, 8, fabrics=["ib"]) for n in ("c", "d")]
    plan = plan_drain([spec("m", gpus=8, shards=2)], [replica("r1", "m", "a", "b")], nodes, {"b"})
    assert plan.replicas_to_move == 1
    assert plan.impacts[0].verdict == "ok"


def test_only_models_with_replicas_on_the_nodes_are_listed() -> None:
    nodes = [node("a", 8), node("b", 8)]
    replicas = [replica("r1", "m", "a"), replica("r2", "other", "b"), replica("r3", "gone", "a")]
    specs = [spec("m"), spec("other")]  # "gone" was deleted: its replica stops, not moves
    plan = plan_drain(specs, replicas, nodes, {"a"})
    assert [i.model for i in plan.impacts] == ["m"]
    assert plan.replicas_to_move == 1


def test_worst_first() -> None:
    nodes = [node(n, 0, total=8) for n in ("a", "b", "c")] + [node("free", 8)]
    replicas = [
        replica("r1", "fine", "a"),
        replica("r2", "waits", "b"),
        replica("r3", "waits", "c"),
        replica("r4", "short", "b"),
    ]
    specs = [
        spec("fine", gpus=1),
        spec("waits", gpus=8, min_replicas=0),
        spec("short", gpus=8, min_replicas=1),
    ]
    plan = plan_drain(specs, replicas, nodes, {"a", "b", "c"})
    # "fine" takes one card of "free", so no 8-card replacement fits anywhere.
    assert [(i.model, i.verdict) for i in plan.impacts] == [
        ("short", "below_minimum"),
        ("waits", "unplaceable"),
        ("fine", "ok"),
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=8),
    st.sets(st.integers(0, 5)),
    st.integers(0, 4),
)
def test_counts_are_consistent(
    free: list[int], placed: list[tuple[int, bool]], drain: set[int], minimum: int
) -> None:
    names = [f"n{i}" for i in range(len(free))]
    nodes = [node(n, f, total=8) for n, f in zip(names, free, strict=True)]
    replicas = [
        replica(f"r{j}", "m", names[i % len(names)], ready=ready)
        for j, (i, ready) in enumerate(placed)
    ]
    draining = {names[i % len(names)] for i in drain}
    plan = plan_drain([spec("m", gpus=4, min_replicas=minimum)], replicas, nodes, draining)
    moving = sum(r.nodes[0] in draining for r in replicas)
    assert plan.replicas_to_move == moving
    if not moving:
        assert plan.impacts == []
        return
    [impact] = plan.impacts
    assert 0 <= impact.replaceable <= impact.replicas_on_nodes == moving
    fits = sum(f // 4 for n, f in zip(names, free, strict=True) if n not in draining)
    assert impact.replaceable == min(moving, fits)
    assert (impact.verdict == "ok") == (impact.replaceable == moving)
    assert (impact.reason is None) == (impact.verdict == "ok")


def test_a_model_that_fits_anywhere_leaves_the_class_another_needs() -> None:
    """Issue 23 item 11: the plan gave the one free H100 node to a model that fits on
    any class, then said of the H100 model "no ready node has a free one"."""
    nodes = [
        node("gpu-a01", 0, total=8),
        node("gpu-a02", 0, total=8),
        node("gpu-a16", 8),
        node("gpu-b01", {A100: 8}),
    ]
    replicas = [replica("r1", "any", "gpu-a01"), replica("r2", "big", "gpu-a02")]
    specs = [spec("any", gpus=8, cls=None), spec("big", gpus=8, cls=H100)]
    plan = plan_drain(specs, replicas, nodes, {"gpu-a01", "gpu-a02"})
    assert [(i.model, i.verdict) for i in plan.impacts] == [("any", "ok"), ("big", "ok")]


def test_a_reason_says_what_the_fleet_has_and_who_takes_it() -> None:
    nodes = [node("gpu-a01", 0, total=8), node("gpu-a02", 0, total=8), node("gpu-a16", 8)]
    replicas = [replica("r1", "alpha", "gpu-a01"), replica("r2", "beta", "gpu-a02")]
    specs = [spec("alpha", gpus=8), spec("beta", gpus=8)]
    plan = plan_drain(specs, replicas, nodes, {"gpu-a01", "gpu-a02"})
    [short, _] = plan.impacts
    assert short.reason == (
        "replacements that fit elsewhere: 0 of 1; ready replicas would fall to 0 of minimum 1:"
        " needs 1 node with 8 free H100-80GB; gpu-a16 has room for it, but this drain's"
        " replacements of alpha take it first"
    )
    # Placing it alone would not fit either: the fleet's own reason.
    nodes = [node("gpu-a01", 0, total=8), node("gpu-a16", 4, total=8)]
    plan = plan_drain(
        [spec("alpha", gpus=8)], [replica("r1", "alpha", "gpu-a01")], nodes, {"gpu-a01"}
    )
    assert plan.impacts[0].reason is not None
    assert plan.impacts[0].reason.endswith(
        "needs 1 node with 8 free H100-80GB; most free on a ready node: 4 (gpu-a16)"
    )
