"""A model short because a replica just failed says why from the first moment, in
the words the loop's backoff will use, not "no reason given" until the next pass
(issue 35 item 11: `ctl models` said so for seconds after a hung engine was killed)."""

from __future__ import annotations

from pathlib import Path

from fleet_factories import FakeClock, report
from test_reconcile import MODEL, Sim

from llmgw import present
from llmgw.controller.views import model_views

HUNG = "hung: 3 request(s) in it and no token for 61s (hung_after_s 60)"


def words(sim: Sim) -> str:
    [view] = [v for v in model_views.model_views(sim.fleet.facts) if v.spec.name == MODEL.name]
    return present.model_words(view)[0]


def test_a_replica_failed_since_the_last_pass_is_the_reason(tmp_path: Path) -> None:
    sim = Sim(tmp_path, FakeClock(), ["gpu1", "gpu2", "gpu3"])
    sim.fleet.facts.put_models([MODEL])
    for _ in range(3):
        sim.step()
    assert words(sim) == "satisfied"
    [failing] = [r for r in sim.fleet.facts.records.values() if "gpu1" in r.nodes]
    shard = {
        "id": failing.id,
        "model": MODEL.name,
        "rank": 0,
        "state": "failed",
        "gpus": list(failing.shards[0].gpus),
        "idle_seconds": 0.0,
        "error": f"{HUNG}\nlast lines of its log: ...",
    }
    sim.fleet.ingest(report("gpu1", replicas=[shard]))
    # Before any reconcile pass: the failure itself is the reason.
    assert words(sim) == f"short: its replicas fail: {HUNG}"  # its first line
    sim.reconciler.tick()  # the loop backs the model off: the same words
    assert words(sim) == f"short: its replicas fail: {HUNG}"
    assert sim.fleet.facts.backoffs[MODEL.name].failures == 1
