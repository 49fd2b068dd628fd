"""Tenants isolated in every combination of function kinds (the extras boot: VFS=2 SMP=2
VIRTIO=1; docs/uapi.md "Threat model").

Each property runs against each kind of function: the PF, the boot's two VFs and the
virtio-tacc function, all driven by tacc.ko, plus a VF handed to vfio-pci whose owner is
the attacker.  ``KINDS`` names how a kind's accel node is found; a new kind is one line
there, a new property one test parametrized over ``KINDS`` (or the subset it applies to).
The attacker is the unprivileged tacc-user; root is the victim.

- Device memory: the functions' windows are disjoint (the virtio window is reserved by
  the PF at probe, VF windows are carved around it): what a victim writes on one function
  is neither read nor changed through a BO of any other.
- Fences: a sync_file exported on any kind holds tacc.ko until it is closed.
- Handoff: a VF given to vfio-pci right after its tacc.ko user freed a BO (its FILL still
  queued behind a slow job on queue 0) shows the VFIO owner none of that user's bytes.
- Telemetry: the PF's function-wide sysfs files (counters, queue_stats, live_objects) are
  root's, and so are its counter page (mmap) and its PMU's events (CAP_PERFMON); its
  clock_sync does not wake a suspended PF for tacc-user; TRACE_OPEN needs CAP_PERFMON on
  every kind (a ring shows every user's commands); a VF's and virtio-tacc's own counter
  page stays their node's users'.
- GEM names: GEM_OPEN of a BO another file created is refused (a BO keeps its creator's
  context, freed with that file).
- Close: a file whose job waits on an in-syncobj nobody signals closes in bounded time.
- The virtio device is checked: a context id it answers out of range or already held by
  another file is refused (it indexes fence slots and bitmaps).
- One validation of commands: every field an opcode does not use is zero on every kind
  (a COPY with a value, a GEMM with an eltwise field, an eltwise payload with bytes past
  its last field: -EINVAL at SUBMIT), and the device cannot write a read-only USERPTR
  (the job faults, the user's memory is unchanged).
- Per-user limits: one user's processes together take at most its share of a function's
  contexts, device memory and (virtio-tacc: the backend's) BOs, so a second user
  (tacc-user2) still gets service; the PF's and VFs' page tables are charged to the memory
  cgroup of the task that needed them.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import errno
import fcntl
import gc
import grp
import json
import mmap
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import PAYLOAD
from tacc.runtime.device import devices
from tacc.testing.unpriv import CAP_PERFMON, USER2, call_as_tacc_user
from test_driver_basic import (
    BIND_FIXED,
    BO_NO_BIND,
    BO_READONLY,
    DEVICE,
    ELT_RELU,
    MMAP_COUNTERS,
    OP_D2D,
    OP_D2H,
    OP_ELT,
    OP_GEMM,
    OP_H2D,
    P_CNT_SIZE,
    P_DEVMEM,
    TRACE_CLOSE,
    TRACE_OPEN,
    USERPTR,
    VM_BIND,
    Cmd,
    Dev,
    Operand,
    Pair,
    TraceOpen,
    UserBuf,
    VmBind,
    cmd2,
    copy,
    dmesg_problems,
    fence,
    gemm,
    leak_snapshot,
    live_objects,
    nop,
    pf_sysfs,
    record_figures,
    submit2,
    wait_accel_node,
)
from test_driver_sriov import fill
from test_isolation_rings import UserProc

P_DEVMEM_FREE = 23
MIB = 1 << 20
CHUNK = 8 * MIB
WORKER = str(Path(__file__).with_name("vfio_worker.py"))


def _vf(n: int) -> Path:
    vfs = sorted(p.resolve() for p in pf_sysfs().glob("virtfn*"))
    if len(vfs) < n:
        pytest.skip(f"VF {n} absent (the extras boot has 2)")
    return wait_accel_node(vfs[n - 1])


def _virtio() -> Path:
    found = [d for d in devices() if d.virtio]
    if not found:
        pytest.skip("no virtio-tacc function (VIRTIO=1)")
    return Path(found[0].devnode)


# kind -> its accel node (tacc.ko's); the VFIO kind is the VF handed over in its tests
KINDS: dict[str, Callable[[], Path]] = {
    "pf": lambda: wait_accel_node(pf_sysfs()),
    "vf1": lambda: _vf(1),
    "vf2": lambda: _vf(2),
    "virtio": _virtio,
}
PATTERN = {"pf": 0xA1, "vf1": 0xB2, "vf2": 0xC3, "virtio": 0xD4}
ATTACKER = 0xEE


def _node(kind: str) -> Path:
    """The kind's node, open to group tacc (a node made after boot is root's 0600)."""
    node = KINDS[kind]()
    os.chown(node, 0, grp.getgrnam("tacc").gr_gid)
    os.chmod(node, 0o660)
    return node


def _free(d: Dev) -> int:
    """Device memory a new BO may take: DEVMEM_FREE, or (virtio has none) the window."""
    try:
        return d.param(P_DEVMEM_FREE)
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP, e
        return d.param(P_DEVMEM)


def _alloc_most(d: Dev, want: int) -> tuple[int, int]:
    """The biggest DEVICE BO up to @want (2 MiB steps down on ENOSPC): (handle, size)."""
    size = want // (2 * MIB) * (2 * MIB)
    while size > 0:
        try:
            return d.bo(size, DEVICE).handle, size
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            size -= 2 * MIB
    raise AssertionError(f"no device memory at all (wanted {want})")


def _values(d: Dev, h: int, size: int) -> set[int]:
    """Every byte value in DEVICE BO @h (read back through a host BO)."""
    host = d.bo(CHUNK).handle
    m = d.map(host, CHUNK)
    found: set[int] = set()
    try:
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            assert d.run([copy(OP_D2H, h, host, n, soff=off)]) == 0, off
            found.update(int(v) for v in np.unique(np.frombuffer(m, np.uint8, n)))
    finally:
        m.close()
        d.gem_close(host)
    return found


def u_take_all(state: dict[str, Any], node: str) -> tuple[int, list[int]]:
    """tacc-user: all the free device memory of @node in one BO; the byte values read
    there; then writes its own pattern over it and frees it."""
    with Dev(node) as d:
        h, size = _alloc_most(d, _free(d))
        found = _values(d, h, size)
        fill(d, h, size, ATTACKER, chunk=CHUNK)
    return size, sorted(found)


@pytest.fixture
def victims() -> Iterator[dict[str, tuple[Dev, int, int]]]:
    """root, on every kind: a DEVICE BO of half the free memory, filled with the kind's
    pattern; kept open for the test."""
    held: dict[str, tuple[Dev, int, int]] = {}
    try:
        for kind in KINDS:
            d = Dev(_node(kind))
            h, size = _alloc_most(d, _free(d) // 2)
            fill(d, h, size, PATTERN[kind], chunk=CHUNK)
            held[kind] = (d, h, size)
        yield held
    finally:
        for d, _, _ in held.values():
            d.close()


@pytest.fixture
def no_devmem_quota() -> Iterator[None]:
    """user_devmem_pct off (0) for the test: tacc-user may take all of a function's free
    memory, as these properties need (the quota itself: test_a_second_user_gets_device_
    memory_after_a_hog)."""
    p = Path("/sys/module/tacc/parameters/user_devmem_pct")
    old = p.read_text().strip() if p.exists() else None
    if old is not None:
        p.write_text("0")
    yield
    if old is not None:
        p.write_text(old)


@pytest.fixture
def user() -> Iterator[UserProc]:
    u = UserProc()
    yield u
    u.close()


# ------------------------------------------------------------ device memory ----
def test_no_function_reads_or_changes_another_functions_memory(victims, user, no_devmem_quota):
    """tacc-user takes all the free memory of every function in turn and reads it:
    zeros only (no victim's pattern, its own or another function's); then writes its
    own pattern everywhere it could.  Every victim BO still holds exactly its pattern."""
    seen = {}
    for kind in KINDS:
        size, found = user.call(u_take_all, str(_node(kind)))
        seen[kind] = (size, found)
    leaks = {k: (s, f) for k, (s, f) in seen.items() if f != [0]}
    assert not leaks, f"tacc-user read non-zero bytes (size, values): {leaks}"
    changed = {}
    for kind, (d, h, size) in victims.items():
        found = _values(d, h, size)
        if found != {PATTERN[kind]}:
            changed[kind] = sorted(found)
    assert not changed, f"victim BOs changed through another function: {changed}"
    assert all(s > 0 for s, _ in seen.values()), seen
    assert not dmesg_problems()


def test_windows_disjoint_in_sysfs_and_virtio_reserved():
    """The PF's allocator holds the virtio window: the PF's free memory plus every VF
    window plus the virtio window fit in the PF's memory (before, the virtio window was
    also counted free on the PF and inside VF 1's window)."""
    with Dev(_node("pf")) as pf, Dev(_node("virtio")) as vt:
        total, free, vwin = pf.param(P_DEVMEM), pf.param(P_DEVMEM_FREE), vt.param(P_DEVMEM)
    vfs = 0
    for kind in ("vf1", "vf2"):
        with Dev(_node(kind)) as d:
            vfs += d.param(P_DEVMEM)
    assert vwin > 0 and vfs > 0
    assert free + vfs + vwin <= total, (free, vfs, vwin, total)


