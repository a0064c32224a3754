"""Every ctl command that takes a node or a model, given one the controller does not
know: one line on stderr that names it, no traceback, the exit code of the error
table. The commands are read from ctl's own parser, so a new one is covered as
soon as it is added (or fails here until it is said to take no name)."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
from collections.abc import Iterator

import pytest

from llmgw.ctl.checks import check_args
from llmgw.ctl.parser import COMMANDS, parser
from llmgw.errors import NotFound, UsageError, advice
from tests.ctl.ctl_support import Controller, controller_process, ctl

NODE, MODEL = "no-such-node", "no-such-org/no-such-model"
# What stands for each name a positional takes, by its metavar.
UNKNOWN = {"NODE": NODE, "NAME": NODE, "MODEL": MODEL, "KIND": "model"}  # NAME: forget, delete
# Options whose value names an object: each kind of name it takes.
NAMING_OPTIONS = {"--for": [f"node/{NODE}", f"model/{MODEL}"]}
# Commands that take no name at all; any other command must yield a case below.
# (`keys` names client keys by their id: tests/tenants/test_keys_controller.py;
# `limits` names tenants, whose unknown ones tests/tenants/test_usage_controller.py tries.)
NAMELESS = {"status", "models", "replicas", "apply", "config", "keys", "limits", "usage"}
# A word a free positional also takes, which argparse cannot list (its help says it).
VERBS = {("node", "name"): ["forget"]}


def _positional_words(command: str, action: argparse.Action) -> list[list[str]]:
    """The ways to fill one positional, each a list of words ([] leaves it out)."""
    ways: list[list[str]] = [[str(choice)] for choice in action.choices or ()]
    if not action.choices and action.metavar in UNKNOWN:
        ways.append([UNKNOWN[str(action.metavar)]])
    ways += [[verb] for verb in VERBS.get((command, action.dest), [])]
    if action.nargs in ("?", "*"):
        ways.append([])
    return ways


def _valid(argv: list[str]) -> bool:
    """What ctl's parser and checks take (a usage error is no unknown-name case)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            check_args(parser(argv).parse_args(argv))
    except (UsageError, SystemExit):
        return False
    return True


def _cases_for(command: str, sub: argparse.ArgumentParser) -> list[list[str]]:
    own = [a for a in sub._actions if not any(a in g._group_actions for g in _common(sub))]
    positionals = [a for a in own if not a.option_strings]
    flags = [[]] + [
        [a.option_strings[-1]]
        for a in own
        if a.option_strings and a.nargs == 0 and not isinstance(a, argparse._HelpAction)
    ]
    reason = ["--reason", "x"] if "--reason" in sub._option_string_actions else []
    cases = []
    for combo in itertools.product(*(_positional_words(command, a) for a in positionals)):
        words = [w for part in combo for w in part]
        if NODE in words or MODEL in words:
            cases += [[command, *words, *reason, *flag] for flag in flags]
    for option, values in NAMING_OPTIONS.items():
        if option in sub._option_string_actions:
            cases += [[command, option, value] for value in values]
    return [case for case in cases if _valid(case)]


def _common(sub: argparse.ArgumentParser) -> list[argparse._ArgumentGroup]:
    """The connection and output options every command shares (-w among them)."""
    return [g for g in sub._action_groups if (g.title or "").startswith("connection")]


def _cases() -> list[list[str]]:
    top = parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for command in COMMANDS:
        found = _cases_for(command, subs.choices[command])
        assert bool(found) != (command in NAMELESS), (command, found)
        cases += found
    return cases


CASES = _cases()


def test_every_naming_command_has_a_case() -> None:
    commands = {case[0] for case in CASES}
    assert commands == set(COMMANDS) - NAMELESS
    assert ["rollout", "status", MODEL] in CASES
    assert ["node", "forget", NODE] in CASES
    assert ["events", "--for", f"model/{MODEL}"] in CASES


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-unknown")) as c:
        c.report("gpu-a01")
        yield c


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) for c in CASES])
def test_an_unknown_name_is_one_line_and_the_not_found_exit_code(
    fleet: Controller, argv: list[str]
) -> None:
    result = ctl(fleet.url, *argv)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("llmgw ctl: "), lines[0]
    named = NODE if NODE in " ".join(argv) else MODEL.split("/")[-1]
    assert named in lines[0].lower(), lines[0]
    assert result.returncode == advice(NotFound).exit_code != 0, (result.returncode, lines)
