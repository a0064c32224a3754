"""ctl's command line: usage errors, flags anywhere, help, wrong URLs, tokens, `/` names."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import api
from llmgw.ctl import parser
from tests.ctl.ctl_support import (
    ADMIN,
    READ,
    Controller,
    controller_process,
    ctl,
    llmgw,
    ok,
    one_line_error,
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-cli")) as c:
        c.report("gpu-a01")
        c.report("gpu-a02")
        yield c


@pytest.mark.parametrize(
    "args",
    [
        ["nodes", "--state", "bogus"],
        ["drain", "gpu-a01", "--reason", "r", "--wait", "--timeout", "-5"],
        ["drain", "gpu-a01", "--reason", "r", "--timeout", "5"],
        ["cordon", "gpu-a01", "--reason", ""],
        ["cordon", "gpu-a01", "--reason", "   "],
        ["drain", "gpu-a01", "--reason", ""],
        ["drain", "gpu-a01", "--reason", "r", "--yes"],
        ["nodes", "--sort-by", "nope"],
        ["nodes", "-o", "toml"],
        ["cordon", "gpu-a01"],
        ["status", "-w", "--interval", "0"],
        ["frobnicate"],
        ["credentials", "approve", "gpu-a01", "--allow-enroll"],
        ["credentials", "list", "--ttl", "1h"],
        ["credentials", "token", "delete"],
    ],
)
def test_usage_errors_exit_2_with_one_plain_line(fleet: Controller, args: list[str]) -> None:
    line = one_line_error(ctl(fleet.url, *args), 2)
    assert "ValidationError" not in line and "Request" not in line
    nodes = json.loads(ok(ctl(fleet.url, "nodes", "-o", "json")))
    assert all(n["admin"]["flag"] == "none" for n in nodes)  # nothing changed


def test_agent_json_without_once_is_a_usage_error() -> None:
    result = llmgw("agent", "--json", "--fake-gpus", "1xH100-80GB")
    assert result.returncode == 2
    assert "--once" in result.stderr


def test_duplicate_models_in_apply_and_apply_from_stdin(fleet: Controller) -> None:
    twice = "- name: org/a\n  source: org/a\n- name: org/a\n  source: org/b\n"
    line = one_line_error(ctl(fleet.url, "apply", "-f", "-", input=twice), 2)
    assert "org/a twice" in line
    once = "- name: org/a\n  source: org/a\n  min_replicas: 0\n"
    assert ok(ctl(fleet.url, "apply", "-f", "-", input=once)) == "model org/a applied (ready 0/0)\n"


def test_names_with_a_slash_work_on_every_path(fleet: Controller) -> None:
    spec = "- name: meta-llama/Llama-3.1-8B\n  source: meta-llama/Llama-3.1-8B\n  min_replicas: 0\n"
    ok(ctl(fleet.url, "apply", "-f", "-", input=spec))
    assert ok(ctl(fleet.url, "delete", "model", "meta-llama/Llama-3.1-8B")).startswith(
        "model meta-llama/Llama-3.1-8B deleted"
    )
    assert "meta-llama" not in ok(ctl(fleet.url, "models", "-o", "name"))
    # a node name that could never exist is the controller's 404, not a wrong path
    line = one_line_error(ctl(fleet.url, "node", "a?b#c"), 1)
    assert "a?b#c" in line and "not an llmgw controller" not in line
    # a node name never holds `/`: that is a kind (node/NAME) or a mistake
    line = one_line_error(ctl(fleet.url, "node", "a/b"), 2)
    assert line == "llmgw ctl: node takes nodes (NAME or node/NAME); 'a/b' is not a node name"


def test_every_call_encodes_its_path_segments() -> None:
    name = "org/na me?#%"
    enc = "org%2Fna%20me%3F%23%25"
    assert api.node(name).path == f"/v1/nodes/{enc}"
    assert api.cordon(name, "r").path == f"/v1/nodes/{enc}/cordon"
    assert api.uncordon(name).path == f"/v1/nodes/{enc}/uncordon"
    assert api.drain(name, "r").path == f"/v1/nodes/{enc}/drain"
    assert api.delete_model(name).path == f"/v1/models/{enc}"
    assert api.nodes_since("a/b").target() == "/v1/nodes?since=a%2Fb"


async def test_the_async_client_deletes_a_model_with_a_slash(fleet: Controller) -> None:
    from llmgw.client import AdminClient
    from llmgw.wire import ModelSpec

    async with AdminClient(fleet.url, ADMIN) as client:
        await client.apply_models([ModelSpec(name="org/x", source="org/x", min_replicas=0)])
        await client.delete_model("org/x")
        assert "org/x" not in [m.spec.name for m in await client.models()]


@pytest.mark.parametrize("where", ["before", "after"])
def test_connection_and_output_flags_work_before_or_after_the_command(
    fleet: Controller, where: str
) -> None:
    flags = ["--controller", fleet.url, "--token", ADMIN, "--json"]
    args = [*flags, "nodes"] if where == "before" else ["nodes", *flags]
    rows = json.loads(ok(llmgw("ctl", *args)))
    assert [r["name"] for r in rows] == ["gpu-a01", "gpu-a02"]
    args = ["-o", "name", "nodes"] if where == "before" else ["nodes", "-o", "name"]
    out = ok(llmgw("ctl", "--controller", fleet.url, "--token", READ, *args))
    assert out == "node/gpu-a01\nnode/gpu-a02\n"


def test_a_url_without_scheme_means_http(fleet: Controller) -> None:
    bare = fleet.url.removeprefix("http://")
    assert "2 total" in ok(llmgw("ctl", "status", "--controller", bare, "--token", READ))


class _Html(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_wrong_urls_say_this_is_not_an_llmgw_controller(fleet: Controller) -> None:
    line = one_line_error(ctl(f"{fleet.url}/foo", "status"), 1)
    assert line == (
        f"llmgw ctl: {fleet.url}/foo is not an llmgw controller "
        "(GET /healthz answered 404 with application/json); check --controller (e.g. http://HOST:7460)"
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        line = one_line_error(ctl(url, "nodes"), 1)
        assert "is not an llmgw controller (GET /healthz answered 200 with text/html)" in line
        assert "<html>" not in line
    finally:
        server.shutdown()


def test_token_errors_say_what_to_do(fleet: Controller) -> None:
    line = one_line_error(ctl(fleet.url, "status", token=None), 1)
    assert "--token" in line and "LLMGW_TOKEN" in line and "token-file" in line
    line = one_line_error(ctl(fleet.url, "status", token="wrong"), 1)
    assert "invalid token" in line and "--token" in line
    result = ctl(fleet.url, "cordon", "gpu-a01", "--reason", "x", token=READ)
    assert result.returncode == 1
    assert "a read token cannot do this; it needs an admin token" in result.stderr


def test_recordoning_says_the_reason_was_replaced(fleet: Controller) -> None:
    assert ok(ctl(fleet.url, "cordon", "gpu-a02", "--reason", "xid 79")) == "gpu-a02 cordoned\n"
    out = ok(ctl(fleet.url, "cordon", "gpu-a02", "--reason", "PSU swap"))
    assert out == "gpu-a02 cordoned; reason replaced: 'xid 79' -> 'PSU swap'\n"
    ok(ctl(fleet.url, "uncordon", "gpu-a02"))


def _commands(p: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    import argparse

    assert isinstance(p, argparse.ArgumentParser)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


def test_every_subcommand_help_lists_options_with_defaults_and_an_example() -> None:
    commands = list(_commands(parser()))
    assert len(commands) == 21  # 17 commands, 4 config actions
    for path, sub in commands:
        text = sub.format_help()  # type: ignore[attr-defined]
        assert "example:\n  llmgw ctl" in text or "example:\n  LLMGW_" in text, path
    drain = dict(commands)[("drain",)].format_help()  # type: ignore[attr-defined]
    assert "--force-after DURATION" in drain and "--yes" in drain and "--dry-run" in drain
    nodes = dict(commands)[("nodes",)].format_help()  # type: ignore[attr-defined]
    assert "(default: 2s)" in nodes  # --interval shows its default, as a duration
    result = llmgw("ctl", "drain", "--help")
    assert result.returncode == 0 and "llmgw ctl drain --dry-run" in result.stdout


@pytest.mark.parametrize(
    "program",
    ["controller", "controller migrate", "agent", "console", "demo", "gateway", "completion"],
)
def test_every_program_help_ends_with_an_example_to_copy(program: str) -> None:
    result = llmgw(*program.split(), "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    example = result.stdout.split("example:\n", 1)[1]
    lines = example.rstrip("\n").splitlines()
    assert lines and all(line.startswith(("  llmgw ", '  eval "$(llmgw ')) for line in lines)
    assert program.split()[0] in lines[0]
    # Prose is wrapped to the terminal; the example lines are kept whole to copy.
    prose = result.stdout.split("example:\n", 1)[0]
    assert all(len(line) <= 80 for line in prose.splitlines()), program


def setting(view: str, key: str) -> list[str]:
    """VALUE and FROM of one row of `ctl config view`."""
    (line,) = [line for line in view.splitlines() if line.split("   ")[0].strip() == key]
    return [part.strip() for part in line.split("   ") if part.strip()][1:]


def test_config_contexts(fleet: Controller, tmp_path: Path) -> None:
    cfg = tmp_path / "llmgw" / "config.toml"
    cfg.parent.mkdir()
    token = tmp_path / "read.token"
    token.write_text(READ + "\n")
    cfg.write_text(
        "# my contexts\n"
        f'[contexts.here]\ncontroller = "{fleet.url}"\ntoken-file = "{token}"\n\n'
        '[contexts.nowhere]\ncontrollers = ["http://127.0.0.1:9", "http://127.0.0.1:10"]\n'
    )
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert ok(llmgw("ctl", "config", "use-context", "here", env=env)).startswith(
        "current context: here"
    )
    assert cfg.read_text().startswith('current-context = "here"\n# my contexts\n')
    # the context gives URL and token
    assert ok(llmgw("ctl", "nodes", "-o", "name", env=env)) == "node/gpu-a01\nnode/gpu-a02\n"
    listing = ok(llmgw("ctl", "config", "get-contexts", env=env)).splitlines()
    assert listing[1].startswith("*         here")
    assert "http://127.0.0.1:9,http://127.0.0.1:10" in listing[2]
    # the environment beats the file, a flag beats the environment
    view = ok(llmgw("ctl", "config", "view", env={**env, "LLMGW_CONTEXT": "nowhere"}))
    assert setting(view, "context") == ["nowhere", "env LLMGW_CONTEXT"]
    assert setting(view, "controller") == [
        "http://127.0.0.1:9,http://127.0.0.1:10",
        "context nowhere",
    ]
    view = ok(
        llmgw(
            "ctl", "config", "view", "--controller", "h:1",
            env={**env, "LLMGW_CONTEXT": "nowhere", "LLMGW_TOKEN": "t"},
        )
    )  # fmt: skip
    assert setting(view, "controller") == ["http://h:1", "flag --controller"]
    assert setting(view, "token") == ["(hidden)", "env LLMGW_TOKEN"]
    line = one_line_error(llmgw("ctl", "--context", "nope", "status", env=env), 2)
    assert "no context 'nope'" in line and "here, nowhere" in line
    line = one_line_error(llmgw("ctl", "status", env={**env, "LLMGW_CONTEXT": "nowhere"}), 1)
    assert "cannot reach the controller at http://127.0.0.1:9" in line