# ----------------------------------------------------------------- handoff ----
def u_secret(state: dict[str, Any], node: str, value: int) -> int:
    """tacc-user: a DEVICE BO over all of the function's free memory, filled with
    @value; the file stays open."""
    d = state["dev"] = Dev(node)
    h, size = _alloc_most(d, _free(d))
    fill(d, h, size, value, chunk=CHUNK)
    return size


def u_close(state: dict[str, Any]) -> int:
    state.pop("dev").close()   # the BO's FILL is queued
    return 0


def _cli(*args: str) -> int:
    from tacc.cli import main

    return main(["vfio", *args])


def test_handoff_to_vfio_waits_for_the_scrub(user, no_devmem_quota):
    """tacc-user fills VF 2's memory and closes its file; the BO's FILL is queued 10 s
    later (debugfs scrub_delay_ms, as behind a busy queue).  `tacc vfio bind` right away
    (handoff, unbind, vfio-pci): the handoff waits for the FILL, so the VFIO owner
    (tacc-user again, owner of the group node) reads only zeros in the whole window.
    Before: the unbind dropped the queued FILL and the VFIO owner read the previous
    tenant's bytes (an FLR keeps device memory)."""
    import tacc.cli  # noqa: F401  (imported before the clock starts: seconds of guest time)
    from tacc.vfio import bind as vb

    node = _node("vf2")
    vf = Path(f"/sys/class/accel/{node.name}/device").resolve()
    bdf = vf.name
    knob = Path("/sys/kernel/debug/accel", bdf, "scrub_delay_ms")
    secret = 0x5E
    try:
        size = user.call(u_secret, str(node), secret)
        knob.write_text("10000")
        user.call(u_close)
        t0 = time.monotonic()
        rc = _cli("bind", bdf)
        bind_s = time.monotonic() - t0
        assert rc == 0, rc
        assert vb.driver_of(bdf) == "vfio-pci"
        group = f"/dev/vfio/{vb.group_of(bdf)}"
        os.chown(group, int(subprocess.check_output(["id", "-u", "tacc-user"])), -1)
        pypath = os.pathsep.join(sys.path)
        r = subprocess.run(["su", "tacc-user", "-c",
                            f"PYTHONPATH={pypath} {sys.executable} {WORKER} {bdf} scan"],
                           capture_output=True, text=True, timeout=300)
        os.chown(group, 0, -1)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        if knob.exists():
            knob.write_text("0")
        if vb.driver_of(bdf) != vb.TACC_DRIVER:
            vb.unbind(bdf)
        wait_accel_node(vf)
    assert size > 0 and res["size"] >= size, (size, res)
    assert res["values"] == [0], f"VFIO owner read {res['values']} (bind took {bind_s:.2f} s)"
    assert not dmesg_problems()


# ------------------------------------------------------------------ fences ----
def _refcnt() -> int:
    return int(Path("/sys/module/tacc/refcnt").read_text())


