"""Models and their replicas: apply (and its dry run), revisions, undo, delete."""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.core.revisions import same_engine
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


async def put_models(request: web.Request) -> web.Response:
    body = await parse_body(request, ModelSpecList)
    names = [m.name for m in body.models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"model names must be unique; repeated: {', '.join(dupes)}")
    term = term_of(request.app)
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
    term.facts.put_models(body.models, who(request))
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
    term_of(request.app).facts.delete_model(request.match_info["name"])
    return web.Response(status=204)
