"""VFs given to user space: ``tacc vfio bind/unbind`` and the tacc.vfio driver.

Runs in the "extras" boot (VFS=2).  VF 2 goes to vfio-pci; the PF and VF 1 stay with
tacc.ko and must keep working while the VFIO user runs, resets the VF and is killed
with SIGKILL mid-job.  The IOMMU must hold: a VFIO user (the unprivileged tacc-user,
owner of the group node) that points the device at memory it never mapped gets
DMA_ERROR, the guest logs a DMAR fault, and the memory is untouched.  The module's
teardown returns every VF to tacc.ko and asserts it.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import io
import json
import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tacc import hw
from tacc.errors import VfioError
from tacc.testing.unpriv import errno_as_tacc_user
from tacc.vfio import bind as vb
from test_driver_basic import Dev, dmesg_problems, nop, pf_sysfs, wait_accel_node

# tests that need an IOMMU group skip with this reason under IOMMU=off (scripts/test-vm)
NO_IOMMU_SKIP = "IOMMU off: vfio-pci needs an IOMMU group (Debian's kernel has no VFIO_NOIOMMU)"
WORKER = str(Path(__file__).with_name("vfio_worker.py"))
PYPATH = os.pathsep.join(sys.path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``tacc vfio ARGS`` through tacc.cli.main in this process (a new tacc process costs
    ~6 s of guest time in imports; README's guest blocks run the console script)."""
    from tacc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["vfio", *args])
    return subprocess.CompletedProcess(["tacc", "vfio", *args], rc, out.getvalue(),
                                       err.getvalue())


def _one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, (r.returncode, r.stderr)
    assert lines[0].startswith("tacc: error: "), lines
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def vfs():
    """Two VFs (the extras boot has them; other boots get them here); at the end every
    VF is back on tacc.ko with its accel node, asserted."""
    pf = pf_sysfs()
    before = (pf / "sriov_numvfs").read_text().strip()
    if before == "0":
        (pf / "sriov_numvfs").write_text("2")
    vfs = sorted(p.resolve() for p in pf.glob("virtfn*"))
    if not (vfs[0] / "iommu_group").exists():
        pytest.skip(NO_IOMMU_SKIP)
    try:
        yield vfs
    finally:
        for vf in vfs:
            if vb.driver_of(vf.name) != vb.TACC_DRIVER:
                vb.unbind(vf.name)
        for vf in vfs:
            assert vb.driver_of(vf.name) == vb.TACC_DRIVER, vf.name
            wait_accel_node(vf)
        if before == "0":
            (pf / "sriov_numvfs").write_text("0")


