"""`llmgw gateway --max-body SIZE`: the size syntax."""

from __future__ import annotations

import pytest

from llmgw.gateway.main import parser
from llmgw.gateway.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [("32MiB", 32 * 2**20), ("512kib", 512 * 2**10), ("1GiB", 2**30), ("2000000", 2_000_000),
     ("10MB", 10_000_000), (" 64 MiB ", 64 * 2**20)],
)  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "1.5MiB", "3 parsecs", "1e6"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_the_option_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["--controller", "http://c:1", "--max-body", "32MiB"])
    assert args.max_body == 32 * 2**20
    assert format_size(parser().parse_args(["--controller", "http://c:1"]).max_body) == "64MiB"
    with pytest.raises(SystemExit):
        parser().parse_args(["--controller", "http://c:1", "--max-body", "lots"])
    assert "not a size: 'lots'" in capsys.readouterr().err
