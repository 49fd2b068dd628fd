"""tacc.ko in the guest: isolation and lifetimes of the trace/sample rings, the MMU-fault
context lookup, WAIT's status of a failed job, and who may open what (items
1, 2, 5, 8; docs/uapi.md "Threat model").

Adversarial: the unprivileged side runs in a forked child that has dropped to
`tacc-user` (group `tacc`, no capabilities) and is driven over a pipe (UserProc); a
touch of a mapping that must be gone runs in a grandchild whose signal is checked.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import mmap
import os
import pwd
import signal
import struct
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

import pytest
from tacc.runtime import uapi as ru
from tacc.testing.unpriv import drop_to_tacc_user
from test_driver_basic import (
    BIND_READONLY,
    BO_NO_BIND,
    DEVICE,
    OP_H2D,
    TRACE_ADVANCE,
    TRACE_CLOSE,
    TRACE_OPEN,
    VM_BIND,
    Dev,
    TraceAdvance,
    TraceClose,
    TraceOpen,
    VmBind,
    copy,
    dmesg_problems,
    nop,
    pf_sysfs,
    wait_accel_node,
)
from test_driver_recovery import EV_MMU_FAULT, TaccEvents, u32a

PERIOD_NS = 1_000_000


# ------------------------------------------------------------------ helpers ---
def errno_of(fn: Callable[[], Any]) -> int:
    try:
        fn()
    except OSError as e:
        return int(e.errno or 0)
    return 0


def trace_open(fd: int, entries: int = 64) -> TraceOpen:
    a = TraceOpen(entries=entries)
    fcntl.ioctl(fd, TRACE_OPEN, a, True)
    return a


def trace_advance(fd: int, cons: int = 0) -> TraceAdvance:
    a = TraceAdvance(cons=cons)
    fcntl.ioctl(fd, TRACE_ADVANCE, a, True)
    return a


def trace_close(fd: int) -> None:
    fcntl.ioctl(fd, TRACE_CLOSE, TraceClose(), True)


def sample_open(fd: int, entries: int = 4) -> ru.drm_tacc_sample_open:
    a = ru.drm_tacc_sample_open(period_ns=PERIOD_NS, entries=entries)
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_OPEN, a, True)
    return a


def sample_advance(fd: int, cons: int = 0) -> ru.drm_tacc_sample_advance:
    a = ru.drm_tacc_sample_advance(cons=cons)
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_ADVANCE, a, True)
    return a


def sample_close(fd: int) -> None:
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_CLOSE, ru.drm_tacc_sample_close(), True)


RINGS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[[int], None]]] = {
    "trace": (trace_open, trace_advance, trace_close),
    "sample": (sample_open, sample_advance, sample_close),
}


def ring_map(fd: int, opened: Any) -> mmap.mmap:
    return mmap.mmap(fd, opened.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ,
                     offset=opened.mmap_offset)


def touch(mm: mmap.mmap, needle: bytes = b"") -> tuple[str, int]:
    """Read all of @mm in a grandchild: ("signal", signo) if it died of one, else
    ("exit", 1 if @needle was found in the mapping else 0)."""
    pid = os.fork()
    if pid == 0:
        try:
            data = mm[:]  # every page
            os._exit(1 if needle and needle in data else 0)
        finally:
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return ("signal", os.WTERMSIG(st))
    return ("exit", os.WEXITSTATUS(st))


class UserProc:
    """A forked child that dropped to tacc-user (group tacc, no capabilities), or to
    another unprivileged @user of the group (tacc-user2); with @caps, keeping those
    capabilities only (tacc.testing.unpriv.CAP_PERFMON: a tool given CAP_PERFMON).

    call(fn, *args) runs the module-level function fn(state, *args) in it and returns
    its result; an OSError there comes back as ("errno", n)."""

    def __init__(self, user: str = "tacc-user", caps: tuple[int, ...] = ()) -> None:
        self.conn, child = Pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 0
            try:
                self.conn.close()
                drop_to_tacc_user(user, caps)
                _serve(child)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        child.close()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.conn.send((fn, args))
        ok, val = self.conn.recv()
        if not ok:
            raise AssertionError(f"{fn.__name__} in tacc-user's process: {val}")
        return val

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.conn.close()
        os.waitpid(self.pid, 0)


def _serve(conn: Connection) -> None:
    state: dict[str, Any] = {}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        fn, args = msg
        try:
            conn.send((True, fn(state, *args)))
        except OSError as e:
            conn.send((True, ("errno", e.errno)))
        except Exception as e:  # noqa: BLE001
            conn.send((False, repr(e)))


# functions run in tacc-user's process (state: that process's fds and mappings)
def u_ids(state: dict[str, Any]) -> tuple[int, int, list[int]]:
    return os.getuid(), os.geteuid(), os.getgroups()


def u_open(state: dict[str, Any], node: str) -> int:
    state["fd"] = os.open(node, os.O_RDWR | os.O_CLOEXEC)
    return 0


def u_ring_open(state: dict[str, Any], ring: str) -> int:
    a = RINGS[ring][0](state["fd"])
    state[ring] = ring_map(state["fd"], a)
    return 0


def u_ring_advance(state: dict[str, Any], ring: str) -> int:
    RINGS[ring][1](state["fd"])
    return 0


def u_touch(state: dict[str, Any], ring: str) -> tuple[str, int]:
    return touch(state[ring])


def u_netlink_join(state: dict[str, Any]) -> int:
    TaccEvents().close()
    return 0


def u_close(state: dict[str, Any]) -> int:
    for k in RINGS:
        if k in state:
            state.pop(k).close()
    os.close(state.pop("fd"))
    return 0


@pytest.fixture
def user() -> Iterator[UserProc]:
    u = UserProc()
    uid, euid, groups = u.call(u_ids)
    assert uid == euid == pwd.getpwnam("tacc-user").pw_uid and groups == [
        grp.getgrnam("tacc").gr_gid]
    yield u
    u.close()


@pytest.fixture(scope="module")
def vf_node() -> Iterator[Path]:
    """One VF's accel node (mode 0660 group tacc, as the guest init sets nodes)."""
    pci = pf_sysfs()
    if int((pci / "sriov_totalvfs").read_text()) < 1:
        pytest.skip("no SR-IOV")
    before = int((pci / "sriov_numvfs").read_text())
    if before == 0:
        (pci / "sriov_numvfs").write_text("1")
    try:
        vf = sorted(p.resolve() for p in pci.glob("virtfn*"))[0]
        node = wait_accel_node(vf)
        os.chown(node, 0, grp.getgrnam("tacc").gr_gid)
        os.chmod(node, 0o660)
        yield node
    finally:
        if before == 0:
            (pci / "sriov_numvfs").write_text("0")


