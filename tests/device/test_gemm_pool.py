"""Big GEMMs (at least 2^21 multiply-adds) run on QEMU's thread pool and QEMU's
main loop never waits for them (docs/hardware.md section 9, "Host work"): a
completion due before the worker has finished is deferred to the pool's
completion callback with its modelled timestamps; resets, FLR, VF disable and
an unplug in flight cancel the worker and never join it.

The GEMM here is 2^30 multiply-adds (4096 x 64 x 4096: about a second of host
compute on the 2-core machine).  Modelled, it takes 0.28 ms.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_gemm, desc
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import DEVMEM_VA, Tacc
from test_host_bounds import QMP_BOUND_S, Probe

M, N, K = 4096, 64, 4096
B_OFF, C_OFF = 64 << 20, 66 << 20
Q0 = hw.TACC_QUEUE_BASE(0)
# a clock_step past a due GEMM completion, a reset or unplug mid-GEMM
STEP_BOUND_S = 0.5
PCIHP_EJ, PCIHP_SEL = 0xCC8, 0xCD0  # q35 ACPI PCI hotplug: eject, slot select


def threads(pid: int) -> dict[int, str]:
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(t.name)] = (t / "comm").read_text().strip()
        except OSError:
            pass
    return out


_seen: dict[int, tuple[int, list[str]]] = {}  # per QEMU: log offset read, trace lines


def gemm_log(d: Tacc, what: str) -> list[str]:
    """The tacc_gemm_* trace lines naming what, from the whole log (qt.log() is
    its tail; the log also holds the qtest traffic, so only new bytes are read)."""
    pos, lines = _seen.get(id(d), (0, []))
    with open(d.qt.log_path, "rb") as f:
        f.seek(pos)
        new = f.read()
    end = new.rfind(b"\n") + 1
    lines += [ln for ln in new[:end].decode(errors="replace").splitlines()
              if "tacc_gemm_" in ln]
    _seen[id(d)] = (pos + end, lines)
    return [ln for ln in lines if what in ln]


def wait_log(d: Tacc, what: str, n: int, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while len(gemm_log(d, what)) < n:
        assert time.monotonic() < end, d.qt.log()[-2000:]
        time.sleep(0.002)


def new_dev(props: str = "", data: bool = False,
            **kw) -> tuple[Tacc, np.ndarray, np.ndarray]:
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc(props, extra=["-name", "debug-threads=on", "-trace", "tacc_gemm_*",
                           *kw.pop("extra", [])], **kw)
    pf = d.pf
    pf.reset()
    pf.set_ptbr(0, d.map_default())
    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    for off, arr in ((0, A), (B_OFF, B)) if data else ():
        raw = arr.tobytes()
        for i in range(0, len(raw), 16 << 20):
            chunk = raw[i:i + (16 << 20)]
            host = d.alloc(len(chunk))
            d.qt.memwrite(host, chunk)
            cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA + off + i,
                                       len(chunk))])
            assert cq.status == hw.TACC_ST_OK
    d.reset_alloc()
    return d, A, B


def big_gemm():
    return d_gemm(DEVMEM_VA, DEVMEM_VA + B_OFF, DEVMEM_VA + C_OFF, M, N, K, K, N, N)


def start_big_gemm(d: Tacc) -> float:
    """Submit the big GEMM on the PF's queue 0 and wait until its worker has
    it; returns the time then."""
    _, ds = d.pf.job_of(0, [big_gemm()])
    d.pf.submit(0, ds)
    wait_log(d, "tacc_gemm_submit", 1)
    return time.monotonic()


def fetch_c(d: Tacc) -> np.ndarray:
    d.reset_alloc()  # the same host pages each time (the same TLB entries)
    host = d.alloc(M * N * 4)
    cq = d.pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + C_OFF, host, M * N * 4)])
    assert cq.status == hw.TACC_ST_OK
    return np.frombuffer(d.qt.memread(host, M * N * 4), np.float32).reshape(M, N)


def test_due_gemm_completion_does_not_hold_the_main_loop():
    """The clock is stepped past a computing GEMM's modelled completion: the
    step and QMP come back at once (they waited for the worker before: the
    completion joined it under the BQL), the CQE appears once the pool's
    completion callback has run, with the same start/end as a GEMM whose
    worker finished before its completion was due, and C equals numpy's.
    No thread is created per GEMM: the pool's workers compute them."""
    sock = f"/tmp/tacc-gp-{time.monotonic_ns()}.sock"
    d, A, B = new_dev(data=True, extra=["-qmp", f"unix:{sock},server=on,wait=off"])
    try:
        pf, pid = d.pf, d.qt.proc.pid
        probe = Probe(sock, pid)
        want = A.astype(np.float64) @ B
        # 1. the worker finishes before the completion is due (wall-time wait);
        # twice, so that the TLB holds the same entries before each round
        compute = []  # wall time of the worker, from its start to its completion
        for i in range(2):
            _, ds = pf.job_of(0, [big_gemm()])
            pf.submit(0, ds)
            wait_log(d, "tacc_gemm_submit", i + 1)
            t0 = time.monotonic()
            wait_log(d, "tacc_gemm_done", i + 1)
            compute.append(time.monotonic() - t0)
            d.qt.clock_step(10**7)
            ref = pf.cqes(0)
            assert [c.status for c in ref] == [hw.TACC_ST_OK]
            np.testing.assert_allclose(fetch_c(d), want, rtol=1e-4, atol=1e-3 * K)
        # 2. the completion is due while the worker computes
        names: set[str] = set()
        probe.start()
        _, ds = pf.job_of(0, [big_gemm()])
        pf.submit(0, ds)
        wait_log(d, "tacc_gemm_submit", 3)  # gathered (sliced): the worker computes
        names |= set(threads(pid).values())
        t0 = time.monotonic()
        d.qt.clock_step(10**7, settle=False)
        t_step = time.monotonic() - t0
        early = pf.cqes(0)  # registers show the device stopped at the completion
        waited = d.qom_get("x-gemm-wait")
        names |= set(threads(pid).values())
        t0 = time.monotonic()
        d.settle()
        t_settle = time.monotonic() - t0
        cq = early + pf.cqes(0)
        probe.finish()
        print(f"deferred {waited}; worker {compute[-1]:.3f} s; "
              f"clock_step {t_step:.3f} s (then {t_settle:.3f} s until the worker "
              f"was done), worst QMP {probe.worst:.3f} s over {probe.rounds} rounds; "
              f"threads {sorted(names)}")
        assert t_step < STEP_BOUND_S, t_step
        # the step did not wait for the worker (a join took the compute time)
        assert t_step < compute[-1] / 2, (t_step, compute)  # [0]: log backlog
        assert probe.worst < QMP_BOUND_S, probe.worst
        assert "tacc-gemm" not in names
        if waited:  # the host was slower than the model: deferred, not late
            assert early == []
        assert [c.status for c in cq] == [hw.TACC_ST_OK]
        assert cq[0].end - cq[0].start == ref[0].end - ref[0].start
        np.testing.assert_allclose(fetch_c(d), want, rtol=1e-4, atol=1e-3 * K)
    finally:
        probe.stop.set()
        d.close()


