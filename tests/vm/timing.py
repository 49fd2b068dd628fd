"""Ratio and latency assertions that follow from the guest's speed.

On the debug kernel (KASAN, lockdep: several times slower) a miss of one of these is an
xfail, raised only after every correctness assertion before it in the test has passed;
anywhere else it fails.  A whole test is marked ``timing`` only when all it asserts is
such a figure (tests/vm/conftest.py)."""

from __future__ import annotations

import os

import pytest


def debug_kernel() -> bool:
    return os.uname().release.endswith("-tacc-debug")


def check(ok: bool, what: str) -> None:
    if ok:
        return
    if debug_kernel():
        pytest.xfail(f"timing, on the debug kernel: {what}")
    raise AssertionError(what)
