"""tacc.fdinfo.parse: the rules of drm-usage-stats.rst that the VM test
(tests/vm/test_fdinfo.py) reads tacc's fdinfo by, on the old and the new key sets."""

from __future__ import annotations

import pytest
from tacc.fdinfo import FdinfoError, parse

GOOD = """pos:\t0
flags:\t02100002
drm-driver:\ttacc
drm-client-id:\t7
drm-pdev:\t0000:01:00.0
drm-engine-queue0:\t123456 ns
drm-engine-queue1:\t0 ns
tacc-jobs-queue0:\t3
drm-total-memory:\t2 MiB
drm-shared-memory:\t0
drm-active-memory:\t0
drm-resident-memory:\t2048 KiB
tacc-memory-device:\t1024 KiB
"""


def test_good_fdinfo() -> None:
    f = parse(GOOD)
    assert (f.driver, f.client_id, f.pdev) == ("tacc", 7, "0000:01:00.0")
    assert f.engines == {"queue0": 123456, "queue1": 0}
    assert f.memory == {"memory": {"total": 2 << 20, "shared": 0, "active": 0,
                                   "resident": 2 << 20}}
    assert f.other["tacc-jobs-queue0"] == "3"


@pytest.mark.parametrize(("line", "why"), [
    ("drm-jobs-queue0:\t3", "not a key of drm-usage-stats.rst"),  # the old driver's key
    ("drm-memory-device:\t1024 KiB", "deprecated"),  # the old driver's key
    ("drm-engine-queue0:\t12", "not '<uint> ns'"),
    ("drm-total-memory:\t1 GiB", "not '<uint> [KiB|MiB]'"),
    ("drm-client-id:\t-1", "not a uint"),
    ("drm-engine-queue0 12 ns", "not '<key>:<whitespace><value>'"),
])
def test_rule_breaks_are_named(line: str, why: str) -> None:
    with pytest.raises(FdinfoError, match=why.replace("[", r"\[").replace("|", r"\|")):
        parse(GOOD + line + "\n")


def test_driver_is_mandatory() -> None:
    with pytest.raises(FdinfoError, match="drm-driver"):
        parse("drm-engine-queue0:\t1 ns\n")
