"""tacc.ko in the guest: MMU faults, hang recovery, -EAGAIN, netlink events, runtime PM."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from pathlib import Path

import pytest
from tacc.guest_qmp import PF_QOM
from test_driver_basic import (
    BIND_READONLY,
    BO_NO_BIND,
    DEVICE,
    OP_H2D,
    P_CTX,
    P_CTX_FAULT_ADDR,
    P_CTX_FAULTS,
    P_CTX_RESETS,
    VM_BIND,
    Dev,
    VmBind,
    copy,
    dmesg_problems,
    fence,
    nop,
    pf_sysfs,
)

HANG_PROP = "x-fi-hang-engine"  # the device's fault injection: engine 0 stops completing

# ---------------------------------------------------------- generic netlink ---
NETLINK_GENERIC, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 16, 270, 1
GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 0x10, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME, CTRL_ATTR_MCAST_GROUPS = 1, 2, 7
A_EVENT, A_DEVICE, A_CTX, A_PID, A_QUEUE, A_ADDR, A_INFO, A_TAG = 1, 2, 4, 5, 6, 7, 8, 9
EV_MMU_FAULT, EV_HANG, EV_RESET, EV_PM = 1, 2, 3, 5


def _attrs(buf: bytes) -> dict[int, bytes]:
    out, i = {}, 0
    while i + 4 <= len(buf):
        ln, typ = struct.unpack_from("<HH", buf, i)
        if ln < 4:
            break
        out[typ & 0x3FFF] = buf[i + 4:i + ln]
        i += (ln + 3) & ~3
    return out


class TaccEvents:
    """Subscriber of the "tacc" generic netlink family's "events" group."""

    def __init__(self) -> None:
        self.s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.s.bind((0, 0))
        name = b"tacc\0"
        attr = struct.pack("<HH", 4 + len(name), CTRL_ATTR_FAMILY_NAME) + name
        attr += b"\0" * (-len(attr) % 4)
        msg = struct.pack("<BBH", CTRL_CMD_GETFAMILY, 1, 0) + attr
        self.s.send(struct.pack("<IHHII", 16 + len(msg), GENL_ID_CTRL, 1, 1, 0) + msg)
        reply = self.s.recv(65536)
        attrs = _attrs(reply[20:])
        self.family = struct.unpack("<H", attrs[CTRL_ATTR_FAMILY_ID][:2])[0]
        groups = _attrs(attrs[CTRL_ATTR_MCAST_GROUPS])
        gid = None
        for g in groups.values():
            ga = _attrs(g)
            if ga.get(1, b"").rstrip(b"\0") == b"events":
                gid = struct.unpack("<I", ga[2][:4])[0]
        assert gid is not None
        self.s.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, gid)

    def events(self, timeout: float = 5.0) -> list[dict[int, bytes]]:
        out = []
        self.s.settimeout(timeout)
        try:
            while True:
                data = self.s.recv(65536)
                i = 0
                while i + 16 <= len(data):
                    ln, typ = struct.unpack_from("<IH", data, i)
                    if typ == self.family:
                        out.append(_attrs(data[i + 20:i + ln]))
                    i += (ln + 3) & ~3
                self.s.settimeout(0.5)
        except TimeoutError:
            pass
        return out

    def close(self) -> None:
        self.s.close()


def u32a(a: dict[int, bytes], k: int) -> int:
    return struct.unpack("<I", a[k][:4])[0]


def u64a(a: dict[int, bytes], k: int) -> int:
    return struct.unpack("<Q", a[k][:8])[0]


# -------------------------------------------------------------------- tests ---
def test_fault_goes_to_own_context(pf_accel):
    ev = TaccEvents()
    with Dev(pf_accel) as a, Dev(pf_accel) as b:
        h = a.bo(8192)
        d = a.bo(8192, DEVICE, flags=BO_NO_BIND)
        r = a.ioctl(VM_BIND, VmBind(handle=d.handle, flags=BIND_READONLY))
        # b keeps working alongside
        hb = b.bo(4096)
        seq_b = b.submit([fence(hb.handle, 0, 5)], queue=1)
        st = a.run([copy(OP_H2D, h.handle, d.handle, 4096, tag=0xfa17)])
        assert st == -errno.EFAULT
        assert b.wait(seq_b) == 0
        assert a.param(P_CTX_FAULTS) == 1
        assert a.param(P_CTX_FAULT_ADDR) == r.va
        assert b.param(P_CTX_FAULTS) == 0
        # the context still works after its fault
        assert a.run([nop()]) == 0
        ctx_a = a.param(P_CTX)
        evs = [e for e in ev.events() if u32a(e, A_EVENT) == EV_MMU_FAULT]
    ev.close()
    assert evs, "no MMU fault netlink event"
    e = evs[0]
    assert u32a(e, A_CTX) == ctx_a
    assert u32a(e, A_PID) == os.getpid()
    assert u64a(e, A_ADDR) == r.va
    assert u64a(e, A_TAG) == 0xfa17
    assert e[A_DEVICE].rstrip(b"\0").decode() == pf_sysfs().name


