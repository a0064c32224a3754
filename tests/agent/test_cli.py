from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.agent.cli import UsageError, main, read_token
from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.report import ReportBuilder, read_boot_id
from llmgw.agent.sample_models import write_model
from llmgw.agent.storage import StorageScanner
from llmgw.wire import GpuHealth, NodeReport


def test_once_json_prints_one_report_without_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_model(tmp_path / "models" / "org" / "m")
    rc = main(
        [
            "--once",
            "--json",
            "--node",
            "gpu-07",
            "--controller",
            "http://127.0.0.1:9",  # nothing listens: must not matter
            "--fake-gpus",
            "8xH100-80GB,unhealthy=3",
            "--fake-gpus",
            "2xA100-40GB",
            "--storage",
            f"{tmp_path / 'models'}:shared",
            "--fabric",
            "ib-a",
        ]
    )
    assert rc == 0
    report = NodeReport.model_validate_json(capsys.readouterr().out)
    assert report.node == "gpu-07" and report.fabrics == ["ib-a"]
    assert len(report.gpus) == 10
    assert [g.index for g in report.gpus if g.health is GpuHealth.UNHEALTHY] == [3]
    assert report.storage_configured and report.storage[0].scope_overridden
    assert [m.name for m in report.storage[0].models] == ["org/m"]


