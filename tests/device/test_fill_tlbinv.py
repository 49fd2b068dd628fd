"""FILL (device-memory scrub) and the TLB invalidation completion (TLB_INV_SEQ/DONE).

FILL stores a 64-bit pattern over window offsets (no MMU), timed and counted
like the write half of a D2D copy (device-memory bandwidth, DMA H2D engine).
TLB_INV_DONE publishes the TLB_INV_SEQ written before the TLB_INV it completes.
docs/hardware.md sections "FILL" and "TLB invalidation completion".
"""

import struct

import pytest
from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.taccdev import DEVMEM_VA

OK = hw.TACC_ST_OK


def d_fill(dst, length, value, **kw):
    return desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", dst, length, value), **kw)


def read_devmem(dev, pf, off, n):
    dst = dev.alloc(n)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + off, dst, n)]).status == OK
    return dev.qt.memread(dst, n)


def write_devmem(dev, pf, off, data):
    src = dev.alloc(len(data))
    dev.qt.memwrite(src, data)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + off, len(data))]
                      ).status == OK


def test_caps_and_version(pf):
    caps = pf.r32(hw.TACC_REG_CAPS)
    assert caps & hw.TACC_CAP_FILL and caps & hw.TACC_CAP_TLB_INV_DONE
    v = pf.r32(hw.TACC_REG_VERSION)
    assert v == hw.TACC_HW_VERSION_MAJOR << 16 | hw.TACC_HW_VERSION_MINOR and v >= 1 << 16 | 1


@pytest.mark.parametrize("value", [0, 0x0123_4567_89AB_CDEF])
def test_fill_pattern_counters_timing(dev, pf, value):
    off, n = 0x30_0000, 1 << 20
    write_devmem(dev, pf, off - 4096, b"\xAA" * (n + 8192))
    c0 = pf.counters()
    # @ctx is unused by FILL: an out-of-range context is not an error
    cq = pf.run_job(1, [d_fill(off, n, value, ctx=0xFFFF)])
    assert cq.status == OK
    c = pf.counters()
    d = {k: c[k] - c0[k] for k in c}
    assert d["devmem_write_bytes"] == n and d["devmem_read_bytes"] == 0
    assert d["cmds_dma_h2d"] == 1 and d["h2d_bytes"] == 0 and d["d2h_bytes"] == 0
    assert d["tlb_misses"] == 0 and d["tlb_hits"] == 0
    # cmd-latency-ns (100) + n bytes at devmem-gbps
    gbps = dev.qom_get("devmem-gbps")
    assert abs((cq.end - cq.start) - (100 + n * 1000 // gbps // 1000)) <= 1
    got = read_devmem(dev, pf, off - 4096, n + 8192)
    assert got[:4096] == b"\xAA" * 4096 and got[-4096:] == b"\xAA" * 4096
    assert got[4096:-4096] == struct.pack("<Q", value) * (n // 8)


def test_fill_trace_record(dev, pf):
    pf.trace_enable()
    p0 = pf.r32(hw.TACC_REG_TRACE_PROD)
    assert pf.run_job(0, [d_fill(0, 65536, 0)]).status == OK
    p1 = pf.r32(hw.TACC_REG_TRACE_PROD)
    assert p1 == p0 + 1
    (r,) = pf.trace_read(p0, p1)
    assert r.opcode == hw.TACC_OP_FILL and r.engine == hw.TACC_ENGINE_DMA_H2D
    assert r.bytes == 65536 and r.status == OK
    pf.w32(hw.TACC_REG_TRACE_CTRL, 0)


@pytest.mark.parametrize("dst,length,status", [
    (0, 0, "TACC_ST_BAD_LENGTH"),
    (0, 12, "TACC_ST_BAD_LENGTH"),
    (4, 64, "TACC_ST_BAD_ALIGN"),
    ((256 << 20) - 64, 128, "TACC_ST_MMU_FAULT"),   # beyond the window
    (1 << 40, 64, "TACC_ST_MMU_FAULT"),
])
def test_fill_bad(dev, pf, dst, length, status):
    pf.w32(hw.TACC_REG_FAULT_CLEAR, 1)
    assert pf.run_job(0, [d_fill(dst, length, 0)]).status == getattr(hw, status)
    if status == "TACC_ST_MMU_FAULT":
        info = pf.r32(hw.TACC_REG_FAULT_INFO)
        assert info & hw.TACC_FAULT_VALID and info & hw.TACC_FAULT_WRITE
        assert (info & hw.TACC_FAULT_TYPE_MASK) >> hw.TACC_FAULT_TYPE_SHIFT == \
            hw.TACC_FAULT_DEVMEM_RANGE
        pf.w32(hw.TACC_REG_FAULT_CLEAR, 1)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)


def test_fill_vf_window_offsets(dev, pf):
    """A VF's FILL offsets are relative to its window and cannot leave it."""
    from test_sriov import setup_vfs

    base = 64 << 20                       # setup_vfs: VF1 at [64 MiB, +32 MiB)
    write_devmem(dev, pf, base - 4096, b"\x55" * 8192)
    write_devmem(dev, pf, base + (32 << 20) - 4096, b"\x66" * 8192)
    vf1, _ = setup_vfs(dev, pf)
    assert vf1.run_job(0, [d_fill(0, 32 << 20, 0)]).status == OK
    assert vf1.run_job(0, [d_fill(32 << 20, 8, 0)]).status == hw.TACC_ST_MMU_FAULT
    dev.enable_vfs(0)
    got = read_devmem(dev, pf, base - 4096, 8192)
    assert got == b"\x55" * 4096 + b"\0" * 4096
    got = read_devmem(dev, pf, base + (32 << 20) - 4096, 8192)
    assert got == b"\0" * 4096 + b"\x66" * 4096


def test_tlb_inv_done_protocol(dev, pf):
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0 and pf.r32(hw.TACC_REG_TLB_INV_SEQ) == 0
    pf.w32(hw.TACC_REG_TLB_INV_SEQ, 5)
    assert pf.r32(hw.TACC_REG_TLB_INV_SEQ) == 5
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0      # SEQ alone completes nothing
    pf.w32(hw.TACC_REG_TLB_INV, 1)
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 5
    pf.w32(hw.TACC_REG_TLB_INV_SEQ, 0xFFFF_FFFF)
    pf.w32(hw.TACC_REG_TLB_INV, hw.TACC_TLB_INV_ALL)
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0xFFFF_FFFF
    pf.w32(hw.TACC_REG_TLB_INV_SEQ, 7)
    pf.w32(hw.TACC_REG_TLB_INV, 99)                    # bad context: no invalidation
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0xFFFF_FFFF
    pf.w32(hw.TACC_REG_TLB_INV, 2)
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 7
    pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)       # a function reset clears both
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0 and pf.r32(hw.TACC_REG_TLB_INV_SEQ) == 0
    pf.reset()


def _cached_then_remapped(dev, pf):
    """Context 3's page at VA 0x20_0000_0000 (device memory of 0x11 bytes) read once, so
    the TLB holds it, then remapped in the tables to 0x22 bytes: (va, dst, root)."""
    va = 0x20_0000_0000
    write_devmem(dev, pf, 0x50_0000, b"\x11" * 4096)
    write_devmem(dev, pf, 0x60_0000, b"\x22" * 4096)
    root = dev.pt.new_root()
    dev.pt.map(root, 0, 0, 0x2000_0000, huge=True)
    dev.pt.map(root, va, 0x50_0000, 4096, devmem=True)
    dev.pt.flush()
    pf.set_ptbr(3, root)
    dst = dev.alloc(4096)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, 4096, ctx=3)]).status == OK
    assert dev.qt.memread(dst, 4096) == b"\x11" * 4096
    dev.pt.map(root, va, 0x60_0000, 4096, devmem=True)   # remap: the TLB still has the old
    dev.pt.flush()
    return va, dst, root


