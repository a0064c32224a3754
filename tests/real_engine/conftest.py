"""The real-engine tests walk one cluster through steps in order: once a step fails,
the steps after it are skipped (they would only fail for the same reason)."""

from __future__ import annotations

from typing import Any

import pytest

FAILED = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and item.parent is not None:
        item.parent.stash[FAILED] = item.name


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.parent is not None and FAILED in item.parent.stash:
        pytest.skip(f"an earlier step failed: {item.parent.stash[FAILED]}")
