"""tacc.ko in the guest: lifetimes and resource limits (driver items 6 and 10).

- a job whose fence a function reset failed never writes its memory afterwards;
- page tables emptied by VM_UNBIND are freed (a bind/unbind loop stays flat; many BOs
  over the VA space: the context's fdinfo tacc-pt-pages returns to its baseline and the
  device walks the same number of PTEs per round, whatever came before);
- a TLB invalidation the device does not complete (x-fi-tlb-inv-stall): the wait sleeps,
  the function is reset before the unbound pages can go, the device does not write
  through its stale entry; a released context's root table and slot wait for that reset;
- USERPTR pins are charged to the process's RLIMIT_MEMLOCK (tacc-user);
- one process takes at most ``max_ctx_per_process`` contexts of a function (tacc-user).

The unbind/rmmod lifetimes (sync_file, perf event) are in test_driver_zz_reload.py.
"""

from __future__ import annotations

import errno
import resource
import threading
import time
from pathlib import Path

from tacc.hw.records import d_fence
from tacc.testing.unpriv import call_as_tacc_user, python_as_tacc_user
from test_driver_basic import (
    BIND_FIXED,
    BO_NO_BIND,
    DEVICE,
    OP_H2D,
    VM_BIND,
    VM_UNBIND,
    Dev,
    VmBind,
    VmUnbind,
    copy,
    dmesg_problems,
    fence,
    live_objects,
    nop,
    pf_sysfs,
    record_figures,
    run_list,
)

GIB = 1 << 30


def _debugfs(pf_accel: Path) -> Path:
    """The function's debugfs directory (6.12 accel: /sys/kernel/debug/accel/<pci>)."""
    d = Path("/sys/kernel/debug/accel") / pf_sysfs().name
    assert d.is_dir(), f"{d} missing"
    return d


# ------------------------------------------------------------- item 10 ------
def test_pagetables_freed_by_unbind(pf_accel):
    """VM_BIND/VM_UNBIND at ever new VAs: the tables emptied by each unbind go back,
    so the device's page-table page count returns to its baseline (the root)."""
    with Dev(pf_accel) as d:
        h = d.bo(8192, flags=BO_NO_BIND).handle
        base = live_objects()["pt_pages"]
        for i in range(8):
            d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED, va=(i + 1) * GIB))
            assert live_objects()["pt_pages"] == base + 2  # one L1 and one L2 table
            d.ioctl(VM_UNBIND, VmUnbind(handle=h))
        after = live_objects()["pt_pages"]
        assert after == base, f"pt_pages {base} -> {after} after 8 bind/unbind"
        # and the context still works: bind again, run a job through the new tables
        d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED, va=3 * GIB))
        assert d.run([fence(h, 0, 0x77)]) == 0
    assert not dmesg_problems()


def _pt_pages(d: Dev) -> int:
    """The context's page-table pages (fdinfo tacc-pt-pages, the root included)."""
    for ln in Path(f"/proc/self/fdinfo/{d.fd}").read_text().splitlines():
        if ln.startswith("tacc-pt-pages:"):
            return int(ln.split()[1])
    raise AssertionError("fdinfo has no tacc-pt-pages")


def _counter(name: str) -> int:
    return int((pf_sysfs() / "counters" / name).read_text())


