"""Isolation of device memory and of a context's device VAs.

Device memory is scrubbed (the device's FILL command) before it changes owner: a freed
DEVICE BO before another process gets it, the PF's memory before it becomes a VF's
window, a VF's window before it goes back to the PF, and before a new VF gets it.
The new owner reads zeros where the previous one wrote a pattern.

A job's device VAs cannot change under it: VM_UNBIND (and GEM_CLOSE of a bound BO) waits
for the context's jobs submitted before it; VM_UNBIND_NOWAIT returns EBUSY instead; a
signal interrupts the wait (EINTR without SA_RESTART, a transparent restart with it).
The jobs are made slow deterministically with the device's QOM time-scale (10,000x:
a 512x512x256 GEMM takes ~0.34 s of device time).  The adversary runs as tacc-user.
"""

from __future__ import annotations

import ctypes as C
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tacc.runtime.uapi import VM_UNBIND_NOWAIT
from test_driver_basic import (
    BIND_FIXED,
    BO_INFO,
    BO_NO_BIND,
    DEVICE,
    P_DEVMEM,
    VM_BIND,
    VM_UNBIND,
    BoInfo,
    Dev,
    VmBind,
    VmUnbind,
    dmesg_problems,
    gemm,
    pf_sysfs,
    rebind,
    wait_accel_node,
)
from test_driver_sriov import check, fill

P_DEVMEM_FREE = 23
HERE = Path(__file__).resolve().parent
SLOW_SCALE = 10_000_000          # device time-scale x 1000: every duration x 10,000
GM, GN, GK = 512, 512, 256       # ~33.5 us of compute at 1x, ~0.34 s at 10,000x


