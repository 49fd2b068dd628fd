"""Migration of the PF, its VFs and virtio-tacc (docs/hardware.md section 15).

Each test starts its own source QEMU, saves it with QMP ``migrate`` to a file and loads
that file into a second QEMU started with ``-incoming defer``.  The destination must
carry on where the source stopped: the same register values, device memory, counters
and device time, commands that were on the engines complete with the results and the
times the source gives them when it resumes, and new work runs.  A damaged stream
(truncated, an index out of range, an unknown version) fails the load with a message;
the source keeps running.  virtio-tacc moves with its held submit buffers and their jobs,
which complete once on the destination; damaged records of them are refused.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import Cqe, d_copy, d_gemm, desc
from tacc.testing.qtest import QEMU, QTestError
from tacc.testing.taccdev import DEVMEM_VA, Func, Tacc
from tacc.testing.virtiodev import Job, VirtioTacc, device_arg
from test_iommu import DMAR, HOLE, iommu_on

OK = hw.TACC_ST_OK
PROPS = "sriov-max-vfs=4"
VF_WINDOW = 32 << 20

pytestmark = pytest.mark.skipif(not QEMU.exists(), reason=f"{QEMU} not built (make qemu)")


# ----------------------------------------------------------------- helpers --

def wait_migration(t: Tacc, timeout: float = 60.0) -> dict:
    """Poll query-migrate until the migration ends (or the QEMU does)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = t.qt.qmp.cmd("query-migrate")
        except Exception:  # noqa: BLE001 (a destination that failed to load exits)
            return {"status": "exited"}
        if st.get("status") in ("completed", "failed", "cancelled"):
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.02)


def save(src: Tacc, path: Path) -> dict:
    src.qt.qmp.cmd("migrate", uri=f"file:{path}")
    st = wait_migration(src)
    assert st["status"] == "completed", st
    return st


def load(path: Path, props: str = PROPS, root_port: str | None = None) -> tuple[Tacc, dict]:
    """A destination QEMU that loads @path: (it, its query-migrate result)."""
    dst = Tacc(props, extra=["-incoming", "defer"], root_port=root_port)
    dst.qt.qmp.cmd("migrate-incoming", uri=f"file:{path}")
    return dst, wait_migration(dst)


def adopt(src: Tacc, dst: Tacc, funcs: list[Func]) -> list[Func]:
    """The test's own bookkeeping (allocators, ring tails, job numbers) moves too."""
    dst.pt_pool[0] = src.pt_pool[0]
    dst.pt.tables = src.pt.tables
    dst.data_next = src.data_next
    moved = [dataclasses.replace(f, dev=dst, tail=list(f.tail), cq_head=list(f.cq_head))
             for f in funcs]
    dst.vfs = [f for f in moved if f.fn]
    return moved


def registers(f: Func) -> dict[str, int]:
    """The guest-visible register state of a function (no side effects on reads)."""
    r: dict[str, int] = {}
    for name in ("CTRL", "STATUS", "IRQ_MASK", "SCRATCH", "TRACE_SIZE", "TRACE_CTRL",
                 "TRACE_PROD", "TRACE_CONS", "TRACE_DROPPED", "FAULT_INFO",
                 "TLB_INV_SEQ", "TLB_INV_DONE", "DEVMEM_SIZE", "LINK_STATUS"):
        r[name] = f.r32(getattr(hw, f"TACC_REG_{name}"))
    for name in ("TRACE_BASE", "TRACE_WB", "FAULT_ADDR", "DEVCLK"):
        r[name] = f.r64(getattr(hw, f"TACC_REG_{name}"))
    for ctx in range(hw.TACC_NUM_CONTEXTS):
        r[f"PTBR{ctx}"] = f.r64(hw.TACC_REG_CTX_PTBR(ctx))
    for q in range(hw.TACC_NUM_QUEUES):
        b = hw.TACC_QUEUE_BASE(q)
        for name in ("CTRL", "SQ_SIZE", "CQ_SIZE", "SQ_TAIL", "SQ_HEAD", "CQ_HEAD",
                     "CQ_TAIL", "STATUS"):
            r[f"Q{q}_{name}"] = f.r32(b + getattr(hw, f"TACC_Q_{name}"))
        for name in ("SQ_BASE", "CQ_BASE"):
            r[f"Q{q}_{name}"] = f.r64(b + getattr(hw, f"TACC_Q_{name}"))
    if f.fn == 0:  # VF partitions and policy, TLP capture, link PM: every dword
        for lo, hi in ((hw.TACC_REG_VF_DEVMEM_BASE(0), hw.TACC_REG_ARB_WEIGHT(8)),
                       (hw.TACC_REG_TLPCAP_BASE, hw.TACC_REG_TLPCAP_ADDR_HI + 8),
                       (hw.TACC_REG_LINKPM_STATE, hw.TACC_REG_LINKPM_END)):
            for off in range(lo, hi, 4):
                r[f"{off:#x}"] = f.r32(off)
    return r


def config_space(d: Tacc, bus: int, devfn: int) -> list[int]:
    """A function's 4 KiB of configuration space, as dwords."""
    return [d.qt.cfg_read(bus, devfn, off) for off in range(0, 4096, 4)]


def f32(dev: Tacc, arr: np.ndarray) -> int:
    data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
    a = dev.alloc(len(data))
    dev.qt.memwrite(a, data)
    return a


def to_dev(f: Func, host: int, dev_off: int, n: int, q: int = 0) -> Cqe:
    return f.run_job(q, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA + dev_off, n)])


def from_dev(f: Func, dev_off: int, n: int, q: int = 0) -> bytes:
    dst = f.dev.alloc(n)
    assert f.run_job(q, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + dev_off, dst, n)]).status == OK
    return f.dev.qt.memread(dst, n)


def gemm_check(f: Func, rng: np.random.Generator, m: int, n: int, k: int, base: int,
               q: int = 2) -> None:
    """A GEMM in device memory at @base, its result checked against numpy."""
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    offs = (base, base + (4 << 20), base + (8 << 20))
    for arr, off in zip((A, B), offs, strict=False):
        assert to_dev(f, f32(f.dev, arr), off, arr.nbytes).status == OK
    cq = f.run_job(q, [d_gemm(DEVMEM_VA + offs[0], DEVMEM_VA + offs[1], DEVMEM_VA + offs[2],
                              m, n, k, k, n, n)])
    assert cq.status == OK
    got = np.frombuffer(from_dev(f, offs[2], m * n * 4), np.float32).reshape(m, n)
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4 * k)