def test_pagetables_many_bos_back_to_baseline(pf_accel):
    """Rounds of 16 BOs bound at new VAs spread over the 512 GiB space (each its own
    1 GiB region: one level-1 and one level-2 table each), a job writing a fence into each,
    all unbound: the context's tacc-pt-pages is 1 + 2 x 16 while bound and back to its
    baseline after each round, and every round's job costs the device the same TLB misses
    and page-table reads (counters), 3 reads per miss (4 KiB pages), whatever the rounds
    before left."""
    n, rounds = 16, 3
    with Dev(pf_accel) as d:
        hs = [d.bo(8192, flags=BO_NO_BIND).handle for _ in range(n)]
        base = _pt_pages(d)
        assert base == 1, base  # the root
        costs = []
        for r in range(rounds):
            vas = [(1 + r * n + i) * GIB + (i % 8) * (2 << 20) + (r % 4) * 4096
                   for i in range(n)]
            for h, va in zip(hs, vas, strict=True):
                d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED, va=va))
            assert _pt_pages(d) == base + 2 * n
            m0, w0 = _counter("tlb_misses"), _counter("tlb_walk_reads")
            assert d.run([fence(h, 0, 0x100 + r) for h in hs]) == 0
            costs.append((_counter("tlb_misses") - m0, _counter("tlb_walk_reads") - w0))
            for h in hs:
                d.ioctl(VM_UNBIND, VmUnbind(handle=h))
            assert _pt_pages(d) == base, f"round {r}: {_pt_pages(d)} table pages, {base} before"
        assert costs[0][0] >= n and costs[0][1] == 3 * costs[0][0], costs
        assert all(c == costs[0] for c in costs), f"walk cost grew with history: {costs}"
    assert not dmesg_problems()


TLB_STALL = "x-fi-tlb-inv-stall"


def _tlb_debugfs() -> dict[str, int] | None:
    """debugfs tlb (TLB invalidation timeouts and their resets), None without it."""
    f = _debugfs(None) / "tlb"
    if not f.exists():
        return None
    return {k: int(v) for k, v in (ln.split() for ln in f.read_text().splitlines())}


def test_stalled_tlb_invalidation_resets_before_unbinding(pf_accel):
    """The device stops completing TLB invalidations (x-fi-tlb-inv-stall) with a translation
    of a host BO cached: VM_UNBIND of that BO still returns 0 (docs/uapi.md), after
    tacc.ko waited its 10 ms sleeping (voluntary context switches; no spin under a lock)
    and reset the function (function_resets + 1, debugfs tlb), so a LIST job writing
    through the BO's old VA faults instead of reaching its pages through the stale
    entry, and the BO's memory keeps its bytes."""
    from tacc.guest_qmp import PF_QOM, GuestQMP

    resets = pf_sysfs() / "tacc/function_resets"
    with Dev(pf_accel) as d:
        lst = d.bo(1 << 16)  # holds the LIST's descriptors
        lmem = d.map(lst.handle, 1 << 16)
        victim = d.bo(8192)
        vmem = d.map(victim.handle, 8192)
        assert d.run([fence(victim.handle, 0, 0x11)]) == 0  # the device caches its page
        assert int.from_bytes(vmem[:4], "little") == 0x11
        r0, t0 = int(resets.read_text()), _tlb_debugfs()
        q = GuestQMP()
        q.qom_set(PF_QOM, TLB_STALL, True)
        try:
            sw0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            t = time.monotonic()
            d.ioctl(VM_UNBIND, VmUnbind(handle=victim.handle))
            took = time.monotonic() - t
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - sw0
            st = run_list(d, lst.handle, lmem, 4096, [d_fence(victim.va, 0x22)])
        finally:
            q.qom_set(PF_QOM, TLB_STALL, False)
            q.close()
        t1 = _tlb_debugfs()
        record_figures("tlb_inv_stall_unbind", {"unbind_ms": round(took * 1e3, 1),
                                                "voluntary_switches": switches})
        got = int.from_bytes(vmem[:4], "little")
        assert got == 0x11, (f"the device wrote 0x{got:x} through its stale TLB entry "
                             f"after VM_UNBIND (job status {st})")
        assert st != 0, "a LIST job at the unbound VA completed"
        assert int(resets.read_text()) == r0 + 1, "no function reset after the timeout"
        assert t0 is not None and t1 is not None, "no debugfs tlb"
        assert t1["inv_timeouts"] > t0["inv_timeouts"] and t1["resets"] == t0["resets"] + 1, \
            (t0, t1)
        assert t1["leaked_tables"] == t0["leaked_tables"] == 0, t1
        assert took >= 0.01, f"VM_UNBIND took {took * 1e3:.1f} ms: no 10 ms wait"
        # each poll step (<= 100 us) sleeps: a 10 ms wait is 100 switches or more
        assert switches >= 20, f"{switches} voluntary switches in a {took * 1e3:.0f} ms unbind"
        # the context works after the reset
        assert d.run([fence(lst.handle, 0, 0x33)]) == 0
    assert not dmesg_problems()


