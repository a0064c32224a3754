"""`llmgw controller` timing options reach the settings, and bad ones are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.controller.main import parser, settings_from_args


def test_timing_options_reach_the_settings(tmp_path: Path) -> None:
    args = parser().parse_args(
        [
            "--state-dir",
            str(tmp_path),
            "--backoff-base",
            "0.5",
            "--backoff-cap",
            "8",
            "--reconcile-interval",
            "0.25",
            "--idle-after",
            "90s",
        ]
    )
    settings = settings_from_args(args)
    assert settings.backoff_base_s == 0.5
    assert settings.backoff_cap_s == 8
    assert settings.reconcile_interval_s == 0.25
    assert settings.idle_after_s == 90


def test_defaults_are_the_settings_defaults(tmp_path: Path) -> None:
    settings = settings_from_args(parser().parse_args(["--state-dir", str(tmp_path)]))
    assert (settings.backoff_base_s, settings.backoff_cap_s) == (5.0, 300.0)
    assert settings.reconcile_interval_s == 1.0
    assert settings.idle_after_s == 600.0


@pytest.mark.parametrize(
    "option", ["--backoff-base", "--backoff-cap", "--reconcile-interval", "--idle-after"]
)
def test_refuses_a_non_positive_time(tmp_path: Path, option: str) -> None:
    args = parser().parse_args(["--state-dir", str(tmp_path), option, "0"])
    with pytest.raises(ValueError, match=option):
        settings_from_args(args)