def debugfs_knob(pf_accel: Path, name: str) -> Path:
    """The PF's debugfs file @name: accel/<PCI name>/ (6.12), accel/<minor>/ before."""
    root = Path("/sys/kernel/debug/accel")
    dirs = [root / pf_sysfs().name, root / pf_accel.name.removeprefix("accel")]
    found = [d for d in dirs if (d / "objects").exists()]
    assert found, f"no tacc debugfs directory among {dirs}"
    return found[0] / name


def faulting_copy(d: Dev, tag: int) -> int:
    """Submit a write into a read-only binding: the device's MMU faults, the job fails
    with -EFAULT."""
    h = d.bo(8192)
    dv = d.bo(8192, DEVICE, flags=BO_NO_BIND)
    d.ioctl(VM_BIND, VmBind(handle=dv.handle, flags=BIND_READONLY))
    return d.submit([copy(OP_H2D, h.handle, dv.handle, 4096, tag=tag)])


# ------------------------------------------------- item 1: rings and CLOSE ---
@pytest.mark.parametrize("ring", sorted(RINGS))
def test_ring_mapping_sigbus_after_close(ring: str, pf_accel: Path) -> None:
    """A mapping left behind by CLOSE faults with SIGBUS (read in a child that inherited
    it); a second consumer's new ring never shows through the old mapping; a mapping
    keeps its file, and so its ring, alive after close(fd)."""
    open_, _, close = RINGS[ring]
    with Dev(pf_accel) as a, Dev(pf_accel) as b:
        mm = ring_map(a.fd, open_(a.fd))
        assert touch(mm) == ("exit", 0)  # readable while open
        close(a.fd)
        after_close = touch(mm)
        # a new consumer's ring, same size: its records carry a tag we look for
        mb = ring_map(b.fd, open_(b.fd))
        needle = struct.pack("<Q", 0x15_0A7E_D0C0)
        for _ in range(3):
            assert b.run([nop(tag=0x15_0A7E_D0C0)]) == 0
        if ring == "trace":
            assert needle in mb[:], "the new consumer's ring has no record of its NOPs"
        # ("exit", 1): the new consumer's records showed through the old mapping
        after_reopen = touch(mm, needle)
        assert (after_close, after_reopen) == (("signal", signal.SIGBUS),) * 2, (
            f"old mapping after CLOSE: {after_close}, after a new OPEN: {after_reopen}")
        mm.close()
        # a mapping keeps its file (and so the ring) alive after close(fd) ...
        b.close()
        assert touch(mb) == ("exit", 0)
        with Dev(pf_accel) as c:  # the slot stays taken (root's ring: no take-over)
            assert errno_of(lambda: open_(c.fd)) == errno.EBUSY
        mb.close()  # the last mapping: release frees the slot
    with Dev(pf_accel) as c:  # the slot is free again and works
        mc = ring_map(c.fd, open_(c.fd))
        assert touch(mc) == ("exit", 0)
        mc.close()
        close(c.fd)