def _ctx_id(d: Dev) -> int:
    """The file's hardware context (fdinfo tacc-context)."""
    for ln in Path(f"/proc/self/fdinfo/{d.fd}").read_text().splitlines():
        if ln.startswith("tacc-context:"):
            return int(ln.split()[1])
    raise AssertionError("fdinfo has no tacc-context")


def test_stalled_tlb_invalidation_resets_before_context_release(pf_accel):
    """A context whose BO the device translated (a job ran through it) is closed while the
    device completes no TLB invalidation (x-fi-tlb-inv-stall): the unbind of its BO resets
    the function (as above), and the release's root-clear invalidation times out too. Its
    root table is then still held (live pt_pages) and its slot not given to a new context
    while that reset is held (debugfs recover_delay_ms); after the second reset the root
    goes, and a LIST job of the new context through the closed one's VA faults."""
    resets = pf_sysfs() / "tacc/function_resets"
    knob = _debugfs(pf_accel) / "recover_delay_ms"
    delay_s = 1.5
    # kept in D0: a function suspended during the held reset is invalidated by its resume
    control = pf_sysfs() / "power/control"
    old_control = control.read_text().strip()
    control.write_text("on")
    try:
        _release_under_stall(pf_accel, resets, knob, delay_s)
    finally:
        control.write_text(old_control)
    assert not dmesg_problems()


def _release_under_stall(pf_accel, resets: Path, knob: Path, delay_s: float) -> None:
    from tacc.guest_qmp import PF_QOM, GuestQMP

    base = live_objects()["pt_pages"]
    a = Dev(pf_accel)
    try:
        victim = a.bo(8192)
        assert a.run([fence(victim.handle, 0, 0x11)]) == 0  # the device caches its page
        a_id, a_va = _ctx_id(a), victim.va
        assert live_objects()["pt_pages"] == base + 3  # A's root, L1 and L2
    except BaseException:
        a.close()
        raise
    r0, t0 = int(resets.read_text()), _tlb_debugfs()
    assert t0 is not None, "no debugfs tlb"
    q = GuestQMP()
    q.qom_set(PF_QOM, TLB_STALL, True)
    knob.write_text(str(int(delay_s * 1e3)))
    b = None
    try:
        a.close()  # the BO's unbind resets (held delay_s); the release's reset follows
        held = live_objects()["pt_pages"]
        b = Dev(pf_accel)
        b_id = _ctx_id(b)
        deadline = time.monotonic() + 30
        while int(resets.read_text()) < r0 + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        knob.write_text("0")
        q.qom_set(PF_QOM, TLB_STALL, False)
        q.close()
    try:
        r1, t1 = int(resets.read_text()), _tlb_debugfs()
        after = live_objects()["pt_pages"]
        assert held == base + 1, (
            f"pt_pages {base} -> {held} right after the close: the released context's "
            "root was freed before the function was reset")
        assert b_id != a_id, (f"a new context took slot {a_id} while its old TLB "
                              "entries could still be cached")
        assert r1 == r0 + 2, f"function resets {r0} -> {r1}: none for the release's timeout"
        assert t1["resets"] == t0["resets"] + 2 and t1["inv_timeouts"] > t0["inv_timeouts"]
        assert t1["leaked_tables"] == t0["leaked_tables"], (t0, t1)
        assert after == base + 1, f"pt_pages {after} after the reset, {base + 1} expected"
        # the new context reaches nothing through the closed one's VA (its own BO is
        # bound elsewhere: the VA allocator would have given it that VA again)
        lst = b.bo(1 << 16, flags=BO_NO_BIND)
        b.ioctl(VM_BIND, VmBind(handle=lst.handle, flags=BIND_FIXED, va=8 * GIB))
        assert not a_va <= 8 * GIB < a_va + 8192
        lmem = b.map(lst.handle, 1 << 16)
        assert run_list(b, lst.handle, lmem, 4096, [d_fence(a_va, 0x22)]) != 0
        assert b.run([fence(lst.handle, 0, 0x33)]) == 0  # and works
    finally:
        if b is not None:
            b.close()
    # the slot serves again once reset
    with Dev(pf_accel) as c:
        assert _ctx_id(c) == a_id
        h = c.bo(8192).handle
        assert c.run([fence(h, 0, 0x44)]) == 0