def _settled_refcnt() -> int:
    """The module's count once an earlier test's last fences are gone (5 s at most), and
    its unreachable Python objects (a device file in a reference cycle holds a reference on
    tacc.ko until the collector closes it)."""
    gc.collect()
    last, deadline = _refcnt(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _refcnt()
        if now == last:
            return now
        last = now
    return last


@pytest.mark.parametrize("kind", list(KINDS))
def test_exported_fence_holds_the_module(kind):
    """A sync_file exported from an out-syncobj outlives its file: while it is open it
    holds one reference on tacc.ko (so `rmmod tacc` fails instead of leaving its ops to
    an oops at close), given back when it closes.  Before, a virtio fence held none."""
    from test_driver_zz_reload import export_sync_file, sync_file_info

    base = _settled_refcnt()
    d = Dev(_node(kind))
    try:
        so = d.syncobj()
        d.wait(d.submit([nop()], out=so))
        sf = export_sync_file(d, so)
    finally:
        d.close()
    try:
        deadline = time.monotonic() + 5  # the job's own fences go once it is freed
        while _refcnt() > base + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        held = _refcnt()
        status, fences = sync_file_info(sf)
    finally:
        os.close(sf)
    deadline = time.monotonic() + 5  # the last put may be RCU-deferred
    while _refcnt() != base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 1 and len(fences) == 1, (status, fences)
    assert held == base + 1, f"{kind}: module refcount {base} -> {held} with a sync_file open"
    assert _refcnt() == base


# --------------------------------------------------------------- telemetry ----
def _pf_wide_files() -> list[Path]:
    pf = pf_sysfs()
    files = [p for p in sorted((pf / "counters").iterdir()) if p.name != "catalogue"]
    return files + [pf / "tacc" / "queue_stats", pf / "tacc" / "live_objects"]


def u_read(state: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """tacc-user: each file's text, or the errno its open or read ended with."""
    out: dict[str, Any] = {}
    for p in paths:
        try:
            out[p] = Path(p).read_text()
        except OSError as e:
            out[p] = ("errno", e.errno)
    return out


def test_pf_wide_sysfs_telemetry_is_root_only(user):
    """The PF's function page sums every tenant's work: its counters/*, tacc/queue_stats
    and tacc/live_objects are refused to tacc-user (EACCES) and still read by root (as
    taccd and `tacc stat` do); a VF's own counters stay readable by its users.  Before:
    all 0444."""
    from tacc.devices import discover, read_counters_sysfs

    files = _pf_wide_files()
    vf_counter = Path(f"/sys/class/accel/{_vf(1).name}/device/counters/h2d_bytes")
    got = user.call(u_read, [str(p) for p in files] + [str(vf_counter)])
    readable = [p for p in files if got[str(p)] != ("errno", errno.EACCES)]
    assert not readable, f"tacc-user read PF-wide telemetry: {[str(p) for p in readable]}"
    assert isinstance(got[str(vf_counter)], str) and got[str(vf_counter)].strip().isdigit(), \
        got[str(vf_counter)]
    for p in files:  # root still reads them all
        assert p.read_text().strip(), p
    pf = [f for f in discover() if f.sysfs.resolve() == pf_sysfs().resolve()]
    assert pf and "h2d_bytes" in read_counters_sysfs(pf[0]), "root's sysfs backend broke"


def _rpm(pci: Path) -> str:
    return (pci / "power" / "runtime_status").read_text().strip()


def test_clock_sync_does_not_wake_the_pf_for_tacc_user(user):
    """With the PF runtime-suspended, tacc-user's read of its clock_sync is refused
    (EACCES) and the PF stays suspended (pm_resumes unchanged); root's read still
    wakes it and returns the samples.  Before: any reader woke the device.  (Enabled
    VFs hold the PF in D0: they are disabled for the test, then enabled again.)"""
    pci = pf_sysfs()
    power = pci / "power"
    old = {k: (power / k).read_text().strip() for k in ("control", "autosuspend_delay_ms")}
    clock = pci / "tacc" / "clock_sync"
    numvfs = int((pci / "sriov_numvfs").read_text() or 0)
    try:
        if numvfs:
            (pci / "sriov_numvfs").write_text("0")
        (power / "autosuspend_delay_ms").write_text("0")
        (power / "control").write_text("auto")
        end = time.monotonic() + 30
        while _rpm(pci) != "suspended":
            assert time.monotonic() < end, f"PF never suspended ({_rpm(pci)})"
            time.sleep(0.05)
        resumes = int((pci / "tacc" / "pm_resumes").read_text())
        got = user.call(u_read, [str(clock)])[str(clock)]
        status, after = _rpm(pci), int((pci / "tacc" / "pm_resumes").read_text())
        root = clock.read_text()
    finally:
        for k, v in old.items():
            (power / k).write_text(v)
        if numvfs:
            (pci / "sriov_numvfs").write_text(str(numvfs))
            for vf in sorted(p.resolve() for p in pci.glob("virtfn*")):
                wait_accel_node(vf)
    assert got == ("errno", errno.EACCES), f"tacc-user read clock_sync of a suspended PF: {got}"
    assert status == "suspended" and after == resumes, (status, resumes, after)
    assert len(root.splitlines()) == 4, root


def u_trace_open(state: dict[str, Any], node: str) -> int:
    """tacc-user: TRACE_OPEN on @node (0, closed again, or the errno)."""
    with Dev(node) as d:
        d.ioctl(TRACE_OPEN, TraceOpen())
        d.ioctl(TRACE_CLOSE, Pair())
    return 0


@pytest.fixture
def perfmon_user() -> Iterator[UserProc]:
    """tacc-user keeping CAP_PERFMON only (a tool given that capability, as taccd may be)."""
    u = UserProc(caps=(CAP_PERFMON,))
    yield u
    u.close()


@pytest.mark.parametrize("kind", list(KINDS))
def test_trace_ring_needs_perfmon_on_every_kind(kind, user, perfmon_user):
    """TRACE_OPEN as tacc-user is refused (EACCES) on every kind: a function's ring
    records every command of every user of its node (on a VF shared by two users of the
    node, the other's command stream); tacc-user with CAP_PERFMON opens it.  Before: a
    VF's ring opened for any user of its node (and virtio-tacc's, before that)."""
    node = str(_node(kind))
    got = user.call(u_trace_open, node)
    if got == ("errno", errno.EOPNOTSUPP):
        pytest.skip(f"{kind}: no trace ring")
    assert got == ("errno", errno.EACCES), f"{kind}: tacc-user TRACE_OPEN -> {got}"
    got = perfmon_user.call(u_trace_open, node)
    assert got == 0, f"{kind}: TRACE_OPEN with CAP_PERFMON -> {got}"


@pytest.fixture
def perf_open_to_all() -> Iterator[None]:
    """kernel.perf_event_paranoid -1 for the test (Debian's 3 refuses every perf event to
    an unprivileged user before the driver is asked): only the driver's rule is left."""
    p = Path("/proc/sys/kernel/perf_event_paranoid")
    old = p.read_text().strip()
    p.write_text("-1")
    yield
    p.write_text(old)


@contextlib.contextmanager
def _awake(node: Path) -> Iterator[None]:
    """The function behind @node held in D0 (power/control on): its counter page decodes."""
    ctl = Path(f"/sys/class/accel/{node.name}/device/power/control")
    old = ctl.read_text().strip() if ctl.exists() else None
    if old is not None:
        ctl.write_text("on")
    try:
        yield
    finally:
        if old is not None:
            ctl.write_text(old)


def _pmu(node: Path) -> str:
    """The node's function's perf PMU, tacc_<hex> (docs/counters.md), "" if it has none."""
    pci = Path(f"/sys/class/accel/{node.name}/device").resolve().name
    try:
        dom, bus, devfn = pci.split(":")
        dev, fn = devfn.split(".")
        name = f"tacc_{int(dom, 16) << 16 | int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn):x}"
    except ValueError:  # virtio-tacc: a virtio device, no PMU
        return ""
    return name if Path("/sys/bus/event_source/devices", name).is_dir() else ""


def u_counters(state: dict[str, Any], node: str, pmu: str, size: int) -> dict[str, Any]:
    """This process on @node: COUNTERS_MMAP_SIZE; an mmap of @size bytes of the counter
    block (its header's version, or the errno); a perf event of @pmu's function counter
    h2d_bytes (0 opened, or the errno)."""
    from tacc.counters import backends as cb

    out: dict[str, Any] = {}
    with Dev(node) as d:
        try:
            out["size"] = d.param(P_CNT_SIZE)
        except OSError as e:
            out["size"] = ("errno", e.errno)
        try:
            mm = mmap.mmap(d.fd, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=MMAP_COUNTERS)
            out["mmap"] = struct.unpack_from("<Q", mm, 0)[0] >> 32
            mm.close()
        except OSError as e:
            out["mmap"] = ("errno", e.errno)
    if pmu:
        d = Path("/sys/bus/event_source/devices", pmu)
        event = (d / "events" / "h2d_bytes").read_text().strip()  # "event=0x02"
        assert event.startswith("event="), event
        attr = cb.PerfEventAttr(type=int((d / "type").read_text()), size=cb.PERF_ATTR_SIZE,
                                config=int(event.removeprefix("event="), 16))
        cpu = int((d / "cpumask").read_text().split(",")[0].split("-")[0])
        try:
            os.close(cb.perf_event_open(attr, -1, cpu, -1))
            out["perf"] = 0
        except OSError as e:
            out["perf"] = ("errno", e.errno)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_pf_counter_page_and_pmu_need_perfmon(kind, user, perfmon_user, perf_open_to_all):
    """The PF's function counter page sums the work of every tenant of the PF: its mmap
    and its perf PMU's function events are refused to tacc-user (EACCES; the PMU's with
    perf_event_paranoid -1, so that the driver's rule is what refuses) and
    COUNTERS_MMAP_SIZE is 0 for it; tacc-user with CAP_PERFMON, and root, map both pages
    and open the events.  A VF's and virtio-tacc's own page (the users of that function's
    node) stay open to tacc-user: mapped, header version TACC_CNT_VERSION, size 4096;
    a VF's PMU events too.  Before: tacc-user mapped the PF's page and opened its events."""
    node = _node(kind)
    pmu = _pmu(node)
    assert pmu or kind == "virtio", f"{kind}: no perf PMU"
    with _awake(node):
        got = user.call(u_counters, str(node), pmu, 4096)
        if kind != "pf":
            want = {"size": 4096, "mmap": hw.TACC_CNT_VERSION} | ({"perf": 0} if pmu else {})
            assert got == want, f"{kind}: tacc-user's own function counters: {got}"
            return
        refused = ("errno", errno.EACCES)
        assert got == {"size": 0, "mmap": refused, "perf": refused}, \
            f"tacc-user reached the PF's function counters: {got}"
        want = {"size": 8192, "mmap": hw.TACC_CNT_VERSION, "perf": 0}
        got = perfmon_user.call(u_counters, str(node), pmu, 8192)
        assert got == want, f"tacc-user with CAP_PERFMON: {got}"
        got = u_counters({}, str(node), pmu, 8192)
        assert got == want, f"root: {got}"


# --------------------------------------------------------------- GEM names ----
class GemFlink(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("name", C.c_uint32)]


class GemOpen(C.Structure):
    _fields_ = [("name", C.c_uint32), ("handle", C.c_uint32), ("size", C.c_uint64)]


def _drm_iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("d") << 8) | nr


def _drm_iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (ord("d") << 8) | nr


GEM_FLINK = _drm_iowr(0x0A, C.sizeof(GemFlink))
GEM_OPEN = _drm_iowr(0x0B, C.sizeof(GemOpen))


@pytest.mark.parametrize("kind", list(KINDS))
def test_gem_open_of_another_files_bo_is_refused(kind):
    """root (flink and open are root's on accel nodes): file A creates a BO and flinks
    it; GEM_OPEN of the name in file B is EPERM (the BO keeps A's context, freed when A
    closes); in A itself it works.  Closing A then B leaves dmesg clean.  Before: B got
    a handle, and its GEM_CLOSE after A's close touched A's freed context."""
    node = _node(kind)
    a, b = Dev(node), Dev(node)
    try:
        h = a.bo(4096).handle
        name = a.ioctl(GEM_FLINK, GemFlink(handle=h)).name
        assert name
        own = a.ioctl(GEM_OPEN, GemOpen(name=name))
        assert own.handle and own.size == 4096
        try:
            other = b.ioctl(GEM_OPEN, GemOpen(name=name)).handle
        except OSError as e:
            other = ("errno", e.errno)
        assert other == ("errno", errno.EPERM), f"{kind}: GEM_OPEN in another file -> {other}"
        a.close()
    finally:
        a.close()
        b.close()
    assert not dmesg_problems()


# ------------------------------------------------------------------- close ----
class DumbCreate(C.Structure):
    _fields_ = [("height", C.c_uint32), ("width", C.c_uint32), ("bpp", C.c_uint32),
                ("flags", C.c_uint32), ("handle", C.c_uint32), ("pitch", C.c_uint32),
                ("size", C.c_uint64)]


class PrimeHandle(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("flags", C.c_uint32), ("fd", C.c_int32)]


class VgemFenceAttach(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("flags", C.c_uint32), ("out_fence", C.c_uint32),
                ("pad", C.c_uint32)]


class VgemFenceSignal(C.Structure):
    _fields_ = [("fence", C.c_uint32), ("flags", C.c_uint32)]


class SyncobjHandle(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("flags", C.c_uint32), ("fd", C.c_int32),
                ("pad", C.c_uint32)]


class ExportSyncFile(C.Structure):
    _fields_ = [("flags", C.c_uint32), ("fd", C.c_int32)]


MODE_CREATE_DUMB = _drm_iowr(0xB2, C.sizeof(DumbCreate))
PRIME_HANDLE_TO_FD = _drm_iowr(0x2D, C.sizeof(PrimeHandle))
VGEM_FENCE_ATTACH = _drm_iowr(0x41, C.sizeof(VgemFenceAttach))
VGEM_FENCE_SIGNAL = _drm_iow(0x42, C.sizeof(VgemFenceSignal))
SYNCOBJ_FD_TO_HANDLE = _drm_iowr(0xC2, C.sizeof(SyncobjHandle))
DMA_BUF_EXPORT_SYNC_FILE = (3 << 30) | (C.sizeof(ExportSyncFile) << 16) | (ord("b") << 8) | 2
CLOSE_WAIT = Path("/sys/module/tacc/parameters/close_wait_ms")


class VgemFence:
    """An unsignalled fence of vgem (no other driver's fence can be held open from user
    space on this kernel: no sw_sync), as a sync_file; vgem signals it itself after 10 s."""

    def __init__(self) -> None:
        def vgem_cards() -> list[Path]:
            return [c for c in Path("/sys/class/drm").glob("card*")
                    if (c / "device").resolve().name == "vgem"]

        cards = vgem_cards()  # built in (the debug kernel: no modules to probe)
        if not cards:
            subprocess.run(["modprobe", "vgem"], check=True)
            cards = vgem_cards()
        assert cards, "no vgem card"
        self.fd = os.open(f"/dev/dri/{cards[0].name}", os.O_RDWR | os.O_CLOEXEC)
        bo = DumbCreate(width=1024, height=1, bpp=32)
        fcntl.ioctl(self.fd, MODE_CREATE_DUMB, bo, True)
        att = VgemFenceAttach(handle=bo.handle, flags=1)  # VGEM_FENCE_WRITE
        fcntl.ioctl(self.fd, VGEM_FENCE_ATTACH, att, True)
        self.fence = att.out_fence
        ph = PrimeHandle(handle=bo.handle, flags=os.O_CLOEXEC | os.O_RDWR)
        fcntl.ioctl(self.fd, PRIME_HANDLE_TO_FD, ph, True)
        self.dmabuf = ph.fd
        ex = ExportSyncFile(flags=3)  # DMA_BUF_SYNC_RW: every fence
        fcntl.ioctl(self.dmabuf, DMA_BUF_EXPORT_SYNC_FILE, ex, True)
        self.sync_file = ex.fd

    def into_syncobj(self, d: Dev) -> int:
        so = d.syncobj()
        d.ioctl(SYNCOBJ_FD_TO_HANDLE, SyncobjHandle(handle=so, flags=1, fd=self.sync_file))
        return so

    def close(self) -> None:
        try:
            fcntl.ioctl(self.fd, VGEM_FENCE_SIGNAL, VgemFenceSignal(fence=self.fence), True)
        except OSError:
            pass  # signalled by its timer already
        for fd in (self.sync_file, self.dmabuf, self.fd):
            os.close(fd)


@pytest.fixture
def close_wait_1s() -> Iterator[None]:
    old = CLOSE_WAIT.read_text().strip() if CLOSE_WAIT.exists() else None
    if old is not None:
        CLOSE_WAIT.write_text("1000")
    yield
    if old is not None:
        CLOSE_WAIT.write_text(old)


@pytest.mark.parametrize("kind", list(KINDS))
def test_close_returns_while_a_job_waits_on_an_unsignalled_syncobj(kind, close_wait_1s):
    """A job (writing a fence into a bound BO) waits on an in-syncobj holding a fence
    nobody signals; close(fd) returns within the driver's bound (close_wait_ms, 1 s
    here), the job never runs, dmesg stays clean.  Before: the close path waited
    without a timeout (PF/VF: GEM_CLOSE's wait and the scheduler entity's flush; virtio:
    the context's idle wait) and returned only when vgem's own 10 s timer signalled."""
    node = _node(kind)
    vf = VgemFence()
    try:
        d = Dev(node)
        try:
            so = vf.into_syncobj(d)
            h = d.bo(4096).handle
            d.submit([fence(h, 0, 1)], ins=[so])
            time.sleep(0.2)
        finally:
            t0 = time.monotonic()
            d.close()
            took = time.monotonic() - t0
    finally:
        vf.close()
    assert took < 5, f"{kind}: close took {took:.1f} s with a job on an unsignalled fence"
    assert not dmesg_problems()


def _reap(pid: int, limit_s: float) -> tuple[float, str]:
    """Waits up to @limit_s for the killed child @pid to be reaped: (seconds, the states
    /proc/<pid>/stat showed meanwhile, in order, deduplicated)."""
    t0, states = time.monotonic(), ""
    while time.monotonic() - t0 < limit_s:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return time.monotonic() - t0, states
        try:
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            st = "?"
        if not states.endswith(st):
            states += st
        time.sleep(0.05)
    return time.monotonic() - t0, states


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["pf", "vf1", "virtio"])
def test_a_killed_process_exits_while_the_device_holds_its_job(kind, close_wait_1s):
    """A process's copy job is in the device, which never completes it (the PF's engine 0
    hung, x-fi-hang-engine); the process is killed (SIGKILL).  Its exit (the file's
    release) ends within a bound, not in uninterruptible sleep until the device answers.
    PF and VF: the scheduler's job timeout (job_timeout_ms) resets the function.
    virtio-tacc (its device is the host's): 2 x close_wait_ms, 1 s here (staged jobs
    cancelled after one, the device's given up on after the second); its two BOs are
    leaked, counted (their pages stay pinned: the job may still use them), and its
    context stays (ctx_stuck) until the job ended, then is destroyed by itself
    (ctx_reaped, its id and its uid's context charge back, with no open or close of the
    node to carry it).  Before (virtio): the release waited for the device without a
    bound (state D until the engine resumed); then, bounded, the context went only at
    the node's next open or close (ctx_reaped 0 for 5 s after the engine resumed)."""
    from tacc.guest_qmp import PF_QOM, GuestQMP

    node = str(_node(kind))
    st0 = _vstats()
    ctxs0 = _users(kind).get(0, [0])[0]
    rfd, wfd = os.pipe()
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-fi-hang-engine", 0)
        reaped = False
        try:
            pid = os.fork()
            if pid == 0:  # the tenant: its job in the device, then it sleeps
                try:
                    d = Dev(node)
                    h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
                    d.submit([copy(OP_H2D, h, dv, 4096)])
                    os.write(wfd, b"1")
                    time.sleep(600)
                finally:
                    os._exit(1)
            os.close(wfd)
            assert os.read(rfd, 1) == b"1", "the child did not submit"
            time.sleep(0.3)
            os.kill(pid, 9)
            took, states = _reap(pid, 15)
            reaped = took < 15
        finally:
            q.qom_set(PF_QOM, "x-fi-hang-engine", -1)
            os.close(rfd)
            if not reaped:
                os.waitpid(pid, 0)
    st1 = _vstats()
    deadline = time.monotonic() + 5  # the job ends now: its context goes, no open needed
    while kind == "virtio" and time.monotonic() < deadline and \
            _vstats().get("ctx_reaped", 0) == st0.get("ctx_reaped", 0):
        time.sleep(0.05)
    st2 = _vstats()
    delta = {k: st1.get(k, 0) - st0.get(k, 0)
             for k in ("ctx_stuck", "leaked_bos", "leaked_pages")}
    delta["ctx_reaped"] = st2.get("ctx_reaped", 0) - st0.get("ctx_reaped", 0)
    delta["ctx_charged"] = _users(kind).get(0, [0])[0] - ctxs0
    record_figures(f"kill_held_job_{kind}", {"seconds": round(took, 2), "states": states,
                                             **delta})
    bound = 2 * 1 + 2 if kind == "virtio" else _param("job_timeout_ms", 2000) / 1000 + 2
    assert took < bound, f"{kind}: the killed process took {took:.1f} s to exit ({states})"
    if kind == "virtio":
        assert delta == {"ctx_stuck": 1, "leaked_bos": 2, "leaked_pages": 2,
                         "ctx_reaped": 1, "ctx_charged": 0}, delta
    with Dev(node) as d:
        assert d.run([nop()]) == 0
    assert not dmesg_problems()