def source_with_vfs(nvfs: int = 2) -> tuple[Tacc, Func, list[Func]]:
    """A source QEMU: the PF with 4 queues and context 0, and @nvfs VFs each with a
    32 MiB window, 2 queues and context 0."""
    src = Tacc(PROPS)
    pf = src.pf
    pf.reset()
    pf.set_ptbr(0, src.map_default())
    vfs = src.enable_vfs(nvfs)
    for i, vf in enumerate(vfs):
        pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(i), (64 << 20) * (i + 1))
        pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(i), VF_WINDOW)
        vf.reset(queues=2)
        vf.set_ptbr(0, src.map_default(devmem=VF_WINDOW))
    return src, pf, vfs


@pytest.fixture
def qemus() -> Iterator[list[Tacc]]:
    """Every QEMU a test starts is closed at its end."""
    started: list[Tacc] = []
    yield started
    for t in started:
        try:
            t.close()
        except Exception:  # noqa: BLE001 (a destination that failed has exited)
            pass


# ------------------------------------------------------------------- tests --

def test_state_moves_and_work_goes_on(qemus: list[Tacc], tmp_path: Path) -> None:
    """Registers, device memory, counters and device time arrive as they were; the PF and
    a VF run new work on the destination with numpy-correct results."""
    rng = np.random.default_rng(7)
    src, pf, (vf1, vf2) = source_with_vfs()
    qemus.append(src)
    # state a driver leaves behind: scratch, an interrupt mask, more contexts, a trace ring
    pf.w32(hw.TACC_REG_SCRATCH, 0x5EED_CAFE)
    vf2.w32(hw.TACC_REG_SCRATCH, 0x0BAD_F00D)
    pf.w32(hw.TACC_REG_IRQ_MASK, 0x5)
    pf.set_ptbr(3, pf.r64(hw.TACC_REG_CTX_PTBR(0)) & ~hw.TACC_PTBR_VALID)
    vf1.set_ptbr(7, vf1.r64(hw.TACC_REG_CTX_PTBR(0)) & ~hw.TACC_PTBR_VALID)
    pf.trace_enable()
    # work: copies into device memory (PF and VF1), a GEMM
    blob = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    vblob = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    h = src.alloc(len(blob))
    src.qt.memwrite(h, blob)
    assert to_dev(pf, h, 32 << 20, len(blob), q=1).status == OK
    hv = src.alloc(len(vblob))
    src.qt.memwrite(hv, vblob)
    assert to_dev(vf1, hv, 4096, len(vblob)).status == OK
    gemm_check(pf, rng, 64, 48, 40, 0)
    src.qt.clock_step(123_456)
    before = {f.fn: registers(f) for f in (pf, vf1, vf2)}
    cnt_before = {f.fn: f.counters() for f in (pf, vf1, vf2)}
    gcnt_before = {k: pf.gcnt(k) for k in hw.GLOBAL_COUNTERS}
    assert before[0]["TRACE_PROD"] > 0 and cnt_before[0]["cmds_completed"] > 0

    cfg_before = [config_space(src, 0, f.devfn) for f in (pf, vf1, vf2)]

    save(src, tmp_path / "state")
    dst, st = load(tmp_path / "state")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    dpf, dvf1, dvf2 = adopt(src, dst, [pf, vf1, vf2])
    assert [config_space(dst, 0, f.devfn) for f in (dpf, dvf1, dvf2)] == cfg_before

    # the same values, device time included (no clock has moved since the save)
    after = {f.fn: registers(f) for f in (dpf, dvf1, dvf2)}
    assert after == before
    assert after[0]["DEVCLK"] == src.qt.clock() != dst.qt.clock()
    assert {f.fn: f.counters() for f in (dpf, dvf1, dvf2)} == cnt_before
    assert {k: dpf.gcnt(k) for k in hw.GLOBAL_COUNTERS} == gcnt_before
    # device memory: the PF's data, VF1's in its window (64 MiB on)
    assert from_dev(dpf, 32 << 20, len(blob)) == blob
    assert from_dev(dvf1, 4096, len(vblob)) == vblob
    assert from_dev(dpf, (64 << 20) + 4096, len(vblob)) == vblob

    # new work: a GEMM on the PF and one on VF1, copies on VF2
    gemm_check(dpf, rng, 33, 17, 65, 16 << 20)
    gemm_check(dvf1, rng, 16, 16, 16, 1 << 20, q=1)
    h2 = dst.alloc(8192)
    dst.qt.memwrite(h2, blob[:8192])
    assert to_dev(dvf2, h2, 0, 8192).status == OK
    assert from_dev(dvf2, 0, 8192) == blob[:8192]
    # counters go on from their values (the TLB was dropped: walks again)
    for f, old in zip((dpf, dvf1, dvf2), (cnt_before[0], cnt_before[1], cnt_before[2]),
                      strict=True):
        new = f.counters()
        assert all(new[k] >= old[k] for k in old), f.fn
        assert new["cmds_completed"] > old["cmds_completed"]
    assert dpf.counters()["tlb_misses"] > cnt_before[0]["tlb_misses"]
    assert dpf.r64(hw.TACC_REG_DEVCLK) > before[0]["DEVCLK"]
    assert dpf.r32(hw.TACC_REG_SCRATCH) == 0x5EED_CAFE
    assert dpf.r32(hw.TACC_REG_TRACE_PROD) > before[0]["TRACE_PROD"]


