"""tacc.ko in the guest: SR-IOV acceptance.

VFs appear with sriov_numvfs, each in its own IOMMU group with its own accel
node; each VF sees only its device-memory window (the driver cannot express
an address outside it: commands carry handles and offsets, and BOs are
allocated inside the window; the device's DEVMEM_RANGE fault beyond the
window is checked by tests/device); VF windows do not overlap each other or
PF allocations (data written through one function is not changed by another).
"""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest
from test_driver_basic import (
    BO_NO_BIND,
    DEVICE,
    OP_D2H,
    OP_H2D,
    P_DEVMEM,
    P_FUNC,
    Dev,
    copy,
    dmesg_problems,
    live_objects,
    nop,
    pf_sysfs,
    wait_accel_node,
)


@pytest.fixture
def vfs():
    pci = pf_sysfs()
    if int((pci / "sriov_totalvfs").read_text()) < 2:
        pytest.skip("no SR-IOV")
    before = (pci / "sriov_numvfs").read_text().strip()  # VFS=N boots have N already
    (pci / "sriov_numvfs").write_text("0")
    (pci / "sriov_numvfs").write_text("4")
    try:
        yield sorted(p.resolve() for p in pci.glob("virtfn*"))
    finally:
        (pci / "sriov_numvfs").write_text("0")
        if before != "0":
            (pci / "sriov_numvfs").write_text(before)  # as the boot had them


def fill(d: Dev, dv: int, size: int, value: int, chunk: int = 4 << 20) -> None:
    h = d.bo(chunk).handle
    m = d.map(h, chunk)
    m[:] = bytes([value]) * chunk
    m.close()
    for off in range(0, size, chunk):
        assert d.run([copy(OP_H2D, h, dv, min(chunk, size - off), doff=off)]) == 0
    d.gem_close(h)


def check(d: Dev, dv: int, size: int, value: int, chunk: int = 4 << 20) -> None:
    h = d.bo(chunk).handle
    for off in range(0, size, chunk):
        n = min(chunk, size - off)
        assert d.run([copy(OP_D2H, dv, h, n, soff=off)]) == 0
        m = d.map(h, chunk)
        a = np.frombuffer(m, dtype=np.uint8, count=n)
        assert (a == value).all(), f"offset {off}: found {np.unique(a)[:4]}"
        del a
        m.close()
    d.gem_close(h)


def test_vfs_groups_nodes(vfs):
    pci = pf_sysfs()
    assert len(vfs) == 4
    groups = {(pci / "iommu_group").resolve().name} if (pci / "iommu_group").exists() else set()
    nodes = set()
    for i, vf in enumerate(vfs):
        if (vf / "iommu_group").exists():
            g = (vf / "iommu_group").resolve()
            assert [p.name for p in (g / "devices").iterdir()] == [vf.name]
            groups.add(g.name)
        node = wait_accel_node(vf)
        nodes.add(node)
        with Dev(node) as d:
            assert d.param(P_FUNC) == i + 1
            assert d.run([nop(tag=i)]) == 0
    assert len(nodes) == 4
    if (pci / "iommu_group").exists():
        assert len(groups) == 5, groups


def test_vf_memory_isolation(vfs):
    """Each VF fills its whole window; no other function's writes show up in it."""
    a_node, b_node = wait_accel_node(vfs[0]), wait_accel_node(vfs[1])
    with Dev(a_node) as a, Dev(b_node) as b, Dev(wait_accel_node(pf_sysfs())) as pf:
        win = a.param(P_DEVMEM)
        assert win == b.param(P_DEVMEM) and 0 < win < pf.param(P_DEVMEM)
        # nothing beyond the window can be allocated, let alone addressed
        with pytest.raises(OSError) as e:
            a.bo(win + (2 << 20), DEVICE, flags=BO_NO_BIND)
        assert e.value.errno in (errno.ENOSPC, errno.EINVAL, errno.ENOMEM)
        da, db = a.bo(win, DEVICE).handle, b.bo(win, DEVICE).handle
        fill(a, da, win, 0xA1)
        fill(b, db, win, 0xB2)
        # the PF's own allocations avoid the VF windows
        pfd = pf.bo(64 << 20, DEVICE).handle
        fill(pf, pfd, 64 << 20, 0xCF)
        check(a, da, win, 0xA1)
        check(b, db, win, 0xB2)
    deadline = time.monotonic() + 10
    while any(live_objects(vfs[0]).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(live_objects(vfs[0]).values())
    assert not dmesg_problems()
