"""Shared by every test layer: the `long` marker.

Tests marked ``@pytest.mark.long`` (5k-call fuzzing, reload loops, sweeps) run
only under `make test-long` (TACC_LONG=1) or with ``-m long``.
"""

from __future__ import annotations

import os

import pytest

# The one reason a `long` test is skipped with: scripts/test-vm allows exactly this reason
# (keyed on the marker, not on the word "long" in some other reason).
LONG_SKIP_REASON = "long test: make test-long"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long: heavy test, run by `make test-long` only")
    config.addinivalue_line("markers", "debugkernel: also run by `make test-debug` (on the "
                            "debug kernel), long or not")
    config.addinivalue_line("markers", "timing: asserts a performance ratio or a finding that "
                            "follows from timing; on the debug kernel (KASAN, lockdep: several "
                            "times slower) it runs, and a failure is an xfail")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TACC_LONG") or "long" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason=LONG_SKIP_REASON)
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