def test_commands_in_flight_complete_as_on_the_source(qemus: list[Tacc], tmp_path: Path) -> None:
    """Commands on the engines at save time (a long H2D copy part-way over the link, a
    GEMM whose worker computed C, a D2H copy queued behind them) complete on the
    destination with the data and the completion times the source gives them when it
    resumes: timers and modelled times are device time, carried over."""
    rng = np.random.default_rng(11)
    src, pf, (vf1,) = source_with_vfs(1)
    qemus.append(src)
    m = n = k = 256  # >= 2^21 multiply-adds: computed on a worker thread
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    for arr, off in ((A, 0), (B, 1 << 20)):
        assert to_dev(pf, f32(src, arr), off, arr.nbytes).status == OK
    big = rng.integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    h = src.alloc(len(big))
    src.qt.memwrite(h, big)
    vdata = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    hv = src.alloc(len(vdata))
    src.qt.memwrite(hv, vdata)
    out = src.alloc(A.nbytes)
    jobs = [
        (pf, 0, [d_copy(hw.TACC_OP_COPY_H2D, h, DEVMEM_VA + (32 << 20), len(big))]),
        (pf, 2, [d_gemm(DEVMEM_VA, DEVMEM_VA + (1 << 20), DEVMEM_VA + (2 << 20),
                        m, n, k, k, n, n)]),
        (pf, 1, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, out, A.nbytes)]),
        (vf1, 0, [d_copy(hw.TACC_OP_COPY_H2D, hv, DEVMEM_VA, len(vdata))]),
    ]
    for f, q, descs in jobs:
        f.submit(q, f.job_of(q, descs)[1])
    src.qt.clock_step(2_000)  # every command is on a unit or waiting for one
    assert not pf.qstatus(0) & hw.TACC_Q_STATUS_IDLE
    assert pf.cqes(0) == [] and pf.cqes(2) == []

    save(src, tmp_path / "state")
    dst, st = load(tmp_path / "state")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    dpf, dvf1 = adopt(src, dst, [pf, vf1])

    # both sides now run the same 10 ms of device time
    src.qt.qmp.cmd("cont")
    results = []
    for t, funcs in ((src, {0: pf, 1: vf1}), (dst, {0: dpf, 1: dvf1})):
        t.qt.clock_step(10_000_000)
        results.append({(fn, q): f.cqes(q) for fn, f in funcs.items()
                        for q in range(4 if fn == 0 else 2)})
    want, got = results
    assert got == want
    done = {key: c for key, c in got.items() if c}
    assert {(0, 0), (0, 1), (0, 2), (1, 0)} <= set(done)
    assert all(c[-1].status == OK for c in done.values())
    # the data: the H2D copy landed, the D2H copy read A, C is numpy's, VF1's copy
    assert from_dev(dpf, 32 << 20, len(big)) == big
    assert dst.qt.memread(out, A.nbytes) == A.tobytes()
    C = np.frombuffer(from_dev(dpf, 2 << 20, m * n * 4), np.float32).reshape(m, n)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
    assert from_dev(dvf1, 0, len(vdata)) == vdata


def test_device_time_goes_on_across_two_moves(qemus: list[Tacc], tmp_path: Path) -> None:
    """Source -> A -> B with a copy on the link all along: B completes it with the CQE
    (times included) the resumed source gives over the same device time; DEVCLK on B reads
    the source's clock although B's own clock has moved only since its load."""
    src, pf, _ = source_with_vfs(1)
    qemus.append(src)
    src.qt.clock_step(5_000_000)
    h = src.alloc(4 << 20)
    pf.submit(0, pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, h, DEVMEM_VA, 4 << 20)])[1])
    src.qt.clock_step(1000)
    save(src, tmp_path / "a")
    a, st = load(tmp_path / "a")
    qemus.append(a)
    assert st["status"] == "completed", (st, a.qt.log())
    a.qt.clock_step(20_000)
    save(a, tmp_path / "b")
    b, st = load(tmp_path / "b")
    qemus.append(b)
    assert st["status"] == "completed", (st, b.qt.log())
    (bpf,) = adopt(src, b, [pf])
    src.qt.qmp.cmd("cont")
    src.qt.clock_step(20_000)
    assert bpf.r64(hw.TACC_REG_DEVCLK) == pf.r64(hw.TACC_REG_DEVCLK) == src.qt.clock()
    assert src.qt.clock() == 5_021_000 and b.qt.clock() == 0
    for t in (src, b):
        t.qt.clock_step(1_000_000)
    (want,), (got,) = pf.cqes(0), bpf.cqes(0)
    assert got == want and got.status == OK and got.end > 5_021_000


def test_dma_goes_through_the_viommu_after_a_move(qemus: list[Tacc], tmp_path: Path) -> None:
    """With intel-iommu translating the PF's DMA, a copy on the link at save lands on the
    destination through the destination's vIOMMU (its state came first), and a copy from
    an IOVA the IOMMU does not map still fails there with DMA_ERROR and a DMAR fault."""
    pre = ["-device", "intel-iommu"]
    src = Tacc("sriov-max-vfs=0", pre=pre)
    qemus.append(src)
    pf = src.pf
    root0 = iommu_on(src)
    pf.reset()
    pf.set_ptbr(0, root0)
    data = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    h = 0x0200_0000
    src.qt.memwrite(h, data)
    pf.submit(0, pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, h, DEVMEM_VA, len(data))])[1])
    src.qt.clock_step(1000)
    save(src, tmp_path / "state")
    dst = Tacc("sriov-max-vfs=0", pre=pre, extra=["-incoming", "defer"])
    qemus.append(dst)
    dst.qt.qmp.cmd("migrate-incoming", uri=f"file:{tmp_path / 'state'}")
    st = wait_migration(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    (dpf,) = adopt(src, dst, [pf])
    dst.qt.clock_step(1_000_000)
    (cq,) = dpf.cqes(0)
    assert cq.status == OK
    out = 0x0280_0000
    assert dpf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, out, len(data))]).status == OK
    assert dst.qt.memread(out, len(data)) == data
    assert dst.qt.readl(DMAR + 0x34) & 2 == 0  # no DMAR fault so far
    cq = dpf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, HOLE[0], DEVMEM_VA, 64)])
    assert cq.status == hw.TACC_ST_DMA_ERROR
    assert dst.qt.readl(DMAR + 0x34) & 2  # FSTS.PPF


# ------------------------------------------------------------ bad streams --

def prepared_stream(qemus: list[Tacc], path: Path) -> tuple[Tacc, Func]:
    """A source with a job done on queue 1 (SQ and CQ indices not 0), saved to @path."""
    src, pf, _ = source_with_vfs(1)
    qemus.append(src)
    h = src.alloc(4096)
    for _ in range(3):
        assert to_dev(pf, h, 0, 4096, q=1).status == OK
    save(src, path)
    return src, pf


def source_goes_on(src: Tacc, pf: Func) -> None:
    """The source, resumed after the migration, still runs jobs."""
    src.qt.qmp.cmd("cont")
    h = src.alloc(4096)
    src.qt.memwrite(h, b"\xa5" * 4096)
    assert to_dev(pf, h, 8192, 4096, q=1).status == OK
    assert from_dev(pf, 8192, 4096, q=1) == b"\xa5" * 4096


Loader = Callable[[Path], tuple[Tacc, dict]]