# ------------------------------------------------------ a lying virtio device ----
VIRTIO_BACKEND_QOM = "/machine/peripheral/vtacc0/virtio-backend"  # scripts/run-vm: id=vtacc0
P_CTX_ID = hw.DRM_TACC_PARAM_CONTEXT_ID


@pytest.mark.parametrize("lie", ["in_use", "out_of_range"])
def test_virtio_context_id_from_the_device_is_checked(lie):
    """The device answers the next CTX_CREATE with a context another open file holds,
    or with 16 (the function has 16): open() of the node fails with EIO and the file
    holding that context keeps working.  Before: the driver took any id, so two files
    shared one backend context (one's bindings and jobs in the other's address space)
    or an id indexed the fence page and the 16-bit bitmap of the submit path out of
    range."""
    from tacc.guest_qmp import GuestQMP

    node = _node("virtio")
    with Dev(node) as held, GuestQMP() as q:
        mine = held.param(P_CTX_ID)
        q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctx-id", mine if lie == "in_use" else 16)
        try:
            second = Dev(node)
        except OSError as e:
            got: Any = ("errno", e.errno)
        else:
            got = ("opened", second.param(P_CTX_ID))
            second.close()
        finally:
            q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctx-id", -1)
        assert got == ("errno", errno.EIO), f"{lie}: open() with a lying device -> {got}"
        assert held.run([nop()]) == 0
    with Dev(node) as again:  # the device answers truthfully again
        assert again.run([nop()]) == 0


