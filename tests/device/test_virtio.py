"""virtio-tacc over qtest: a Python virtio-pci driver against the real backend
(docs/virtio.md).  One QEMU with the PF (2 VFs possible) and a virtio-tacc-pci
linked to it; each test re-initialises the virtio device (a virtio reset frees
every context, BO and page table) and resets the PF.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_gemm, desc
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import DEVMEM_VA, Tacc
from tacc.testing.virtiodev import (
    F_ACCESS_PLATFORM,
    F_EVENT_IDX,
    F_VERSION_1,
    MSI_MSG,
    TRACE_SETUP,
    Job,
    VirtioTacc,
    device_arg,
    hdr,
)

WIN_BASE, WIN_SIZE = 192 << 20, 64 << 20  # the function's device-memory window
HOST_VA, DEV_VA = 0x1000_0000, 0x40_0000_0000
ALL_F = (1 << hw.TACC_VIRTIO_F_DEVMEM) | (1 << hw.TACC_VIRTIO_F_FILL) | \
    (1 << hw.TACC_VIRTIO_F_TRACE)


def _boot(props: str = "") -> tuple[Tacc, VirtioTacc]:
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    win = f"devmem-base={WIN_BASE:#x},devmem-size={WIN_SIZE:#x}"
    d = Tacc("sriov-max-vfs=2", extra=device_arg(props=win + ("," + props if props else "")))
    return d, VirtioTacc(d)


@pytest.fixture(scope="module")
def vdev():
    d, v = _boot()
    d.root0 = d.map_default(0x2000_0000, 256 << 20)
    yield d, v
    d.close()


@pytest.fixture
def vt(vdev):
    d, v = vdev
    d.pf.reset()
    d.pf.set_ptbr(0, d.root0)
    d.reset_alloc()
    assert v.init()
    return v


def host_bo(v: VirtioTacc, ctx: int, data: bytes, va: int, split: int = 0) -> tuple[int, int]:
    """Guest pages holding data, as a BO bound at va; returns (handle, address)."""
    size = (len(data) + 4095) & ~4095
    a = v.dev.alloc(size)
    v.qt.memwrite(a, data.ljust(size, b"\0"))
    h = v.bo_host(ctx, a, size, split)
    assert v.bind(ctx, h, va, size) == hw.TACC_VIRTIO_OK
    return h, a


def dev_bo(v: VirtioTacc, ctx: int, size: int, va: int) -> int:
    st, h = v.bo_create(ctx, size, devmem=True)
    assert st == hw.TACC_VIRTIO_OK, st
    assert v.bind(ctx, h, va, size) == hw.TACC_VIRTIO_OK
    return h


# ------------------------------------------------------------------ identity --
def test_identity_config_and_pf_view(vdev, vt):
    d, v = vdev
    qt = d.qt
    assert qt.cfg_read(0, v.devfn, 0) == (hw.TACC_VIRTIO_PCI_DEVICE_ID << 16) | 0x1AF4
    assert hw.TACC_VIRTIO_PCI_DEVICE_ID == 0x1079 and hw.TACC_VIRTIO_ID == 57
    assert qt.cfg_read(0, v.devfn, 0x08) >> 8 == hw.TACC_PCI_CLASS
    assert sorted(v.shm) == [hw.TACC_VIRTIO_SHM_FENCES, hw.TACC_VIRTIO_SHM_COUNTERS]
    c = v.config()
    assert c["version"] == hw.TACC_VIRTIO_VERSION_MAJOR << 16 | hw.TACC_VIRTIO_VERSION_MINOR
    assert c["func"] == hw.TACC_FN_VIRTIO == hw.TACC_MAX_VFS + 1
    assert (c["num_contexts"], c["num_rings"]) == (hw.TACC_NUM_CONTEXTS, hw.TACC_VIRTIO_NUM_RINGS)
    assert c["devmem_size"] == WIN_SIZE and c["caps"] & hw.TACC_CAP_FILL
    assert (c["page_entries"], c["rsvd"]) == (hw.TACC_VIRTIO_MAX_FN_ENTS, 0)
    # the PF knows it has a virtio function, and where its window is
    assert d.pf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VIRTIO_FN
    assert d.pf.r32(hw.TACC_REG_VERSION) >= 1 << 16 | 2  # since hw 1.2
    assert d.pf.r64(hw.TACC_REG_VIRTIO_DEVMEM_BASE) == WIN_BASE
    assert d.pf.r64(hw.TACC_REG_VIRTIO_DEVMEM_SIZE) == WIN_SIZE
    # the counter block in shared memory has the BAR2 header
    hdr0 = qt.readq(v.shm[hw.TACC_VIRTIO_SHM_COUNTERS])
    assert hdr0 >> 32 == hw.TACC_CNT_VERSION and hdr0 & 0xFFFF == max(hw.FUNC_COUNTERS.values()) + 1
    assert v.features >> F_VERSION_1 & 1 and v.features >> F_EVENT_IDX & 1
    assert v.features & ALL_F == ALL_F and not v.features >> F_ACCESS_PLATFORM & 1


def test_version_1_required(vt):
    vt.init(want=ALL_F)  # no VERSION_1: the device uses no buffer until reset
    vt.ctrlq.add([hdr(hw.TACC_VIRTIO_CTX_CREATE)], 16)
    vt.ctrlq.kick()
    vt.qt.clock_step(1000)
    assert vt.ctrlq.used_idx() == 0
    assert vt.init() and vt.ctx_create() == 0


def test_window_reprogram_refused_with_devmem_bos(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    h = dev_bo(v, c, 1 << 20, DEV_VA)
    d.pf.w64(hw.TACC_REG_VIRTIO_DEVMEM_SIZE, 4096)  # refused: a device BO exists
    assert d.pf.r64(hw.TACC_REG_VIRTIO_DEVMEM_SIZE) == WIN_SIZE
    assert v.unbind(c, DEV_VA, 1 << 20) == 0 and v.bo_destroy(c, h) == 0
    d.pf.w64(hw.TACC_REG_VIRTIO_DEVMEM_SIZE, 8 << 20)
    assert v.config()["devmem_size"] == 8 << 20
    st, _ = v.bo_create(c, 16 << 20, devmem=True)
    assert st == hw.TACC_VIRTIO_ERR_NOSPC
    d.pf.w64(hw.TACC_REG_VIRTIO_DEVMEM_SIZE, WIN_SIZE)


# ---------------------------------------------------------------- jobs --
def test_nop_copy_gemm_batch(vdev, vt):
    d, v = vdev
    rng = np.random.default_rng(16)
    m, n, k = 24, 40, 32
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    c = v.ctx_create()
    # A and B in host pages listed scattered (4 KiB entries), C's host pages
    src = A.tobytes() + B.tobytes()
    _, a_src = host_bo(v, c, src, HOST_VA, split=4096)
    _, a_out = host_bo(v, c, b"\0" * (m * n * 4), HOST_VA + 0x100000)
    dev_bo(v, c, 1 << 20, DEV_VA)
    ga, gb, gc = DEV_VA, DEV_VA + 0x10000, DEV_VA + 0x20000
    before = {k_: d.pf.gcnt(k_) for k_ in ("link_h2d_payload", "link_d2h_payload")}
    jobs = [
        Job(c, 0, 1, [desc(hw.TACC_OP_NOP)], tag=0x16_0001),
        Job(c, 1, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, ga, A.nbytes),
                      d_copy(hw.TACC_OP_COPY_H2D, HOST_VA + A.nbytes, gb, B.nbytes),
                      d_gemm(ga, gb, gc, m, n, k, k, n, n),
                      d_copy(hw.TACC_OP_COPY_D2H, gc, HOST_VA + 0x100000, m * n * 4)],
            tag=0x16_0002),
        Job(c, 0, 2, [desc(hw.TACC_OP_NOP), desc(hw.TACC_OP_NOP)], tag=0x16_0003),
    ]
    v.submit(jobs)
    [(st, nj, failed, js)] = v.wait_used()
    assert (st, nj, failed) == (0, 3, 0)
    assert [(s_, st_) for s_, st_, _ in js] == [(1, 0), (1, 0), (2, 0)]
    assert v.fence(c, 0) == (2, 0, 0) and v.fence(c, 1) == (1, 0, 0)
    C = np.frombuffer(d.qt.memread(a_out, m * n * 4), dtype=np.float32).reshape(m, n)
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
    # in place: the source pages were read where the guest has them
    assert d.qt.memread(a_src, 64) == src[:64]
    assert v.cnt("cmds_completed") == 7 and v.cnt("jobs_completed") == 3
    assert v.cnt("h2d_bytes") == A.nbytes + B.nbytes and v.cnt("d2h_bytes") == m * n * 4
    assert d.pf.gcnt("link_h2d_payload") - before["link_h2d_payload"] == A.nbytes + B.nbytes
    assert d.pf.gcnt("link_d2h_payload") - before["link_d2h_payload"] == m * n * 4


def test_failed_command_ends_its_job_and_counts(vt):
    c = vt.ctx_create()
    bad = d_copy(hw.TACC_OP_COPY_H2D, 0x7000_0000, DEV_VA, 4096)  # nothing bound
    vt.submit([Job(c, 2, 5, [desc(hw.TACC_OP_NOP), bad, desc(hw.TACC_OP_NOP)]),
               Job(c, 2, 6, [desc(hw.TACC_OP_NOP)])])
    [(st, nj, failed, js)] = vt.wait_used()
    assert (st, nj, failed) == (0, 2, 1)
    assert js[0] == (5, hw.TACC_ST_MMU_FAULT, 0) and js[1] == (6, 0, 0)
    assert vt.fence(c, 2) == (6, 0, 1)  # failed count stays with the timeline


def test_fill_takes_a_va_of_a_devmem_binding(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    dev_bo(v, c, 64 << 10, DEV_VA)
    _, out = host_bo(v, c, b"\0" * 8192, HOST_VA)

    def fill(dst, ln, val):
        return desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", dst, ln, val))

    v.submit([Job(c, 0, 1, [fill(DEV_VA + 4096, 8192, 0x1122334455667788),
                            d_copy(hw.TACC_OP_COPY_D2H, DEV_VA + 4096, HOST_VA, 8192)])])
    [(st, _, failed, _)] = v.wait_used()
    assert (st, failed) == (0, 0)
    assert d.qt.memread(out, 16) == struct.pack("<QQ", 0x1122334455667788, 0x1122334455667788)
    # a FILL of host memory, or beyond the binding, is refused whole
    for dst, ln in ((HOST_VA, 4096), (DEV_VA + (60 << 10), 8192)):
        v.submit([Job(c, 0, 2, [fill(dst, ln, 1)])])
        [(st, nj, _, _)] = v.wait_used()
        assert (st, nj) == (hw.TACC_VIRTIO_ERR_INVAL, 0)


# ----------------------------------------------------------------- isolation --
def test_other_contexts_bo_refused(vt):
    a, b = vt.ctx_create(), vt.ctx_create()
    assert a != b
    h, _ = host_bo(vt, a, b"secret" * 100, HOST_VA)
    assert vt.bind(b, h, HOST_VA, 4096) == hw.TACC_VIRTIO_ERR_PERM
    assert vt.bo_destroy(b, h) == hw.TACC_VIRTIO_ERR_PERM
    assert vt.bind(a, h, HOST_VA + 0x10000, 4096) == hw.TACC_VIRTIO_OK  # the owner may
    assert vt.bind(b, 0xDEAD, HOST_VA, 4096) == hw.TACC_VIRTIO_ERR_NOENT
    assert vt.bind(9, h, HOST_VA, 4096) == hw.TACC_VIRTIO_ERR_NOENT  # no such context


def test_context_cannot_reach_another_contexts_memory(vdev, vt):
    d, v = vdev
    a, b = v.ctx_create(), v.ctx_create()
    _, secret = host_bo(v, a, b"S" * 4096, HOST_VA)
    _, out = host_bo(v, b, b"\0" * 4096, HOST_VA + 0x10000)
    # context b names a's VA: its own address space has nothing there
    v.submit([Job(b, 0, 1, [d_copy(hw.TACC_OP_COPY_D2H, HOST_VA, HOST_VA + 0x10000, 64)])])
    [(st, _, failed, js)] = v.wait_used()
    assert failed == 1 and js[0][1] == hw.TACC_ST_MMU_FAULT
    assert d.qt.memread(out, 64) == b"\0" * 64 and d.qt.memread(secret, 1) == b"S"


def test_readonly_binding_not_writable(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    a = d.alloc(4096)
    d.qt.memwrite(a, b"R" * 4096)
    h = v.bo_host(c, a, 4096)
    assert v.bind(c, h, HOST_VA, 4096, readonly=True) == 0
    dev_bo(v, c, 4096, DEV_VA)
    v.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_D2H, DEV_VA, HOST_VA, 4096)])])
    [(_, _, failed, js)] = v.wait_used()
    assert failed == 1 and js[0][1] == hw.TACC_ST_MMU_FAULT
    assert d.qt.memread(a, 4) == b"RRRR"


def test_mappings_do_not_change_under_jobs_in_flight(vt):
    c = vt.ctx_create()
    h, _ = host_bo(vt, c, b"\0" * (1 << 20), HOST_VA)
    dev_bo(vt, c, 1 << 20, DEV_VA)
    vt.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, 1 << 20)])])
    # the clock has not moved: the copy is in flight
    assert vt.unbind(c, HOST_VA, 1 << 20) == hw.TACC_VIRTIO_ERR_BUSY
    assert vt.ctx_destroy(c) == hw.TACC_VIRTIO_ERR_BUSY
    assert vt.bo_destroy(c, h) == hw.TACC_VIRTIO_ERR_BUSY
    vt.wait_used()
    assert vt.bo_destroy(c, h) == hw.TACC_VIRTIO_ERR_BUSY  # still bound
    assert vt.unbind(c, HOST_VA, 1 << 20) == 0 and vt.bo_destroy(c, h) == 0
    assert vt.ctx_destroy(c) == 0


def test_devmem_bo_is_scrubbed(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    h = dev_bo(v, c, 4096, DEV_VA)
    _, src = host_bo(v, c, b"\xAA" * 4096, HOST_VA)
    v.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, 4096)])])
    v.wait_used()
    assert v.unbind(c, DEV_VA, 4096) == 0 and v.bo_destroy(c, h) == 0
    c2 = v.ctx_create()
    dev_bo(v, c2, 4096, DEV_VA)  # the same window pages, now c2's
    _, out = host_bo(v, c2, b"\x55" * 4096, HOST_VA)
    v.submit([Job(c2, 0, 1, [d_copy(hw.TACC_OP_COPY_D2H, DEV_VA, HOST_VA, 4096)])])
    v.wait_used()
    assert d.qt.memread(out, 4096) == b"\0" * 4096


# ------------------------------------------------------- completions, stalls --
def test_stalled_guest_cannot_stall_pf(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    v.subq.set_used_event(0x8000)  # and no interrupt either
    for i in range(64):  # 64 batches, never consumed
        v.submit([Job(c, i % 4, i // 4 + 1, [desc(hw.TACC_OP_NOP)] * 8)], kick=(i == 63))
    # the PF's work still runs and completes on the shared engines
    pf = d.pf
    a = d.alloc(1 << 16)
    _, ds = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEV_VA_PF, 1 << 16)])
    pf.submit(0, ds)
    for _ in range(100):
        d.qt.clock_step(100_000)
        cq = pf.cqes(0)
        if cq:
            break
    assert cq and cq[0].status == 0
    # the virtio jobs completed too (fences), though nobody takes the buffers
    assert all(v.fence(c, r)[0] == 16 for r in range(4))
    assert v.subq.used_idx() == 64 and len(v.subq.free) < v.subq.size
    assert len(v.wait_used(64)) == 64


DEV_VA_PF = 0x40_0000_0000  # tests/device/conftest.py map_default: devmem at DEVMEM_VA


def test_event_idx_suppresses_interrupts(vdev, vt):
    d, v = vdev
    assert v.init(msix=True)
    c = v.ctx_create()
    msg = MSI_MSG + 4 * hw.TACC_VIRTIO_VQ_SUBMIT
    # the first used buffer after a reset always notifies (QEMU's signalled_used)
    v.submit([Job(c, 0, 1, [desc(hw.TACC_OP_NOP)] * 4)])
    v.wait_used(1)
    assert d.qt.readl(msg) == 0x200 + hw.TACC_VIRTIO_VQ_SUBMIT
    d.qt.writel(msg, 0)
    v.subq.set_used_event(3)  # notify when the used index passes 3: 3 batches on
    for i in range(2):
        v.submit([Job(c, 0, i + 2, [desc(hw.TACC_OP_NOP)] * 4)])
    assert len(v.wait_used(2)) == 2
    assert d.qt.readl(msg) == 0, "interrupt although used_event said not yet"
    # one batch of 8 jobs on 4 rings: one used buffer, one interrupt
    v.submit([Job(c, r, 10 + r, [desc(hw.TACC_OP_NOP)] * 2) for r in range(4)] +
             [Job(c, r, 20 + r, [desc(hw.TACC_OP_NOP)]) for r in range(4)])
    [(st, nj, _, _)] = v.wait_used(1)
    assert (st, nj) == (0, 8)
    assert d.qt.readl(msg) == 0x200 + hw.TACC_VIRTIO_VQ_SUBMIT


# -------------------------------------------------------------------- trace --
def test_trace_kick_dispatch_and_command_records(vdev, vt):
    d, v = vdev
    ring = d.alloc(64 * 64)
    d.qt.memset(ring, 64 * 64)
    assert v.trace_setup(ring, 64) == 0
    c = v.ctx_create()
    v.submit([Job(c, 1, 1, [desc(hw.TACC_OP_NOP), desc(hw.TACC_OP_NOP)], tag=0xABC0001),
              Job(c, 2, 1, [desc(hw.TACC_OP_NOP)], tag=0xABC0002)])
    v.wait_used()
    recs = []
    for i in range(8):
        raw = d.qt.memread(ring + 64 * i, 64)
        ver, op, eng, q, fn, ctx, seq, job, tag = struct.unpack_from("<BBBBHHIIQ", raw)
        if ver:
            recs.append((op, q, fn, ctx, seq, job, tag))
    assert all(r[2] == hw.TACC_FN_VIRTIO for r in recs)
    assert [r[4] for r in recs] == list(range(len(recs)))
    kick = [r for r in recs if r[0] == hw.TACC_TRACE_EV_VIRTIO_KICK]
    disp = [r for r in recs if r[0] == hw.TACC_TRACE_EV_VIRTIO_DISPATCH]
    cmds = [r for r in recs if r[0] < hw.TACC_TRACE_EV_BASE]
    assert len(kick) == 1 and kick[0][6] == 0xABC0001 and kick[0][5] == 2  # 2 jobs
    assert {(r[1], r[6]) for r in disp} == {(1, 0xABC0001), (2, 0xABC0002)}
    # the timeline joins by tag: each job's commands carry its dispatch's job number
    for r in disp:
        mine = [x for x in cmds if x[5] == r[5]]
        assert mine and all(x[1] == r[1] and x[3] == c for x in mine)
    assert len(cmds) == 3
    assert d.qt.readb(ring) == hw.TACC_TRACE_VERSION == 2


# ------------------------------------------------------- negotiation, errors --
def test_negotiated_subset_is_what_counts(vt):
    """A driver that knows only DEVMEM (an older frontend) on this backend."""
    assert vt.init(want=(1 << F_VERSION_1) | (1 << hw.TACC_VIRTIO_F_DEVMEM))
    assert not vt.has(hw.TACC_VIRTIO_F_FILL) and not vt.has(hw.TACC_VIRTIO_F_TRACE)
    assert vt.trace_setup(0x100000, 64) == hw.TACC_VIRTIO_ERR_UNSUPP
    c = vt.ctx_create()
    dev_bo(vt, c, 4096, DEV_VA)
    fill = desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", DEV_VA, 4096, 0))
    vt.submit([Job(c, 0, 1, [fill])])
    [(st, nj, _, _)] = vt.wait_used()
    assert (st, nj) == (hw.TACC_VIRTIO_ERR_INVAL, 0)
    assert vt.config()["caps"] & hw.TACC_CAP_FILL == 0


def test_older_backend():
    """A backend without FILL, TRACE and DEVMEM (their properties off)."""
    d, v = _boot("devmem=off,fill=off,trace=off")
    try:
        assert v.device_features() & ALL_F == 0
        assert v.init()  # the driver asks for everything, gets what is offered
        assert v.features & ALL_F == 0
        c = v.ctx_create()
        assert v.bo_create(c, 4096, devmem=True)[0] == hw.TACC_VIRTIO_ERR_UNSUPP
        assert v.trace_setup(0x100000, 64) == hw.TACC_VIRTIO_ERR_UNSUPP
        h, _ = host_bo(v, c, b"x" * 4096, HOST_VA)  # the base protocol works
        v.submit([Job(c, 0, 1, [desc(hw.TACC_OP_NOP)])])
        assert v.wait_used()[0][:3] == (0, 1, 0)
        assert v.bo_destroy(c, h) == hw.TACC_VIRTIO_ERR_BUSY
    finally:
        d.close()


def test_control_errors(vt):
    c = vt.ctx_create()
    E = hw
    cases = [
        (hdr(0x77, c), E.TACC_VIRTIO_ERR_UNSUPP),
        (hdr(E.TACC_VIRTIO_CTX_CREATE, version=2), E.TACC_VIRTIO_ERR_VERSION),
        (b"\1\0", E.TACC_VIRTIO_ERR_INVAL),
        (hdr(E.TACC_VIRTIO_CTX_DESTROY, 15), E.TACC_VIRTIO_ERR_NOENT),
        (hdr(E.TACC_VIRTIO_BO_CREATE, c) + struct.pack("<QII", 4096, 0, 1) +
         struct.pack("<QII", 0x1001, 4096, 0), E.TACC_VIRTIO_ERR_INVAL),  # misaligned
        (hdr(E.TACC_VIRTIO_BO_CREATE, c) + struct.pack("<QII", 8192, 0, 1) +
         struct.pack("<QII", 0x100000, 4096, 0), E.TACC_VIRTIO_ERR_INVAL),  # short
        (hdr(E.TACC_VIRTIO_BO_CREATE, c) + struct.pack("<QII", 0, 0, 0), E.TACC_VIRTIO_ERR_INVAL),
        (hdr(E.TACC_VIRTIO_VM_UNBIND, c) + struct.pack("<QQ", 0, 4096), E.TACC_VIRTIO_ERR_NOENT),
        (hdr(E.TACC_VIRTIO_SUBMIT, c), E.TACC_VIRTIO_ERR_UNSUPP),  # not on the control queue
    ]
    for req, want in cases:
        assert vt.ctrl(req)[0] == want, (req, want)
    h, _ = host_bo(vt, c, b"\0" * 8192, HOST_VA)
    assert vt.bind(c, h, HOST_VA + 4096, 4096) == E.TACC_VIRTIO_ERR_BUSY  # overlaps
    assert vt.bind(c, h, 1 << 39, 4096) == E.TACC_VIRTIO_ERR_INVAL
    assert vt.bind(c, h, HOST_VA + 0x10000, 4096, offset=8192) == E.TACC_VIRTIO_ERR_INVAL
    for _ in range(hw.TACC_NUM_CONTEXTS - 1):
        vt.ctx_create()
    assert vt.ctrl(hdr(E.TACC_VIRTIO_CTX_CREATE))[0] == E.TACC_VIRTIO_ERR_NOSPC
    # a response part too small to answer: the buffer is still used
    assert vt.ctrl_raw(hdr(E.TACC_VIRTIO_CTX_DESTROY, c), in_len=8) == b""


def test_submit_refusals_are_whole(vt):
    c = vt.ctx_create()
    nop = desc(hw.TACC_OP_NOP)
    bad = [
        [Job(c, 4, 1, [nop])],                       # ring
        [Job(c, 0, 1, [nop]), Job(c, 0, 1, [nop])],  # seqno not increasing
        [Job(c, 0, 1, [desc(hw.TACC_OP_MAX)])],      # opcode
        [Job(3, 0, 1, [nop])],                       # no such context
        [Job(c, 0, 1, [nop] * 257)],                 # too many commands
    ]
    for jobs in bad:
        vt.submit(jobs)
        [(st, nj, _, _)] = vt.wait_used()
        assert st != 0 and nj == 0, jobs
    assert vt.fence(c, 0) == (0, 0, 0)  # nothing of them ran
    raw = vt.batch([Job(c, 0, 1, [nop])])
    for buf in (raw[:-1], raw + b"\0" * 8, raw[:20]):  # truncated, trailing, short
        vt.subq.add([buf], 16)
        vt.subq.kick()
        [(st, nj, _, _)] = vt.wait_used()
        assert st == hw.TACC_VIRTIO_ERR_INVAL and nj == 0
    vt.submit([Job(c, 0, 1, [nop])])  # and the timeline is still at 0: seqno 1 runs
    assert vt.wait_used()[0][:2] == (0, 1) and vt.fence(c, 0)[0] == 1


def test_reset_mid_flight_frees_everything(vdev, vt):
    d, v = vdev
    c = v.ctx_create()
    host_bo(v, c, b"\0" * (1 << 20), HOST_VA)
    dev_bo(v, c, 1 << 20, DEV_VA)
    v.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, 1 << 20)])])
    v.reset()  # jobs in flight: dropped with the rings
    d.qt.clock_step(10_000_000)
    assert not d.qt.died()
    assert v.init()
    assert v.ctx_create() == 0  # every context was freed
    st, _ = v.bo_create(0, WIN_SIZE, devmem=True)  # and the whole window is free
    assert st == 0


def test_trace_setup_checks(vt):
    bad = [TRACE_SETUP.pack(0x100001, 0, 64, 1), TRACE_SETUP.pack(0x100000, 0, 63, 1),
           TRACE_SETUP.pack(0x100000, 3, 64, 1), TRACE_SETUP.pack(0x100000, 0, 64, 2)]
    for body in bad:
        assert vt.ctrl(hdr(hw.TACC_VIRTIO_TRACE_SETUP) + body)[0] == hw.TACC_VIRTIO_ERR_INVAL


def test_2m_aligned_bindings_take_2m_leaves(vdev, vt):
    """A 2 MiB-aligned run of a binding (device memory, or guest-physical entries of a
    host BO that follow each other) is one 2 MiB leaf, as tacc.ko's PF driver maps it
    (TACC_CAP_MMU_2M): a 4 MiB copy takes a handful of TLB misses, not one per 4 KiB
    page (BENCH=virt: 4 MiB copies ran at 0.10x the VF's).  Unbinding clears the leaves
    (a binding at the same VA works), and a reset frees the tables without walking
    into a leaf's data."""
    d, v = vdev
    huge, size = 2 << 20, 4 << 20
    c = v.ctx_create()
    data = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8).tobytes()
    a = v.dev.alloc(size, align=huge)
    v.qt.memwrite(a, data)
    h = v.bo_host(c, a, size)
    assert v.bind(c, h, HOST_VA, size) == hw.TACC_VIRTIO_OK
    dev_bo(v, c, size, DEV_VA)
    out = v.dev.alloc(size, align=huge)
    v.qt.memwrite(out, b"\0" * size)
    ho = v.bo_host(c, out, size)
    assert v.bind(c, ho, HOST_VA + 0x4000_0000, size) == hw.TACC_VIRTIO_OK
    m0 = v.cnt("tlb_misses")
    v.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, size),
                            d_copy(hw.TACC_OP_COPY_D2H, DEV_VA, HOST_VA + 0x4000_0000,
                                   size)])])
    [(st, nj, failed, _)] = v.wait_used()
    assert (st, nj, failed) == (0, 1, 0)
    assert d.qt.memread(out, size) == data
    misses = v.cnt("tlb_misses") - m0
    assert misses <= 12, f"{misses} TLB misses for 2 x 4 MiB: 4 KiB leaves"
    # unbind, then the same VA with the same pages listed in 4 KiB entries: the
    # entries follow each other, so they merge into 2 MiB leaves again
    assert v.unbind(c, HOST_VA, size) == hw.TACC_VIRTIO_OK
    h2 = v.bo_host(c, a, size, page_split=4096)
    assert v.bind(c, h2, HOST_VA, size) == hw.TACC_VIRTIO_OK
    v.qt.memwrite(out, b"\0" * size)
    m0 = v.cnt("tlb_misses")
    v.submit([Job(c, 0, 2, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, size),
                            d_copy(hw.TACC_OP_COPY_D2H, DEV_VA, HOST_VA + 0x4000_0000,
                                   size)])])
    [(st, nj, failed, _)] = v.wait_used()
    assert (st, nj, failed) == (0, 1, 0) and d.qt.memread(out, size) == data
    assert v.cnt("tlb_misses") - m0 <= 12
    assert v.init()  # a reset frees every table (2 MiB leaves are not tables)
    assert d.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


