"""tacc.ko on the debug kernel: every allocation failure of open, BO_CREATE (host,
device, userptr), VM_BIND, SUBMIT and TRACE_OPEN unwinds cleanly.

/proc/thread-self/fail-nth = N makes the N-th fault-injection site (failslab, and
fail_page_alloc for kernel pages, order 0 and sleeping allocations included) that this
thread passes fail; reading it back gives 0 once the failure was injected.  For each operation, N
runs 1, 2, ... until the operation completes without reaching its N-th allocation:
every allocation on its path has then failed once.  Each failed call must return
-ENOMEM (nothing else), the file must stay usable, no object may outlive its file
(live_objects), and no KASAN/lockdep/ODEBUG/refcount report or kmemleak object may
name tacc.  The allocation-failure warnings the injections print are expected: the
dmesg of this file is kept as dmesg-faults.txt in the run's output and cleared, so
that later tests' dmesg checks see only their own lines (scripts/test-vm scans both).

Needs CONFIG_FAULT_INJECTION + FAILSLAB + FAIL_PAGE_ALLOC + DEBUG_KMEMLEAK: the
debug kernel (`make test-debug`); skipped on Debian's kernel.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tacc.testing.kreports import dmesg_reports, kmemleak_reports, tacc_reports
from test_driver_basic import (
    BO_NO_BIND,
    DEVICE,
    HOST,
    OP_H2D,
    TRACE_CLOSE,
    TRACE_OPEN,
    USERPTR,
    VM_BIND,
    VM_UNBIND,
    Dev,
    TraceClose,
    TraceOpen,
    UserBuf,
    VmBind,
    VmUnbind,
    copy,
    fence,
    live_objects,
    nop,
)

FAILNTH = Path("/proc/thread-self/fail-nth")
DBG = Path("/sys/kernel/debug")
KMEMLEAK = DBG / "kmemleak"
MAX_N = 2000  # allocations per call, debug metadata included (kmemleak, ODEBUG, stack depot)

pytestmark = [
    pytest.mark.debugkernel,
    pytest.mark.skipif(not FAILNTH.exists() or not KMEMLEAK.exists(),
                       reason="needs the debug kernel's fault injection and kmemleak "
                              "(make test-debug)"),
]


def _write(p: Path, v: str) -> None:
    p.write_text(v)


@pytest.fixture(scope="module")
def injection() -> Iterator[None]:
    """failslab and fail_page_alloc armed for fail-nth only (probability 0), quiet,
    sleeping and order-0 allocations included; the dmesg of the module saved."""
    saved: dict[Path, str] = {}
    knobs = {DBG / "failslab/ignore-gfp-wait": "N", DBG / "failslab/verbose": "0",
             DBG / "failslab/probability": "0",
             # highmem stays ignored: user pages (Python's own page faults between
             # the fail-nth write and the ioctl) are never failed, kernel ones are
             DBG / "fail_page_alloc/ignore-gfp-wait": "N",
             DBG / "fail_page_alloc/min-order": "0", DBG / "fail_page_alloc/verbose": "0",
             DBG / "fail_page_alloc/probability": "0"}
    for p, v in knobs.items():
        saved[p] = p.read_text().strip()
        _write(p, v)
    out = os.environ.get("TACC_VM_OUT")
    if out:  # what earlier tests logged stays scanned (scripts/test-vm reads dmesg*.txt)
        Path(out, "dmesg-before-faults.txt").write_text(os.popen("dmesg").read())
    os.system("dmesg -C")
    try:
        yield
    finally:
        for p, v in saved.items():
            _write(p, v)
        text = os.popen("dmesg").read()
        out = os.environ.get("TACC_VM_OUT")
        if out:
            Path(out, "dmesg-faults.txt").write_text(text)
        os.system("dmesg -C")
        Path("/dev/kmsg").write_text("tacc-test: the dmesg before this line is dmesg-faults.txt\n")


class Walk:
    """One operation walked through its allocation failures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failed_at: list[int] = []     # N whose injection made the call fail
        self.survived: list[int] = []      # N injected but the call succeeded anyway
        self.errnos: dict[int, int] = {}   # N -> errno other than ENOMEM (a finding)
        self.total = 0                     # allocations on the successful path


