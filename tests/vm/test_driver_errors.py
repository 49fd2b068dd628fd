"""tacc.ko in the guest: injected device errors, FLR through sysfs `reset`, AER.

Fault injection goes through QMP from inside the guest (tacc.guest_qmp):
x-fi-fail-next-dma and x-fi-corrupt-next-cqe end in a job error (never a hang or a
WARN); FLR and a fatal error (x-fi-fatal, reported by the device as an AER
uncorrectable internal error) fail the jobs in flight with -EIO and leave a
working function, with the same files, buffers and mappings.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest
from tacc.guest_qmp import PF_QOM
from test_driver_basic import (
    DEVICE,
    OP_D2H,
    OP_H2D,
    Dev,
    copy,
    dmesg_problems,
    live_objects,
    nop,
    pf_sysfs,
)
from test_driver_recovery import A_EVENT, TaccEvents, u32a

EV_RESET, EV_FATAL, EV_DMA_ERROR = 3, 4, 8


@pytest.fixture(scope="module")
def qmp():
    mod = pytest.importorskip("tacc.guest_qmp")
    try:
        q = mod.GuestQMP()
    except FileNotFoundError:
        pytest.skip("no guest QMP port")
    yield q
    q.close()


def sysfs_int(name: str) -> int:
    return int((pf_sysfs() / "tacc" / name).read_text())


def roundtrip(d: Dev, h: int, dv: int, n: int = 4096, pattern: int = 0x5A) -> None:
    """Host -> device -> host through existing BOs and mappings."""
    m = d.map(h, 2 * n)
    m[:n] = bytes([pattern]) * n
    m[n:2 * n] = b"\0" * n
    assert d.run([copy(OP_H2D, h, dv, n)]) == 0
    assert d.run([copy(OP_D2H, dv, h, n, doff=n)]) == 0
    assert m[n:2 * n] == bytes([pattern]) * n
    m.close()


def test_injected_dma_error(pf_accel, qmp):
    ev = TaccEvents()
    e0 = sysfs_int("dma_errors")
    with Dev(pf_accel) as d:
        h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
        qmp.qom_set(PF_QOM, "x-fi-fail-next-dma", True)
        t = time.monotonic()
        assert d.run([copy(OP_H2D, h, dv, 4096, tag=0xd3a)], timeout_s=30) == -errno.EIO
        assert time.monotonic() - t < 5, "a DMA error must not wait for the job timeout"
        roundtrip(d, h, dv)     # self-clearing: the next job works
    kinds = [u32a(e, A_EVENT) for e in ev.events(2)]
    ev.close()
    assert sysfs_int("dma_errors") == e0 + 1
    assert EV_DMA_ERROR in kinds
    assert not dmesg_problems()


def test_corrupted_completion(pf_accel, qmp):
    q0 = Path(pf_sysfs() / "tacc/queue_stats").read_text().splitlines()[1].split()
    with Dev(pf_accel) as d:
        d.run([nop()])
        qmp.qom_set(PF_QOM, "x-fi-corrupt-next-cqe", True)
        t = time.monotonic()
        assert d.run([nop(tag=0xbad)], timeout_s=30) == -errno.EIO
        assert time.monotonic() - t < 5, "a corrupted CQE must not wait for the job timeout"
        assert d.run([nop()]) == 0
        assert [d.run([nop()], queue=q) for q in range(4)] == [0] * 4
    q1 = Path(pf_sysfs() / "tacc/queue_stats").read_text().splitlines()[1].split()
    assert int(q1[4]) == int(q0[4]) + 1        # bad_cqes of queue 0
    assert not dmesg_problems()


def _hung_job(d: Dev, qmp, h: int, dv: int) -> int:
    qmp.qom_set(PF_QOM, "x-fi-hang-engine", 0)
    return d.submit([copy(OP_H2D, h, dv, 4096, tag=0x4a46)], queue=0)


def test_flr_sysfs_reset(pf_accel, qmp):
    """FLR through sysfs: jobs in flight get an error fence, state is restored."""
    pci = pf_sysfs()
    r0 = sysfs_int("function_resets")
    ev = TaccEvents()
    with Dev(pf_accel) as d, Dev(pf_accel) as other:
        h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
        roundtrip(d, h, dv, pattern=1)
        try:
            hung = _hung_job(d, qmp, h, dv)
            behind = d.submit([nop()], queue=0)
            time.sleep(0.2)
            (pci / "reset").write_text("1")
        finally:
            qmp.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        assert d.wait(hung, 30) == -errno.EIO
        assert d.wait(behind, 30) in (0, -errno.EIO)
        # contexts, page tables and BOs survive the reset
        roundtrip(d, h, dv, pattern=2)
        assert other.run([nop()], queue=2) == 0
    kinds = [u32a(e, A_EVENT) for e in ev.events(2)]
    ev.close()
    assert sysfs_int("function_resets") == r0 + 1
    assert EV_RESET in kinds
    assert not dmesg_problems()


def test_fatal_error_recovers(pf_accel, qmp):
    """x-fi-fatal: AER (internal error unmasked by the driver) or the driver's own
    fallback resets the function; jobs in flight fail with -EIO."""
    pci = pf_sysfs()
    r0, f0 = sysfs_int("function_resets"), sysfs_int("fatal_errors")
    ev = TaccEvents()
    with Dev(pf_accel) as d:
        h, dv = d.bo(8192).handle, d.bo(8192, DEVICE).handle
        roundtrip(d, h, dv, pattern=3)
        try:
            hung = _hung_job(d, qmp, h, dv)
            time.sleep(0.2)
            qmp.qom_set(PF_QOM, "x-fi-fatal", True)
            assert d.wait(hung, 30) == -errno.EIO
        finally:
            qmp.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        deadline = time.monotonic() + 30
        while sysfs_int("function_resets") == r0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sysfs_int("function_resets") >= r0 + 1
        assert sysfs_int("fatal_errors") == f0 + 1
        roundtrip(d, h, dv, pattern=4)
    kinds = [u32a(e, A_EVENT) for e in ev.events(2)]
    ev.close()
    assert EV_FATAL in kinds and EV_RESET in kinds
    import subprocess
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    aer = [ln for ln in log.splitlines() if "AER" in ln and pci.name in ln]
    print("AER lines:", *aer[-6:], sep="\n  ")
    assert not dmesg_problems()


def test_live_objects_after_errors(pf_accel):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(live_objects().values()):
        time.sleep(0.1)
    assert not any(live_objects().values()), live_objects()
