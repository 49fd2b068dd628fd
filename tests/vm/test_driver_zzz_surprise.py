"""tacc.ko in the guest: surprise removal of the PF (QMP device_del) with open
files, mappings (BO, counter page, trace ring) and a job stuck in the device.

Runs last (file name): the device is gone afterwards.  Expected: no oops or
WARN; ioctls on the open files fail with -ENODEV; munmap and close are safe;
the stuck job's fence ends; the module can be unloaded.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import time

import pytest
from tacc.guest_qmp import PF_QOM
from test_driver_basic import (
    DEVICE,
    MMAP_COUNTERS,
    MMAP_TRACE,
    OP_H2D,
    TRACE_OPEN,
    Dev,
    TraceOpen,
    copy,
    dmesg_problems,
    nop,
    pf_sysfs,
)
from test_driver_zz_reload import export_sync_file, rmmod_tacc, sync_file_info


def test_surprise_removal(pf_accel):
    mod = pytest.importorskip("tacc.guest_qmp")
    try:
        qmp = mod.GuestQMP()
    except FileNotFoundError:
        pytest.skip("no guest QMP port")
    pci = pf_sysfs()
    if int((pci / "sriov_numvfs").read_text() or 0):
        (pci / "sriov_numvfs").write_text("0")
    d = Dev(pf_accel)
    h = d.bo(8192)
    dv = d.bo(8192, DEVICE)
    bo_map = d.map(h.handle, 8192)
    bo_map[:4] = b"tacc"
    cnt_map = mmap.mmap(d.fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ, offset=MMAP_COUNTERS)
    tr = d.ioctl(TRACE_OPEN, TraceOpen())
    tr_map = mmap.mmap(d.fd, tr.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=MMAP_TRACE)
    assert d.run([nop()]) == 0
    qmp.qom_set(PF_QOM, "x-fi-hang-engine", 0)
    so = d.syncobj()
    stuck = d.submit([copy(OP_H2D, h.handle, dv.handle, 4096, tag=0x5e)], queue=0, out=so)
    sync_fd = export_sync_file(d, so)
    qmp.execute("device_del", id="tacc0")
    deadline = time.monotonic() + 60
    while pci.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pci.exists(), "the PF did not go away"
    qmp.close()

    for call in (lambda: d.run([nop()]), lambda: d.bo(4096), lambda: d.wait(stuck, 5)):
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.ENODEV
    # mappings: BO pages stay readable (shmem); the BAR and ring mappings were
    # zapped by drm_dev_unplug and are not touched; munmap is safe; new mappings of
    # the (gone) counter BAR and trace ring fail with ENODEV
    assert bo_map[:4] == b"tacc"
    for off, size in ((MMAP_COUNTERS, 4096), (MMAP_TRACE, tr.mmap_size)):
        with pytest.raises(OSError) as e:
            mmap.mmap(d.fd, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)
        assert e.value.errno == errno.ENODEV
    bo_map.close()
    cnt_map.close()
    tr_map.close()
    d.close()
    # the stuck job's sync_file outlives the device (issue 14 item 7): it signalled
    # with an error and still names its timeline; closing it lets the module go
    assert select.select([sync_fd], [], [], 30)[0] == [sync_fd]
    status, fences = sync_file_info(sync_fd)
    assert status < 0 and fences == [(f"{pci.name}-q0", "tacc", status)], (status, fences)
    os.close(sync_fd)
    rmmod_tacc()  # retried: the last fences (each holds the module) go just after close
    assert not dmesg_problems(), dmesg_problems()