def test_once_without_json_is_a_readable_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models" / "half").mkdir(parents=True)
    rc = main(
        [
            "--once",
            "--node",
            "n",
            "--fake-gpus",
            "2xH100-80GB,unhealthy=1",
            "--storage",
            str(tmp_path / "models"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "GPUs: 2, 1 unhealthy" in out
    assert "not usable half: empty directory" in out


def test_no_storage_says_not_configured(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--json", "--node", "n", "--fake-gpus", "1xL4-24GB"]) == 0
    report = NodeReport.model_validate_json(capsys.readouterr().out)
    assert not report.storage_configured and report.storage == []


def test_the_node_name_is_reported_in_lower_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--once", "--json", "--node", "GPU-A01", "--fake-gpus", "1xL4-24GB"]) == 0
    assert NodeReport.model_validate_json(capsys.readouterr().out).node == "gpu-a01"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--fake-gpus", "lots"], "COUNTxCLASS"),
        (["--node", "bad name"], "a node name is a host name"),
        (["--node", "n1."], "no trailing dot"),
        (["--node", "0"], "reads as an IP address"),
        (["--interval", "0"], "--interval"),
        (["--storage", ":shared"], "--storage"),
        (["--ignore-xids", "a,b", "--once"], "--ignore-xids"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--once", *args]) == 2
    assert words in capsys.readouterr().err


def test_token_from_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_AGENT_TOKEN", "from-env")
    assert read_token(None) == "from-env"
    f = tmp_path / "token"
    f.write_text("# agent token\n\nnode-a s3cret\n")
    assert read_token(f) == "s3cret"
    f.write_text("\n")
    with pytest.raises(UsageError, match="holds no token"):
        read_token(f)
    with pytest.raises(UsageError, match="cannot read"):
        read_token(tmp_path / "missing")
    monkeypatch.delenv("LLMGW_AGENT_TOKEN")
    assert read_token(None) is None


def test_report_builder_uptime_boot_id_and_derived_fabric(tmp_path: Path) -> None:
    clock = [100.0]
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    for name, text in [
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("link_layer", "InfiniBand"),
        ("lid", "0x5"),
    ]:
        (port / name).write_text(text)
    (port / "gids" / "0").write_text("fec0:0000:0000:0007:0002:c903:00f1:1234")
    b = ReportBuilder(
        node="n",
        gpus=FakeGpus("n", [parse_fake_spec("1xH100-80GB")]),
        storage=StorageScanner([]),
        sysfs_root=tmp_path,
        boot_id="b",
        clock=lambda: clock[0],
    )
    clock[0] += 42.5
    report = b.build()
    assert report.uptime_s == 42.5 and report.boot_id == "b"
    assert report.fabrics == ["ib-fec0:0000:0000:0007"]
    assert not report.storage_configured


def test_boot_id(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("abc-123\n")
    assert read_boot_id(tmp_path / "boot_id") == "abc-123"
    assert read_boot_id(tmp_path / "missing") == "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_a_clean_exit_and_a_down_controller_is_logged_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The CLI entry point, and only it, turns SIGTERM and SIGINT into a clean stop."""
    env = {**os.environ, "LLMGW_AGENT_TOKEN": ""}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "agent",
            "--node",
            "n1",
            "--interval",
            "0.05",
            "--fake-gpus",
            "1xH100-80GB",
            "--state-dir",
            str(tmp_path / "state"),
            "--controller",
            f"http://127.0.0.1:{free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # Signal once it is running (its first failed try logged), then let several
        # more tries fail (backoff from 25 ms): a slow start on a loaded machine
        # must not be taken for a run.
        assert proc.stderr is not None
        first = ""
        while "cannot reach the controller" not in first:
            first = proc.stderr.readline()
            assert first, "the agent exited before it tried the controller"
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=10)
        err = first + err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert err.count("cannot reach the controller") == 1, err
    assert "stopped" in err
    assert (tmp_path / "state").is_dir()  # the engine supervisor ran there


def test_unwritable_state_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    args = ["--node", "n", "--fake-gpus", "1xL4-24GB", "--state-dir", str(tmp_path / "file" / "s")]
    assert main(args) == 2
    assert "cannot use --state-dir" in capsys.readouterr().err


def test_bad_engine_templates_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "engines.toml"
    bad.write_text("this is = = not toml")
    args = [
        "--node",
        "n",
        "--fake-gpus",
        "1xL4-24GB",
        "--state-dir",
        str(tmp_path / "s"),
        "--engine-templates",
        str(bad),
    ]
    assert main(args) == 2
    assert "not valid TOML" in capsys.readouterr().err


async def test_engine_start_timeout_reaches_the_supervisor(tmp_path: Path) -> None:
    from llmgw.agent.cli import make_engines, parser
    from llmgw.agent.engines import EngineSupervisor

    limits = ["--engine-start-timeout", "90", "--engine-start-stall", "120"]
    args = parser().parse_args(["--node", "n", "--state-dir", str(tmp_path / "s"), *limits])
    builder = ReportBuilder(
        node="n",
        gpus=FakeGpus("n", [parse_fake_spec("1xH100-80GB")]),
        storage=StorageScanner([]),
        boot_id="b",
    )
    engines = make_engines(args, builder)
    assert isinstance(engines, EngineSupervisor)
    try:
        assert engines.settings.start_timeout_s == 90.0
        assert engines.settings.start_stall_s == 120.0
    finally:
        await engines.close()
    default = parser().parse_args(["--node", "n"])
    assert default.engine_start_timeout == 1800.0
    assert default.engine_start_stall == 600.0


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--engine-start-timeout", "0", "--engine-start-timeout must be a positive"),
        # what is no duration at all, the one duration parser refuses (llmgw.durations)
        ("--engine-start-timeout", "nan", "argument --engine-start-timeout: 'nan' is not a"),
        ("--engine-start-stall", "-5", "argument --engine-start-stall: '-5' is"),
        ("--engine-start-stall", "nan", "argument --engine-start-stall: 'nan' is not a"),
    ],
)
def test_engine_start_limits_out_of_range_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str
) -> None:
    state = tmp_path / "s"
    args = ["--node", "n", "--fake-gpus", "1xL4-24GB", "--state-dir", str(state), flag, value]
    try:
        code = main(args)
    except SystemExit as parser_exit:  # argparse refused the value
        code = int(str(parser_exit.code))
    assert code == 2
    assert said in capsys.readouterr().err
    assert not (state / "engines.json").exists()