def test_ring_mapping_survives_munmap_order(pf_accel: Path) -> None:
    """munmap after CLOSE, CLOSE after munmap, a fork's copy: no leak, no oops."""
    with Dev(pf_accel) as a:
        for _ in range(3):
            t = trace_open(a.fd)
            mm = ring_map(a.fd, t)
            mm.close()
            trace_close(a.fd)
            t = trace_open(a.fd)
            mm = ring_map(a.fd, t)
            trace_close(a.fd)
            mm.close()
    assert not dmesg_problems()


# ------------------------------------ item 5: who may open which ring ----
@pytest.mark.parametrize("ring", sorted(RINGS))
def test_pf_rings_need_perfmon(ring: str, pf_accel: Path, user: UserProc) -> None:
    """tacc-user may use the PF but not see its trace/sample rings (other tenants'
    commands, global counters): OPEN is -EACCES without CAP_PERFMON."""
    assert user.call(u_open, str(pf_accel)) == 0
    assert user.call(u_ring_open, ring) == ("errno", errno.EACCES)
    user.call(u_close)
    with Dev(pf_accel) as root:  # root still may
        RINGS[ring][0](root.fd)
        RINGS[ring][2](root.fd)


def test_vf_sample_ring_open_to_node_user_and_perfmon_takes_over(vf_node: Path,
                                                                 user: UserProc) -> None:
    """On a VF the node's user may open the sample ring (the VF's own counter page, as
    its counters/ files); a CAP_PERFMON opener takes the slot over: the old owner's
    ADVANCE gets -ENODEV and its mapping SIGBUS.  (A VF's trace ring, every command of
    every user of the node, needs CAP_PERFMON: test_isolation_matrix.py::
    test_trace_ring_needs_perfmon_on_every_kind.)"""
    ring = "sample"
    open_, advance, close = RINGS[ring]
    assert user.call(u_open, str(vf_node)) == 0
    assert user.call(u_ring_open, ring) == 0
    assert user.call(u_ring_advance, ring) == 0
    assert user.call(u_touch, ring) == ("exit", 0)
    with Dev(vf_node) as root:
        t = open_(root.fd)  # take-over
        assert user.call(u_ring_advance, ring) == ("errno", errno.ENODEV)
        assert user.call(u_touch, ring) == ("signal", signal.SIGBUS)
        assert user.call(u_ring_open, ring) == ("errno", errno.EBUSY)  # no take-back
        mm = ring_map(root.fd, t)
        assert touch(mm) == ("exit", 0)
        advance(root.fd)
        mm.close()
        close(root.fd)
    user.call(u_close)


