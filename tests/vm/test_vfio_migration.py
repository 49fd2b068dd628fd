"""Live migration of a VF through VFIO: tacc_vfio_pci.ko and tacc.vfio.migration.

Runs in the "extras" boot (VFS=2).  VF 1 goes to the variant driver tacc_vfio_pci; the
PF and VF 2 stay with tacc.ko.  Jobs are in flight on VF 1 when it stops (one with its
completion waiting for CQ space, one behind it not started); STOP_COPY's data is read,
the VF is reset (FLR) and its device memory overwritten, hostile states are refused with
the PF and VF 2 working, the saved state is loaded (RESUMING), and after RUNNING both
jobs complete with the data numpy expects, read from the restored device memory.
The phases are timed (record_figures: build/test-results/<boot>/vfio_migration.json).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from tacc.errors import VfioError
from tacc.vfio import bind as vb
from tacc.vfio import uapi as V
from tacc.vfio.workload import VFSTATE_HDR
from test_driver_basic import (
    VM_UNBIND,
    Dev,
    VmUnbind,
    dmesg_problems,
    fence,
    nop,
    pf_sysfs,
    record_figures,
    wait_accel_node,
)
from test_vfio import _cli, vfs  # noqa: F401 (vfs: the fixture: two VFs, all back on tacc.ko)

N = 256 << 10  # bytes each in-flight job copies out of device memory
OFF_FN, OFF_CRC = 8, 12


@pytest.fixture(scope="module")
def mig_vf(request):
    """VF 1 on tacc_vfio_pci for the module (test_vfio's fixture `vfs` enables the VFs
    and gives every VF back to tacc.ko at the end, asserted).  The module is unloaded
    after if this loaded it: tacc.ko, whose symbols it uses, stays removable."""
    fns = request.getfixturevalue("vfs")
    bdf = fns[0].name
    loaded = Path("/sys/module/tacc_vfio_pci").exists()
    r = _cli("bind", "--migration", bdf, "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)[0]
    assert f["driver"] == vb.VARIANT_DRIVER and f["vfio"] == f"/dev/vfio/{vb.group_of(bdf)}", f
    yield bdf, fns
    vb.unbind(bdf)
    with Dev(wait_accel_node(fns[0])) as d:
        assert d.run([nop()]) == 0  # tacc.ko drives it again
    if not loaded:
        r = subprocess.run(["rmmod", "tacc_vfio_pci"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def _others_work(fns) -> None:
    """The PF and VF 2, through tacc.ko, complete jobs."""
    for pci in (pf_sysfs(), fns[1]):
        with Dev(wait_accel_node(pci)) as d:
            assert d.run([nop(tag=9)] * 4) == 0, pci.name


def _refused(m, t, fns, blob: bytes) -> None:
    """Hostile states into VF 1 (RUNNING, just reset): each refused with its errno, the
    device left RESUMING until a reset, the PF and VF 2 working, VF 1's device memory
    unchanged (it holds zeros here)."""
    regs = VFSTATE_HDR.unpack_from(blob)[7]
    mv = memoryview(blob)
    bad = bytearray(blob)  # one copy: damaged, then another VF's with a good CRC
    bad[64 + regs + N // 2] ^= 0x40

    def forge() -> bytearray:
        bad[64 + regs + N // 2] ^= 0x40
        struct.pack_into("<HHI", bad, OFF_FN, 2, 0, 0)
        struct.pack_into("<I", bad, OFF_CRC, zlib.crc32(bad))
        return bad

    cases = [("truncated", lambda: [mv[:-4096]], errno.EINVAL),
             ("damaged", lambda: [bad], errno.EINVAL),
             ("another VF's", lambda: [forge()], errno.EACCES),
             ("empty", lambda: [], errno.EINVAL),
             ("padded", lambda: [mv, bytes(8)], errno.EFBIG)]
    for name, parts, want in cases:
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        with pytest.raises(VfioError) as e:
            m.load(*parts())
        assert e.value.errno == want, (name, e.value)
        assert m.state() == V.VFIO_DEVICE_STATE_RESUMING, name
        t.reset()
        assert m.state() == V.VFIO_DEVICE_STATE_RUNNING, name
    _others_work(fns)
    out = t.alloc(N)
    assert t.run([t.copy_d2h(0, out, N)]).status == 0  # VF 1 itself works after them
    assert not out.array.any(), "the refused states changed VF 1's device memory"
    t.free(out)


def _iommufd_driver() -> bool:
    """The running kernel's CONFIG_IOMMUFD_DRIVER: from /proc/config.gz (the debug
    kernel's IKCONFIG) or the distribution's /boot/config-<release>."""
    import gzip

    proc, boot = Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}")
    text = gzip.decompress(proc.read_bytes()).decode() if proc.exists() else \
        boot.read_text() if boot.exists() else None
    assert text is not None, "the running kernel's configuration is not readable"
    return "CONFIG_IOMMUFD_DRIVER=y" in text


def test_migrate_jobs_in_flight(mig_vf):
    """RUNNING -> STOP with two jobs in flight -> STOP_COPY (read) -> FLR, device memory
    overwritten -> hostile states refused -> RESUMING (the saved state) -> RUNNING: the
    jobs complete with numpy's data (tacc.vfio.workload.migrate_in_flight); the state's
    header and size; the dirty pages; figures of every phase."""
    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import migrate_in_flight

    bdf, fns = mig_vf
    with TaccVfio(bdf) as t:
        m = Migration(t.dev)
        assert m.flags() == V.VFIO_MIGRATION_STOP_COPY
        assert m.state() == V.VFIO_DEVICE_STATE_RUNNING
        fig = migrate_in_flight(t, m, N, between=lambda blob: _refused(m, t, fns, blob))
        assert m.state() == V.VFIO_DEVICE_STATE_RUNNING
        assert fig["hdr_fn"] == 1 and fig["devmem_bytes"] == t.devmem_size, fig
        assert fig["state_bytes"] == fig["size_reported"] == fig["hdr_total"] == (
            64 + fig["regs_bytes"] + fig["devmem_bytes"]), fig
        # VFIO's DMA_LOGGING_REPORT walks the user's bitmap with iova_bitmap, built only
        # with CONFIG_IOMMUFD_DRIVER; Debian's 6.12 has none: the core answers EOPNOTSUPP
        # before asking the driver (DMA_LOGGING_START reached it: the log was on)
        if fig["dirty"] is None:
            assert not _iommufd_driver()
        else:
            assert fig["dirty"] == fig["written"], fig
            print(f"dirty pages exact: {len(fig['dirty'])} pages")
    _others_work(fns)
    record_figures("vfio_migration", {k: round(v, 2) if isinstance(v, float) else v
                                      for k, v in fig.items() if k not in ("dirty", "written")})



def test_state_of_another_vf_refused(mig_vf):
    """VF 1's state, unmodified, into VF 2 (both on tacc_vfio_pci, each opened by its own
    VFIO user): EACCES (the device's WRONG_FN), VF 2 left RESUMING until its reset, then
    both VFs run numpy-checked copies.  Each user reaches only its own device's state: the
    data fds come from the device fd it opened."""
    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import copies

    bdf, fns = mig_vf
    other = fns[1].name
    vb.bind(other, driver=vb.VARIANT_DRIVER)
    try:
        with TaccVfio(bdf) as t1, TaccVfio(other) as t2:
            m1, m2 = Migration(t1.dev), Migration(t2.dev)
            m1.set_state(V.VFIO_DEVICE_STATE_STOP)
            blob = m1.save()
            m1.set_state(V.VFIO_DEVICE_STATE_RUNNING)
            assert VFSTATE_HDR.unpack_from(blob)[3] == 1
            m2.set_state(V.VFIO_DEVICE_STATE_STOP)
            with pytest.raises(VfioError) as e:
                m2.load(blob)
            assert e.value.errno == errno.EACCES, e.value
            assert m2.state() == V.VFIO_DEVICE_STATE_RESUMING
            t2.reset()
            assert m2.state() == V.VFIO_DEVICE_STATE_RUNNING
            assert copies(t2, 64 << 10, seed=5) == 64 << 10
            assert copies(t1, 64 << 10, seed=6) == 64 << 10
    finally:
        vb.unbind(other)

def _buffer_bytes(fd: int) -> int:
    """The PF buffer a migration file holds (tacc_vfio_pci's fdinfo)."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("tacc-mig-buffer-bytes:"):
            return int(line.split()[1])
    raise AssertionError(f"no tacc-mig-buffer-bytes in fd {fd}'s fdinfo")


def _released(fd: int, timeout: float = 5.0) -> int:
    """The file's buffer bytes once they are 0, or after @timeout seconds."""
    deadline = time.monotonic() + timeout
    while (n := _buffer_bytes(fd)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def _read_err(fd: int) -> int | None:
    """The errno of one read of a migration file, None if it returned data or EOF."""
    try:
        os.read(fd, 4096)
    except OSError as e:
        return e.errno
    return None


def test_flr_disables_open_files(mig_vf):
    """VFIO_DEVICE_RESET (FLR) while the STOP_COPY file is being read (a thread reads it
    in 4 KiB pieces), then with the RESUMING file half written: the state is RUNNING after
    each, the file's next read or write fails with ENODEV (not the saved bytes), its PF
    buffer (the blob's size, in its fdinfo) is freed soon after the reset while the file
    stays open and no state changes, and VF 1 runs a numpy-checked copy.  The reads and
    writes copy to or from user memory under the file's lock while the reset holds VFIO's
    memory_lock (taken in a BAR mmap's fault under mmap_lock): the debug kernel's lockdep
    sees both orders here."""
    import threading

    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import copies

    bdf, _ = mig_vf
    with TaccVfio(bdf) as t:
        m = Migration(t.dev)
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        fd = m.set_state(V.VFIO_DEVICE_STATE_STOP_COPY)
        assert fd is not None
        size = _buffer_bytes(fd)
        assert size >= m.data_size() > 0 and size % 4096 == 0, size
        got: dict[str, object] = {"bytes": 0}
        first = threading.Event()

        def reader() -> None:
            try:
                while b := os.read(fd, 4096):
                    got["bytes"] = int(got["bytes"]) + len(b)
                    first.set()
                got["end"] = "eof"
            except OSError as e:
                got["end"] = e.errno
            first.set()

        try:
            th = threading.Thread(target=reader)
            th.start()
            assert first.wait(60)
            t.reset()
            th.join(60)
            assert not th.is_alive()
            assert got["end"] in ("eof", errno.ENODEV), got
            assert m.state() == V.VFIO_DEVICE_STATE_RUNNING
            assert _read_err(fd) == errno.ENODEV, "STOP_COPY data read after the FLR"
            assert _released(fd) == 0, f"STOP_COPY file holds {_buffer_bytes(fd)} bytes"
        finally:
            os.close(fd)
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        fd = m.set_state(V.VFIO_DEVICE_STATE_RESUMING)
        assert fd is not None
        try:
            assert os.write(fd, bytes(4096)) == 4096
            assert _buffer_bytes(fd) == size
            t.reset()
            assert m.state() == V.VFIO_DEVICE_STATE_RUNNING
            with pytest.raises(OSError) as e:
                os.write(fd, bytes(4096))
            assert e.value.errno == errno.ENODEV
            assert _released(fd) == 0, f"RESUMING file holds {_buffer_bytes(fd)} bytes"
        finally:
            os.close(fd)
        assert copies(t, 64 << 10, seed=7) == 64 << 10
    print(f"STOP_COPY bytes read before the FLR: {got['bytes']}, then {got['end']}")


def _pf_function_reset() -> None:
    """tacc.ko resets the PF's function (CTRL_RESET, no PCI reset: the VFs stay): a TLB
    invalidation the device does not complete (x-fi-tlb-inv-stall) on a VM_UNBIND of the
    PF; function_resets + 1."""
    from tacc.guest_qmp import PF_QOM, GuestQMP

    resets = pf_sysfs() / "tacc/function_resets"
    r0 = int(resets.read_text())
    with Dev(wait_accel_node(pf_sysfs())) as d:
        victim = d.bo(8192)
        assert d.run([fence(victim.handle, 0, 0x11)]) == 0  # the device caches its page
        q = GuestQMP()
        q.qom_set(PF_QOM, "x-fi-tlb-inv-stall", True)
        try:
            d.ioctl(VM_UNBIND, VmUnbind(handle=victim.handle))
        finally:
            q.qom_set(PF_QOM, "x-fi-tlb-inv-stall", False)
            q.close()
        assert d.run([nop()]) == 0
    assert int(resets.read_text()) == r0 + 1, "no function reset of the PF"


def test_pf_reset_ends_stop(mig_vf):
    """A reset of the PF ends VF 1's stop and log on the device (docs/hardware.md section
    16) without VF 1's driver seeing a reset of its own: tacc_vfio_pci then reports
    RUNNING as after an FLR, the open STOP_COPY file's next read fails with ENODEV (not
    the state saved before the reset), logging is off (a report fails, LOG_STOP passes),
    and a new migration of VF 1 works: STOP, STOP_COPY's state with VF 1's number,
    RUNNING, a numpy-checked copy."""
    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import copies

    bdf, _ = mig_vf
    with TaccVfio(bdf) as t:
        m = Migration(t.dev)
        iova, size = t.bufs[0].iova, t.next_iova - t.bufs[0].iova  # the rings' IOVAs
        page = m.log_start([(iova, size)], 4096)
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        fd = m.set_state(V.VFIO_DEVICE_STATE_STOP_COPY)
        assert fd is not None
        try:
            assert len(os.read(fd, 4096)) == 4096
            _pf_function_reset()
            st = m.state()
            assert st == V.VFIO_DEVICE_STATE_RUNNING, \
                f"state {st} after the PF's reset (the device runs VF 1 again)"
            assert _read_err(fd) == errno.ENODEV, "the state saved before the PF's reset read"
        finally:
            os.close(fd)
        with pytest.raises(VfioError) as e:
            m.log_report(iova, size, page)
        # the driver's "not logging" (the device's refusal of LOG_REPORT would be EBUSY);
        # without iommufd's iova_bitmap the VFIO core answers EOPNOTSUPP before it
        assert e.value.errno == (errno.EINVAL if _iommufd_driver() else errno.EOPNOTSUPP), \
            e.value
        m.log_stop()
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        blob = m.save()
        assert VFSTATE_HDR.unpack_from(blob)[3] == 1
        m.set_state(V.VFIO_DEVICE_STATE_RUNNING)
        t.init_hw()
        assert copies(t, 64 << 10, seed=8) == 64 << 10
    assert not dmesg_problems()


FUZZ_WINDOW = 2 << 20  # VF 1's window while fuzzing: each state ~2.2 MB, not 33.75


@pytest.fixture
def small_window_vf(mig_vf):
    """VF 1 with a 2 MiB window (sriov_policy/, set with the VFs off), on tacc_vfio_pci;
    afterwards the policy and the VFs as they were."""
    pf = pf_sysfs()
    pol = pf / "sriov_policy" / "vf1_devmem_bytes"
    numvfs, old = (pf / "sriov_numvfs").read_text().strip(), pol.read_text().strip()
    (pf / "sriov_numvfs").write_text("0")
    pol.write_text(str(FUZZ_WINDOW))
    (pf / "sriov_numvfs").write_text("2")
    fns = sorted(p.resolve() for p in pf.glob("virtfn*"))
    try:
        vb.bind(fns[0].name, driver=vb.VARIANT_DRIVER)
        yield fns[0].name, fns
    finally:
        vb.unbind(fns[0].name)
        (pf / "sriov_numvfs").write_text("0")
        pol.write_text(old)
        (pf / "sriov_numvfs").write_text(numvfs)


def _mutate(rng: np.random.Generator, blob: bytes, regs: int) -> tuple[str, bytes]:
    """One hostile state: bits flipped anywhere (the CRC left), bits flipped with the CRC
    made good again (to reach the device's own checks) in the header and the first KiB
    of the registers (the scalar registers and queue 0's ring) or anywhere in the
    registers, a truncation, or a header length forged with a good CRC."""
    b = bytearray(blob)
    kind = int(rng.integers(5))
    if kind == 0:
        for _ in range(int(rng.integers(1, 5))):
            i = int(rng.integers(len(b) * 8))
            b[i // 8] ^= 1 << (i % 8)
        return "flip", bytes(b)
    if kind in (1, 4):
        span = 64 + (1024 if kind == 1 else regs)
        for _ in range(int(rng.integers(1, 5))):
            i = int(rng.integers(span * 8))
            if i // 8 not in range(OFF_CRC, OFF_CRC + 4):
                b[i // 8] ^= 1 << (i % 8)
        return ("flip1k+crc" if kind == 1 else "flip+crc"), _recrc(b)
    if kind == 2:
        return "truncate", bytes(b[:int(rng.integers(len(b)))])
    off = int(rng.choice([16, 24, 32]))  # total_len, regs_len, devmem_len
    struct.pack_into("<Q", b, off, int(rng.integers(1 << 63)) >> int(rng.integers(64)))
    return "length+crc", _recrc(b)


def _recrc(b: bytearray) -> bytes:
    struct.pack_into("<I", b, OFF_CRC, 0)
    struct.pack_into("<I", b, OFF_CRC, zlib.crc32(b))
    return bytes(b)


@pytest.mark.long
@pytest.mark.timeout(3600)  # 10,000 states: ~8 per second of the TCG guest
def test_fuzz_resuming(small_window_vf):
    """TACC_VFMIG_FUZZ (10,000) mutated states into VF 1 through RESUMING: each refused
    with EINVAL, EPROTONOSUPPORT or EACCES, or taken (a mutation the device's checks allow:
    the VF then runs it and is reset); never another errno, a hang or a kernel problem.
    Every 1,000 and at the end the PF and VF 2 run jobs, and VF 1, reset, runs a
    numpy-checked copy."""
    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import copies

    count = int(os.environ.get("TACC_VFMIG_FUZZ", "10000"))
    bdf, fns = small_window_vf
    rng = np.random.default_rng(34)
    outcomes: dict[str, int] = {}
    with TaccVfio(bdf) as t:
        assert t.devmem_size == FUZZ_WINDOW
        m = Migration(t.dev)
        t.submit([t.nop()])  # some queue state to save
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        blob = m.save()
        regs = VFSTATE_HDR.unpack_from(blob)[7]
        t.reset()
        allowed = {errno.EINVAL, errno.EPROTONOSUPPORT, errno.EACCES}
        for i in range(count):
            kind, bad = _mutate(rng, blob, regs)
            m.set_state(V.VFIO_DEVICE_STATE_STOP)
            try:
                m.load(bad)
                m.set_state(V.VFIO_DEVICE_STATE_RUNNING)
                res = "taken"
            except VfioError as e:
                assert e.errno in allowed, (i, kind, e)
                assert m.state() == V.VFIO_DEVICE_STATE_RESUMING, (i, kind)
                res = errno.errorcode[e.errno]
            outcomes[f"{kind}:{res}"] = outcomes.get(f"{kind}:{res}", 0) + 1
            t.dev.reset()
            if (i + 1) % 1000 == 0 or i + 1 == count:
                _others_work(fns)
                t.init_hw()
                assert copies(t, 64 << 10, seed=i) == 64 << 10
    assert not dmesg_problems()
    record_figures("vfio_migration_fuzz", {"states": count, **dict(sorted(outcomes.items()))})
