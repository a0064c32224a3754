"""One method per ctl command: what it asks the controller and what it prints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmgw import api, render
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
        state = getattr(self.args, "state", None)
        if state and isinstance(data, list):
            return [r for r in data if r.get("state") == state]
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
        return self._read(api.nodes(), table, plain=True)

    def _only(self, rows: list[NodeRow]) -> list[NodeRow]:
        if self.args.state:  # rows are JSON objects: plain, or api.View
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
            if not nodes:
                raise UsageError(f"credentials {action} needs at least one NODE")
            if action == "approve":
                return self._each(nodes, api.approve_credential, "approved: it may take replicas")
            if action == "allow":
                return self._each(nodes, api.allow_enroll, "may enroll once")
            code = self._each(nodes, api.revoke_credential, "revoked")
            if self.args.allow_enroll and code == EXIT_OK:
                code = self._each(nodes, api.allow_enroll, "may enroll again")
            return code
        if nodes:
            raise UsageError("credentials list takes no NODE")
        creds = self.client.json(api.credentials())
        if self.args.output in ("json", "yaml"):
            self.out.data(creds)
            return EXIT_OK
        for c in creds:
            when = render.timestamp(c.get("issued_at"))
            by = c.get("by") or "-"
            pending = "  awaiting approval" if c.get("awaiting_approval") else ""
            self.term.write(f"{c['node']:<32} {c['source']:<9} {when:<20} {by}{pending}\n")
        return EXIT_OK

    def _enroll_tokens(self, words: list[str]) -> int:
        verb, ids = (words[0], words[1:]) if words else ("list", [])
        if verb == "create" and not ids:
            if self.args.uses is not None and self.args.uses < 1:
                raise UsageError("--uses must be at least 1 (leave it out for no limit)")
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
        if verb == "delete" and ids:
            return self._each(ids, api.delete_enroll_token, "deleted")
        if verb == "list" and not ids:
            tokens = self.client.json(api.enroll_tokens())
            if self.args.output in ("json", "yaml"):
                self.out.data(tokens)
                return EXIT_OK
            for t in tokens:
                what = f"  {render.clean(t['description'])}" if t.get("description") else ""
                self.term.write(f"{t['id']:<8} {t['state']:<9} {_token_limits(t)}{what}\n")
            return EXIT_OK
        raise UsageError(
            "credentials token takes: create [--ttl D] [--uses N] [--description TEXT], "
            "list, or delete ID..."
        )

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
            return watch_events(self.client, self.out, a.object, a.interval, wide=wide)
        if a.output in ("json", "yaml"):
            self.out.data(self.client.json(api.events(0, a.object))["events"])
            return EXIT_OK
        found = self.client(api.events(0, a.object))
        self.term.write(self.out.table(render.events_table(found.events, wide=wide)))
        return EXIT_OK

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
        return self._each(self.args.nodes, api.uncordon, "uncordoned")

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
        if a.force and not a.yes:
            plan = self.client(api.drain_plan(a.nodes))
            below = [i for i in plan.impacts if i.verdict == "below_minimum"]
            if below:
                self.term.write(render.drain_plan(plan, color=self.term.color))
                raise UsageError(
                    "--force would drop "
                    + ", ".join(f"{i.model} below its minimum ({i.min_replicas})" for i in below)
                    + "; add --yes to go ahead anyway"
                )
        code = self._each(
            a.nodes,
            lambda n: api.drain(n, a.reason.strip(), force=a.force, force_after_s=a.force_after),
            "draining",
        )
        if code == EXIT_OK and a.wait:
            limit_s = 600.0 if a.timeout is None else a.timeout
            return wait_drained(self.client, self.out, a.nodes, limit_s)
        return code

    def apply(self) -> int:
        from llmgw.ctl.modelfile import apply_warnings, load_specs

        specs = load_specs(self.args.file)
        for v in self.client(api.apply_models(specs)):
            self.term.write(
                f"model {v.spec.name} applied (ready {v.ready}/{v.spec.min_replicas})\n"
            )
        for warning in apply_warnings(specs, self.client.json(api.summary_json())):
            print(f"llmgw ctl: warning: {warning}", file=sys.stderr)
        return EXIT_OK

    def delete(self) -> int:
        self.client(api.delete_model(self.args.name))
        self.term.write(f"model {self.args.name} deleted; its replicas are being stopped\n")
        return EXIT_OK

    def _each(self, nodes: list[str], call: Callable[[str], api.Call[Any]], done: str) -> int:
        """Apply to every node; report each failure and go on with the others."""
        code = EXIT_OK
        for node in nodes:
            try:
                self.client(call(node))
            except ControllerError as exc:
                if isinstance(exc, NotAController):
                    raise
                self._fail(node, exc)
                code = EXIT_FAILED
            else:
                self.term.write(f"{node} {done}\n")
        return code

    def _fail(self, node: str, exc: ControllerError) -> None:
        print(f"llmgw ctl: {node}: {explain(exc)}", file=sys.stderr)


def _token_limits(t: dict[str, Any]) -> str:
    """`used 2 of 10, expires 2026-12-05 18:00:00`, as a token's list line says it."""
    uses = f"used {t['used']} of {t['uses']}" if t.get("uses") else f"used {t['used']}, no limit"
    expires = t.get("expires_at")
    return f"{uses}, " + (f"expires {render.timestamp(expires)}" if expires else "never expires")