def test_hang_recovery(pf_accel):
    qmp_mod = pytest.importorskip("tacc.guest_qmp")
    try:
        qmp = qmp_mod.GuestQMP()
    except FileNotFoundError:
        pytest.skip("no guest QMP port")
    ev = TaccEvents()
    timeout_ms = int(Path("/sys/module/tacc/parameters/job_timeout_ms").read_text())
    with Dev(pf_accel) as a, Dev(pf_accel) as b:
        h = a.bo(8192)
        d = a.bo(8192, DEVICE)
        qmp.execute("qom-set", path=PF_QOM,
                    property="x-fi-hang-engine", value=0)
        try:
            t0 = time.monotonic()
            hung = a.submit([copy(OP_H2D, h.handle, d.handle, 4096, tag=0xdead)], queue=0)
            # queue 0 fills up behind the hung job: -EAGAIN, never a block
            queued, eagain = [], False
            for _ in range(200):
                try:
                    queued.append(a.submit([nop()], queue=0))
                except OSError as e:
                    assert e.errno == errno.EAGAIN
                    eagain = True
                    break
            assert eagain
            # another context on another queue keeps completing
            hb = b.bo(4096)
            for i in range(3):
                assert b.run([fence(hb.handle, 0, i)], queue=1) == 0
            st = a.wait(hung, timeout_s=30)
            elapsed = time.monotonic() - t0
        finally:
            qmp.execute("qom-set", path=PF_QOM,
                        property="x-fi-hang-engine", value=-1)
        assert st == -errno.ETIMEDOUT
        assert elapsed < timeout_ms / 1000 * 3 + 10
        assert a.param(P_CTX_RESETS) == 1
        assert b.param(P_CTX_RESETS) == 0
        # the innocent jobs behind it were replayed and complete
        assert all(a.wait(s, 30) == 0 for s in queued)
        # the queue takes work again; a job's slot is returned when the scheduler frees
        # it, after its fence: EAGAIN meanwhile is the documented back-pressure (seen on the
        # debug kernel, where free_job runs late), so retry as a client does
        deadline = time.monotonic() + 30
        while True:
            try:
                seq = a.submit([copy(OP_H2D, h.handle, d.handle, 4096)], queue=0)
                break
            except OSError as e:
                assert e.errno == errno.EAGAIN and time.monotonic() < deadline
                time.sleep(0.05)
        assert a.wait(seq, 30) == 0
    kinds = [u32a(e, A_EVENT) for e in ev.events(2)]
    ev.close()
    qmp.close()
    assert EV_HANG in kinds and EV_RESET in kinds
    assert not dmesg_problems()


def _rpm(pci: Path) -> str:
    return (pci / "power/runtime_status").read_text().strip()


def test_runtime_pm(pf_accel):
    pci = pf_sysfs()
    tr = Path("/sys/kernel/tracing")
    (tr / "events/tacc/tacc_pm/enable").write_text("1")
    (tr / "trace").write_text("")
    s0 = int((pci / "tacc/pm_suspends").read_text())
    r0 = int((pci / "tacc/pm_resumes").read_text())
    try:
        deadline = time.monotonic() + 30
        while _rpm(pci) != "suspended" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _rpm(pci) == "suspended"
        assert (pci / "power_state").read_text().strip() == "D3hot"
        with Dev(pf_accel) as d:
            h = d.bo(4096)
            assert d.run([fence(h.handle, 0, 9)]) == 0
            assert _rpm(pci) == "active"
        deadline = time.monotonic() + 30
        while _rpm(pci) != "suspended" and time.monotonic() < deadline:
            time.sleep(0.2)
        s1 = int((pci / "tacc/pm_suspends").read_text())
        r1 = int((pci / "tacc/pm_resumes").read_text())
        assert r1 - r0 >= 1 and s1 - s0 >= 1
        lines = (tr / "trace").read_text().splitlines()
        assert sum("from=D0 to=D3" in ln for ln in lines) == s1 - s0
        assert sum("from=D3 to=D0" in ln for ln in lines) == r1 - r0
    finally:
        (tr / "events/tacc/tacc_pm/enable").write_text("0")


def test_hang_leaves_a_devcoredump(pf_accel):
    """A job timeout leaves a devcoredump of the PF in /sys/class/devcoredump (before the
    queue reset): the registers, queue 0 hung, the job with its command and tag."""
    from tacc.devcoredump import dumps_of, parse
    from tacc.testing.guest_qmp import GuestQMP

    pci = pf_sysfs().name
    for old in dumps_of(pci):
        (old / "data").write_text("1")  # earlier dumps (test_hang_recovery's) freed
    with GuestQMP() as qmp, Dev(pf_accel) as a:
        h, d = a.bo(8192), a.bo(8192, DEVICE)
        qmp.qom_set(PF_QOM, HANG_PROP, 0)
        try:
            hung = a.submit([copy(OP_H2D, h.handle, d.handle, 4096, tag=0xc0de)], queue=0)
            assert a.wait(hung, timeout_s=30) == -errno.ETIMEDOUT
        finally:
            qmp.qom_set(PF_QOM, HANG_PROP, -1)
        ctx = a.param(P_CTX)
    dumps = dumps_of(pci)
    assert len(dumps) == 1, dumps
    dump = parse((dumps[0] / "data").read_text())
    (dumps[0] / "data").write_text("1")
    assert dump.reason == "job timeout" and dump.device == pci
    assert 0 < dump.time_ns <= time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert dump.registers["FUNC"] == 0 and "STATUS" in dump.registers
    q0 = dump.queues[0]
    assert q0["queue"] == 0 and q0["STATUS"] & 0x4, q0  # TACC_Q_STATUS_HUNG
    assert dump.job["tag"] == "0xc0de" and dump.job["context"] == str(ctx)
    assert dump.job["pid"] == str(os.getpid())
    assert dump.commands == [{"index": 0, "opcode": 1, "flags": dump.commands[0]["flags"],
                              "tag": 0xc0de}]
    assert not dmesg_problems()