CTRL_TIMEOUT = Path("/sys/module/tacc/parameters/virtio_ctrl_timeout_ms")
PAGES = 4


def _vstats() -> dict[str, int]:
    """The virtio-tacc node's debugfs virtio_stats (name value lines)."""
    found = list(Path("/sys/kernel/debug/accel").glob("*/virtio_stats"))
    assert found, "no virtio_stats in debugfs"
    return {k: int(v) for k, v in (ln.split() for ln in found[0].read_text().splitlines())}


def _pinned() -> int:
    """Pages pinned (FOLL_PIN) in the guest now, the per-CPU vmstat deltas folded in first
    (the counters otherwise lag up to a second)."""
    Path("/proc/sys/vm/stat_refresh").write_text("1")
    snap = leak_snapshot()
    return snap["nr_foll_pin_acquired"] - snap["nr_foll_pin_released"]


def _pin_base() -> int:
    """_pinned() once it held still for 0.1 s (other I/O pins pages for a moment)."""
    prev = None
    for _ in range(20):
        now = _pinned()
        if now == prev:
            return now
        prev = now
        time.sleep(0.1)
    return now


def _pins(base: int, want: int) -> int:
    """Pages pinned since @base: @want as soon as it is (within 2 s), else the last
    count."""
    for _ in range(20):
        held = _pinned() - base
        if held == want:
            break
        time.sleep(0.1)
    return held


@pytest.mark.timeout(120)
def test_a_late_virtio_control_answer_is_never_the_next_requests():
    """The device carries out a USERPTR BO's BO_CREATE but answers it after the frontend
    gave up (x-fi-ctrl-delay-ms 1500 against virtio_ctrl_timeout_ms 300): BO_CREATE fails
    with ETIMEDOUT and the BO's 4 pages stay pinned (the device may write them), counted
    in virtio_stats.  The next BO_CREATE (a HOST BO, the device serving its queue in
    order) sees the late answer first: dropped, its buffers freed (ctrl_late), and the
    BO gets its own handle: a FENCE into it shows in its mapping, never in the first
    BO's memory.  Before: the failed BO's pages were unpinned (0 pins left) while the
    device held them."""
    from tacc.guest_qmp import GuestQMP

    node = _node("virtio")
    st0, pins0 = _vstats(), _pin_base()
    ub = UserBuf(PAGES * 4096)
    ub.array(np.uint32)[:] = 0x5A5A5A5A
    old = CTRL_TIMEOUT.read_text().strip() if CTRL_TIMEOUT.exists() else None
    timeout_ms = 300 if old else 5000  # a driver without the parameter waits 5 s
    with Dev(node) as d, GuestQMP() as q:
        used0 = q.qom_get(VIRTIO_BACKEND_QOM, "x-page-entries-used")
        try:
            if old:
                CTRL_TIMEOUT.write_text(str(timeout_ms))
            q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctrl-delay-ms", timeout_ms + 1200)
            t0 = time.monotonic()
            first = _err(lambda: d.bo(PAGES * 4096, USERPTR, BO_NO_BIND, userptr=ub.addr))
            took = time.monotonic() - t0
        finally:
            if old:
                CTRL_TIMEOUT.write_text(old)
        bo = d.bo(4096)  # behind the late answer: waits for it, then its own
        d.run([fence(bo.handle, 64, 0xC0FFEE)])
        got = struct.unpack_from("<I", d.map(bo.handle, 4096), 64)[0]
        st1 = _vstats()
        held = _pins(pins0, PAGES)
    used1 = q_get_used()
    delta = {k: st1.get(k, 0) - st0.get(k, 0)
             for k in ("ctrl_timeouts", "ctrl_late", "leaked_bos", "leaked_pages")}
    record_figures("virtio_late_answer", {"errno": first, "seconds": round(took, 2),
                                          "pins_held": held, **delta})
    assert first == errno.ETIMEDOUT, f"BO_CREATE with a late answer -> {first}"
    assert got == 0xC0FFEE, f"the next BO's FENCE landed elsewhere (read {got:#x})"
    assert np.all(ub.array(np.uint32) == 0x5A5A5A5A), "the timed-out BO's memory was written"
    assert held == PAGES, f"{held} of the device-held BO's {PAGES} pages still pinned"
    assert delta == {"ctrl_timeouts": 1, "ctrl_late": 1, "leaked_bos": 1,
                     "leaked_pages": PAGES}, delta
    assert used1 == used0, f"backend page entries {used0} before, {used1} after close"


def q_get_used() -> int:
    from tacc.guest_qmp import GuestQMP

    with GuestQMP() as q:
        return int(q.qom_get(VIRTIO_BACKEND_QOM, "x-page-entries-used"))


def _err(fn: Callable[[], object]) -> int:
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def test_a_short_virtio_control_answer_is_an_error_and_leaves_the_pages_pinned():
    """The device carries out BO_CREATE of a USERPTR BO but its answer has 4 bytes
    (x-fi-ctrl-short=4; the zeroed rest would read as OK with handle 0): BO_CREATE fails
    with EPROTO, the BO's 4 pages stay pinned, counted (ctrl_short, leaked_pages), and
    the file keeps working.  Before: EIO and the pages were unpinned while the device's
    BO named them."""
    from tacc.guest_qmp import GuestQMP

    node = _node("virtio")
    st0, pins0 = _vstats(), _pin_base()
    ub = UserBuf(PAGES * 4096)
    with Dev(node) as d, GuestQMP() as q:
        q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctrl-short", 4)
        first = _err(lambda: d.bo(PAGES * 4096, USERPTR, BO_NO_BIND, userptr=ub.addr))
        assert d.run([nop()]) == 0
        st1 = _vstats()
        held = _pins(pins0, PAGES)
    delta = {k: st1.get(k, 0) - st0.get(k, 0) for k in ("ctrl_short", "leaked_bos",
                                                        "leaked_pages")}
    record_figures("virtio_short_answer", {"errno": first, "pins_held": held, **delta})
    assert held == PAGES, f"{held} of the device-held BO's {PAGES} pages still pinned"
    assert first == errno.EPROTO, f"BO_CREATE with a short answer -> {first}"
    assert delta == {"ctrl_short": 1, "leaked_bos": 1, "leaked_pages": PAGES}, delta


def _open_all(node: Path) -> int:
    """How many files root opens on @node now, until EBUSY (the backend has no context
    left); all closed again."""
    devs: list[Dev] = []
    try:
        while len(devs) < 64:
            try:
                devs.append(Dev(node))
            except OSError as e:
                assert e.errno == errno.EBUSY, f"open #{len(devs) + 1}: {os.strerror(e.errno)}"
                break
        return len(devs)
    finally:
        for d in devs:
            d.close()


LATE_OPENS = 3
LATE_VA = 1 << 32
LATE_TIMEOUT_MS = 200
LATE_DELAY_MS = 6 * LATE_TIMEOUT_MS  # the first answer after the 4 requests' timeouts