def walk(name: str, op: Callable[[], object], undo: Callable[[object], None]) -> Walk:
    """op() once per N with fail-nth = N; undo(result) after every success."""
    w = Walk(name)
    fd = os.open(FAILNTH, os.O_WRONLY)
    try:
        for n in range(1, MAX_N + 1):
            # fail-nth cannot seek: a fresh file to read it back, opened before arming
            rfd = os.open(FAILNTH, os.O_RDONLY)
            os.write(fd, str(n).encode())
            err, res = 0, None
            try:
                res = op()
            except OSError as e:
                err = e.errno
            left = int(os.read(rfd, 32) or b"0")
            os.write(fd, b"0")
            os.close(rfd)
            if err == 0:
                undo(res)
            if left:        # the N-th allocation never came: the path is covered
                assert err == 0, f"{name}: failed with {os.strerror(err)} without injection"
                w.total = n - left
                return w
            if err == errno.ENOMEM:
                w.failed_at.append(n)
            elif err:
                w.errnos[n] = err
            else:
                w.survived.append(n)
        pytest.fail(f"{name}: still allocating after {MAX_N} injections")
    finally:
        os.write(fd, b"0")
        os.close(fd)
    return w


def settle() -> dict[str, int]:
    deadline = time.monotonic() + 30
    lo = live_objects()
    while any(lo.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        lo = live_objects()
    return lo


def report(ws: list[Walk]) -> str:
    return "; ".join(f"{w.name}: {w.total} allocs, {len(w.failed_at)} -ENOMEM, "
                     f"{len(w.survived)} survived, other errnos {w.errnos}" for w in ws)


def test_open_enomem_unwinds(pf_accel, injection):
    def op() -> int:
        return os.open(pf_accel, os.O_RDWR | os.O_CLOEXEC)

    w = walk("open", op, os.close)
    print(report([w]))
    assert not w.errnos, report([w])
    assert w.failed_at, "no injected failure reached open's error path"
    assert not any(settle().values())
    with Dev(pf_accel) as d:  # the device still opens and runs
        assert d.run([nop()]) == 0


def test_bo_create_and_bind_enomem_unwind(pf_accel, injection):
    ws = []
    buf = UserBuf(65536)
    with Dev(pf_accel) as d:
        for kind, uptr in (("host", 0), ("device", 0), ("userptr", buf.addr)):
            typ = {"host": HOST, "device": DEVICE, "userptr": USERPTR}[kind]
            ws.append(walk(f"bo_create {kind}", lambda t=typ, u=uptr: d.bo(65536, t, userptr=u),
                           lambda r: d.gem_close(r.handle)))
            h = d.bo(65536, typ, flags=BO_NO_BIND, userptr=uptr).handle
            ws.append(walk(f"vm_bind {kind}",
                           lambda h=h: d.ioctl(VM_BIND, VmBind(handle=h)),
                           lambda r: d.ioctl(VM_UNBIND, VmUnbind(handle=r.handle))))
            d.gem_close(h)
        assert d.run([nop()]) == 0  # the file still works after every failure
    print(report(ws))
    # shmem turns a failed inode allocation into -ENOSPC (mm/shmem.c __shmem_get_inode),
    # which BO_CREATE documents; tacc passes it through
    ws[0].errnos = {n: e for n, e in ws[0].errnos.items() if e != errno.ENOSPC}
    assert not any(w.errnos for w in ws), report(ws)
    assert all(w.failed_at for w in ws), report(ws)
    assert not any(settle().values())


def test_submit_enomem_unwinds(pf_accel, injection):
    ws = []
    with Dev(pf_accel) as d:
        h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
        so = d.syncobj()
        for name, cmds, out in (("submit nop", [nop()], 0),
                                ("submit copy+fence", [copy(OP_H2D, h, dv, 4096),
                                                       fence(h, 4096, 7)], 0),
                                ("submit out-syncobj", [nop()], so)):
            ws.append(walk(name, lambda c=cmds, o=out: d.submit(c, out=o),
                           lambda seq: d.wait(seq)))
        assert d.run([copy(OP_H2D, h, dv, 4096)]) == 0
    print(report(ws))
    assert not any(w.errnos for w in ws), report(ws)
    assert all(w.failed_at for w in ws), report(ws)
    assert not any(settle().values())


def test_trace_open_enomem_unwinds(pf_accel, injection):
    with Dev(pf_accel) as d:
        w = walk("trace_open", lambda: d.ioctl(TRACE_OPEN, TraceOpen()),
                 lambda r: d.ioctl(TRACE_CLOSE, TraceClose()))
        assert d.run([nop()]) == 0
    print(report([w]))
    assert not w.errnos, report([w])
    assert w.failed_at, report([w])
    assert not any(settle().values())


def test_zz_no_report_or_leak_names_tacc(pf_accel, injection):
    """After the walks: no checker report and no unreferenced object names tacc."""
    _write(KMEMLEAK, "scan")
    time.sleep(6)  # kmemleak reports objects 5 s old, unreferenced in a scan
    _write(KMEMLEAK, "scan")
    leaks = [r for r in kmemleak_reports(KMEMLEAK.read_text()) if r.names_tacc]
    bad = tacc_reports(dmesg_reports(os.popen("dmesg").read()), allow_injected=True)
    assert not bad, "\n\n".join(r.text for r in bad)
    assert not leaks, "\n\n".join(r.text for r in leaks)
