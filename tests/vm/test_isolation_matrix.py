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
"""

from __future__ import annotations

import errno
import grp
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tacc.runtime.device import devices
from test_driver_basic import (
    DEVICE,
    OP_D2H,
    P_DEVMEM,
    Dev,
    copy,
    dmesg_problems,
    nop,
    pf_sysfs,
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
def user() -> Iterator[UserProc]:
    u = UserProc()
    yield u
    u.close()


# ------------------------------------------------------------ device memory ----
def test_no_function_reads_or_changes_another_functions_memory(victims, user):
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


def test_handoff_to_vfio_waits_for_the_scrub(user):
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
    """The module's count once an earlier test's last fences are gone (5 s at most)."""
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
