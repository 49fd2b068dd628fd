"""Device-layer tests: the tacc QEMU model driven through qtest, no guest kernel.

One QEMU per session (plus one per extra configuration); each test starts
from a function reset and re-programs what it needs.
"""

import os

import pytest
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import Tacc

HOST_MAP = 0x2000_0000  # identity-map guest RAM 0 .. 512 MiB in context 0
DEVMEM = 256 << 20


def map_ctx0(d: Tacc):
    return d.map_default(HOST_MAP, DEVMEM)


@pytest.fixture(scope="session")
def dev():
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    # TACC_DEVICE_PROPS=x-host-slice=65536: every copy/eltwise above 64 KiB takes
    # the sliced host-work path; the suite must give identical results
    extra = os.environ.get("TACC_DEVICE_PROPS", "")
    d = Tacc("sriov-max-vfs=4" + ("," + extra if extra else ""))
    d.root0 = map_ctx0(d)
    yield d
    d.close()


@pytest.fixture
def pf(dev):
    """The PF after a function reset: enabled, 4 queues, context 0 mapped."""
    if dev.vfs:
        dev.enable_vfs(0)
    dev.pf.reset()
    dev.pf.set_ptbr(0, dev.root0)
    dev.reset_alloc()
    return dev.pf
