"""What ctl takes as arguments: options anywhere, `-o name` output taken back,
`nodes NAME`, options a command has no use for, URLs, `apply --dry-run`,
`config current-context` (issue 23 item 10)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ctl.ctl_support import ADMIN, Controller, controller_process, ctl, llmgw, ok
from tests.ctl.ctl_support import one_line_error as error


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-args")) as c:
        c.report("gpu-a01")
        c.report("gpu-a02", n_gpus=4)
        c.report("gpu-b01", n_gpus=2)
        spec = {"name": "org/tiny", "source": "org/tiny", "min_replicas": 0}
        c.admin("POST", "/v1/models", {"models": [spec]})
        yield c


def names(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()]


def flags(c: Controller) -> dict[str, str]:
    return {r["name"]: r["admin"]["flag"] for r in json.loads(ok(ctl(c.url, "nodes", "--json")))}


def test_sort_by_and_watch_go_before_the_command_too(fleet: Controller) -> None:
    before = ok(ctl(fleet.url, "--sort-by", "GPUS", "--no-headers", "nodes"))
    assert names(before) == ["gpu-b01", "gpu-a02", "gpu-a01"]
    after = ok(ctl(fleet.url, "nodes", "--sort-by", "GPUS", "--no-headers"))
    # The last column is the report's age, which may tick between the two commands.
    assert [r.rsplit(maxsplit=1)[0] for r in before.splitlines()] == [
        r.rsplit(maxsplit=1)[0] for r in after.splitlines()
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "ctl", "-w", "--interval", "0.2", "nodes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LLMGW_CONTROLLER": fleet.url, "LLMGW_TOKEN": ADMIN},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the table, not a refusal
        assert first.startswith("NODE "), proc.stderr.read() if proc.stderr else ""
        assert proc.poll() is None  # still watching
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--sort-by", "AGE", "status"], "--sort-by applies to tables"),
        (["-w", "cordon", "gpu-a01", "--reason", "r"], "-w applies to status, nodes"),
        (["status", "--no-headers"], "--no-headers applies to tables; status prints no header"),
        (["--no-headers", "node", "gpu-a01"], "--no-headers applies to tables"),
        (["node", "gpu-a01", "gpu-a02"], "for a row each: llmgw ctl nodes gpu-a01 gpu-a02"),
        (["nodes", "--interval", "5"], "--interval applies to -w"),
        (["--interval", "5", "rollout", "history", "org/tiny"], "--interval applies to -w"),
        (["rollout", "status", "org/tiny", "--interval", "5"], "--interval applies to -w"),
        (["cordon", "model/org/tiny", "--reason", "r"], "model/org/tiny is a model"),
        (["drain", "replica/abc", "--reason", "r"], "replica/abc is a replica"),
        (["uncordon", "gpu-a01", "node/"], "'node/' is not a node name"),
        (["delete", "model", "node/gpu-a01"], "node/gpu-a01 is a node"),
        (["delete", "node/gpu-a01"], "delete takes model NAME or model/NAME"),
        (["rollout", "history", "node/gpu-a01"], "takes a model (NAME or model/NAME)"),
        (["--controller", "http:/127.0.0.1:7460", "status"], "the scheme is written http://"),
        (["--controller", "htp://127.0.0.1:7460", "status"], "the scheme must be http://"),
        (["--controller", "127.0.0.1:7x", "status"], "the port must be a number"),
    ],
)
def test_what_a_command_cannot_use_is_a_usage_error(
    fleet: Controller, args: list[str], said: str
) -> None:
    line = error(ctl(fleet.url, *args), 2)
    assert said in line, line
    assert set(flags(fleet).values()) == {"none"}  # nothing changed


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval", "5s", "rollout", "status", "org/tiny", "--wait"],
        ["rollout", "--interval", "5s", "status", "org/tiny", "--wait"],
        ["rollout", "status", "org/tiny", "--wait", "--interval", "5s"],
        ["--interval", "5s", "drain", "gpu-a01", "--reason", "r", "--wait"],
        ["drain", "gpu-a01", "--reason", "r", "--wait", "--interval", "5s"],
        ["--interval", "5s", "nodes", "-w"],
        ["nodes", "-w", "--interval", "5s"],
    ],
)
def test_interval_means_one_thing_wherever_it_is_written(argv: list[str]) -> None:
    """The time between polls, before or after the command (a subcommand's own
    default never overrides a value given before it)."""
    from llmgw.ctl.checks import check_args
    from llmgw.ctl.parser import parser

    args = parser(argv).parse_args(argv)
    check_args(args)
    assert args.interval == 5.0


def test_a_bad_url_in_the_environment_names_it(fleet: Controller) -> None:
    line = error(llmgw("ctl", "status", env={"LLMGW_CONTROLLER": "http//ctl:7460"}), 2)
    assert line == (
        "llmgw ctl: LLMGW_CONTROLLER http//ctl:7460: the scheme is written http:// or "
        "https:// (e.g. http://HOST:7460)"
    )


def test_name_output_is_taken_back_as_arguments(fleet: Controller) -> None:
    listed = ok(ctl(fleet.url, "nodes", "-o", "name", "gpu-a01", "gpu-a02")).split()
    assert listed == ["node/gpu-a01", "node/gpu-a02"]
    # `ctl nodes -o name | xargs llmgw ctl cordon --reason x`
    assert ok(ctl(fleet.url, "cordon", "--reason", "x", *listed)) == (
        "gpu-a01 cordoned\ngpu-a02 cordoned\n"
    )
    assert ok(ctl(fleet.url, "uncordon", *listed)) == "gpu-a01 uncordoned\ngpu-a02 uncordoned\n"
    assert ok(ctl(fleet.url, "node", "node/gpu-b01")).startswith("Node       gpu-b01\n")
    (model,) = ok(ctl(fleet.url, "models", "-o", "name")).split()
    assert model == "model/org/tiny"
    assert ok(ctl(fleet.url, "rollout", "history", model, "-o", "name")) == "revision/1\n"
    spec = "- name: org/gone\n  source: org/gone\n  min_replicas: 0\n"
    ok(ctl(fleet.url, "apply", "-f", "-", input=spec))
    assert ok(ctl(fleet.url, "delete", "model/org/gone")) == "model org/gone deleted\n"
    ok(ctl(fleet.url, "apply", "-f", "-", input=spec))
    assert ok(ctl(fleet.url, "delete", "model", "model/org/gone")) == "model org/gone deleted\n"


def test_nodes_names_show_those_rows(fleet: Controller) -> None:
    out = ok(ctl(fleet.url, "nodes", "--no-headers", "gpu-b01", "node/gpu-a01"))
    assert names(out) == ["gpu-b01", "gpu-a01"]  # in the order named, as kubectl
    rows = json.loads(ok(ctl(fleet.url, "nodes", "-o", "json", "gpu-a02")))
    assert [r["name"] for r in rows] == ["gpu-a02"]
    result = ctl(fleet.url, "nodes", "--no-headers", "gpu-a02", "gpu-zz9")
    assert result.returncode == 1
    assert names(result.stdout) == ["gpu-a02"]
    assert result.stderr == "llmgw ctl: node gpu-zz9 not found\n"


def test_apply_dry_run_shows_what_would_change_and_writes_nothing(fleet: Controller) -> None:
    before = ok(ctl(fleet.url, "models", "-o", "json"))
    specs = (
        "- name: org/tiny\n  source: org/tiny\n  min_replicas: 0\n"
        "- name: org/new\n  source: org/new\n  min_replicas: 1\n"
    )
    out = ok(ctl(fleet.url, "apply", "-f", "-", "--dry-run", input=specs))
    assert out == "model org/tiny unchanged (dry run)\nmodel org/new created (dry run)\n"
    changed = (
        "- name: org/tiny\n  source: org/tiny\n  min_replicas: 2\n"
        "  engine_args: [--max-model-len, '4096']\n"
    )
    out = ok(ctl(fleet.url, "apply", "-f", "-", "--dry-run", input=changed))
    assert out == (
        "model org/tiny configured (dry run): a new revision, rolled out with new replicas\n"
        "  min_replicas: 0 -> 2\n"
        "  engine_args: (none) -> --max-model-len 4096\n"
    )
    counts = "- name: org/tiny\n  source: org/tiny\n  min_replicas: 0\n  max_surge: 2\n"
    out = ok(ctl(fleet.url, "apply", "-f", "-", "--dry-run", input=counts))
    assert out.splitlines()[0] == (
        "model org/tiny configured (dry run): no engine change: no replica restarts"
    )
    assert ok(ctl(fleet.url, "models", "-o", "json")) == before  # nothing written
    # the controller validates: what it refuses, a dry run refuses alike
    bad = "- name: org/x\n  source: org/x\n  max_surge: 0\n  max_unavailable: 0\n"
    result = ctl(fleet.url, "apply", "-f", "-", "--dry-run", input=bad)
    assert result.returncode == 2 and "max_surge" in result.stderr


def test_config_current_context(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    line = error(llmgw("ctl", "config", "current-context", env=env), 1)
    assert line == (
        f"llmgw ctl: no current context in {tmp_path}/llmgw/config.toml; set one with "
        "`llmgw ctl config use-context NAME`"
    )
    (tmp_path / "llmgw").mkdir()
    (tmp_path / "llmgw" / "config.toml").write_text(
        '[contexts.prod]\ncontroller = "http://a:1"\n[contexts.demo]\ncontroller = "http://b:1"\n'
    )
    ok(llmgw("ctl", "config", "use-context", "prod", env=env))
    assert ok(llmgw("ctl", "config", "current-context", env=env)) == "prod\n"
    demo = {**env, "LLMGW_CONTEXT": "demo"}
    assert ok(llmgw("ctl", "config", "current-context", env=demo)) == "demo\n"