@pytest.mark.timeout(120)
def test_late_virtio_context_and_binding_answers_are_settled():
    """The device carries out three CTX_CREATEs (opens) and a FIXED VM_BIND but answers
    each after the frontend gave up (x-fi-ctrl-delay-ms 1200 twice against
    virtio_ctrl_timeout_ms 200; the device serves in order, so the rest wait behind the
    held answers, all answered 2.4 s after the first request, once the timeout is back
    to its default): each fails with ETIMEDOUT.  When the answers come the frontend
    settles them with no request of anyone's to carry them: each late context is
    destroyed (its uid's context charge held until then), the late binding unbound and
    its range released (virtio_stats late_settled 4, ctx_lost and va_lost 0).  Then a
    second BO's VM_BIND is answered late and the BO closed while its binding is in
    doubt: unbound first, so BO_DESTROY is not refused and nothing is leaked
    (late_settled 5).  Then root opens as many files as before (the backend's 16
    contexts less those held elsewhere), root's context count is back, and the first BO
    binds FIXED at the same VA again and a FENCE through it lands.  Before: each late
    context was the backend's for good, so root opened 3 fewer files (16 before, 13
    after: a tenant whose answers come late uses up the 16), and the range stayed taken
    (the second bind EBUSY)."""
    from tacc.guest_qmp import GuestQMP

    node = _node("virtio")
    old = CTRL_TIMEOUT.read_text().strip()
    before = _open_all(node)
    st0 = _vstats()

    def settled(n: int) -> int:
        """late_settled since the start, once it reached @n (within 2 delays + 5 s)."""
        deadline = time.monotonic() + 2 * LATE_DELAY_MS / 1000 + 5
        while (done := _vstats().get("late_settled", 0) - st0.get("late_settled", 0)) < n \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        return done

    with Dev(node) as d, GuestQMP() as q:
        ctxs0 = _users("virtio").get(0, [0])[0]  # root's contexts: this file's
        h = d.bo(8192, flags=BO_NO_BIND).handle
        h2 = d.bo(4096, flags=BO_NO_BIND).handle
        errs = []
        t0 = time.monotonic()
        try:
            CTRL_TIMEOUT.write_text(str(LATE_TIMEOUT_MS))
            for _ in range(LATE_OPENS):
                q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctrl-delay-ms", LATE_DELAY_MS)
                errs.append(_err(lambda: Dev(node).close()))
            q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctrl-delay-ms", LATE_DELAY_MS)
            errs.append(_err(lambda: d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED,
                                                             va=LATE_VA))))
        finally:
            CTRL_TIMEOUT.write_text(old)
        took = time.monotonic() - t0
        held = _users("virtio").get(0, [0])[0] - ctxs0  # the late contexts, still charged
        first = settled(LATE_OPENS + 1)  # no request of ours carries the answers
        ctxs1 = _users("virtio").get(0, [0])[0]
        try:  # a BO closed while its binding is in doubt
            CTRL_TIMEOUT.write_text(str(LATE_TIMEOUT_MS))
            q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-ctrl-delay-ms", LATE_DELAY_MS)
            errs.append(_err(lambda: d.ioctl(VM_BIND, VmBind(handle=h2))))
        finally:
            CTRL_TIMEOUT.write_text(old)
        d.gem_close(h2)  # its VM_UNBIND waits behind the late answer
        settled(LATE_OPENS + 2)
        st1 = _vstats()
        rebind = _err(lambda: d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED, va=LATE_VA)))
        got = None
        if not rebind:
            d.run([fence(h, 64, 0xC0FFEE)])
            got = struct.unpack_from("<I", d.map(h, 8192), 64)[0]
    after = _open_all(node)
    delta = {k: st1.get(k, 0) - st0.get(k, 0)
             for k in ("ctrl_timeouts", "late_settled", "ctx_lost", "va_lost", "leaked_bos")}
    delta["late_pending"] = st1.get("late_pending", -1)  # answers still owed: none
    record_figures("virtio_late_ctx_bind", {
        "errnos": errs, "seconds": round(took, 2), "opens_before": before,
        "opens_after": after, "charged_while_late": held, "settled_unasked": first,
        "rebind": rebind, **delta})
    assert errs == [errno.ETIMEDOUT] * (LATE_OPENS + 2), f"late requests -> {errs}"
    assert held == LATE_OPENS, f"{held} late contexts charged to root while in doubt"
    assert first == LATE_OPENS + 1, f"{first} late answers settled with no request"
    assert after == before, f"root opened {before} files before, {after} after " \
        f"{LATE_OPENS} late CTX_CREATEs"
    assert ctxs1 == ctxs0, f"root holds {ctxs1} contexts after settling, {ctxs0} before"
    assert rebind == 0, f"VM_BIND again at the late binding's VA -> {os.strerror(rebind)}"
    assert got == 0xC0FFEE, f"the FENCE through the new binding read {got}"
    assert delta == {"ctrl_timeouts": LATE_OPENS + 2, "late_settled": LATE_OPENS + 2,
                     "ctx_lost": 0, "va_lost": 0, "leaked_bos": 0, "late_pending": 0}, delta


# ------------------------------------------------------------ per-user limits ----
PARAMS = Path("/sys/module/tacc/parameters")
LIMIT_KINDS = ["pf", "vf1", "virtio"]  # one of each kind: the VFs share their driver code


def _param(name: str, default: int) -> int:
    """A limit of tacc.ko (its documented default where this module has none)."""
    p = PARAMS / name
    return int(p.read_text()) if p.exists() else default


def u_open_until_refused(state: dict[str, Any], node: str, tries: int) -> list[Any]:
    """Opens @node until refused, keeping each file: [files opened, errno or None]."""
    devs = state.setdefault("devs", [])
    for _ in range(tries):
        try:
            devs.append(Dev(node))
        except OSError as e:
            return [len(devs), e.errno]
    return [len(devs), None]


def served(node: str, devmem: int = 0) -> list[Any]:
    """(call_as_tacc_user) Service on @node: open it, with @devmem a DEVICE BO of that size
    copied out to a host BO, else a NOP; ["ok", job status] or ["errno", n, step]."""
    step = "open"
    try:
        with Dev(node) as d:
            if not devmem:
                step = "nop"
                return ["ok", d.run([nop()])]
            step = "device BO"
            h = d.bo(devmem, DEVICE).handle
            step = "host BO"
            host = d.bo(4096).handle
            step = "copy"
            return ["ok", d.run([copy(OP_D2H, h, host, 4096)])]
    except OSError as e:
        return ["errno", e.errno, step]


def _users(kind: str) -> dict[int, list[int]]:
    """The function's per-user counts (uid -> contexts bos devmem_bytes page_entries): a
    PCI function's tacc/users, virtio-tacc's debugfs users; {} from a driver without
    them."""
    if kind == "virtio":
        debug = Path("/sys/kernel/debug/accel")
        found = [p for p in debug.glob("*/users") if (p.parent / "virtio_stats").exists()]
        f = found[0] if found else Path("/nonexistent")
    else:
        f = Path(f"/sys/class/accel/{_node(kind).name}/device/tacc/users")
    if not f.exists():
        return {}
    rows = [ln.split() for ln in f.read_text().splitlines() if not ln.startswith("#")]
    return {int(r[0]): [int(v) for v in r[1:]] for r in rows}


@pytest.mark.parametrize("kind", LIMIT_KINDS)
def test_a_second_user_gets_a_context_when_one_user_forks_for_all(kind):
    """tacc-user forks four processes (as a server forks workers); each opens the node
    until refused and keeps its files.  tacc-user2 then opens the node and runs a job: it
    is served.  tacc-user holds max_ctx_per_user (8) contexts, its processes at most
    max_ctx_per_process (4) each; the refusal past the user's limit is EDQUOT.  Before:
    the limit counted per process only, so the four took all 16 contexts of the PF and of a
    VF (the virtio node had no limit: the first process took 16) and tacc-user2 got
    EBUSY."""
    node = str(_node(kind))
    per_user, per_proc = _param("max_ctx_per_user", 8), _param("max_ctx_per_process", 4)
    procs = [UserProc() for _ in range(4)]
    try:
        got = [p.call(u_open_until_refused, node, 16) for p in procs]
        users = _users(kind)
        second = call_as_tacc_user(served, node, user=USER2)
    finally:
        for p in procs:
            p.close()
    held = sum(n for n, _ in got)
    assert second == ["ok", 0], \
        f"{kind}: tacc-user2 not served ({second}) while tacc-user's processes held {got}"
    assert held == per_user and all(n <= per_proc for n, _ in got), (kind, got)
    assert errno.EDQUOT in {e for _, e in got}, (kind, got)
    uid = int(subprocess.check_output(["id", "-u", "tacc-user"]))
    if users:  # the function's own count of tacc-user's files
        assert users[uid][0] == held, (kind, users)
    assert not dmesg_problems()


