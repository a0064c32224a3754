"""Models and their replicas: apply (and its dry run), revisions, undo, delete."""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.core.adapter_specs import check_adapters, check_delete
from llmgw.controller.core.revisions import same_engine
from llmgw.controller.http.adapter_views import adapter_views
from llmgw.controller.http.keys import term_of
from llmgw.controller.http.web_io import json_model, json_models, parse_body, who
from llmgw.controller.views.endpoints import endpoint_of
from llmgw.errors import BadRequest
from llmgw.wire import ModelDryRun, ModelSpecList, RolloutUndo, printable


async def list_models(request: web.Request) -> web.Response:
    return json_models(term_of(request.app).model_views())


async def list_replicas(request: web.Request) -> web.Response:
    term = term_of(request.app)
    now = term.facts.clock()
    urls = {
        rid: ep.url
        for rid, rec in term.facts.records.items()
        if (ep := endpoint_of(term.facts, rec, now)) is not None
    }
    return json_models([v.model_copy(update={"url": urls.get(v.id)}) for v in term.replica_views()])


async def list_adapters(request: web.Request) -> web.Response:
    return json_models(adapter_views(term_of(request.app)))


async def put_models(request: web.Request) -> web.Response:
    body = await parse_body(request, ModelSpecList)
    names = [m.name for m in body.models]
    everything = names + [a.name for a in body.adapters]
    dupes = sorted({n for n in everything if everything.count(n) > 1})
    if dupes:
        raise BadRequest(f"model and adapter names must be unique; repeated: {', '.join(dupes)}")
    for m in body.models:
        if any(a == "--api-key" or a.startswith("--api-key=") for a in m.engine_args):
            raise BadRequest(
                f"model {m.name}: engine_args must not give --api-key: each replica's engines "
                "get a key of their own (VLLM_API_KEY, which --api-key would override, on a "
                "command line every local user can read); the gateways and the agent hold it"
            )
    term = term_of(request.app)
    facts = term.facts
    # Adapters are checked against what the models will be, before anything is written.
    check_adapters(
        {**facts.models, **{m.name: m for m in body.models}},
        {**facts.adapters, **{a.name: a for a in body.adapters}},
        everything,
    )
    dry_run = request.query.get("dry_run", "false")
    if dry_run not in ("true", "false"):
        raise BadRequest(f"dry_run must be true or false, not {printable(dry_run)!r}")
    if dry_run == "true":  # validated as a real apply is; nothing written
        held = {v.spec.name: v.spec for v in term.model_views()}
        return json_models(
            [
                ModelDryRun(
                    spec=s,
                    current=held.get(s.name),
                    new_revision=s.name not in held or not same_engine(held[s.name], s),
                )
                for s in body.models
            ]
        )
    new = [n for n in names if n not in term.facts.models]
    new += [a.name for a in body.adapters if a.name not in term.facts.adapters]
    if body.models:
        term.facts.put_models(body.models, who(request))
    if body.adapters:
        term.facts.loras.put(body.adapters, term.facts.wall())
    if new:  # once this answers, every gateway says 503 + Retry-After for it, never 404
        await term.gateways.caught_up(term.facts.revision, f"model(s) {', '.join(new)} declared")
    applied = set(names)
    return json_models([v for v in term.model_views() if v.spec.name in applied])


async def model_revisions(request: web.Request) -> web.Response:
    return json_models(term_of(request.app).facts.model_revisions(request.match_info["name"]))


async def undo_rollout(request: web.Request) -> web.Response:
    body = await parse_body(request, RolloutUndo)
    term = term_of(request.app)
    name = request.match_info["name"]
    term.facts.undo(name, body.to_revision, who(request))
    return json_model(next(v for v in term.model_views() if v.spec.name == name))


async def delete_model(request: web.Request) -> web.Response:
    facts = term_of(request.app).facts
    name = request.match_info["name"]
    if name in facts.adapters:
        facts.loras.delete(name)
    else:
        check_delete(name, facts.adapters)
        facts.delete_model(name)
    return web.Response(status=204)
