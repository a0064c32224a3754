"""`--lease-ttl` reaches the settings and a bad one is refused; `migrate` will not
write a PostgreSQL store that a running controller leads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.main import advertise_warning, parser, settings_from_args
from llmgw.controller.store import Store
from tests.e2e.procs import clean_env, llmgw
from tests.leader.ha import HaCluster


def test_the_lease_ttl_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--store", "postgresql://db/llmgw", "--advertise-url", "https://ctl-a:7460"]
    settings = settings_from_args(parser().parse_args([*args, "--lease-ttl", "3"]))
    assert settings.lease_ttl_s == 3 and settings.url == "https://ctl-a:7460"
    assert settings_from_args(parser().parse_args(args)).lease_ttl_s == 8
    for bad in ("0", "100000"):
        with pytest.raises(ValueError, match="--lease-ttl"):
            settings_from_args(parser().parse_args([*args, "--lease-ttl", bad]))
    with pytest.raises(SystemExit):  # no duration at all: the parser refuses it
        parser().parse_args([*args, "--lease-ttl", "-1"])
    assert "argument --lease-ttl: '-1'" in capsys.readouterr().err


def test_the_advertised_url(tmp_path: Path) -> None:
    store = ["--store", "postgresql://db/llmgw"]
    tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"]
    local = settings_from_args(parser().parse_args([*store, "--listen", "127.0.0.1:7000"]))
    assert local.url == "http://127.0.0.1:7000" and advertise_warning(local) is None
    secure = settings_from_args(parser().parse_args([*store, "--listen", "[::1]:7000", *tls]))
    assert secure.url == "https://[::1]:7000", "with TLS, others use https"
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-token-1\n")
    public = ["--listen", "0.0.0.0:7000", *tls]
    public += ["--admin-token-file", str(tokens), "--enroll-token-file", str(tokens)]
    public += ["--allow-static-enroll-token"]

    def settings(*extra: str) -> ControllerSettings:
        return settings_from_args(parser().parse_args([*public, *extra]))

    assert "--advertise-url" in (advertise_warning(settings(*store)) or "")
    assert advertise_warning(settings(*store, "--advertise-url", "https://ctl-a:7000")) is None
    one = settings("--state-dir", str(tmp_path))
    assert advertise_warning(one) is None, "a lone SQLite controller is named by no follower"


@pytest.mark.slow
def test_migrate_refuses_a_store_a_controller_leads(tmp_path: Path, pg_url: str) -> None:
    Store(tmp_path / "state").close()
    c = HaCluster(tmp_path / "ha", pg_url, controllers=1)
    try:
        c.start(0, role="leader")
        done = subprocess.run(
            llmgw(
                "controller", "migrate", "--from", f"sqlite:{tmp_path / 'state'}", "--to", pg_url
            ),
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=60,
        )
        assert done.returncode == 2, done
        assert "a controller leads PostgreSQL" in done.stderr and c.urls[0] in done.stderr
        assert "Traceback" not in done.stderr
        assert c.health(0)["role"] == "leader"  # type: ignore[index]
    finally:
        c.close()