def _copy_pair(size: int, src: int, dev: int, dst: int) -> list[bytes]:
    return [d_copy(hw.TACC_OP_COPY_H2D, src, dev, size),
            d_copy(hw.TACC_OP_COPY_D2H, dev, dst, size)]


def _busy(cnt) -> int:
    """Modelled DMA busy time of a function (both directions), from its counters."""
    return cnt("busy_dma_h2d") + cnt("busy_dma_d2h")


def test_linux_page_list_copy_runs_at_the_pfs_speed(vdev, vt):
    """A 4 MiB copy in and out of a host BO listed as a Linux guest lists it (64 KiB
    pieces: the DMA API's default segment size splits an IOVA-contiguous buffer), to a
    device BO allocated after a small one, takes the modelled device time of the same
    copy on the PF, whose driver maps 2 MiB leaves (tacc.ko: 2 MiB-aligned device
    memory for BOs of 2 MiB and more, one leaf per aligned 2 MiB run of a mapping).
    Cold (first copy after the binds) and warm (the same again), from the functions'
    own busy counters: virtual time, exact."""
    d, v = vdev
    huge, size, piece = 2 << 20, 4 << 20, 64 << 10
    data = np.random.default_rng(36).integers(0, 256, size, dtype=np.uint8).tobytes()
    a = v.dev.alloc(size, align=huge)
    out = v.dev.alloc(size, align=huge)
    v.qt.memwrite(a, data)

    # the PF: ctx 0 maps guest RAM 1:1 and device memory at DEVMEM_VA, 2 MiB leaves
    pf_t = []
    for _ in range(2):
        b0 = _busy(d.pf.cnt)
        cq = d.pf.run_job(0, _copy_pair(size, a, DEVMEM_VA, out))
        assert cq.status == hw.TACC_ST_OK
        pf_t.append(_busy(d.pf.cnt) - b0)
    assert d.qt.memread(out, size) == data

    # virtio-tacc: the same copies through a context's bindings
    v.qt.memwrite(out, b"\0" * size)
    c = v.ctx_create()
    dev_bo(v, c, piece, DEV_VA - (1 << 30))  # a small device BO first
    h = v.bo_host(c, a, size, page_split=piece)
    assert v.bind(c, h, HOST_VA, size) == hw.TACC_VIRTIO_OK
    ho = v.bo_host(c, out, size, page_split=piece)
    assert v.bind(c, ho, HOST_VA + (1 << 30), size) == hw.TACC_VIRTIO_OK
    dev_bo(v, c, size, DEV_VA)
    vt_t, misses = [], []
    for i in range(2):
        b0, m0 = _busy(v.cnt), v.cnt("tlb_misses")
        v.submit([Job(c, 0, i + 1, _copy_pair(size, HOST_VA, DEV_VA, HOST_VA + (1 << 30)))])
        [(st, nj, failed, _)] = v.wait_used(steps=2000)
        assert (st, nj, failed) == (0, 1, 0)
        vt_t.append(_busy(v.cnt) - b0)
        misses.append(v.cnt("tlb_misses") - m0)
    assert d.qt.memread(out, size) == data
    ratios = [p / t for p, t in zip(pf_t, vt_t, strict=True)]
    assert all(r >= 0.97 for r in ratios), (
        f"virtio/PF speed {ratios} (cold, warm): PF {pf_t}, virtio {vt_t} ticks, "
        f"virtio TLB misses {misses}")
    assert misses[0] <= 12 and misses[1] == 0, misses


