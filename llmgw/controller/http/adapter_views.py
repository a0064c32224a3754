"""Each adapter as operators see it (`GET /v1/adapters`, `ctl models`): where it is
loaded and on its way, what it serves, when it was last asked for, its last failure."""

from __future__ import annotations

from llmgw.controller.term import Term
from llmgw.wire import AdapterView


def adapter_views(term: Term) -> list[AdapterView]:
    facts = term.facts
    now = facts.clock()
    memory = term.adapter_use
    in_flight, requests = term.gateways.adapter_traffic(now)
    held = term.gateways.held(now)
    shards = {
        s.replica_id: s.adapters
        for entry in facts.nodes.values()
        for s in entry.shards
        if s.rank == 0
    }
    with_files: dict[str, int] = {}
    for entry in facts.nodes.values():
        for source in entry.digest.adapters:
            with_files[source] = with_files.get(source, 0) + 1
    views = []
    for name, spec in sorted(facts.adapters.items()):
        loaded: list[str] = []
        loading: list[str] = []
        for rid, holds in sorted(facts.adapter_holds.items()):
            hold = holds.get(name)
            if hold is None or hold.leaving is not None:
                continue
            (loaded if name in shards.get(rid, ()) else loading).append(rid)
        idle = memory.idle_for(name, now)
        views.append(
            AdapterView(
                spec=spec,
                loaded_on=loaded,
                loading_on=loading,
                nodes_with_files=with_files.get(spec.source, 0),
                in_flight=in_flight.get(name, 0),
                requests=requests.get(name, 0),
                held=held.get(name, 0),
                last_used_s=None if idle is None else round(idle, 1),
                last_failure=memory.last_failure.get(name),
            )
        )
    return views
