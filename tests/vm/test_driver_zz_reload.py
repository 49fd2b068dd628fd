"""tacc.ko in the guest: unload/load loops with VFs 0 -> 4 -> 0 in between, and what
outlives an unbind and an rmmod (a sync_file of an out-syncobj, a perf event).

Runs last (file name): it unbinds every tacc device.  2 rounds normally,
20 with TACC_LONG=1.
"""

from __future__ import annotations

import ctypes as C
import os
import select
import subprocess
import time
from pathlib import Path

import pytest
from tacc.counters.backends import PERF_ATTR_SIZE, PerfEventAttr, perf_event_open
from test_driver_basic import (
    DEVICE,
    OP_H2D,
    OP_NOP,
    Cmd,
    Dev,
    copy,
    dmesg_problems,
    leak_delta,
    leak_snapshot,
    live_objects,
    nop,
    pf_sysfs,
    record_figures,
    wait_accel_node,
)

ROOT = Path(os.environ.get("TACC_ROOT", "/work/main"))
KO = ROOT / "build/modules" / os.uname().release / "tacc.ko"


def _sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, timeout=120)


def rmmod_tacc(timeout: float = 10) -> None:
    """rmmod tacc, retried briefly: the last fences of closed files are freed by the
    scheduler's workqueue just after the close, and each holds the module."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(["rmmod", "tacc"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"rmmod tacc: {r.stderr.strip()}")
        time.sleep(0.2)


class SyncobjHandle(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("flags", C.c_uint32), ("fd", C.c_int32),
                ("pad", C.c_uint32)]


class SyncFileInfo(C.Structure):
    _fields_ = [("name", C.c_char * 32), ("status", C.c_int32), ("flags", C.c_uint32),
                ("num_fences", C.c_uint32), ("pad", C.c_uint32), ("sync_fence_info", C.c_uint64)]


class SyncFenceInfo(C.Structure):
    _fields_ = [("obj_name", C.c_char * 32), ("driver_name", C.c_char * 32),
                ("status", C.c_int32), ("flags", C.c_uint32), ("timestamp_ns", C.c_uint64)]


SYNCOBJ_HANDLE_TO_FD = (3 << 30) | (C.sizeof(SyncobjHandle) << 16) | (ord("d") << 8) | 0xC1
EXPORT_SYNC_FILE = 1
SYNC_IOC_FILE_INFO = (3 << 30) | (C.sizeof(SyncFileInfo) << 16) | (ord(">") << 8) | 4


def sync_file_info(fd: int) -> tuple[int, list[tuple[str, str, int]]]:
    """SYNC_IOC_FILE_INFO: the file's status and (timeline, driver, status) per fence."""
    import fcntl
    info = SyncFileInfo()
    fcntl.ioctl(fd, SYNC_IOC_FILE_INFO, info, True)
    arr = (SyncFenceInfo * max(1, info.num_fences))()
    info2 = SyncFileInfo(num_fences=info.num_fences, sync_fence_info=C.addressof(arr))
    fcntl.ioctl(fd, SYNC_IOC_FILE_INFO, info2, True)
    return info2.status, [(f.obj_name.decode(), f.driver_name.decode(), f.status)
                          for f in arr[:info2.num_fences]]


def export_sync_file(d: Dev, syncobj: int) -> int:
    return d.ioctl(SYNCOBJ_HANDLE_TO_FD, SyncobjHandle(handle=syncobj,
                                                       flags=EXPORT_SYNC_FILE)).fd


def _perf_open(pci: Path) -> int:
    devid = (int(pci.name[:4], 16) << 16) | (int(pci.name[5:7], 16) << 8) | \
        (int(pci.name[8:10], 16) << 3) | int(pci.name[11], 16)
    d = Path(f"/sys/bus/event_source/devices/tacc_{devid:x}")
    cfg = int((d / "events/h2d_bytes").read_text().strip().split("=")[1].split(",")[0], 16)
    cpu = int((d / "cpumask").read_text().split(",")[0].split("-")[0])
    return perf_event_open(PerfEventAttr(type=int((d / "type").read_text()),
                                         size=PERF_ATTR_SIZE, config=cfg), -1, cpu, -1)