def refused(qemus: list[Tacc], path: Path, loader: Loader = load) -> str:
    """Load @path (with @loader), which must fail: the destination's messages."""
    dst, st = loader(path)
    qemus.append(dst)
    assert st["status"] in ("failed", "exited"), st
    try:
        dst.qt.proc.wait(timeout=10)  # a failed incoming migration ends the QEMU
    except Exception:  # noqa: BLE001
        pass
    return dst.qt.log()


def queue_record(pf: Func, q: int) -> bytes:
    """Queue @q's first saved fields: SQ base, CQ base, SQ size, CQ size (big-endian)."""
    return struct.pack(">QQII", pf.sq_addr(q), pf.cq_addr(q), pf.sq_size, pf.cq_size)


def test_truncated_stream_fails_the_load(qemus: list[Tacc], tmp_path: Path) -> None:
    src, pf = prepared_stream(qemus, tmp_path / "state")
    data = (tmp_path / "state").read_bytes()
    at = data.index(queue_record(pf, 1))  # in the middle of the PF's section
    (tmp_path / "cut").write_bytes(data[:at + 100])
    log = refused(qemus, tmp_path / "cut")
    assert "error while loading state for instance 0x0 of device '0000:00:01.0/tacc'" in log, log
    assert "load of migration failed" in log, log
    source_goes_on(src, pf)


@pytest.mark.parametrize("fn,q,offset,bit,why", [
    (0, 1, 24, 12, "SQ head/tail beyond the ring"),  # sq_tail 3 | 1 << 12, 256 entries
    (0, 1, 32, 9, "CQ head/tail beyond the ring"),   # cq_head 3 | 1 << 9
    (0, 1, 16, 0, "ring size"),                      # sq_size 257
    (1, 0, 28, 8, "SQ head/tail beyond the ring"),   # VF1's sq_head 1 << 8 (its section)
])
def test_bad_index_fails_the_load(qemus: list[Tacc], tmp_path: Path, fn: int, q: int,
                                  offset: int, bit: int, why: str) -> None:
    """A bit flipped in a queue index of the PF's or a VF's section: the load fails with
    the device's message naming the function, the queue and the reason."""
    src, pf = prepared_stream(qemus, tmp_path / "state")
    f = pf if fn == 0 else src.vfs[fn - 1]
    data = bytearray((tmp_path / "state").read_bytes())
    assert data.count(queue_record(f, q)) == 1
    word = data.index(queue_record(f, q)) + offset
    v = struct.unpack_from(">I", data, word)[0]
    struct.pack_into(">I", data, word, v ^ (1 << bit))
    (tmp_path / "bad").write_bytes(bytes(data))
    log = refused(qemus, tmp_path / "bad")
    assert f"tacc: migration: fn{fn} queue {q}: {why}" in log, log
    source_goes_on(src, pf)


def gemm_in_flight(qemus: list[Tacc], path: Path) -> tuple[Tacc, Func, bytes, int]:
    """A source saved with a 256^3 GEMM on a compute engine: (it, the PF, the stream,
    where that unit's record starts in it)."""
    src, pf, _ = source_with_vfs(1)
    qemus.append(src)
    job, descs = pf.job_of(2, [d_gemm(DEVMEM_VA, DEVMEM_VA, DEVMEM_VA + (1 << 20),
                                      256, 256, 256, 256, 256, 256)])
    pf.submit(2, descs)
    src.qt.clock_step(1000)
    save(src, path)
    data = path.read_bytes()
    for engine in range(2, hw.TACC_NUM_ENGINES):  # busy, fn, queue, engine, descriptor
        rec = b"\x01" + struct.pack(">iii", 0, 2, engine) + descs[0]
        if rec in data:
            assert data.count(rec) == 1
            return src, pf, data, data.index(rec)
    raise AssertionError("no busy compute unit in the stream")


@pytest.mark.parametrize("what,patch,why", [
    ("queue", lambda d, u, g: struct.pack_into(">i", d, u + 5, 7), "function or queue"),
    ("function", lambda d, u, g: struct.pack_into(">i", d, u + 1, -1), "function or queue"),
    ("engine", lambda d, u, g: struct.pack_into(">i", d, u + 9, 0), "engine"),
    ("GEMM m", lambda d, u, g: struct.pack_into(">Q", d, g + 1, 0), "bad GEMM result"),
    ("GEMM n", lambda d, u, g: struct.pack_into(">Q", d, g + 9, 4097), "bad GEMM result"),
])
def test_bad_unit_fails_the_load(qemus: list[Tacc], tmp_path: Path, what: str,
                                 patch: Callable[[bytearray, int, int], None],
                                 why: str) -> None:
    """The command on an engine: its queue, function, engine and GEMM result are checked
    (a queue index out of range would index past the function's queues)."""
    src, pf, data, unit = gemm_in_flight(qemus, tmp_path / "state")
    buf = bytearray(data)
    gemm = buf.index(b"\x01" + struct.pack(">QQQ", 256, 256, 1), unit)
    patch(buf, unit, gemm)
    (tmp_path / "bad").write_bytes(bytes(buf))
    log = refused(qemus, tmp_path / "bad")
    assert "tacc: migration: " in log and why in log, log
    source_goes_on(src, pf)


def test_unknown_version_fails_the_load(qemus: list[Tacc], tmp_path: Path) -> None:
    """The section is versioned: a stream from a newer layout is refused by name."""
    src, pf = prepared_stream(qemus, tmp_path / "state")
    data = bytearray((tmp_path / "state").read_bytes())
    idstr = b"0000:00:01.0/tacc"
    at = data.index(bytes([len(idstr)]) + idstr) + 1 + len(idstr)
    instance, version = struct.unpack_from(">II", data, at)
    assert version == 1
    struct.pack_into(">I", data, at + 4, 2)
    (tmp_path / "v2").write_bytes(bytes(data))
    log = refused(qemus, tmp_path / "v2")
    assert "tacc" in log and "version" in log, log
    source_goes_on(src, pf)


