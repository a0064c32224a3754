"""`--lease-ttl` reaches the settings and a bad one is refused; `migrate` will not
write a PostgreSQL store that a running controller leads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.controller.main import parser, settings_from_args
from llmgw.controller.store import Store
from tests.e2e.procs import clean_env, llmgw
from tests.leader.ha import HaCluster


def test_the_lease_ttl_option(tmp_path: Path) -> None:
    args = ["--store", "postgresql://db/llmgw", "--advertise-url", "https://ctl-a:7460"]
    settings = settings_from_args(parser().parse_args([*args, "--lease-ttl", "3"]))
    assert settings.lease_ttl_s == 3 and settings.url == "https://ctl-a:7460"
    assert settings_from_args(parser().parse_args(args)).lease_ttl_s == 8
    for bad in ("0", "-1", "100000"):
        with pytest.raises(ValueError, match="--lease-ttl"):
            settings_from_args(parser().parse_args([*args, "--lease-ttl", bad]))


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