def u_hog_devmem(state: dict[str, Any], node: str) -> list[Any]:
    """Takes DEVICE BOs, each the biggest that fits (halving down to 2 MiB), until none
    does; keeps them: [bytes held, errno of the last refusal]."""
    d = state["dev"] = Dev(node)
    held, err = 0, None
    size = _free(d) // (2 * MIB) * (2 * MIB)
    while size >= 2 * MIB:
        try:
            d.bo(size, DEVICE, BO_NO_BIND)
            held += size
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            err = e.errno
            size = size // 2 // (2 * MIB) * (2 * MIB)
    return [held, err]


@pytest.mark.parametrize("kind", LIMIT_KINDS)
def test_a_second_user_gets_device_memory_after_a_hog(kind, user):
    """tacc-user takes DEVICE BOs until refused; tacc-user2 then gets a 2 MiB DEVICE BO and
    copies from it.  tacc-user holds at most user_devmem_pct (50 %) of the function's
    memory, refused with EDQUOT; the function's tacc/users shows the bytes it holds.
    Before: no quota, the hog took all of it and tacc-user2 got ENOSPC."""
    node = str(_node(kind))
    with Dev(node) as d:
        total = d.param(P_DEVMEM)
    pct = _param("user_devmem_pct", 50)
    try:
        held, err = user.call(u_hog_devmem, node)
        users = _users(kind)
        second = call_as_tacc_user(served, node, 2 * MIB, user=USER2)
    finally:
        user.call(u_close)
    record_figures(f"devmem_hog_{kind}", {"function_bytes": total, "held": held,
                                          "refused": errno.errorcode.get(err, err)})
    assert second == ["ok", 0], \
        f"{kind}: tacc-user2 not served ({second}) while tacc-user held {held} of {total} bytes"
    assert err == errno.EDQUOT and 0 < held <= total * pct // 100, (kind, held, total, err)
    uid = int(subprocess.check_output(["id", "-u", "tacc-user"]))
    if users:
        assert users[uid][2] == held, (kind, held, users)
    assert not dmesg_problems()


def u_hog_bos(state: dict[str, Any], node: str, most: int) -> list[Any]:
    """Creates 4 KiB DEVICE BOs (unbound) until refused, at most @most; keeps them:
    [BOs, errno of the refusal or None]."""
    d = state["dev"] = Dev(node)
    n = 0
    while n < most:
        try:
            d.bo(4096, DEVICE, BO_NO_BIND)
        except OSError as e:
            return [n, e.errno]
        n += 1
    return [n, None]


def test_a_second_user_gets_a_virtio_bo_after_a_hog(user):
    """The virtio-tacc backend has 4096 BO handles for the whole function.  tacc-user
    creates BOs until refused: max_bos_per_user (1024), EDQUOT; tacc-user2 then gets a BO
    and runs a copy from it.  Before: one file took all 4096 handles (ENOSPC from the
    backend) and tacc-user2 got ENOSPC."""
    node = str(_node("virtio"))
    limit = _param("max_bos_per_user", 1024)
    t0 = time.monotonic()
    try:
        n, err = user.call(u_hog_bos, str(node), 5000)
        took = time.monotonic() - t0
        users = _users("virtio")
        second = call_as_tacc_user(served, node, 4096, user=USER2)
    finally:
        user.call(u_close)
    record_figures("virtio_bo_hog", {"bos": n, "refused": errno.errorcode.get(err, err),
                                     "seconds": round(took, 2)})
    assert second == ["ok", 0], f"tacc-user2 not served ({second}) while tacc-user held {n} BOs"
    assert (n, err) == (limit, errno.EDQUOT), (n, err)
    uid = int(subprocess.check_output(["id", "-u", "tacc-user"]))
    if users:  # the node's own count: its BOs and their bytes of the window
        assert users[uid][1:3] == [n, n * 4096], users
    assert not dmesg_problems()


def u_hog_entries(state: dict[str, Any], node: str, most: int) -> list[Any]:
    """Creates 4 KiB HOST BOs (unbound: one page-list entry each) until refused, at most
    @most; keeps them: [BOs, errno of the refusal or None]."""
    d = state["dev"] = Dev(node)
    for n in range(most):
        try:
            d.bo(4096, flags=BO_NO_BIND)
        except OSError as e:
            return [n, e.errno]
    return [most, None]


def served_host(node: str) -> list[Any]:
    """(call_as_tacc_user) A HOST BO on @node with a FENCE into it: ["ok", value read
    back] or ["errno", n]."""
    try:
        with Dev(node) as d:
            h = d.bo(4096).handle
            d.run([fence(h, 0, 0xD00D)])
            return ["ok", struct.unpack_from("<I", d.map(h, 4096), 0)[0]]
    except OSError as e:
        return ["errno", e.errno]


def test_a_second_user_gets_virtio_page_entries_after_a_hog(user):
    """The backend's pool of page-list entries (2^20: half would be 2 GiB of pinned
    pages) lowered to 256 on the device (x-fi-page-entries, config page_entries, read
    back through the node's virtio_stats).  tacc-user creates 4 KiB HOST BOs (one entry
    each) until refused: EDQUOT at user_devmem_pct of the pool (the node's users count and
    the backend's x-page-entries-used agree); tacc-user2 then gets a HOST BO and a FENCE into
    it.  Before: the frontend's share was of the constant 2^20 (tacc-user took all 256,
    refused with ENOSPC by the backend) and tacc-user2 got ENOSPC."""
    from tacc.guest_qmp import GuestQMP

    node = str(_node("virtio"))
    pool, pct = 256, _param("user_devmem_pct", 50)
    share = pool // 100 * pct
    uid = int(subprocess.check_output(["id", "-u", "tacc-user"]))
    with GuestQMP() as q:
        used0 = int(q.qom_get(VIRTIO_BACKEND_QOM, "x-page-entries-used"))
        q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-page-entries", pool)
        try:
            seen = _vstats().get("page_entries")
            n, err = user.call(u_hog_entries, node, pool + 1)
            held = _users("virtio").get(uid, [0, 0, 0, 0])[3]
            used = int(q.qom_get(VIRTIO_BACKEND_QOM, "x-page-entries-used")) - used0
            second = call_as_tacc_user(served_host, node, user=USER2)
        finally:
            user.call(u_close)
            q.qom_set(VIRTIO_BACKEND_QOM, "x-fi-page-entries", 1 << 20)
    record_figures("virtio_entries_hog", {"pool": pool, "share": share, "bos": n,
                                          "entries": held, "backend_entries": used,
                                          "refused": errno.errorcode.get(err, err)})
    assert second == ["ok", 0xD00D], f"tacc-user2 not served ({second}) after {n} BOs"
    assert (n, err, held) == (share, errno.EDQUOT, share), (n, err, held, share)
    assert used == held, f"backend holds {used} entries, the node counts {held}"
    assert seen == pool, f"the node reads a pool of {seen}, the device has {pool}"
    assert not dmesg_problems()


CGROUP = Path("/sys/fs/cgroup")


def _kernel_bytes(cg: Path) -> int:
    """memory.stat's "kernel": the cgroup's kernel memory (slab, page tables, accounted
    pages)."""
    for line in (cg / "memory.stat").read_text().splitlines():
        k, v = line.split()
        if k == "kernel":
            return int(v)
    raise AssertionError(f"no kernel line in {cg}/memory.stat")


def u_bos(state: dict[str, Any], node: str, n: int) -> int:
    d = state["dev"] = Dev(node)
    state["bos"] = [d.bo(4096, DEVICE, BO_NO_BIND).handle for _ in range(n)]
    return len(state["bos"])


def u_bind_apart(state: dict[str, Any]) -> int:
    """Binds each BO at its own GiB of VA: a level-1 and a level-2 table each."""
    d = state["dev"]
    for i, h in enumerate(state["bos"]):
        d.ioctl(VM_BIND, VmBind(handle=h, flags=BIND_FIXED, va=(i + 1) << 30))
    return len(state["bos"])