def test_host_work_is_quiesced_before_save(qemus: list[Tacc], tmp_path: Path) -> None:
    """A device with every kind of state at once (a GEMM on a worker, a sliced copy, a
    trace ring, fetched commands waiting) saves: the stop quiesces it first."""
    src = Tacc(PROPS + ",x-host-slice=65536")
    qemus.append(src)
    pf = src.pf
    pf.reset()
    pf.set_ptbr(0, src.map_default())
    pf.trace_enable()
    h = src.alloc(4 << 20)
    jobs = [pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, h, DEVMEM_VA + (i << 22), 4 << 20)])
            for i in range(4)]
    for _, descs in jobs:
        pf.submit(0, descs)
    pf.submit(2, pf.job_of(2, [d_gemm(DEVMEM_VA, DEVMEM_VA, DEVMEM_VA + (32 << 20),
                                      256, 256, 256, 256, 256, 256)])[1])
    try:
        save(src, tmp_path / "state")
    except QTestError as e:  # pragma: no cover (the message is the point)
        pytest.fail(str(e))
    dst, st = load(tmp_path / "state")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    (dpf,) = adopt(src, dst, [pf])
    dst.qt.clock_step(10**8)
    assert [c.status for c in dpf.cqes(0)] == [OK] * 4
    assert [c.status for c in dpf.cqes(2)] == [OK]


def test_link_power_and_aer_state_move(qemus: list[Tacc], tmp_path: Path) -> None:
    """Behind a root port, ASPM L1 enabled on both ends and the link idle in L1, an AER
    correctable error logged: the PF's and the root port's config space and the link PM
    registers arrive as they were, and the next copy wakes the link at the same time on
    the destination as on the resumed source.  The destination's TLB was dropped: its copy
    walks the page tables again and ends exactly those walks' latency later."""
    src = Tacc("sriov-max-vfs=0", root_port="")
    qemus.append(src)
    pf = src.pf
    pf.reset()
    pf.set_ptbr(0, src.map_default())
    for bus, devfn in ((0, Tacc.RP_DEVFN), (1, 0)):  # ASPM L1: upstream end first
        cap = src.qt.find_cap(bus, devfn, 0x10)
        v = src.qt.cfg_read(bus, devfn, cap + 0x10, 2)
        src.qt.cfg_write(bus, devfn, cap + 0x10, (v & ~3) | 2, 2)
    h = src.alloc(65536)
    assert to_dev(pf, h, 0, 65536).status == OK
    src.qt.clock_step(1_000_000)  # idle: the link goes to L1
    assert pf.r32(hw.TACC_REG_LINKPM_STATE) & hw.TACC_LINKPM_STATE_MASK == hw.TACC_LINKPM_L1
    src.qt.qmp.cmd("human-monitor-command",  # a Receiver Error
                   **{"command-line": "pcie_aer_inject_error -c tacc0 0x1"})
    aer = src.qt.find_ext_cap(1, 0, 0x1)
    assert src.qt.cfg_read(1, 0, aer + 0x10) & 0x1  # COR_STATUS.RxErr
    regs = registers(pf)
    cnt = pf.counters()
    cfg = [config_space(src, *bd) for bd in ((0, Tacc.RP_DEVFN), (1, 0))]

    save(src, tmp_path / "state")
    dst, st = load(tmp_path / "state", "sriov-max-vfs=0", root_port="")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    (dpf,) = adopt(src, dst, [pf])
    assert registers(dpf) == regs
    assert [config_space(dst, *bd) for bd in ((0, Tacc.RP_DEVFN), (1, 0))] == cfg

    src.qt.qmp.cmd("cont")
    seen = []
    for t, f in ((src, pf), (dst, dpf)):
        t.qt.clock_step(50_000)
        f.submit(0, f.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, h, DEVMEM_VA, 65536)])[1])
        t.qt.clock_step(1_000_000)
        (cq,) = f.cqes(0)
        seen.append((cq, f.counters(), registers(f)))
    (scq, scnt, sregs), (dcq, dcnt, dregs) = seen
    assert scq.status == dcq.status == OK
    assert dcq.start == scq.start  # the descriptor fetch paid the same L1 exit
    walks = dcnt["tlb_walk_reads"] - scnt["tlb_walk_reads"]
    assert scnt["tlb_walk_reads"] == cnt["tlb_walk_reads"] and walks == 4  # 2 VAs x 2 levels
    assert dcq.end - scq.end == walks * 500  # walk-latency-ns each
    for reg in (hw.TACC_REG_LINKPM_L1_ENTRIES, hw.TACC_REG_LINKPM_L1_EXITS):
        key = f"{reg:#x}"
        assert dregs[key] == sregs[key] == regs[key] + 1, key


# ----------------------------------------------------------------- virtio --

V_WIN = (192 << 20, 64 << 20)  # the virtio function's device-memory window
V_HOST_VA, V_DEV_VA = 0x1000_0000, 0x40_0000_0000
V_PROPS = f"devmem-base={V_WIN[0]:#x},devmem-size={V_WIN[1]:#x}"
JOBS_SUB = b"virtio-tacc-backend/jobs"  # the section's subsection of held buffers and jobs


def virtio_source() -> tuple[Tacc, VirtioTacc]:
    src = Tacc("sriov-max-vfs=2", extra=device_arg(props=V_PROPS))
    src.pf.reset()
    src.pf.set_ptbr(0, src.map_default())
    v = VirtioTacc(src)
    assert v.init()
    return src, v


def virtio_load(path: Path) -> tuple[Tacc, dict]:
    dst = Tacc("sriov-max-vfs=2", extra=[*device_arg(props=V_PROPS), "-incoming", "defer"])
    dst.qt.qmp.cmd("migrate-incoming", uri=f"file:{path}")
    return dst, wait_migration(dst)


def virtio_adopt(v: VirtioTacc, dst: Tacc) -> VirtioTacc:
    """The test driver's side of the virtqueues (indices, free descriptors) moves too."""
    nv = VirtioTacc(dst)
    nv.features, nv.buf_next = v.features, v.buf_next
    nv.queues = []
    for q in v.queues:
        nq = copy.copy(q)
        nq.drv, nq.free, nq.heads = nv, list(q.free), dict(q.heads)
        nv.queues.append(nq)
    return nv


