from __future__ import annotations

import pytest

from llmgw.durations import BadDuration, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("90m", 5400),
        ("1h", 3600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("20", 20),
        ("1.5h", 5400),
        (" 45S ", 45),
    ],
)
def test_parses_what_kubectl_takes(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1x", "h", "1h h", "30m1h30m", "1h-", "1 h"])
def test_refuses_anything_else_with_a_message(text: str) -> None:
    with pytest.raises(BadDuration, match="is not a duration: use a number with a unit"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5s", "-3", " -1h30m", "-0.5"])
def test_a_negative_time_is_called_negative(text: str) -> None:
    """Not "not a duration": the form is right, the sign is not."""
    with pytest.raises(BadDuration, match=r"is negative: a duration is 0 or more, e\.g\. 30s"):
        parse_duration(text)


def test_formats_back() -> None:
    assert [format_duration(s) for s in (45, 90, 3600, 5400, 93784)] == [
        "45s",
        "1m30s",
        "1h",
        "1h30m",
        "1d2h",
    ]
