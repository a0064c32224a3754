"""`llmgw completion bash`: run for real in bash, names fetched from a real controller."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ctl.ctl_support import ADMIN, Controller, controller_process, llmgw, ok

BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with controller_process(tmp_path_factory.mktemp("ctl-compl")) as c:
        for name in ("gpu-a01", "gpu-a02", "gpu-b01"):
            c.report(name)
        spec = {"name": "org/tiny", "source": "org/tiny", "min_replicas": 0}
        c.admin("POST", "/v1/models", {"models": [spec]})
        yield c


def complete(line: str, url: str, tmp_path: Path) -> list[str]:
    """What bash offers for Tab at the end of `line`, through the generated script."""
    script = tmp_path / "llmgw.bash"
    script.write_text(ok(llmgw("completion", "bash")))
    words = line.split(" ")
    driver = (
        f"source {script}\n"
        f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}\n'
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        "_python_argcomplete llmgw\n"
        "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    env = {
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path),
        "LLMGW_CONTROLLER": url,
        "LLMGW_TOKEN": ADMIN,
    }
    bash = shutil.which("bash")
    assert bash
    out = subprocess.run(
        [bash, "--norc", "-c", driver], capture_output=True, text=True, env=env, timeout=30
    )
    return [w.strip() for w in out.stdout.splitlines() if w.strip()]


def test_bash_completes_node_names_from_the_controller(fleet: Controller, tmp_path: Path) -> None:
    assert complete("llmgw ctl cordon gpu-a", fleet.url, tmp_path) == ["gpu-a01", "gpu-a02"]
    assert complete("llmgw ctl drain gpu-a01 gpu-b", fleet.url, tmp_path) == ["gpu-b01"]
    assert complete("llmgw ctl delete model org/", fleet.url, tmp_path) == ["org/tiny"]
    assert complete("llmgw ctl delete m", fleet.url, tmp_path) == ["model"]
    assert complete("llmgw ctl nodes gpu-b", fleet.url, tmp_path) == ["gpu-b01"]


def test_bash_completes_commands_and_flags(fleet: Controller, tmp_path: Path) -> None:
    assert complete("llmgw ct", fleet.url, tmp_path) == ["ctl"]
    assert complete("llmgw ctl dr", fleet.url, tmp_path) == ["drain"]
    assert complete("llmgw ctl drain --force", fleet.url, tmp_path) == ["--force", "--force-after"]


def test_sort_by_completes_the_columns_of_the_table(fleet: Controller, tmp_path: Path) -> None:
    assert complete("llmgw ctl nodes --sort-by A", fleet.url, tmp_path) == ["AGE"]
    assert complete("llmgw ctl replicas --sort-by I", fleet.url, tmp_path) == ["IDLE"]
    assert complete("llmgw ctl models --sort-by m", fleet.url, tmp_path) == ["model", "min", "max"]


def test_zsh_script_and_bad_shell() -> None:
    assert "#compdef llmgw" in ok(llmgw("completion", "zsh"))
    fish = llmgw("completion", "fish")
    assert fish.returncode == 2 and fish.stdout == ""
    assert fish.stderr == (
        "llmgw completion: no completion for 'fish': bash and zsh are supported "
        '(eval "$(llmgw completion bash)")\n'
    )