def virtio_gemm_job(v: VirtioTacc, ctx: int, rng: np.random.Generator, a_in: int,
                    a_out: int, m: int = 24, n: int = 40, k: int = 32) -> np.ndarray:
    """A and B written to the host BO at a_in (bound at V_HOST_VA), one job: both in,
    GEMM in device memory, C out to the host BO at a_out (V_HOST_VA + 1 MiB); returns
    numpy's C."""
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    v.qt.memwrite(a_in, A.tobytes() + B.tobytes())
    ga, gb, gc = V_DEV_VA, V_DEV_VA + 0x10000, V_DEV_VA + 0x20000
    v.submit([Job(ctx, 1, v.fence(ctx, 1)[0] + 1, [
        d_copy(hw.TACC_OP_COPY_H2D, V_HOST_VA, ga, A.nbytes),
        d_copy(hw.TACC_OP_COPY_H2D, V_HOST_VA + A.nbytes, gb, B.nbytes),
        d_gemm(ga, gb, gc, m, n, k, k, n, n),
        d_copy(hw.TACC_OP_COPY_D2H, gc, V_HOST_VA + 0x100000, m * n * 4)])])
    [(st, nj, failed, _)] = v.wait_used()
    assert (st, nj, failed) == (0, 1, 0)
    return A.astype(np.float64) @ B


def virtio_with_state(qemus: list[Tacc], path: Path | None = None
                      ) -> tuple[Tacc, VirtioTacc, int, int, int]:
    """A source whose virtio function has two contexts (the second unused), a host BO in
    scattered 4 KiB pages and a device BO bound in context 0, one GEMM job done; saved to
    @path if given.  Returns (source, its driver, ctx, host BO handle, its pages)."""
    rng = np.random.default_rng(3)
    src, v = virtio_source()
    qemus.append(src)
    c = v.ctx_create()
    assert v.ctx_create() == c + 1
    a = src.alloc(2 << 20)
    h = v.bo_host(c, a, 2 << 20, page_split=4096)
    assert v.bind(c, h, V_HOST_VA, 2 << 20) == OK
    st, hd = v.bo_create(c, 4 << 20, devmem=True)
    assert st == OK and v.bind(c, hd, V_DEV_VA, 4 << 20) == OK
    want = virtio_gemm_job(v, c, rng, a, a + 0x100000)
    got = np.frombuffer(src.qt.memread(a + 0x100000, want.size * 4), np.float32)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    if path:
        save(src, path)
    return src, v, c, h, a


def test_virtio_state_moves_and_work_goes_on(qemus: list[Tacc], tmp_path: Path) -> None:
    """virtio-tacc's contexts, BOs, bindings, page tables, fences and counters arrive as
    they were: a GEMM job in the old context and bindings on the destination is
    numpy-correct, the handles and bind counts are the source's (a bound BO cannot be
    destroyed, unbound it can), the next context is the source's next."""
    src, v, c, h, a = virtio_with_state(qemus, tmp_path / "state")
    assert JOBS_SUB not in (tmp_path / "state").read_bytes()  # idle: version 1's layout
    names = ("cmds_completed", "jobs_completed", "h2d_bytes", "d2h_bytes", "flops")
    cnt = {k: v.cnt(k) for k in names}
    fence = v.fence(c, 1)
    dst, st = virtio_load(tmp_path / "state")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    dst.data_next = src.data_next
    dv = virtio_adopt(v, dst)
    assert {k: dv.cnt(k) for k in names} == cnt and dv.fence(c, 1) == fence == (1, 0, 0)
    want = virtio_gemm_job(dv, c, np.random.default_rng(4), a, a + 0x100000)
    got = np.frombuffer(dst.qt.memread(a + 0x100000, want.size * 4), np.float32)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert dv.fence(c, 1) == (2, 0, 0)
    assert dv.cnt("jobs_completed") == cnt["jobs_completed"] + 1
    assert dv.bo_destroy(c, h) == hw.TACC_VIRTIO_ERR_BUSY  # still bound
    assert dv.unbind(c, V_HOST_VA, 2 << 20) == OK and dv.bo_destroy(c, h) == OK
    assert dv.ctx_create() == c + 2
    assert dv.ctx_destroy(c) == OK and dv.ctx_destroy(c + 1) == OK


V_MOVED = 768 << 10  # the bytes the held jobs copy


def nops(n: int) -> list[bytes]:
    return [desc(hw.TACC_OP_NOP)] * n


def virtio_jobs_held(qemus: list[Tacc], path: Path
                     ) -> tuple[Tacc, VirtioTacc, int, int, bytes, list[int]]:
    """A source saved with two submit buffers held.  The first: ring 0's job A (512 KiB of
    random bytes from the host BO into device memory, then 199 NOPs: the copy on the link,
    the NOPs in the FIFO) and job B (them back to the host BO's second MiB, then 99 NOPs:
    queued, the FIFO has no room for it); the second: ring 1's job C (256 KiB more in and
    out, to 1.5 MiB).  Returns (source, its driver, ctx, host BO address, the bytes, the
    submit queue's used index before)."""
    src, v, c, _, a = virtio_with_state(qemus)
    data = np.random.default_rng(11).integers(0, 256, V_MOVED, np.uint8).tobytes()
    src.qt.memwrite(a, data)
    used0 = v.subq.used_idx()
    s0, s1 = v.fence(c, 0)[0] + 1, v.fence(c, 1)[0] + 1
    half, mib = 512 << 10, 1 << 20
    v.submit([
        Job(c, 0, s0, [d_copy(hw.TACC_OP_COPY_H2D, V_HOST_VA, V_DEV_VA, half), *nops(199)]),
        Job(c, 0, s0 + 1, [d_copy(hw.TACC_OP_COPY_D2H, V_DEV_VA, V_HOST_VA + mib, half),
                           *nops(99)])])
    v.submit([Job(c, 1, s1, [
        d_copy(hw.TACC_OP_COPY_H2D, V_HOST_VA + half, V_DEV_VA + 2 * mib, 256 << 10),
        d_copy(hw.TACC_OP_COPY_D2H, V_DEV_VA + 2 * mib, V_HOST_VA + mib + half, 256 << 10)])])
    assert v.subq.used_idx() == used0  # nothing done: the virtual clock has not moved
    save(src, path)
    return src, v, c, a, data, [used0, s0, s1]


