"""The wheel installs one top-level package, `llmgw` (issue 35 item 16).

Distributions with top-level `agent` and `console` packages exist on the package
index; the wheel used to install packages of those names, so that installing either
beside llmgw overwrote or shadowed its code. This builds the wheel from the checkout,
installs it into a fresh virtual environment beside a distribution the test builds
with top-level `agent` and `console` packages (each raising on import, so that any
import of them by llmgw fails loudly), and runs the programs from there.

Everything is offline. The wheel and the other distribution are built with the test
environment's setuptools (a test dependency, without build isolation). llmgw's own
dependencies cannot be installed offline into a fresh environment (pip installs only
from distribution files, and there are none of them here: the test environment has
them installed, not as wheels), so the fresh environment installs the two wheels
without dependencies and sees the test environment's installed packages through a
.pth file. Only the directories listed in it are added: the .pth files inside them,
the editable install's import hook among them, are not run, so the checkout's code
is not reachable from there (checked below).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("agent", "console")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, **kwargs
    )  # type: ignore[call-overload]


def _build(src: Path, dist: Path) -> Path:
    """A wheel of the project in `src`, built offline with this environment's setuptools."""
    result = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            dist,
            src,
        ]
    )
    if (
        result.returncode != 0
        and "No module named" in result.stderr
        and "setuptools" in result.stderr
    ):
        pytest.skip(f"setuptools is not installed here (a test dependency): {result.stderr[-300:]}")
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = dist.glob(f"{src.name.replace('-', '_')}-*.whl")
    return wheel


def _llmgw_source(tmp: Path) -> Path:
    """The checkout's files the wheel is built from, copied as they are (links kept),
    so that building leaves nothing in the checkout."""
    src = tmp / "llmgw"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("llmgw", *TOP_LEVEL):
        shutil.copytree(
            ROOT / folder, src / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    return src


def _squatter_source(tmp: Path) -> Path:
    """Another distribution with top-level `agent` and `console` packages."""
    src = tmp / "squatter"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "squatter"\nversion = "1.0"\n'
        f"[tool.setuptools]\npackages = {json.dumps(list(TOP_LEVEL))}\n"
    )
    for name in TOP_LEVEL:
        (src / name).mkdir()
        (src / name / "__init__.py").write_text(
            f'raise ImportError("the squatter distribution\'s top-level {name!r} was imported")\n'
        )
    return src


def _fresh_venv(tmp: Path) -> tuple[Path, Path]:
    """A virtual environment without system site packages: its python and its bin/."""
    venv = tmp / "venv"
    result = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert result.returncode == 0, result.stderr
    bindir = venv / "bin"
    python = bindir / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site_packages = Path(purelib.stdout.strip())
    # The test environment's installed dependencies (directories only: see the docstring).
    ours = sysconfig.get_paths()
    (site_packages / "test_environment.pth").write_text(
        "".join(f"{p}\n" for p in dict.fromkeys((ours["purelib"], ours["platlib"])))
    )
    return python, bindir


def test_the_wheel_installs_beside_top_level_agent_and_console(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    wheel = _build(_llmgw_source(tmp_path), dist)
    squatter = _build(_squatter_source(tmp_path), dist)
    python, bindir = _fresh_venv(tmp_path)
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            wheel,
            squatter,
        ]
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # Away from the checkout, with nothing of it on the path.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    run = {"cwd": tmp_path, "env": env}

    where = _run(
        [
            python,
            "-c",
            "import importlib.util, json, llmgw.agent, llmgw.console, llmgw.agent.fake_engine\n"
            "print(json.dumps({m: importlib.util.find_spec(m).origin for m in\n"
            "    ('llmgw', 'llmgw.agent', 'llmgw.console', 'agent', 'console')}))",
        ],
        **run,
    )
    assert where.returncode == 0, where.stderr
    origins = {m: Path(o) for m, o in json.loads(where.stdout).items()}
    site_packages = origins["agent"].parents[1]
    assert site_packages.is_relative_to(tmp_path / "venv"), origins  # the squatter's
    for module in ("llmgw", "llmgw.agent", "llmgw.console"):
        assert origins[module] == site_packages / module.replace(".", "/") / "__init__.py"
        assert not origins[module].is_relative_to(ROOT), origins  # the wheel's, not the checkout's
    assert origins["console"] == site_packages / "console" / "__init__.py"

    help_ = _run([bindir / "llmgw", "console", "--help"], **run)
    assert help_.returncode == 0, help_.stdout + help_.stderr
    assert help_.stdout.startswith("usage: llmgw console"), help_.stdout

    demo = subprocess.Popen(
        [
            bindir / "llmgw",
            "demo",
            "--headless",
            "--port",
            "0",
            "--nodes",
            "3",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **run,  # type: ignore[arg-type]
    )
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(demo, lines), daemon=True)
    reader.start()
    try:
        url = _controller_url(demo, lines)
        # The engines the demo starts (`python -m llmgw.agent.fake_engine`, from the
        # fresh environment) come up and serve: asked of the controller through ctl.
        deadline = time.monotonic() + 90
        while True:
            status = _run(
                [bindir / "llmgw", "ctl", "--controller", url, "status", "-o", "json"], **run
            )
            assert status.returncode == 0, status.stdout + status.stderr
            if json.loads(status.stdout)["replicas"]["ready"] > 0:
                break
            assert time.monotonic() < deadline, "no replica ready:\n" + "\n".join(lines)
            time.sleep(1)
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0, "\n".join(lines)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    reader.join(timeout=10)
    out = "\n".join(lines)
    assert "squatter" not in out and "Traceback" not in out, out


def _collect(proc: subprocess.Popen[str], into: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        into.append(line.rstrip("\n"))


def _controller_url(demo: subprocess.Popen[str], lines: list[str]) -> str:
    """The controller's URL, from the demo's banner."""
    deadline = time.monotonic() + 90
    while True:
        for line in list(lines):
            if line.strip().startswith("controller:"):
                return line.split(":", 1)[1].strip()
        assert demo.poll() is None and time.monotonic() < deadline, "\n".join(lines)
        time.sleep(0.2)
