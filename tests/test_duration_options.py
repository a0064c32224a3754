"""Every duration option of every program takes the same forms (30s, 90m, 1h, 1h30m,
a bare number of seconds) through the one parser, llmgw.durations, and refuses
anything else in the same words. The options are found by walking each program's
parser: a new option that is a time must use it, or be named here as no duration."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable, Iterator

import pytest

from llmgw.durations import BadDuration, duration_arg
from tests.e2e.procs import clean_env, llmgw


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from llmgw.agent.cli import parser as agent
    from llmgw.console.cli import parser as console
    from llmgw.controller.main import parser as controller
    from llmgw.ctl.parser import parser as ctl
    from llmgw.demo import parser as demo
    from llmgw.gateway.main import parser as gateway

    makers: dict[str, Callable[[], argparse.ArgumentParser]] = {
        "controller": controller,
        "agent": agent,
        "gateway": gateway,
        "demo": demo,
        "console": console,
        "ctl": ctl,
    }
    return {name: make() for name, make in makers.items()}


Option = tuple[str, argparse.ArgumentParser, argparse.Action]


def _walk(prog: str, p: argparse.ArgumentParser) -> Iterator[Option]:
    """(program and subcommand words, its parser, action) for every option."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(f"{prog} {name}", sub)
        elif action.option_strings:
            yield prog, p, action


# Numbers that are not times: rates, counts, ports, multiples of an interval.
NOT_DURATIONS = {
    ("controller", "--enroll-rate"),
    ("controller", "--max-connections"),
    ("gateway", "--max-in-flight"),
    ("controller", "--grace-intervals"),
    ("demo", "--nodes"),
    ("demo", "--port"),
    ("ctl credentials", "--uses"),
    ("ctl rollout", "--to-revision"),
    ("ctl limits", "--rpm"),  # requests per minute: the minute is the unit
    ("ctl limits", "--tpm"),
    ("ctl limits", "--budget"),  # tokens, per --per day|month
}

OPTIONS = [option for name, p in _parsers().items() for option in _walk(name, p)]
DURATIONS = [option for option in OPTIONS if option[2].type is duration_arg]
IDS = [f"{prog} {a.option_strings[-1]}" for prog, _, a in DURATIONS]


def test_every_number_option_is_a_duration_or_named_as_none() -> None:
    numbers = {(prog, a.option_strings[-1]) for prog, _, a in OPTIONS if a.type in (float, int)}
    assert numbers == NOT_DURATIONS
    found = {(prog, a.option_strings[-1]) for prog, _, a in DURATIONS}
    assert {
        ("controller", "--stop-grace"),
        ("agent", "--interval"),
        ("gateway", "--wake-timeout"),
        ("gateway", "--request-timeout"),
        ("demo", "--fail-card-after"),
        ("console", "--refresh"),
        ("ctl", "--interval"),
        ("ctl drain", "--force-after"),
    } <= found


@pytest.mark.parametrize(("prog", "p", "action"), DURATIONS, ids=IDS)
def test_each_takes_the_same_forms_and_refuses_in_the_same_words(
    prog: str, p: argparse.ArgumentParser, action: argparse.Action
) -> None:
    assert action.metavar == "DURATION"
    forms = {"5m": 300, "1h": 3600, "1h30m": 5400, "90": 90, "2.5": 2.5, "30s": 30}
    assert {text: p._get_value(action, text) for text in forms} == forms
    for bad in ("abc", "5 minutes", "1x"):
        with pytest.raises(argparse.ArgumentError) as refused:
            p._get_value(action, bad)
        assert str(refused.value) == f"argument {action.option_strings[-1]}: {BadDuration(bad)}"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(llmgw(*args), capture_output=True, text=True, env=clean_env(), timeout=60)


@pytest.mark.parametrize(
    "argv",
    [
        ["gateway", "--controller", "http://127.0.0.1:1", "--wake-timeout", "5m"],
        ["gateway", "--controller", "http://127.0.0.1:1", "--request-timeout", "1h"],
        ["controller", "--stop-grace", "2m", "--replace-after", "1h"],
        ["agent", "--interval", "10s", "--engine-start-timeout", "1h"],
        ["demo", "--fail-card-after", "3m"],
        ["console", "--refresh", "2s"],
        ["ctl", "nodes", "-w", "--interval", "5s"],
    ],
)
def test_each_program_takes_them_on_its_command_line(argv: list[str]) -> None:
    """The option is taken as parsed (`--help` after it: nothing runs)."""
    taken = _run(*argv, "--help")
    assert taken.returncode == 0, taken.stderr
    option = argv[-2]
    refused = _run(*argv[:-1], "five", "--help")
    assert refused.returncode == 2
    assert f"argument {option}: {BadDuration('five')}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_gateway_takes_whole_seconds_for_smg() -> None:
    result = _run(
        "gateway",
        "--controller",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:1",
        "--request-timeout",
        "1.5s",
    )
    assert result.returncode == 2
    assert "--request-timeout must be whole seconds from 1s to 1d" in result.stderr