def test_virtio_jobs_in_flight_move(qemus: list[Tacc], tmp_path: Path) -> None:
    """Submit buffers held at save (a job on the link, one in the FIFO behind it, one
    queued for FIFO room, one on another ring) move in the section's "jobs" subsection: on
    the destination each job completes once, the used ring advances by exactly the two
    buffers, the bytes arrive byte for byte, the fences and counters count each job once,
    and the context cannot be destroyed while its jobs run (its count moved too)."""
    src, v, c, a, data, (used0, s0, s1) = virtio_jobs_held(qemus, tmp_path / "state")
    stream = (tmp_path / "state").read_bytes()
    off = jobs_records(stream)
    assert {"inflight0", "pending0", "inflight1"} <= off.keys() and "pending1" not in off, off
    assert b"\x01" + struct.pack(">ii", hw.TACC_FN_VIRTIO, 0) in stream  # A's copy on a unit
    jobs0 = v.cnt("jobs_completed")
    dst, st = virtio_load(tmp_path / "state")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    dst.data_next = src.data_next
    dv = virtio_adopt(v, dst)
    assert dv.ctx_destroy(c) == hw.TACC_VIRTIO_ERR_BUSY
    used = dv.wait_used(2)
    assert sorted(used) == [(0, 1, 0, [(s1, OK, 0)]),
                            (0, 2, 0, [(s0, OK, 0), (s0 + 1, OK, 0)])], used
    dst.qt.clock_step(50_000_000)
    assert dv.subq.pop() == [] and dv.subq.used_idx() == (used0 + 2) & 0xFFFF
    mib, half = 1 << 20, 512 << 10
    assert dst.qt.memread(a + mib, half) == data[:half]
    assert dst.qt.memread(a + mib + half, 256 << 10) == data[half:]
    assert dv.fence(c, 0) == (s0 + 1, 0, 0) and dv.fence(c, 1) == (s1, 0, 0)
    assert dv.cnt("jobs_completed") == jobs0 + 3
    # the moved jobs are the device's like any: a new one after them, then the context goes
    want = virtio_gemm_job(dv, c, np.random.default_rng(5), a, a + 0x100000)
    got = np.frombuffer(dst.qt.memread(a + 0x100000, want.size * 4), np.float32)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert dv.unbind(c, V_HOST_VA, 2 << 20) == OK and dv.unbind(c, V_DEV_VA, 4 << 20) == OK
    assert dv.ctx_destroy(c) == OK


def jobs_records(stream: bytes) -> dict[str, int]:
    """Offsets of the "jobs" subsection's records in @stream (virtio-tacc.c
    vt_jobs_put): each held buffer's head and counts, its first part, its batch counts,
    and each ring's first job in flight."""
    at = stream.index(JOBS_SUB) + len(JOBS_SUB) + 4  # the subsection's version
    off: dict[str, int] = {"nbatches": at}
    at += 4
    for b in range(struct.unpack_from(">I", stream, off["nbatches"])[0]):
        off[f"head{b}"], off[f"part{b}"] = at, at + 12
        out_num, in_num = struct.unpack_from(">II", stream, at + 4)
        at += 12 + 16 * (out_num + in_num)
        off[f"batch{b}"] = at
        at += 12 + 12 * struct.unpack_from(">I", stream, at)[0]
    for r in range(hw.TACC_VIRTIO_NUM_RINGS):
        for kind in ("inflight", "pending"):
            n = struct.unpack_from(">I", stream, at)[0]
            at += 4
            if n:
                off.setdefault(f"{kind}{r}", at)
            for _ in range(n):
                ncmds = struct.unpack_from(">H", stream, at + 12)[0]
                at += 42 + (hw.TACC_DESC_SIZE * ncmds if kind == "pending" else 0)
    return off


def test_virtio_bad_jobs_fail_the_load(qemus: list[Tacc], tmp_path: Path) -> None:
    """Held buffers' records cut short, damaged or forged (and one forged with the guest's
    descriptor too, to memory the machine does not have): the destination refuses each
    with the backend's message and exits with status 1 (QEMU's own loader of a virtqueue
    element asserts on a count out of range and exits on a part it cannot map); the
    source, resumed, completes the jobs itself."""
    src, v, c, a, data, (used0, s0, s1) = virtio_jobs_held(qemus, tmp_path / "state")
    stream = (tmp_path / "state").read_bytes()
    off = jobs_records(stream)
    head0 = struct.unpack_from(">I", stream, off["head0"])[0]
    head1 = struct.unpack_from(">I", stream, off["head1"])[0]

    def put(fmt: str, at: int, *vals: int) -> bytes:
        b = bytearray(stream)
        struct.pack_into(fmt, b, at, *vals)
        return bytes(b)

    addr0, len0 = struct.unpack_from(">QQ", stream, off["part0"])
    # the buffer's first part and its descriptor in guest RAM (the stream's RAM pages,
    # little-endian) both moved to an address where the machine has no memory
    desc0, nowhere = struct.pack("<QI", addr0, len0), 0x4000_0000_0000
    assert stream.count(desc0) >= 1
    unmapped = put(">Q", off["part0"], nowhere).replace(desc0, struct.pack("<QI", nowhere, len0))
    devjob = off["inflight0"] + 30  # batch, idx, ctx, ncmds, seqno, tag, then devjob
    cases = [
        ("cut", stream[:off["part1"] + 8], "error while loading state"),
        ("head", put(">I", off["head0"], 300),
         "submit buffer 0: head 300 (ring of 256)"),
        ("another head", put(">I", off["head0"], head1),
         f"submit buffer 0 at head {head1}: parts that are not its descriptors'"),
        ("address", put(">Q", off["part0"], addr0 + 64),
         f"submit buffer 0 at head {head0}: parts that are not its descriptors'"),
        ("counts", put(">I", off["head0"] + 4, 0xFFFFFFFF),
         "submit buffer 0: 4294967295 read and 1 written parts"),
        ("done", put(">I", off["batch0"] + 4, 1),
         "submit buffer 0: 2 jobs, 1 done, 2 listed"),
        ("device job", put(">I", devjob, struct.unpack_from(">I", stream, devjob)[0] + 7),
         "ring 0: commands of another job"),
        ("no buffers", put(">I", off["nbatches"], 0), "0 held submit buffers"),
        ("no memory", unmapped, f"submit buffer 0 at head {head0}: not in guest memory"),
    ]
    for name, bad, why in cases:
        (tmp_path / "bad").write_bytes(bad)
        log = refused(qemus, tmp_path / "bad", virtio_load)
        assert why in log and "load of migration failed" in log, (name, log)
        assert qemus[-1].qt.proc.returncode == 1, (name, qemus[-1].qt.proc.returncode, log)
        assert "Assertion" not in log and "core dumped" not in log, (name, log)
    src.qt.qmp.cmd("cont")
    used = v.wait_used(2)
    assert sorted(used) == [(0, 1, 0, [(s1, OK, 0)]),
                            (0, 2, 0, [(s0, OK, 0), (s0 + 1, OK, 0)])], used
    assert src.qt.memread(a + (1 << 20), V_MOVED) == data