# ------------------------------------------------------------------ helpers ----
def as_user(fn: str, *args: str) -> subprocess.Popen[str]:
    """Run user_<fn>(*args) of this module as the unprivileged tacc-user."""
    path = os.pathsep.join([str(HERE), *sys.path])
    code = f"import sys, test_isolation_memory as t; t.user_{fn}(*sys.argv[1:])"
    cmd = f"cd {HERE} && PYTHONPATH={path} exec {sys.executable} -c '{code}' " + \
        " ".join(args)
    return subprocess.Popen(["su", "tacc-user", "-c", cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_user(fn: str, *args: str, timeout: float = 120) -> str:
    p = as_user(fn, *args)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, (out, err)
    return out


def numvfs(n: int) -> None:
    pci = pf_sysfs()
    (pci / "sriov_numvfs").write_text("0")
    if n:
        (pci / "sriov_numvfs").write_text(str(n))


def vf_node() -> Path:
    vfs = sorted(p.resolve() for p in pf_sysfs().glob("virtfn*"))
    assert vfs, "no VF after sriov_numvfs"
    return wait_accel_node(vfs[0])


@pytest.fixture
def sriov():
    pci = pf_sysfs()
    if int((pci / "sriov_totalvfs").read_text()) < 1:
        pytest.skip("no SR-IOV")
    numvfs(0)
    try:
        yield
    finally:
        numvfs(0)


def top_of_pf(pf: Dev, size: int) -> tuple[int, int]:
    """A PF DEVICE BO at the top of its free memory (where a VF window goes): a filler
    takes the rest of the (one, contiguous) free range first.  Returns (filler, top)."""
    free = pf.param(P_DEVMEM_FREE)
    assert free > size, free
    filler = pf.bo(free - size, DEVICE, flags=BO_NO_BIND).handle
    top = pf.bo(size, DEVICE).handle
    return filler, top


# ---------------------------------------------- item 3: memory is scrubbed ----
SIZES = (1 << 20, 2 << 20, 4 << 20)


def user_alloc_check(node: str, *sizes: str) -> None:
    """tacc-user: new DEVICE BOs of these sizes; report whether each reads all zeros."""
    with Dev(node) as d:
        for s in map(int, sizes):
            h = d.bo(s, DEVICE).handle
            try:
                check(d, h, s, 0)
                print(f"ZERO {s}")
            except AssertionError as e:
                print(f"DIRTY {s}: {e}".splitlines()[0])


def take_rest(d: Dev, pattern: int | None = None) -> list[int]:
    """DEVICE BOs (unbound, filled with ``pattern`` if given) over every free byte of
    device memory, in as many pieces as its holes need; until no freed range is still
    being scrubbed back."""
    hs: list[int] = []
    while True:
        while (free := d.param(P_DEVMEM_FREE)) > 0:
            size = free
            while True:
                try:
                    hs.append(d.bo(size, DEVICE, flags=BO_NO_BIND if pattern is None
                                   else 0).handle)
                    break
                except OSError as e:
                    if e.errno != errno.ENOSPC or size <= 4096:
                        raise
                    size = max(4096, (size // 2) & ~4095)
            if pattern is not None:
                fill(d, hs[-1], size, pattern)
        time.sleep(0.2)  # a scrub still running gives its range back meanwhile
        if d.param(P_DEVMEM_FREE) == 0:
            return hs


def _devmem_free_becomes(d: Dev, want: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while (free := d.param(P_DEVMEM_FREE)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return free


def test_freed_bo_scrubbed_for_other_process(pf_accel):
    """The other process's new BOs can only be placed in the freed ranges: the rest of
    device memory is held by a filler BO while it allocates (largest first, so the sizes
    fit the freed ranges however they lie)."""
    with Dev(pf_accel) as root:
        hs = [root.bo(s, DEVICE).handle for s in SIZES]
        for h, s in zip(hs, SIZES, strict=True):
            fill(root, h, s, 0xC3)
        take_rest(root)
        for h in hs:
            root.gem_close(h)
        assert _devmem_free_becomes(root, sum(SIZES)) == sum(SIZES)
        order = sorted(SIZES, reverse=True)
        out = run_user("alloc_check", str(pf_accel), *map(str, order))
    assert out.split("\n")[:3] == [f"ZERO {s}" for s in order], out
    assert not dmesg_problems()


def test_vf_window_scrubbed_after_pf(pf_accel, sriov):
    win = int(Path("/sys/module/tacc/parameters/vf_devmem_mib").read_text()) << 20
    with Dev(pf_accel) as pf:
        filler, top = top_of_pf(pf, win)
        fill(pf, top, win, 0xD4)
        pf.gem_close(top)
        pf.gem_close(filler)
    numvfs(1)
    with Dev(vf_node()) as vf:
        w = vf.param(P_DEVMEM)
        assert w == win
        check(vf, vf.bo(w, DEVICE).handle, w, 0)
    assert not dmesg_problems()


def test_pf_memory_scrubbed_after_vf_disable(pf_accel, sriov):
    numvfs(1)
    with Dev(vf_node()) as vf:
        w = vf.param(P_DEVMEM)
        fill(vf, vf.bo(w, DEVICE).handle, w, 0xE5)
    numvfs(0)
    with Dev(pf_accel) as pf:
        filler, top = top_of_pf(pf, w)
        check(pf, top, w, 0)
        pf.gem_close(top)
        pf.gem_close(filler)
    assert not dmesg_problems()


def test_new_vf_scrubbed_after_old_vf(sriov):
    numvfs(1)
    with Dev(vf_node()) as vf:
        w = vf.param(P_DEVMEM)
        fill(vf, vf.bo(w, DEVICE).handle, w, 0xF6)
    numvfs(0)
    numvfs(1)
    with Dev(vf_node()) as vf:
        check(vf, vf.bo(w, DEVICE).handle, w, 0)
    assert not dmesg_problems()


# Guest time the allocation may take on top of its FILL's modelled time: the kernel's
# allocate/wait/retry path and the scrub work item (measured: 1 ms in all; the guest
# clock ran 1.5 .. 2.0 s when it went on during the FILL's host work)
WAIT_SLACK_S = 0.05


def test_allocation_waits_for_scrub(pf_accel):
    """All free memory in one BO, freed, allocated again at once: the allocation waits
    for the range's FILL (no ENOSPC), and the new BO reads zeros.  The device does the
    FILL's host work in x-host-slice slices, one per main-loop turn: at the smallest
    slice (64 KiB) thousands of turns.  Under -icount the guest's clock stands still
    meanwhile (docs/hardware.md section 9, "Host work"): the wait takes the FILL's
    modelled time in guest time, not whatever the host took (an idle guest's clock
    would jump timer to timer, up to the wait's 5 s timeout: ENOSPC)."""
    pytest.importorskip("tacc.guest_qmp")
    from tacc.guest_qmp import PF_QOM, GuestQMP

    with GuestQMP() as q:
        slice0 = q.qom_get(PF_QOM, "x-host-slice")
        gbps, cmd_ns, scale = (q.qom_get(PF_QOM, p) for p in
                               ("devmem-gbps", "cmd-latency-ns", "time-scale"))
        q.qom_set(PF_QOM, "x-host-slice", 64 << 10)
    try:
        with Dev(pf_accel) as d:
            free = d.param(P_DEVMEM_FREE)
            size = free & ~((2 << 20) - 1)
            fill_s = (cmd_ns + size / gbps) * scale / 1000 / 1e9
            h = d.bo(size, DEVICE).handle
            fill(d, h, 4 << 20, 0x77)
            d.gem_close(h)
            t0 = time.monotonic()
            try:
                h = d.bo(size, DEVICE).handle
            except OSError as e:
                raise AssertionError(f"{size >> 20} MiB again after its free: {e} after "
                                     f"{time.monotonic() - t0:.3f} s of guest time") from e
            waited = time.monotonic() - t0
            assert waited < fill_s + WAIT_SLACK_S, \
                f"waited {waited:.3f} s of guest time for a FILL of {fill_s * 1e3:.2f} ms"
            check(d, h, 4 << 20, 0)
            d.gem_close(h)
            deadline = time.monotonic() + 10
            while d.param(P_DEVMEM_FREE) != free and time.monotonic() < deadline:
                time.sleep(0.05)
            assert d.param(P_DEVMEM_FREE) == free
    finally:
        with GuestQMP() as q:
            q.qom_set(PF_QOM, "x-host-slice", slice0)


# ------------------------------------- item 4: VAs are tied to the jobs ----
def _pause(what: str) -> None:
    """Child: ask the parent (root, the guest's QMP port) for a device speed."""
    print(what, flush=True)
    sys.stdin.readline()


def _set_scale(scale: int) -> None:
    from tacc.guest_qmp import PF_QOM, GuestQMP

    with GuestQMP() as q:
        q.qom_set(PF_QOM, "time-scale", scale)


def _in_ioctl(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == "16"   # ioctl
    except (OSError, IndexError):
        return False


def drive(fn: str, node: Path) -> list[str]:
    """Run user_<fn> as tacc-user; serve its requests: need-slow / need-fast (device
    time-scale), "pid N": SIGUSR1 once N sleeps in an ioctl."""
    pytest.importorskip("tacc.guest_qmp")
    p = as_user(fn, str(node))
    lines: list[str] = []
    try:
        assert p.stdout is not None and p.stdin is not None
        for raw in p.stdout:
            line = raw.strip()
            lines.append(line)
            if line in ("need-slow", "need-fast"):
                _set_scale(SLOW_SCALE if line == "need-slow" else 1000)
                p.stdin.write("go\n")
                p.stdin.flush()
            elif line.startswith("pid "):
                pid = int(line.split()[1])
                deadline = time.monotonic() + 10
                while not _in_ioctl(pid) and time.monotonic() < deadline:
                    time.sleep(0.001)
                os.kill(pid, signal.SIGUSR1)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        _set_scale(1000)
    assert p.returncode == 0, (lines, p.stderr.read() if p.stderr else "")
    return lines


BO = 2 << 20   # 2 MiB BOs get 2 MiB pages: a few walks even at 10,000x


def _gemm_bos(d: Dev) -> tuple[int, int, int, int]:
    a = d.bo(BO, DEVICE).handle
    b = d.bo(BO, DEVICE).handle
    c = d.bo(BO, DEVICE)
    fill(d, a, GM * GK * 4, 0x3F, chunk=1 << 20)
    fill(d, b, GK * GN * 4, 0x3F, chunk=1 << 20)
    return a, b, c.handle, c.va


def _slow_gemm(d: Dev, a: int, b: int, c: int) -> int:
    return d.submit([gemm(a, b, c, GM, GN, GK)])


def user_race(node: str) -> None:
    """tacc-user: SUBMIT a slow GEMM writing C, then VM_UNBIND C, VM_BIND FIXED a victim
    BO V at C's VA, GEM_CLOSE C: V must keep its bytes (the GEMM finished first)."""
    with Dev(node) as d:
        a, b, c, c_va = _gemm_bos(d)
        v = d.bo(BO, DEVICE).handle
        fill(d, v, BO, 0x5A, chunk=1 << 20)
        d.ioctl(VM_UNBIND, VmUnbind(handle=v))
        _pause("need-slow")
        s = _slow_gemm(d, a, b, c)
        t0 = time.monotonic()
        d.ioctl(VM_UNBIND, VmUnbind(handle=c))
        t_unbind = time.monotonic() - t0
        d.ioctl(VM_BIND, VmBind(handle=v, flags=BIND_FIXED, va=c_va))
        d.gem_close(c)
        print(f"status {d.wait(s)} unbind_s {t_unbind:.3f}", flush=True)
        _pause("need-fast")
        try:
            check(d, v, BO, 0x5A, chunk=1 << 20)
            print("VICTIM UNTOUCHED")
        except AssertionError as e:
            print(f"VICTIM WRITTEN: {e}".splitlines()[0])


def test_unbind_rebind_race_victim_untouched(pf_accel):
    lines = drive("race", pf_accel)
    assert "VICTIM UNTOUCHED" in lines, lines
    assert any(ln.startswith("status 0 ") for ln in lines), lines
    assert not dmesg_problems()


def user_nowait(node: str) -> None:
    """tacc-user: VM_UNBIND_NOWAIT is EBUSY while a job of the context runs, 0 after."""
    with Dev(node) as d:
        a, b, c, _ = _gemm_bos(d)
        other = d.bo(4096, DEVICE).handle           # not used by the job: VM-wide rule
        _pause("need-slow")
        s = _slow_gemm(d, a, b, c)
        for h in (c, other):
            try:
                d.ioctl(VM_UNBIND, VmUnbind(handle=h, flags=VM_UNBIND_NOWAIT))
                print(f"busy-unbind {h}: 0")
            except OSError as e:
                print(f"busy-unbind {h}: {errno.errorcode[e.errno]}")
        print(f"still-bound {d.ioctl(BO_INFO, BoInfo(handle=c)).bound_size}")
        print(f"status {d.wait(s)}")
        try:
            d.ioctl(VM_UNBIND, VmUnbind(handle=c, flags=VM_UNBIND_NOWAIT))
            print(f"idle-unbind 0 bound {d.ioctl(BO_INFO, BoInfo(handle=c)).bound_size}")
        except OSError as e:
            print(f"idle-unbind {errno.errorcode[e.errno]}")
        try:
            d.ioctl(VM_UNBIND, VmUnbind(handle=other, flags=1 << 5))
            print("bad-flag 0")
        except OSError as e:
            print(f"bad-flag {errno.errorcode[e.errno]}")


def test_unbind_nowait_ebusy(pf_accel):
    lines = drive("nowait", pf_accel)
    busy = [ln.split(": ")[1] for ln in lines if ln.startswith("busy-unbind")]
    assert busy == ["EBUSY", "EBUSY"], lines
    assert f"still-bound {BO}" in lines and "status 0" in lines, lines
    assert "idle-unbind 0 bound 0" in lines and "bad-flag EINVAL" in lines, lines


_libc = C.CDLL(None, use_errno=True)


def _raw_unbind(fd: int, handle: int) -> tuple[int, int]:
    """VM_UNBIND without Python's EINTR retry: (return value, errno)."""
    arg = VmUnbind(handle=handle)
    rc = _libc.ioctl(fd, C.c_ulong(VM_UNBIND), C.byref(arg))
    return rc, C.get_errno() if rc < 0 else 0


def user_signal(node: str) -> None:
    """tacc-user: a signal ends a waiting VM_UNBIND with EINTR (handler without
    SA_RESTART; the binding stays), or restarts it transparently (SA_RESTART)."""
    hits = []
    signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    with Dev(node) as d:
        a, b, c, _ = _gemm_bos(d)
        _pause("need-slow")
        s = _slow_gemm(d, a, b, c)
        print(f"pid {os.getpid()} phase1", flush=True)
        rc, err = _raw_unbind(d.fd, c)
        bound = d.ioctl(BO_INFO, BoInfo(handle=c)).bound_size
        print(f"phase1 rc {rc} errno {errno.errorcode.get(err, err)} bound {bound} "
              f"hits {len(hits)} status {d.wait(s)}", flush=True)
        signal.siginterrupt(signal.SIGUSR1, False)      # SA_RESTART
        s = _slow_gemm(d, a, b, c)
        print(f"pid {os.getpid()} phase2", flush=True)
        rc, err = _raw_unbind(d.fd, c)
        bound = d.ioctl(BO_INFO, BoInfo(handle=c)).bound_size
        print(f"phase2 rc {rc} errno {err} bound {bound} hits {len(hits)} "
              f"status {d.wait(s)}", flush=True)


def test_signal_interrupts_waiting_unbind(pf_accel):
    lines = drive("signal", pf_accel)
    ph1 = next(ln for ln in lines if ln.startswith("phase1 "))
    ph2 = next(ln for ln in lines if ln.startswith("phase2 "))
    assert ph1 == f"phase1 rc -1 errno EINTR bound {BO} hits 1 status 0", lines
    assert ph2 == "phase2 rc 0 errno 0 bound 0 hits 2 status 0", lines


# ------------------------------- memory a previous driver left is scrubbed at probe ----
def test_memory_left_by_previous_driver_scrubbed_at_probe(pf_accel):
    """A driver unbound while a file still holds filled DEVICE BOs frees nothing through
    the scrubber (the device is gone from it): the pattern stays in device memory, as it
    would after a crashed driver, a VFIO user or a guest that had the function.  The next
    probe overwrites all of the function's memory before any file can open, so tacc-user's
    first BOs read zeros."""
    pci = pf_sysfs()
    d = Dev(pf_accel)
    try:
        for s in SIZES:
            fill(d, d.bo(s, DEVICE).handle, s, 0xA7)
        # and every other free byte of device memory: wherever the next driver places
        # tacc-user's BOs, they lie on the pattern
        take_rest(d, 0xA7)
        (pci / "driver" / "unbind").write_text(pci.name)
    finally:
        d.close()  # after the unbind: its BOs' free cannot reach the device
    node = rebind(pci)
    out = run_user("alloc_check", str(node), *map(str, SIZES))
    assert out.split("\n")[:3] == [f"ZERO {s}" for s in SIZES], out
    assert not dmesg_problems()