def _pins() -> tuple[int, int]:
    vm = dict(ln.split() for ln in Path("/proc/vmstat").read_text().splitlines())
    return int(vm["nr_foll_pin_acquired"]), int(vm["nr_foll_pin_released"])


USERPTR_CODE = """
import errno, sys
from test_driver_basic import Dev, UserBuf, USERPTR
d = Dev(sys.argv[1] if len(sys.argv) > 1 else "NODE")
small = UserBuf(16 << 10)
d.bo(small.size, USERPTR, userptr=small.addr)
big = UserBuf(256 << 10)
try:
    d.bo(big.size, USERPTR, userptr=big.addr)
    print("big-ok")
except OSError as e:
    print("big-errno", e.errno)
two = UserBuf(40 << 10)
try:
    d.bo(two.size, USERPTR, userptr=two.addr)
    print("second-ok")
except OSError as e:
    print("second-errno", e.errno)
"""


def test_userptr_charged_to_memlock(pf_accel):
    """As tacc-user with ulimit -l 64 (KiB): a 16 KiB USERPTR pins, a 256 KiB one fails
    with ENOMEM (docs/uapi.md) and is not charged, so 40 KiB more (56 in all) still fit.
    The pins balance in /proc/vmstat once the process is gone."""
    acq0, rel0 = _pins()
    r = python_as_tacc_user(USERPTR_CODE.replace("NODE", str(pf_accel)), prefix="ulimit -l 64; ")
    # earlier tests' BOs may still be going (the debug kernel frees them late: 7 pins
    # were still outstanding after 10 s there)
    deadline = time.monotonic() + 60
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert "big-errno" in out, f"a 256 KiB USERPTR under ulimit -l 64 was pinned: {r.stdout}"
    assert int(out[out.index("big-errno") + 1]) == errno.ENOMEM
    assert "second-ok" in out, r.stdout  # the failed one was not charged
    acq1, rel1 = _pins()
    while acq1 - rel1 > acq0 - rel0 and time.monotonic() < deadline:
        time.sleep(0.2)
        acq1, rel1 = _pins()
    assert acq1 - rel1 <= acq0 - rel0, ("pins outstanding", acq0, rel0, acq1, rel1)
    assert acq1 > acq0  # the 16 KiB and 40 KiB buffers were pinned (counted per folio)
    assert not dmesg_problems()


def _open_until_refused(node: str, tries: int) -> list[int | None]:
    """As tacc-user (call_as_tacc_user): open ``node`` up to ``tries`` times, keeping each
    context; [contexts opened, errno of the refusal or None]."""
    devs, err = [], None
    for _ in range(tries):
        try:
            devs.append(Dev(node))
        except OSError as e:
            err = e.errno
            break
    return [len(devs), err]


