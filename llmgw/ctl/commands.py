"""One method per ctl command: what it asks the controller and what it prints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmgw import api, present, render
from llmgw.ctl.output import Output, Terminal
from llmgw.ctl.watch import (
    model_view,
    rollout_done,
    wait_drained,
    wait_rollout,
    watch,
    watch_events,
    watch_nodes,
)
from llmgw.errors import EXIT_FAILED, EXIT_OK, ControllerError, NotAController, UsageError, explain

if TYPE_CHECKING:
    from llmgw.sync_client import SyncAdminClient
    from llmgw.wire import NodeRow


class Ctl:
    def __init__(self, client: SyncAdminClient, args: argparse.Namespace, term: Terminal) -> None:
        self.client = client
        self.args = args
        self.term = term
        self.out = Output(term, args)
        self._missing: list[str] = []  # nodes named that the controller does not know

    def _read(
        self, call: api.Call[Any], table: Callable[[Any], render.Table], *, plain: bool = False
    ) -> int:
        """`plain`: the table reads the answer's JSON objects by item, not as api.Views
        (`ctl nodes` at 2,000 rows: a View per object costs more than the reading)."""
        if self.args.output in ("json", "yaml"):
            data = self.client.json(call)
            self.out.data(self._filter_json(data))
            return EXIT_OK
        fetch = self.client.json if plain else self.client
        if getattr(self.args, "watch", False):
            return watch(self.out, self.args.interval, lambda: self.out.table(table(fetch(call))))
        self.term.write(self.out.table(table(fetch(call))))
        return EXIT_OK

    def _filter_json(self, data: Any) -> Any:
        if self.args.command == "nodes" and isinstance(data, list):
            return self._only(data)
        return data

    # -- reads

    def status(self) -> int:
        if self.args.output in ("json", "yaml"):
            self.out.data(self.client.json(api.summary_json()))
            return EXIT_OK
        if self.args.output != "table":
            raise UsageError("status prints a summary: -o json or -o yaml, or no -o")

        def draw() -> str:
            text = render.status(
                self.client(api.summary()), self.client.base_url, color=self.term.color
            )
            gateways: list[Any] = self.client(api.gateways())
            return text + render.gateways(gateways)

        if self.args.watch:
            return watch(self.out, self.args.interval, draw)
        self.term.write(draw())
        return EXIT_OK

    def nodes(self) -> int:
        wide = self.args.output == "wide"

        def table(rows: list[Any]) -> render.Table:
            return render.nodes_table(self._only(rows), wide=wide)

        if self.args.watch and self.args.output not in ("json", "yaml"):
            return watch_nodes(self.client, self.out, table, self.args.interval)
        code = self._read(api.nodes(), table, plain=True)
        for name in self._missing:  # as kubectl: the rows found, and each name not found
            print(f"llmgw ctl: node {name} not found", file=sys.stderr)
        return EXIT_FAILED if self._missing else code

    def _only(self, rows: list[NodeRow]) -> list[NodeRow]:
        """The rows asked for: those named (in the order named), in the state asked."""
        # Rows are JSON objects: plain, or api.View.
        if self.args.names:
            by_name = {r["name"]: r for r in rows}  # type: ignore[index]
            self._missing = [n for n in dict.fromkeys(self.args.names) if n not in by_name]
            rows = [by_name[n] for n in dict.fromkeys(self.args.names) if n in by_name]
        if self.args.state:
            rows = [r for r in rows if r["state"] == self.args.state]  # type: ignore[index]
        return rows

    def node(self) -> int:
        if self.args.name == "forget" and self.args.target:
            reply = self.client.json(api.forget_node(self.args.target))
            revoked = "; its credential is revoked" if reply.get("credential_revoked") else ""
            self.term.write(f"node {self.args.target} forgotten{revoked}\n")
            return EXIT_OK
        if self.args.output in ("json", "yaml"):
            self.out.data(self.client.json(api.node(self.args.name)))
            return EXIT_OK
        detail = self.client(api.node(self.args.name))
        if self.args.output == "name":
            self.term.write(f"node/{detail.row.name}\n")
            return EXIT_OK
        self.term.write(render.node_detail(detail, color=self.term.color))
        return EXIT_OK

    def credentials(self) -> int:
        action, nodes = self.args.action, self.args.nodes
        if action == "token":
            return self._enroll_tokens(nodes)
        if action in ("revoke", "approve", "allow"):
            if action == "approve":
                return self._each(nodes, api.approve_credential, "approved: it may take replicas")
            if action == "allow":
                return self._each(nodes, api.allow_enroll, "may enroll once")
            code = self._each(nodes, api.revoke_credential, "revoked")
            if self.args.allow_enroll and code == EXIT_OK:
                code = self._each(nodes, api.allow_enroll, "may enroll again")
            return code
        return self._read(api.credentials(), render.credentials_table, plain=True)

    def _enroll_tokens(self, words: list[str]) -> int:
        verb, ids = (words[0], words[1:]) if words else ("list", [])
        if verb == "create":
            made = self.client.json(
                api.create_enroll_token(self.args.ttl, self.args.uses, self.args.description)
            )
            if self.args.output in ("json", "yaml"):
                self.out.data(made)
                return EXIT_OK
            self.term.write(f"{made['token']}\n")
            print(
                f"enrollment token {made['id']}: {_token_limits(made)}. It is shown only "
                "now: give it to agents in --enroll-token-file (mode 0600)",
                file=sys.stderr,
            )
            return EXIT_OK
        if verb == "delete":
            return self._each(ids, api.delete_enroll_token, "deleted")
        tokens = self.client.json(api.enroll_tokens())
        if self.args.output in ("json", "yaml"):
            self.out.data(tokens)
            return EXIT_OK
        for t in tokens:
            what = f"  {render.clean(t['description'])}" if t.get("description") else ""
            self.term.write(f"{t['id']:<8} {t['state']:<9} {_token_limits(t)}{what}\n")
        return EXIT_OK

    def keys(self) -> int:
        a = self.args
        if a.action == "create":
            made = self.client.json(api.create_client_key(a.tenant, a.models, a.expires))
            if a.output in ("json", "yaml"):
                self.out.data(made)
                return EXIT_OK
            # The key alone on stdout's first line: KEY=$(llmgw ctl keys create ...).
            self.term.write(f"{made['key']}\n")
            print(
                f"client key {made['id']} of tenant {made['tenant']} "
                f"({render.clean(' '.join(made['models']))}"
                f"{', expires ' + present.timestamp(made['expires_at']) if made['expires_at'] else ''}"
                "). It is shown only now: every gateway takes it within a second",
                file=sys.stderr,
            )
            return EXIT_OK
        if a.action == "revoke":
            return self._each(a.ids, api.revoke_client_key, "revoked")
        return self._read(api.client_keys(), render.client_keys_table, plain=True)

    def limits(self) -> int:
        a = self.args
        if a.action == "set":
            body = {"tenant": a.tenant, "model": a.model, "rpm": a.rpm, "tpm": a.tpm}
            body |= {"budget": a.budget, "per": a.per}
            made = self.client.json(api.set_limit({k: v for k, v in body.items() if v is not None}))
            if a.output in ("json", "yaml"):
                self.out.data(made)
                return EXIT_OK
            self.term.write(f"limits of {render.limit_scope(made)}: {render.limit_text(made)}\n")
            return EXIT_OK
        if a.action == "delete":
            self.client.json(api.delete_limit(a.tenant, a.model))
            scope = render.limit_scope({"tenant": a.tenant, "model": a.model})
            self.term.write(f"limits of {scope} deleted\n")
            return EXIT_OK
        return self._read(api.limits(), render.limits_table, plain=True)

    def usage(self) -> int:
        a = self.args
        report = self.client.json(api.usage(a.since, a.by))
        rows = report["rows"]
        if a.output in ("json", "yaml"):
            self.out.data(rows)
            return EXIT_OK
        if a.output == "csv":
            self.term.write(render.usage_csv(rows))
            return EXIT_OK
        print(f"since {present.timestamp(report['since'])}", file=sys.stderr)
        self.term.write(self.out.table(render.usage_table(rows)))
        return EXIT_OK

    def models(self) -> int:
        wide = self.args.output == "wide"
        return self._read(api.models(), lambda ms: render.models_table(ms, wide=wide))

    def replicas(self) -> int:
        wide = self.args.output == "wide"
        return self._read(api.replicas(), lambda rs: render.replicas_table(rs, wide=wide))

    def rollout(self) -> int:
        a = self.args
        if a.action == "history":
            call = api.model_revisions(a.model)
            return self._read(call, render.revisions_table)
        if a.action == "undo":
            view = self.client(api.undo_rollout(a.model, a.to_revision))
            now = view.rollout.revision if view.rollout is not None else "?"
            if a.output in ("json", "yaml"):
                self.out.data(dict(view))
                return EXIT_OK
            self.term.write(
                f"model {a.model}: rolling back"
                + (f" to what revision {a.to_revision} ran" if a.to_revision else "")
                + f" (now revision {now})\n"
            )
            return EXIT_OK
        if a.wait:
            limit_s = 600.0 if a.timeout is None else a.timeout
            return wait_rollout(self.client, self.out, a.model, limit_s, a.interval)
        view = model_view(self.client, a.model)
        if a.output in ("json", "yaml"):
            self.out.data(dict(view.rollout) if view.rollout is not None else None)
        else:
            self.term.write(render.rollout_line(view) + "\n")
        return EXIT_OK if rollout_done(view) else EXIT_FAILED

    def events(self) -> int:
        a = self.args
        wide = a.output == "wide"
        if a.watch:
            if a.object is not None:
                self._exists(a.object)
            return watch_events(self.client, self.out, a.object, a.interval, wide=wide)
        if a.output in ("json", "yaml"):
            events = self.client.json(api.events(0, a.object))["events"]
        else:
            events = self.client(api.events(0, a.object)).events
        if not events and a.object is not None:
            self._exists(a.object)
        if a.output in ("json", "yaml"):
            self.out.data(events)
        else:
            self.term.write(self.out.table(render.events_table(events, wide=wide)))
        return EXIT_OK

    def _exists(self, obj: str) -> None:
        """NotFound for node/NAME or model/NAME the controller does not know: an
        object without events is quiet or unknown, and `events --for` says which.
        (The events of a node forgotten or a model deleted are still shown.)"""
        kind, _, name = obj.partition("/")
        if kind == "node":
            self.client.json(api.node(name))
        else:
            model_view(self.client, name)

    # -- writes

    def cordon(self) -> int:
        reason = self.args.reason.strip()
        before = {r.name: r for r in self.client(api.nodes())}
        code = EXIT_OK
        for node in self.args.nodes:
            try:
                self.client(api.cordon(node, reason))
            except ControllerError as exc:
                if isinstance(exc, NotAController):
                    raise
                self._fail(node, exc)
                code = EXIT_FAILED
                continue
            old = before.get(node)
            if old is not None and old.admin.flag != "none" and old.admin.reason != reason:
                was = render.clean(old.admin.reason or "")
                self.term.write(
                    f"{node} cordoned; reason replaced: {was!r} -> {render.clean(reason)!r}\n"
                )
            else:
                self.term.write(f"{node} cordoned\n")
        return code

    def uncordon(self) -> int:
        force = self.args.force
        return self._each(self.args.nodes, lambda n: api.uncordon(n, force=force), "uncordoned")

    def drain(self) -> int:
        a = self.args
        if a.dry_run:
            if a.output in ("json", "yaml"):
                data = self.client.json(api.drain_plan_json(a.nodes))
                self.out.data(data)
                short = [i for i in data.get("impacts", []) if i.get("verdict") == "below_minimum"]
            else:
                plan = self.client(api.drain_plan(a.nodes))
                self.term.write(render.drain_plan(plan, color=self.term.color))
                short = [i for i in plan.impacts if i.verdict == "below_minimum"]
            return EXIT_FAILED if short else EXIT_OK
        if (a.force or a.force_after is not None) and not a.yes:
            self._refuse_below_minimum()
        code = self._each(
            a.nodes,
            lambda n: api.drain(n, a.reason.strip(), force=a.force, force_after_s=a.force_after),
            _draining,
        )
        if code == EXIT_OK and a.wait:
            limit_s = 600.0 if a.timeout is None else a.timeout
            return wait_drained(self.client, self.out, a.nodes, limit_s, a.interval)
        return code

    def _refuse_below_minimum(self) -> None:
        """Every path that can force a stop (--force, --force-after) passes the
        same pre-check: a model it would drop below its minimum needs --yes."""
        a = self.args
        plan = self.client(api.drain_plan(a.nodes))
        below = [i for i in plan.impacts if i.verdict == "below_minimum"]
        if not below:
            return
        self.term.write(render.drain_plan(plan, color=self.term.color))
        flag = "--force" if a.force else "--force-after"
        when = "" if a.force else " when its deadline forces the drain"
        raise UsageError(
            f"{flag} would drop "
            + ", ".join(f"{i.model} below its minimum ({i.min_replicas})" for i in below)
            + f"{when}; add --yes to go ahead anyway"
        )

    def apply(self) -> int:
        from llmgw.ctl.modelfile import apply_warnings, load_specs

        specs = load_specs(self.args.file)
        if self.args.dry_run:
            for would in self.client(api.apply_models_dry_run(specs)):
                self.term.write(render.dry_run_change(would))
        else:
            for v in self.client(api.apply_models(specs)):
                self.term.write(
                    f"model {v.spec.name} applied (ready {v.ready}/{v.spec.min_replicas})\n"
                )
        # The same warnings either way: the dry run is where they help most.
        for warning in apply_warnings(specs, self.client.json(api.summary_json())):
            print(f"llmgw ctl: warning: {warning}", file=sys.stderr)
        return EXIT_OK

    def delete(self) -> int:
        name = self.args.name
        running = sum(1 for r in self.client(api.replicas()) if r.model == name)
        self.client(api.delete_model(name))
        stopped = f"; its {running} replica(s) are being stopped" if running else ""
        self.term.write(f"model {name} deleted{stopped}\n")
        return EXIT_OK

    def _each(
        self,
        nodes: list[str],
        call: Callable[[str], api.Call[Any]],
        done: str | Callable[[Any], str],
    ) -> int:
        """Apply to every node; report each failure and go on with the others.
        `done`: what to say of a node done, or how to say it from the answer."""
        code = EXIT_OK
        for node in nodes:
            try:
                answer = self.client(call(node))
            except ControllerError as exc:
                if isinstance(exc, NotAController):
                    raise
                self._fail(node, exc)
                code = EXIT_FAILED
            else:
                said = done if isinstance(done, str) else done(answer)
                self.term.write(f"{node} {said}\n")
        return code

    def _fail(self, node: str, exc: ControllerError) -> None:
        print(f"llmgw ctl: {node}: {explain(exc)}", file=sys.stderr)


def _draining(row: Any) -> str:
    """A drain's answer (its node row): with a deadline, the deadline echoed back."""
    force_at = row.admin.get("force_at")
    if force_at is None or row.admin.get("force"):
        return "draining"
    return f"draining; {present.force_at_words(force_at)}"


def _token_limits(t: dict[str, Any]) -> str:
    """`used 2 of 10, expires 2026-12-05 18:00:00`, as a token's list line says it."""
    uses = f"used {t['used']} of {t['uses']}" if t.get("uses") else f"used {t['used']}, no limit"
    expires = t.get("expires_at")
    return f"{uses}, " + (f"expires {render.timestamp(expires)}" if expires else "never expires")
