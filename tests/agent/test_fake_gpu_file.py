"""`--fake-gpus @FILE` (issue 21 item 6): the spec is read from the file at every
scan, so a card fails while the agent runs; a bad file changes nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from llmgw.agent.cli import main
from llmgw.agent.fake_gpus import FakeGpuFile
from llmgw.wire import GpuHealth, NodeReport


def health(source: FakeGpuFile) -> list[tuple[str, GpuHealth]]:
    return [(g.uuid, g.health) for g in source.scan().gpus]


def test_a_card_fails_and_recovers_while_the_file_is_rewritten(tmp_path: Path) -> None:
    spec = tmp_path / "gpus"
    spec.write_text("# two kinds of card\n2xH100-80GB\n\n1xL4-24GB  # the small one\n")
    source = FakeGpuFile("n1", spec)
    first = health(source)
    assert [h for _, h in first] == [GpuHealth.HEALTHY] * 3
    spec.write_text("2xH100-80GB,unhealthy=1\n1xL4-24GB\n")
    second = health(source)
    # Same cards (UUIDs from the node and index), card 1 failed, with the simulated reason.
    assert [u for u, _ in second] == [u for u, _ in first]
    assert [h for _, h in second] == [GpuHealth.HEALTHY, GpuHealth.UNHEALTHY, GpuHealth.HEALTHY]
    assert "simulated fault" in (source.scan().gpus[1].health_reason or "")
    spec.write_text("2xH100-80GB\n1xL4-24GB\n")
    assert health(source) == first


def test_a_file_gone_bad_keeps_the_last_cards_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = tmp_path / "gpus"
    spec.write_text("2xH100-80GB,unhealthy=0\n")
    source = FakeGpuFile("n1", spec)
    good = health(source)
    spec.write_text("2xH100-80GB\nlots of cards\n")
    with caplog.at_level(logging.WARNING, "llmgw.agent.fake_gpus"):
        assert health(source) == good
        assert health(source) == good
        spec.unlink()
        assert health(source) == good
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # once per problem, not once per scan
    assert f"{spec}:2" in said[0] and "COUNTxCLASS" in said[0]
    assert "cannot read it" in said[1]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (None, "cannot read it"),
        ("# nothing\n", "no spec in it"),
        ("2xH100-80GB,unhealthy=5\n", ":1: --fake-gpus"),
    ],
)
def test_a_bad_file_at_start_is_a_usage_error(
    tmp_path: Path, text: str | None, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "gpus"
    if text is not None:
        spec.write_text(text)
    assert main(["--once", "--node", "n", "--fake-gpus", f"@{spec}"]) == 2
    assert words in capsys.readouterr().err


def test_the_file_is_given_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "gpus"
    spec.write_text("1xL4-24GB\n")
    assert main(["--once", "--node", "n", "--fake-gpus", f"@{spec}", "--fake-gpus", "1xL4"]) == 2
    assert "give the file alone" in capsys.readouterr().err
    assert main(["--once", "--json", "--node", "n", "--fake-gpus", f"@{spec}"]) == 0
    report = NodeReport.model_validate_json(capsys.readouterr().out)
    assert [g.gpu_class for g in report.gpus] == ["L4-24GB"]