def test_netlink_events_need_net_admin(user: UserProc) -> None:
    """Device events name other tenants' pids and fault addresses: joining the
    multicast group needs CAP_NET_ADMIN."""
    assert user.call(u_netlink_join) == ("errno", errno.EPERM)
    TaccEvents().close()  # root joins


# -------------------------- item 2: fault IRQ vs. a context being released ---
def test_fault_lookup_during_context_release(pf_accel: Path) -> None:
    """The MMU-fault IRQ thread looks the faulting context up while its last reference
    is being dropped (debugfs fault_ctx_delay_ms holds the lookup with ctx_lock taken,
    so the release waits for it): no reference is taken on a dying context (before the
    fix: "refcount_t: addition on 0; use-after-free")."""
    knob = debugfs_knob(pf_accel, "fault_ctx_delay_ms")
    before = set(dmesg_problems())
    ev = TaccEvents()
    knob.write_text("1000")
    try:
        d = Dev(pf_accel)
        seq = faulting_copy(d, 0xdead_c7c)
        assert d.wait(seq) == -errno.EFAULT
        d.close()  # last reference: the release runs while the lookup is held
        time.sleep(1.5)
    finally:
        knob.write_text("0")
    evs = [e for e in ev.events(timeout=3) if u32a(e, 1) == EV_MMU_FAULT]
    ev.close()
    assert evs, "no MMU fault event"
    new = [ln for ln in dmesg_problems() if ln not in before]
    assert not new, new
    with Dev(pf_accel) as d2:  # contexts still work
        assert d2.run([nop()]) == 0


# --------------------------------------- item 8: WAIT of a failed job ---
def test_wait_reports_failure_while_job_is_freed(pf_accel: Path) -> None:
    """WAIT on a failed job reports its error at every moment, also while the job is
    being freed (debugfs free_job_delay_ms holds tacc_free_job at the point where the
    job leaves the fence table; before the fix WAIT saw neither fence nor status: 0)."""
    knob = debugfs_knob(pf_accel, "free_job_delay_ms")
    knob.write_text("1000")
    try:
        with Dev(pf_accel) as d:
            seq = faulting_copy(d, 0xbad_0b)
            seen: list[int] = []
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                w = ru.drm_tacc_wait(seqno=seq, timeout_ns=0)
                if errno_of(lambda w=w: fcntl.ioctl(d.fd, ru.DRM_IOCTL_TACC_WAIT, w, True)):
                    continue  # -ETIME: not done yet
                seen.append(int(w.status))
                time.sleep(0.02)
    finally:
        knob.write_text("0")
    assert seen, "the job never completed"
    assert set(seen) == {-errno.EFAULT}, f"WAIT statuses seen: {sorted(set(seen))}"


def u_history(state: dict[str, Any], node: str) -> dict[str, int]:
    """tacc-user: a failed job F, then 300 NOPs over queues 1-3 (more than a 256-entry
    history holds, so F's slot is reused); WAIT's status of F before and after."""
    with Dev(node) as d:
        f = faulting_copy(d, 0xf1)
        out = {"f": d.wait(f)}
        seqs = [d.submit([nop()], queue=1 + i % 3) for i in range(300)]
        out["nops"] = sum(d.wait(s) != 0 for s in seqs)
        out["f_after"] = d.wait(f)
        out["last"] = seqs[-1]
    return out


def test_wait_status_exact_for_every_seqno(pf_accel: Path, user: UserProc) -> None:
    """WAIT never reports success for a failed job the file may still wait on: 300 jobs
    after it, its status is still -EFAULT (before: a 256-slot history, slot reused by a
    later job, and a seqno not found there read 0; so did a slow job freed after a
    failed job 256 seqnos younger)."""
    out = user.call(u_history, str(pf_accel))
    assert out["f"] == -errno.EFAULT and out["nops"] == 0 and out["last"] == 301, out
    assert out["f_after"] == -errno.EFAULT, out


def test_debug_knobs_root_only_and_off(pf_accel: Path) -> None:
    for name in ("fault_ctx_delay_ms", "free_job_delay_ms", "recover_delay_ms",
                 "resume_delay_ms"):
        k = debugfs_knob(pf_accel, name)
        assert k.read_text().strip() == "0"
        assert k.stat().st_mode & 0o777 == 0o600