def test_virtio_bad_state_fails_the_load(qemus: list[Tacc], tmp_path: Path) -> None:
    """A binding that names another BO handle, a BO whose size is not page aligned, a
    page-table entry pointing at a page that does not exist: the load fails with the
    backend's message (a walk of that table would dereference a missing page)."""
    src, v, c, h, _ = virtio_with_state(qemus, tmp_path / "state")
    data = (tmp_path / "state").read_bytes()
    bind = struct.pack(">QQQI", V_HOST_VA, 2 << 20, 0, h)
    bo = struct.pack(">IIBQQI", h, c, 0, 2 << 20, 0, 512)
    # page ids are handed out from 1: context 0's root 1, context 1's 2, then the host
    # binding's level-1 table 3 (its pages are scattered: 4 KiB leaves in table 4)
    root = struct.pack(">IQ", 1, 3 << 12 | hw.TACC_PTE_VALID)
    for rec, patched, why in (
            (bind, struct.pack(">QQQI", V_HOST_VA, 2 << 20, 0, h + 100),
             f"context {c} binding 0 (BO {h + 100}"),
            (bo, struct.pack(">IIBQQI", h, c, 0, (2 << 20) + 8, 0, 512), f"BO {h} (context"),
            (root, struct.pack(">IQ", 1, 999 << 12 | hw.TACC_PTE_VALID),
             "page tables: not one tree per context")):
        assert data.count(rec) == 1, why
        (tmp_path / "bad").write_bytes(data.replace(rec, patched))
        log = refused(qemus, tmp_path / "bad", virtio_load)
        assert f"virtio-tacc: migration: {why}" in log, log
    source_goes_on(src, src.pf)


def test_vm_pauses_are_counted_across_a_move(qemus: list[Tacc], tmp_path: Path) -> None:
    """VM_PAUSED_NS (hw 1.7) adds the host time of each stop to the next run, on every
    function: a ``stop``/``cont`` adds the host's pause, and a move adds the whole stop from
    the source's last run to the destination's first, measured by the host around it."""
    src, pf, (vf,) = source_with_vfs(1)
    qemus.append(src)
    reg = hw.TACC_REG_VM_PAUSED_NS
    assert pf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VM_PAUSED
    assert pf.r64(reg) == vf.r64(reg) == 0
    t0 = time.monotonic_ns()
    src.qt.qmp.cmd("stop")
    t1 = time.monotonic_ns()
    time.sleep(0.2)
    t2 = time.monotonic_ns()
    src.qt.qmp.cmd("cont")
    t3 = time.monotonic_ns()
    p1 = pf.r64(reg)
    assert t2 - t1 <= p1 <= t3 - t0, (t2 - t1, p1, t3 - t0)
    assert vf.r64(reg) == p1 and pf.r32(reg + 4) == p1 >> 32
    # a move: the source stops at the migration's end, the destination runs after its load
    t4 = time.monotonic_ns()
    save(src, tmp_path / "a")
    t5 = time.monotonic_ns()
    time.sleep(0.3)
    t6 = time.monotonic_ns()
    dst, st = load(tmp_path / "a")
    qemus.append(dst)
    assert st["status"] == "completed", (st, dst.qt.log())
    deadline = time.monotonic() + 10
    while dst.qt.qmp.cmd("query-status")["status"] != "running":
        assert time.monotonic() < deadline, dst.qt.qmp.cmd("query-status")
        time.sleep(0.01)
    t7 = time.monotonic_ns()
    (dpf,) = adopt(src, dst, [pf])
    moved = dpf.r64(reg) - p1
    assert t6 - t5 <= moved <= t7 - t4, (t6 - t5, moved, t7 - t4)
    # the source, resumed, counts its own stop since the migration's end
    t8 = time.monotonic_ns()
    src.qt.qmp.cmd("cont")
    t9 = time.monotonic_ns()
    assert t8 - t5 <= pf.r64(reg) - p1 <= t9 - t4, (t8 - t5, pf.r64(reg) - p1, t9 - t4)


@pytest.mark.long
def test_virtio_jobs_records_fuzz(qemus: list[Tacc], tmp_path: Path) -> None:
    """Mutated "jobs" subsections (a bit flipped, a 32-bit field set to an edge value, the
    stream cut inside it): every destination either loads (a flip in a tag or a time) and
    keeps running, or refuses with a message and exits with status 1; none aborts (QEMU's
    own element loader asserts or exits on such input)."""
    src, v, *_ = virtio_jobs_held(qemus, tmp_path / "state")
    stream = (tmp_path / "state").read_bytes()
    start = stream.index(JOBS_SUB) + len(JOBS_SUB) + 4
    end = max(o for k, o in jobs_records(stream).items() if k.startswith("pending")) + 42
    rng = np.random.default_rng(34)
    outcome: dict[str, int] = {}
    for i in range(int(os.environ.get("TACC_MIG_FUZZ_N", "300"))):
        b = bytearray(stream)
        kind = ("flip", "field", "cut")[i % 3]
        at = int(rng.integers(start, end))
        if kind == "flip":
            b[at] ^= 1 << int(rng.integers(0, 8))
        elif kind == "field":
            struct.pack_into(">I", b, at, int(rng.choice([0, 1, 0xFF, 0x100, 0xFFFF, 1 << 31,
                                                           0xFFFFFFFF])))
        else:
            del b[at:]
        (tmp_path / "m").write_bytes(bytes(b))
        dst, st = virtio_load(tmp_path / "m")
        try:
            if st["status"] == "completed":
                dst.qt.clock_step(10_000_000)
                assert dst.qt.qmp.cmd("query-status")["status"] == "running", i
                outcome["loaded"] = outcome.get("loaded", 0) + 1
            else:
                try:
                    dst.qt.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001
                    pass
                log = dst.qt.log()
                assert dst.qt.proc.returncode == 1, (i, kind, at, dst.qt.proc.returncode, log)
                assert "Assertion" not in log and "load of migration failed" in log, (i, log)
                why = "virtio-tacc: migration" if "virtio-tacc: migration" in log else "other"
                outcome[why] = outcome.get(why, 0) + 1
        finally:
            try:
                dst.close()
            except Exception:  # noqa: BLE001
                pass
    print(f"jobs records fuzz: {outcome}")
    src.qt.qmp.cmd("cont")
    assert len(v.wait_used(2)) == 2