def test_tlb_inv_done_means_new_translation(dev, pf):
    """Once DONE shows the sequence, a command walks the new page tables."""
    va, dst, _ = _cached_then_remapped(dev, pf)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, 4096, ctx=3)]).status == OK
    assert dev.qt.memread(dst, 4096) == b"\x11" * 4096
    pf.w32(hw.TACC_REG_TLB_INV_SEQ, 42)
    pf.w32(hw.TACC_REG_TLB_INV, 3)
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 42
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, 4096, ctx=3)]).status == OK
    assert dev.qt.memread(dst, 4096) == b"\x22" * 4096


def test_tlb_inv_stall_keeps_stale_translation_until_reset(dev, pf):
    """x-fi-tlb-inv-stall: a TLB_INV neither completes (DONE keeps its value) nor drops
    the entry (a command still reads the old page); a function reset empties the TLB
    (the next command walks the new tables); cleared, TLB_INV completes again."""
    va, dst, root = _cached_then_remapped(dev, pf)
    dev.qom_set("x-fi-tlb-inv-stall", True)
    try:
        pf.w32(hw.TACC_REG_TLB_INV_SEQ, 9)
        pf.w32(hw.TACC_REG_TLB_INV, 3)
        assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 0
        assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, 4096, ctx=3)]).status == OK
        assert dev.qt.memread(dst, 4096) == b"\x11" * 4096     # the stale entry
        pf.reset()                                             # empties the TLB
        pf.set_ptbr(3, root)
        assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, 4096, ctx=3)]).status == OK
        assert dev.qt.memread(dst, 4096) == b"\x22" * 4096
        pf.w32(hw.TACC_REG_TLB_INV_SEQ, 10)
        pf.w32(hw.TACC_REG_TLB_INV, 3)
        assert pf.r32(hw.TACC_REG_TLB_INV_DONE) != 10          # still stalled
    finally:
        dev.qom_set("x-fi-tlb-inv-stall", False)
    pf.w32(hw.TACC_REG_TLB_INV_SEQ, 11)
    pf.w32(hw.TACC_REG_TLB_INV, 3)
    assert pf.r32(hw.TACC_REG_TLB_INV_DONE) == 11