def test_eight_gemms_share_the_pool_threads():
    """Eight big GEMMs on four queues: they run on at most four pool workers
    (threads reused from one GEMM to the next), never one thread per GEMM."""
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc("", extra=["-name", "debug-threads=on", "-trace", "tacc_gemm_*"])
    try:
        pf, pid = d.pf, d.qt.proc.pid
        pf.reset()
        pf.set_ptbr(0, d.map_default())
        m, n, k = 512, 64, 512  # 2^24 multiply-adds each
        before = threads(pid)
        seen: dict[int, str] = {}
        for q in range(4):
            _, ds = pf.job_of(q, [d_gemm(DEVMEM_VA, DEVMEM_VA + B_OFF,
                                         DEVMEM_VA + C_OFF + q * (1 << 20),
                                         m, n, k, k, n, n)] * 2)
            pf.submit(q, ds)
        end = time.monotonic() + 60
        while len(gemm_log(d, "tacc_gemm_done")) < 8:
            seen.update(threads(pid))
            d.qt.clock_step(10**5)
            assert time.monotonic() < end, d.qt.log()[-2000:]
        seen.update(threads(pid))
        d.qt.clock_step(10**9)
        st = [[c.status for c in pf.cqes(q)] for q in range(4)]
        new = {t: c for t, c in seen.items() if t not in before}
        print(f"threads created during 8 GEMMs: {sorted(new.values())}")
        assert st == [[hw.TACC_ST_OK]] * 4  # one job of two GEMMs per queue
        assert "tacc-gemm" not in new.values()
        assert len(new) <= 4, new
    finally:
        d.close()