@pytest.fixture(scope="module")
def vfio_vf(vfs):
    """VF 2 bound to vfio-pci through the CLI for the module (BDF, its group node)."""
    bdf = vfs[1].name
    r = _cli("bind", bdf, "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)[0]
    assert f["driver"] == "vfio-pci" and f["accel"] is None, f
    assert f["vfio"] == f"/dev/vfio/{vb.group_of(bdf)}" and os.path.exists(f["vfio"])
    assert not (vfs[1] / "accel").exists() or not list((vfs[1] / "accel").glob("accel*"))
    yield bdf, f["vfio"]
    r = _cli("unbind", bdf)
    assert r.returncode == 0, r.stderr
    assert vb.driver_of(bdf) == "tacc"
    with Dev(wait_accel_node(vfs[1])) as d:
        assert d.run([nop()]) == 0  # tacc.ko drives it again


def _others_work(vfs) -> None:
    """The PF and VF 1, through tacc.ko, complete jobs."""
    for pci in (pf_sysfs(), vfs[0]):
        with Dev(wait_accel_node(pci)) as d:
            assert d.run([nop(tag=7)] * 4) == 0, pci.name


def test_bind_refusals(vfs):
    """One clear line each: the PF with VFs on, a function whose accel node is open,
    a function that does not exist."""
    _one_line_error(_cli("bind", pf_sysfs().name), "VFs enabled")
    node = wait_accel_node(vfs[0])
    with Dev(node):
        line = _one_line_error(_cli("bind", vfs[0].name), str(node), "is open", str(os.getpid()))
    assert vb.driver_of(vfs[0].name) == "tacc", line
    with pytest.raises(VfioError, match="no such PCI function"):
        vb.bind("0000:7f:1f.7")


def test_vfio_workload_reset(vfs, vfio_vf):
    """Copies and a GEMM through tacc.vfio equal numpy; the PF and VF 1 work beside it,
    across a VFIO_DEVICE_RESET of VF 2; a second open of the group is one clear error."""
    from tacc.vfio import workload
    from tacc.vfio.driver import TaccVfio

    bdf, node = vfio_vf
    with TaccVfio(bdf) as t:
        assert t.func == 2 and t.devmem_size > 0
        assert workload.copies(t, 256 << 10) == 256 << 10
        assert workload.gemm(t) < 1e-5
        with pytest.raises(VfioError) as e:
            TaccVfio(bdf)
        assert str(e.value).count("\n") == 0 and "already open" in str(e.value), e.value
        _others_work(vfs)
        t.reset()
        _others_work(vfs)
        assert workload.copies(t, 64 << 10, seed=3) == 64 << 10
        hp = Path("/proc/sys/vm/nr_hugepages")
        old = hp.read_text().strip()
        hp.write_text("2")
        try:  # 2 MiB hugetlb buffers, mapped with huge IOMMU and device PTEs
            assert workload.copies(t, 2 << 20, seed=4, huge=True) == 2 << 20
        finally:
            hp.write_text(old)
    r = _cli("list", "--json")
    assert r.returncode == 0
    mine = [f for f in json.loads(r.stdout) if f["bdf"] == bdf]
    assert mine and mine[0]["driver"] == "vfio-pci" and mine[0]["openers"] == []


def _phys(addr: int) -> int:
    """Guest-physical address of the page at virtual @addr (root: /proc/self/pagemap)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // 4096 * 8)
        e = struct.unpack("<Q", f.read(8))[0]
    assert e >> 63, "page not present"
    return (e & ((1 << 55) - 1)) * 4096


def test_iommu_holds_for_the_vfio_user(vfs, vfio_vf):
    """tacc-user owns the group and points the VF at a root page it never mapped
    (its guest-physical address as IOVA): DMA_ERROR both ways, a DMAR fault in the
    log for that address, and the page keeps its pattern."""
    bdf, node = vfio_vf
    victim = mmap.mmap(-1, 4096)
    victim[:] = b"\x5a" * 4096
    cbuf = C.c_char.from_buffer(victim)
    phys = _phys(C.addressof(cbuf))
    mark = f"tacc-test: vfio oob {os.getpid()} {time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")  # a mark, not `dmesg -C`: the log stays whole
    os.chown(node, int(subprocess.check_output(["id", "-u", "tacc-user"])), -1)
    try:
        r = subprocess.run(["su", "tacc-user", "-c",
                            f"PYTHONPATH={PYPATH} {sys.executable} {WORKER} {bdf} oob {phys:#x}"],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.chown(node, 0, -1)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    st_dma = 4  # TACC_ST_DMA_ERROR, checked against the header below

    assert hw.TACC_ST_DMA_ERROR == st_dma
    assert res["write"] == st_dma and res["read"] == st_dma and res["after"] == 0, res
    assert res["irq_status"] & hw.TACC_IRQ_DMA_ERROR, res
    assert victim[:] == b"\x5a" * 4096  # untouched
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    assert mark in log, "the mark left the kernel log ring"
    log = log[log.index(mark):]
    dev = bdf.split(":", 1)[1]  # 01:00.2
    faults = [ln for ln in log.splitlines() if "DMAR" in ln and dev in ln
              and re.search(rf"fault addr 0x0*{phys >> 12:x}000", ln)]
    assert faults, log[-2000:]
    del cbuf
    victim.close()


def test_kill9_vfio_user_mid_job(vfs, vfio_vf):
    """A VFIO user with a long job in flight is SIGKILLed: the PF and VF 1 complete
    their jobs before and after, vfio-pci releases (and resets) the VF, the group can be
    opened again, and the VF works again."""
    bdf, node = vfio_vf
    p = subprocess.Popen([sys.executable, WORKER, bdf, "busy"], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": PYPATH})
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "running"
        assert vb.describe(bdf).openers, "the worker holds the group"
        _one_line_error(_cli("unbind", bdf), node, "is open")
        _others_work(vfs)
        assert p.poll() is None, "the VFIO user stopped by itself"
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=60) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    _others_work(vfs)
    from tacc.vfio.driver import TaccVfio
    deadline = time.monotonic() + 20
    while True:  # the group is free once the killed process's files are released
        try:
            t = TaccVfio(bdf)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with t:
        assert t.run([t.nop()]).status == 0
    assert not dmesg_problems()


def test_bind_check_is_atomic(vfs, monkeypatch):
    """The /proc scan only names openers; the guard is tacc.ko's tacc/handoff, checked and
    set under the context lock.  With the scan blind (an open that came after it), the
    bind is still refused while the node is open, and the function stays on tacc.ko;
    once handed off, tacc-user's open fails with EBUSY until the handoff ends; tacc-user
    cannot write the attribute."""
    import errno

    node = wait_accel_node(vfs[0])
    handoff = vfs[0] / "tacc" / "handoff"
    monkeypatch.setattr(vb, "openers", lambda path: [])
    with Dev(node) as d:
        with pytest.raises(VfioError, match="is open"):
            vb.bind(vfs[0].name)
        assert vb.driver_of(vfs[0].name) == "tacc"
        assert handoff.read_text() == "0\n"
        assert d.run([nop()]) == 0  # the open file still works
    handoff.write_text("1")
    try:
        assert errno_as_tacc_user(node) == errno.EBUSY
        r = subprocess.run(["su", "tacc-user", "-c", f"echo 0 > {handoff}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (r.returncode, r.stderr)
        assert handoff.read_text() == "1\n"
    finally:
        handoff.write_text("0")
    assert errno_as_tacc_user(node) == 0