def test_unbind_frees_empty_tables(vdev, vt):
    """VM_UNBIND frees a page table left with no valid entry, as if it had never been
    made: a 2 MiB-aligned binding at the VA of an earlier 4 KiB-leaf binding takes a
    2 MiB leaf (1 TLB miss, 2 PTE reads per side), not the old table's 4 KiB leaves."""
    d, v = vdev
    huge = 2 << 20
    c = v.ctx_create()
    a = v.dev.alloc(huge, align=huge)
    out = v.dev.alloc(huge, align=huge)
    # first: the same VAs bound to pages that are not contiguous (4 KiB leaves)
    scat = [(v.dev.alloc(4096), 4096) for _ in range(huge // 4096)][::-1]
    for va in (HOST_VA, HOST_VA + (1 << 30)):
        st, h = v.bo_create(c, huge, scat)
        assert st == hw.TACC_VIRTIO_OK
        assert v.bind(c, h, va, huge) == hw.TACC_VIRTIO_OK
        assert v.unbind(c, va, huge) == hw.TACC_VIRTIO_OK
        assert v.bo_destroy(c, h) == hw.TACC_VIRTIO_OK
    data = np.random.default_rng(28).integers(0, 256, huge, dtype=np.uint8).tobytes()
    v.qt.memwrite(a, data)
    assert v.bind(c, v.bo_host(c, a, huge), HOST_VA, huge) == hw.TACC_VIRTIO_OK
    assert v.bind(c, v.bo_host(c, out, huge), HOST_VA + (1 << 30), huge) == \
        hw.TACC_VIRTIO_OK
    dev_bo(v, c, huge, DEV_VA)
    m0, w0 = v.cnt("tlb_misses"), v.cnt("tlb_walk_reads")
    v.submit([Job(c, 0, 1, _copy_pair(huge, HOST_VA, DEV_VA, HOST_VA + (1 << 30)))])
    [(st, nj, failed, _)] = v.wait_used(steps=2000)
    assert (st, nj, failed) == (0, 1, 0)
    assert d.qt.memread(out, huge) == data
    misses, walks = v.cnt("tlb_misses") - m0, v.cnt("tlb_walk_reads") - w0
    assert (misses, walks) == (3, 6), (
        f"{misses} TLB misses, {walks} PTE reads: 2 MiB leaves take 3 and 6 "
        "(host, device, host)")


# ------------------------------------------------------ fault injection --
VT_QOM = "/machine/peripheral/vtacc0/virtio-backend"


def test_control_fault_injection_late_short_and_a_smaller_pool():
    """The backend's x-fi-* of a device the guest driver must not trust (docs/hardware.md):
    x-fi-ctrl-short=4 answers the next request (carried out) with 4 bytes written;
    x-fi-ctrl-delay-ms=5 uses the next answer 5 ms of virtual clock late and the requests
    behind it after it, in order; a reset drops a held answer unused;
    x-fi-page-entries=2 is the config's page_entries and the pool BO_CREATE draws from
    (x-page-entries-used counts it)."""
    d, v = _boot("id=vtacc0")
    qmp = d.qt.qmp
    try:
        assert v.init()
        assert v.config()["page_entries"] == hw.TACC_VIRTIO_MAX_FN_ENTS
        qmp.cmd("qom-set", path=VT_QOM, property="x-fi-ctrl-short", value=4)
        raw = v.ctrl_raw(hdr(hw.TACC_VIRTIO_CTX_CREATE))
        assert raw == struct.pack("<I", hw.TACC_VIRTIO_OK)  # 4 bytes: the status only
        assert v.ctx_create() == 1  # context 0 was created all the same
        assert len(v.ctrl_raw(hdr(hw.TACC_VIRTIO_CTX_DESTROY, 1))) == 16  # once

        qmp.cmd("qom-set", path=VT_QOM, property="x-fi-ctrl-delay-ms", value=5)
        q = v.ctrlq
        a = q.add([hdr(hw.TACC_VIRTIO_CTX_CREATE)], 16)
        q.kick()
        b = q.add([hdr(hw.TACC_VIRTIO_CTX_CREATE)], 16)
        q.kick()
        assert q.pop() == []
        d.qt.clock_step(4_000_000)
        assert q.pop() == []
        d.qt.clock_step(2_000_000)
        used = q.pop()
        assert [h for h, _ in used] == [a, b], used
        assert [struct.unpack("<IIQ", r) for _, r in used] == \
            [(hw.TACC_VIRTIO_OK, 0, 1), (hw.TACC_VIRTIO_OK, 0, 2)]
        assert qmp.cmd("qom-get", path=VT_QOM, property="x-fi-ctrl-delay-ms") == 0

        qmp.cmd("qom-set", path=VT_QOM, property="x-fi-page-entries", value=2)
        assert v.config()["page_entries"] == 2
        base = d.alloc(3 * 4096)
        three = [(base + i * 4096, 4096) for i in (2, 0, 1)]  # 3 entries
        assert v.bo_create(0, 3 * 4096, three)[0] == hw.TACC_VIRTIO_ERR_NOSPC
        st, h = v.bo_create(0, 2 * 4096, three[:2])
        assert st == hw.TACC_VIRTIO_OK
        assert qmp.cmd("qom-get", path=VT_QOM, property="x-page-entries-used") == 2
        assert v.bo_create(0, 4096, three[2:])[0] == hw.TACC_VIRTIO_ERR_NOSPC
        assert v.bo_destroy(0, h) == hw.TACC_VIRTIO_OK
        assert qmp.cmd("qom-get", path=VT_QOM, property="x-page-entries-used") == 0
        with pytest.raises(Exception, match="x-fi-page-entries"):
            qmp.cmd("qom-set", path=VT_QOM, property="x-fi-page-entries", value=0)

        qmp.cmd("qom-set", path=VT_QOM, property="x-fi-ctrl-delay-ms", value=5)
        q.add([hdr(hw.TACC_VIRTIO_CTX_CREATE)], 16)
        q.kick()
        assert q.pop() == []
        assert v.init()  # a reset: the held answer is dropped, the queue works
        d.qt.clock_step(10_000_000)
        assert v.ctrlq.pop() == []
        assert v.ctx_create() == 0
    finally:
        d.close()