def test_contexts_limited_per_process(pf_accel):
    """tacc-user opens the node until it fails: max_ctx_per_process (4) contexts, then
    EMFILE; the function's other contexts stay free for another process."""
    param = Path("/sys/module/tacc/parameters/max_ctx_per_process")
    limit = int(param.read_text()) if param.exists() else 4
    assert limit == 4  # the documented default
    with Dev(pf_accel):
        opened, err = call_as_tacc_user(_open_until_refused, str(pf_accel), 16)
        assert opened == limit, f"one process took {opened} contexts"
        assert err == errno.EMFILE, err
        # another process still gets one, and so does this one
        assert call_as_tacc_user(_open_until_refused, str(pf_accel), 1) == [1, None]
    assert not dmesg_problems()


# -------------------------------------------------------------- item 6 ------
def test_reset_fails_fences_only_when_quiet(pf_accel):
    """FLR (sysfs reset) while a job runs: [4 MiB H2D copy, FENCE into a host BO], the
    device's time stretched 1000x so the copy takes ~0.15 s.  The debugfs knob
    recover_delay_ms holds the reset path for 0.5 s right after the fences were failed:
    the driver must have quiesced the function before that point, so the job's FENCE
    write never lands once its fence reported the failure."""
    from tacc.guest_qmp import device_time_scale

    knob = _debugfs(pf_accel) / "recover_delay_ms"
    pci = pf_sysfs()
    with Dev(pf_accel) as d:
        src = d.bo(4 << 20).handle
        dst = d.bo(4 << 20, DEVICE).handle
        h = d.bo(4096)
        m = d.map(h.handle, 4096)
        m[:8] = bytes(8)
        seen: dict[str, object] = {}

        def waiter(seq: int) -> None:
            seen["status"] = d.wait(seq, 60)
            seen["at_signal"] = bytes(m[:8])

        knob.write_text("500")
        try:
            with device_time_scale(1_000_000):
                seq = d.submit([copy(OP_H2D, src, dst, 4 << 20), fence(h.handle, 0, 0xC0FFEE)])
                t = threading.Thread(target=waiter, args=(seq,))
                t.start()
                (pci / "reset").write_text("1")
                t.join(60)
        finally:
            knob.write_text("0")
        assert seen.get("status") == -errno.EIO, f"job not cut by the reset: {seen}"
        assert seen["at_signal"] == bytes(8)
        time.sleep(0.5)
        assert bytes(m[:8]) == bytes(8), "the job wrote its BO after its fence failed"
        assert d.run([nop()]) == 0
        m.close()
    assert not dmesg_problems()


# -------------------------------------------------------------- item 9 ------
def _rpm(pci: Path) -> str:
    return (pci / "power/runtime_status").read_text().strip()


def test_context_opened_while_resuming_gets_its_root(pf_accel):
    """A file opened while the function resumes from runtime suspend, after the resume
    has loaded the context roots (the debugfs knob resume_delay_ms holds the resume
    just there), must still get its root programmed: its first job succeeds instead of
    faulting on context root 0."""
    pci = pf_sysfs()
    knob = _debugfs(pf_accel) / "resume_delay_ms"
    deadline = time.monotonic() + 30
    while _rpm(pci) != "suspended" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rpm(pci) == "suspended"
    waker = Dev(pf_accel)
    knob.write_text("1000")
    try:
        t = threading.Thread(target=lambda: waker.run([nop()]))
        t.start()
        deadline = time.monotonic() + 30
        while _rpm(pci) != "resuming" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _rpm(pci) == "resuming", "the resume window was missed"
        with Dev(pf_accel) as late:
            h = late.bo(4096)
            m = late.map(h.handle, 4096)
            assert _rpm(pci) == "resuming"  # opened and bound inside the window
            status = late.run([fence(h.handle, 0, 0x1234)], timeout_s=30)
            assert status == 0, f"a context opened while resuming: job status {status}"
            assert int.from_bytes(m[:8], "little") == 0x1234
            m.close()
        t.join(30)
    finally:
        knob.write_text("0")
        waker.close()
    assert not dmesg_problems()