@pytest.mark.skipif(not KO.exists(), reason=f"{KO} missing")
def test_fences_and_perf_events_outlive_unbind_and_rmmod():
    """Issue 14 items 7 and 10: a sync_file of a finished job, one of a job the unbind
    cut, and an open perf event of the PMU survive the unbind (device memory gone):
    poll, SYNC_IOC_FILE_INFO, read and close work and name the right timeline; rmmod
    refuses while a fence lives (its ops are module code) and works once closed."""
    from tacc.guest_qmp import PF_QOM, GuestQMP

    pci = pf_sysfs()
    if int((pci / "sriov_numvfs").read_text() or 0):
        (pci / "sriov_numvfs").write_text("0")
    node = wait_accel_node(pci)
    d = Dev(node)
    done, cut = d.syncobj(), d.syncobj()
    d.wait(d.submit([nop()], out=done), 30)
    h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-fi-hang-engine", 0)  # the unbind (or the timeout) cuts it
        try:
            d.submit([copy(OP_H2D, h, dv, 4096)], out=cut)
            files = [export_sync_file(d, done), export_sync_file(d, cut)]
            pfd = _perf_open(pci)
            assert len(os.read(pfd, 8)) == 8
            d.close()
            Path("/sys/bus/pci/drivers/tacc/unbind").write_text(pci.name)
        finally:
            q.qom_set(PF_QOM, "x-fi-hang-engine", -1)
    try:
        r, _, _ = select.select(files, [], [], 30)
        assert sorted(r) == sorted(files), "a sync_file did not signal at unbind"
        assert len(os.read(pfd, 8)) == 8  # the detached event reads its last value
        os.close(pfd)
        pfd = -1
        rm = subprocess.run(["rmmod", "tacc"], capture_output=True, text=True, timeout=60)
        assert rm.returncode != 0, "rmmod succeeded while a tacc fence was alive"
        for fd, want in zip(files, (1, -1), strict=True):
            status, fences = sync_file_info(fd)
            assert (status > 0) if want > 0 else (status < 0), (status, fences)
            assert [(n, drv) for n, drv, _ in fences] == [(f"{pci.name}-q0", "tacc")], fences
    finally:
        for fd in files:
            os.close(fd)
        if pfd >= 0:
            os.close(pfd)
    rmmod_tacc()
    _sh(f"insmod {KO}")
    wait_accel_node(pci)
    assert not dmesg_problems(), dmesg_problems()


def _rounds() -> int:
    return 20 if os.environ.get("TACC_LONG") else 2


@pytest.mark.skipif(not KO.exists(), reason=f"{KO} missing")
def test_reload_with_vfs():
    pci = pf_sysfs()
    before = leak_snapshot()
    t0 = time.monotonic()
    lives = []
    for _ in range(_rounds()):
        node = wait_accel_node(pci)
        with Dev(node) as d:
            assert d.run([Cmd(opcode=OP_NOP, tag=1)]) == 0
        (pci / "sriov_numvfs").write_text("4")
        vfs = sorted(p.resolve() for p in pci.glob("virtfn*"))
        assert len(vfs) == 4
        for vf in vfs:
            with Dev(wait_accel_node(vf)) as d:
                assert d.run([Cmd(opcode=OP_NOP, tag=2)]) == 0
        (pci / "sriov_numvfs").write_text("0")
        lo = live_objects(pci)
        lives.append(sum(lo.values()))
        assert not any(lo.values()), lo
        rmmod_tacc()
        _sh(f"insmod {KO}")
    wait_accel_node(pci)
    record_figures("reload-long" if _rounds() > 2 else "reload",
                   {"rounds": _rounds(), "wall_s": round(time.monotonic() - t0, 1),
                    "live_objects_max_after_vf_disable": max(lives),
                    "leak_delta": leak_delta(before, leak_snapshot())})
    assert not dmesg_problems()
