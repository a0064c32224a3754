"""`llmgw console` options, and the pure formatting helpers."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.console import cli
from llmgw.console.format import age_bucket, size_text, split_width
from llmgw.console.widgets.nodes import natural
from llmgw.present import duration


def test_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGW_CONTROLLER", raising=False)
    args = cli.parse_args(
        ["--controller", "http://h:1", "--token", "t", "--readonly", "--refresh", "0.5"]
    )
    assert (args.controller, args.token, args.readonly, args.refresh) == (
        "http://h:1",
        "t",
        True,
        0.5,
    )
    with pytest.raises(SystemExit):
        cli.parse_args(["--refresh", "0"])


def test_main_builds_the_app_from_options_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(self: Any) -> None:
        seen.update(
            url=self.client.base_url,
            readonly=self.readonly_flag,
            refresh=self.refresh_s,
            auth=self.client._http.headers.get("Authorization"),
        )

    from llmgw.console.app import ConsoleApp

    monkeypatch.setattr(ConsoleApp, "run", fake_run)
    monkeypatch.setenv("LLMGW_CONTROLLER", "http://from-env:7460/")
    monkeypatch.setenv("LLMGW_TOKEN", "env-token")
    assert cli.main(["--readonly"]) == 0
    assert seen == {
        "url": "http://from-env:7460",
        "readonly": True,
        "refresh": 1.0,
        "auth": "Bearer env-token",
    }
    assert cli.main(["--controller", "http://x:1", "--token", "flag"]) == 0
    assert seen["url"] == "http://x:1" and seen["auth"] == "Bearer flag"
    assert seen["readonly"] is False


def test_duration() -> None:
    assert [duration(s) for s in (None, 5, 65, 7980, 2 * 86400 + 3600)] == [
        "-",
        "5s",
        "1m05s",
        "2h13m",
        "2d01h",
    ]


def test_age_buckets_move_rarely() -> None:
    assert {age_bucket(s)[0] for s in (0.1, 3, 9.9)} == {"<10s"}
    assert age_bucket(25)[0] == "20s" and age_bucket(None)[0] == "never"
    assert age_bucket(95) == ("1m00s", "bold red")


def test_split_width_keeps_every_nonzero_segment_visible() -> None:
    cells = split_width([1997, 1, 0, 2], 20)
    assert sum(cells) == 20 and cells[1] == 1 and cells[2] == 0 and cells[3] == 1
    assert split_width([8, 0, 0, 8, 16], 32) == [8, 0, 0, 8, 16]
    assert split_width([0, 0], 10) == [0, 0]


def test_sizes_and_natural_order() -> None:
    assert [size_text(n) for n in (512, 1536, 140 * 2**30)] == ["512 B", "1.5 KiB", "140 GiB"]
    assert sorted(["n10", "n2", "n1"], key=natural) == ["n1", "n2", "n10"]