def _queue_reset(d: Tacc):
    d.pf.w32(Q0 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_RESET)


def _function_reset(d: Tacc):
    d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)


def _flr(d: Tacc):
    qt = d.qt
    exp = qt.find_cap(0, 0x08, 0x10)
    qt.cfg_write(0, 0x08, exp + 8, qt.cfg_read(0, 0x08, exp + 8, 2) | 0x8000, 2)


@pytest.mark.parametrize("abort", [_queue_reset, _function_reset, _flr],
                         ids=["queue-reset", "function-reset", "flr"])
def test_abort_mid_gemm_does_not_wait_for_the_worker(abort):
    """A reset of the queue, of the function, or an FLR while the GEMM computes
    comes back at once; the worker stops at its next batch and its completion
    callback frees the job (QEMU lives on, the device runs the next job)."""
    d, _, _ = new_dev()
    try:
        pf = d.pf
        t0 = start_big_gemm(d)
        abort(d)
        assert d.pf.r32(hw.TACC_REG_SCRATCH) is not None
        dt = time.monotonic() - t0
        assert dt < STEP_BOUND_S, f"{abort.__name__} took {dt:.2f} s"
        wait_log(d, "cancelled 1", 1)
        assert not d.qt.died(), d.qt.died()
        if abort is _flr:
            for bar, addr in ((0, pf.bar0), (2, pf.bar2), (4, pf.bar4)):
                d.qt.set_bar(0, 0x08, 0x10 + 4 * bar, addr, True)
            d.qt.cfg_write(0, 0x08, 0x04, 0x0006, 2)
        if abort is not _queue_reset:
            pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
            pf.set_ptbr(0, d.map_default())
        pf.setup_queue(0)
        assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == hw.TACC_ST_OK
    finally:
        d.close()


def test_vf_disable_mid_gemm():
    """A VF's GEMM in flight when the PF disables its VFs: cancelled, freed by
    its completion callback; the PF goes on."""
    d, _, _ = new_dev("sriov-max-vfs=1")
    try:
        d.pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), 64 << 20)
        d.pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), 64 << 20)
        (vf,) = d.enable_vfs(1)
        vf.reset()
        vf.set_ptbr(0, d.map_default(devmem=64 << 20))
        # 2^28 multiply-adds within the VF's 64 MiB window (A 16 MiB, B 1 MiB)
        _, ds = vf.job_of(0, [d_gemm(DEVMEM_VA, DEVMEM_VA + (32 << 20),
                                     DEVMEM_VA + (40 << 20), 1024, 64, 4096, 4096, 64, 64)])
        vf.submit(0, ds)
        wait_log(d, "tacc_gemm_submit", 1)
        t0 = time.monotonic()
        d.enable_vfs(0)
        assert time.monotonic() - t0 < STEP_BOUND_S
        wait_log(d, "cancelled 1", 1)
        assert d.pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == hw.TACC_ST_OK
    finally:
        d.close()


def test_unplug_mid_gemm():
    """The guest ejects the PF (ACPI PCI hotplug) while its GEMM computes: the
    device is freed at once; the job, detached from it, is freed by its
    completion callback later (no use after free: QEMU lives on)."""
    d, _, _ = new_dev("", root_port="")
    try:
        pf = d.pf
        t0 = start_big_gemm(d)
        d.qt.outl(PCIHP_SEL, 0)
        d.qt.outl(PCIHP_EJ, 1 << (pf.devfn >> 3))
        assert time.monotonic() - t0 < STEP_BOUND_S
        assert d.qt.find_devices(hw.TACC_PCI_VENDOR_ID, hw.TACC_PCI_DEVICE_ID_PF, bus=1) == []
        wait_log(d, "cancelled 1", 1)
        d.qt.clock_step(10**8, settle=False)
        assert not d.qt.died(), d.qt.died()
        assert d.qt.qmp.cmd("query-status")["status"] == "running"
    finally:
        d.close()
