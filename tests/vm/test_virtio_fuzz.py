"""The ioctl fuzz on tacc.ko's virtio-tacc node (extras boot, VIRTIO=1): two processes on
one file (a submitter fuzzing every ioctl through hypothesis, a disturber unbinding,
closing, binding and opening other files under it) and fork-heavy openers (children
inheriting the file, submitting, closing and exiting with their jobs in flight).  Every
call returns 0 or an errno docs/uapi.md documents for a virtio node, nothing oopses or
hangs (the harness checks dmesg), and a fresh opener is served afterwards.  The PF's
runs are in test_driver_fuzz.py."""

from __future__ import annotations

import pytest
from tacc.runtime.device import devices
from test_driver_fuzz import VIRTIO_ALLOWED, run_fork_openers, run_two_process_fuzz


def _virtio_node() -> str:
    found = [d for d in devices() if d.virtio]
    if not found:
        pytest.skip("no virtio-tacc function in this boot (VIRTIO=1; extras has one)")
    return found[0].devnode


def test_fuzz_two_processes_virtio():
    # no function resets: the disturber's FLR is the PF's (the virtio function has none)
    run_two_process_fuzz(_virtio_node(), 15, 0, "fuzz-2proc-virtio", VIRTIO_ALLOWED)


def test_fork_heavy_openers_virtio():
    run_fork_openers(_virtio_node(), 3, 4, "fork-openers-virtio")


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fuzz_two_processes_virtio_long():
    run_two_process_fuzz(_virtio_node(), 450, 0, "fuzz-2proc-virtio-long", VIRTIO_ALLOWED)


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_fork_heavy_openers_virtio_long():
    run_fork_openers(_virtio_node(), 60, 8, "fork-openers-virtio-long")