@pytest.mark.parametrize("kind", ["pf", "vf1"])
def test_page_tables_charged_to_the_callers_memory_cgroup(kind, user):
    """tacc-user, in a memory cgroup of its own, binds 128 BOs a GiB apart: 256 new page-
    table pages (live_objects pt_pages).  The cgroup's kernel memory grows by at least their
    4 KiB each (1.61 MB measured, the level-1 tables' child arrays included).  Before: the
    tables were dma_alloc_coherent() pages, charged to no cgroup (it grew 0 bytes on the PF,
    4096 on a VF).  (virtio-tacc: the backend's tables are the host's.)"""
    n = 128
    node = str(_node(kind))
    pci = Path(f"/sys/class/accel/{_node(kind).name}/device")
    cg = CGROUP / "tacc-pt-charge"
    ctl = CGROUP / "cgroup.subtree_control"
    if "memory" not in ctl.read_text().split():
        ctl.write_text("+memory")
    cg.mkdir(exist_ok=True)
    try:
        (cg / "cgroup.procs").write_text(str(user.pid))
        assert user.call(u_bos, node, n) == n
        pt0, k0 = live_objects(pci)["pt_pages"], _kernel_bytes(cg)
        assert user.call(u_bind_apart) == n
        pt1, k1 = live_objects(pci)["pt_pages"], _kernel_bytes(cg)
        user.call(u_close)
    finally:
        (CGROUP / "cgroup.procs").write_text(str(user.pid))
        cg.rmdir()
    tables = pt1 - pt0
    record_figures(f"pt_memcg_{kind}", {"tables": tables, "kernel_bytes_delta": k1 - k0})
    assert tables == 2 * n, (pt0, pt1)
    assert k1 - k0 >= tables * 4096, \
        f"{kind}: {tables} page-table pages, the cgroup's kernel memory grew {k1 - k0} bytes"


# ------------------------------------------------------ one validation ----
def _payload(member: str, *vals: int) -> bytearray:
    """The 104-byte payload of a struct tacc_desc member, its leading fields given."""
    st = PAYLOAD[member]
    n = len(st.unpack(bytes(st.size)))
    return bytearray(st.pack(*vals, *([0] * (n - len(vals)))).ljust(104, b"\0"))


def _bad_commands(dv: int) -> dict[str, tuple[Any, Any]]:
    """name -> (a command with one unused field set, the same command without it); both
    forms, on DEVICE BO @dv (8 KiB: a 1x1x1 GEMM at 0, 4, 8; 16 floats)."""
    def with_(c: Any, **junk: int) -> Any:
        for k, v in junk.items():
            setattr(c, k, v)
        return c

    def gemm2(junk: int) -> Any:
        pl = _payload("gemm", 0, 0, 0, 1, 1, 1, 1, 1, 1, 0x3F800000, 0)
        pl[96] = junk                                          # rsvd2
        return cmd2(OP_GEMM, bytes(pl), [(dv, 0), (dv, 4), (dv, 8)])

    def elt2(junk: int) -> Any:
        pl = _payload("eltwise", 0, 0, 0, 16, ELT_RELU)
        pl[PAYLOAD["eltwise"].size] = junk                     # past cols: unused
        return cmd2(OP_ELT, bytes(pl), [(dv, 0), (0, 0), (dv, 4096)])

    def bias2(junk: int) -> Any:
        pl = _payload("gemm", 0, 0, 0, 1, 1, 1, 1, 1, 1, 0x3F800000, 0)
        pl[64] = junk                          # bias VA without TACC_GEMM_F_BIAS
        return cmd2(OP_GEMM, bytes(pl), [(dv, 0), (dv, 4), (dv, 8)])

    def elt2_b(junk: int) -> Any:
        pl = _payload("eltwise", 0, 0, 0, 16, ELT_RELU)
        pl[8] = junk                           # b VA of a one-operand op
        return cmd2(OP_ELT, bytes(pl), [(dv, 0), (0, 0), (dv, 4096)])

    def rms2(junk: int) -> Any:
        pl = _payload("norm", 0, 0, 0, 0, 1, 16, 16, 16, 0, hw.TACC_NORM_RMS)
        pl[24] = junk                          # beta VA of an RMS norm
        return cmd2(hw.DRM_TACC_OP_NORM, bytes(pl), [(dv, 0), (dv, 4096), (dv, 64)])

    def copy2(junk: int) -> Any:
        pl = _payload("copy", 0, 0, 4096)
        pl[24] = junk                                          # past len: unused
        return cmd2(OP_D2D, bytes(pl), [(dv, 0), (dv, 4096)])

    base = {
        "copy": lambda: copy(OP_D2D, dv, dv, 4096, 0, 4096),
        "gemm": lambda: gemm(dv, dv, dv, 1, 1, 1),
        "eltwise": lambda: Cmd(opcode=OP_ELT, a=Operand(handle=dv),
                               c=Operand(handle=dv, offset=4096), size=16, elt_op=ELT_RELU),
    }
    return {
        "copy value": (with_(base["copy"](), value=1), base["copy"]()),
        "copy m": (with_(base["copy"](), m=1), base["copy"]()),
        "gemm size": (with_(base["gemm"](), size=4), base["gemm"]()),
        "gemm value": (with_(base["gemm"](), value=1), base["gemm"]()),
        "gemm elt_op": (with_(base["gemm"](), elt_op=ELT_RELU), base["gemm"]()),
        "eltwise value": (with_(base["eltwise"](), value=1), base["eltwise"]()),
        "eltwise m": (with_(base["eltwise"](), m=1), base["eltwise"]()),
        "eltwise scalar": (with_(base["eltwise"](), scalar=0x3F800000), base["eltwise"]()),
        "cmd2 copy past len": (copy2(1), copy2(0)),
        "cmd2 gemm rsvd2": (gemm2(1), gemm2(0)),
        "cmd2 eltwise past cols": (elt2(1), elt2(0)),
        "cmd2 gemm bias without its flag": (bias2(1), bias2(0)),
        "cmd2 eltwise b of RELU": (elt2_b(1), elt2_b(0)),
        "cmd2 norm beta of RMS": (rms2(1), rms2(0)),
    }


def u_unused_fields(state: dict[str, Any], node: str) -> dict[str, tuple[int, int]]:
    """tacc-user: name -> (errno of SUBMIT of the bad command or 0 when accepted, WAIT
    status of the good one)."""
    out = {}
    with Dev(node) as d:
        dv = d.bo(8192, DEVICE).handle
        for name, (bad, good) in _bad_commands(dv).items():
            sub = submit2 if not isinstance(bad, Cmd) else (lambda dev, cs: dev.submit(cs))
            try:
                d.wait(sub(d, [bad]))
                err = 0
            except OSError as e:
                err = e.errno
            try:
                out[name] = (err, d.wait(sub(d, [good])))
            except OSError as e:
                out[name] = (err, f"good: {e}")
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_unused_command_fields_refused_on_every_kind(kind, user):
    """One validation for every function kind (kernel/tacc_cmd.c, docs/uapi.md "SUBMIT"):
    a command with a field its opcode does not use set is -EINVAL at SUBMIT, in both the
    128-byte and the 256-byte form; the same command without it runs (status 0)."""
    got = user.call(u_unused_fields, str(_node(kind)))
    assert isinstance(got, dict), got
    wrong = {k: v for k, v in got.items() if v != (errno.EINVAL, 0)}
    assert not wrong, f"{kind}: (SUBMIT errno of the bad command, status of the good): {wrong}"


RO_BYTE, DEV_BYTE = 0x5A, 0xC3


def u_ro_userptr(state: dict[str, Any], node: str) -> dict[str, Any]:
    """tacc-user: a READONLY USERPTR BO over its own buffer (RO_BYTE): the device reads it
    (into a device BO, read back through a host BO), then a COPY_D2H writes DEV_BYTE into
    it.  Returns the statuses and the byte values seen."""
    n = 4096
    ub = UserBuf(n)
    ub.array(np.uint8)[:] = RO_BYTE
    with Dev(node) as d:
        dv = d.bo(n, DEVICE).handle
        host = d.bo(n).handle
        ro = d.bo(n, USERPTR, BO_READONLY, ub.addr).handle
        m = d.map(host, n)
        try:
            read = d.run([copy(OP_H2D, ro, dv, n), copy(OP_D2H, dv, host, n)])
            seen = sorted({int(v) for v in np.frombuffer(m, np.uint8)})
            m[:] = bytes([DEV_BYTE]) * n
            staged = d.run([copy(OP_H2D, host, dv, n)])
            write = d.run([copy(OP_D2H, dv, ro, n)])
        finally:
            m.close()
    return {"read": read, "seen": seen, "staged": staged, "write": write,
            "user": sorted({int(v) for v in ub.array(np.uint8)})}


@pytest.mark.parametrize("kind", list(KINDS))
def test_device_cannot_write_a_readonly_userptr(kind, user):
    """A READONLY USERPTR is device-read-only on every kind: the device reads it, a copy
    into it fails with an MMU fault (-EFAULT) and the user's bytes are unchanged."""
    got = user.call(u_ro_userptr, str(_node(kind)))
    assert (got["read"], got["seen"], got["staged"]) == (0, [RO_BYTE], 0), got
    assert (got["write"], got["user"]) == (-errno.EFAULT, [RO_BYTE]), \
        f"{kind}: the copy into it: status {got['write']}, the user's bytes {got['user']}"
