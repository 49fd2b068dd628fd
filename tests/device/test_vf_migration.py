"""VF migration at the device layer (hw 1.4, docs/hardware.md section 16): the PF
stops a VF, saves its state into a host buffer, loads it back, and logs the pages
the VF's DMA writes.  Hostile blobs are refused with their status and leave the PF,
the VF and the other VFs as they were; a VF cannot issue the operations."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy
from tacc.testing.taccdev import DEVMEM_VA, Func, Tacc
from test_migration import save as migrate_to
from test_migration import source_with_vfs, wait_migration

WIN = 512 << 10  # each VF's device-memory window
HDR = struct.Struct("<IHHHHIQQQIIQQ")  # struct tacc_vfstate_hdr
OFF_VERSION, OFF_FN, OFF_CRC = 4, 8, 12
Q0_SQ_SIZE = 292  # "tacc/func-regs" stream: queue 0's sq_size (big endian)
Q0_FIFO0_LISTED = Q0_SQ_SIZE + 176  # queue 0's FIFO slot 0: its "listed" flag (a bool)
ST = hw.ENUMS["tacc_vfmig_status"]

HW_VERSION = hw.TACC_HW_VERSION_MAJOR << 16 | hw.TACC_HW_VERSION_MINOR   # 1.4 or later


BUSY_READS = 10_000  # STATUS reads an operation may stay BUSY (one slice per read here)


def admin(pf: Func, op: int, fn: int) -> int:
    """One PF admin operation on VF fn: its status, read until it is not BUSY (SAVE
    and LOAD move the window one x-host-slice per main-loop turn, hw 1.6)."""
    pf.w32(hw.TACC_REG_VFMIG_CMD, op | fn << hw.TACC_VFMIG_CMD_FN_SHIFT)
    for _ in range(BUSY_READS):
        st = pf.r32(hw.TACC_REG_VFMIG_STATUS)
        if st != hw.TACC_VFMIG_ST_BUSY:
            return st
    raise AssertionError(f"VF migration operation {op} on fn{fn}: BUSY after {BUSY_READS} reads")


def vf_state(pf: Func, fn: int) -> int:
    return pf.r32(hw.TACC_REG_VFMIG_VF_STATE(fn - 1))


def setup_vfs(dev: Tacc, pf: Func, n: int = 2) -> list[Func]:
    assert pf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VF_MIGRATION
    vfs = dev.enable_vfs(n)
    for i in range(n):
        pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(i), (64 << 20) * (i + 1))
        pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(i), WIN)
    for vf in vfs:
        vf.reset()
        vf.set_ptbr(0, dev.map_default(devmem=WIN))
    return vfs


def save(dev: Tacc, pf: Func, fn: int) -> bytes:
    """STOP (waiting for STOPPED), QUERY, SAVE: the blob."""
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, fn) == ST["TACC_VFMIG_ST_OK"]
    dev.qt.clock_step(10**7)
    assert vf_state(pf, fn) & hw.TACC_VFMIG_STATE_MASK == hw.TACC_VFMIG_STOPPED
    assert admin(pf, hw.TACC_VFMIG_OP_QUERY, fn) == 0
    size = pf.r64(hw.TACC_REG_VFMIG_RESULT)
    buf = dev.alloc(size)
    pf.w64(hw.TACC_REG_VFMIG_ADDR, buf)
    pf.w64(hw.TACC_REG_VFMIG_LEN, size)
    assert admin(pf, hw.TACC_VFMIG_OP_SAVE, fn) == 0
    assert pf.r64(hw.TACC_REG_VFMIG_RESULT) == size
    return dev.qt.memread(buf, size)


def load(dev: Tacc, pf: Func, fn: int, blob: bytes, length: int | None = None) -> int:
    buf = dev.alloc(len(blob))
    dev.qt.memwrite(buf, blob)
    pf.w64(hw.TACC_REG_VFMIG_ADDR, buf)
    pf.w64(hw.TACC_REG_VFMIG_LEN, len(blob) if length is None else length)
    return admin(pf, hw.TACC_VFMIG_OP_LOAD, fn)


def recrc(blob: bytes | bytearray) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<I", b, OFF_CRC, 0)
    struct.pack_into("<I", b, OFF_CRC, zlib.crc32(b))
    return bytes(b)


def pattern(dev: Tacc, n: int, seed: int) -> tuple[int, np.ndarray]:
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    a = dev.alloc(n)
    dev.qt.memwrite(a, data.tobytes())
    return a, data


def works(dev: Tacc, f: Func, seed: int) -> None:
    """A round trip through f's device memory, numpy-checked."""
    src, data = pattern(dev, 8192, seed)
    dst = dev.alloc(8192)
    assert f.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + 0x8000, 8192),
                         d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + 0x8000, dst, 8192)]).status == 0
    np.testing.assert_array_equal(np.frombuffer(dev.qt.memread(dst, 8192), np.uint8), data)


def vf_flr(dev: Tacc, vf: Func) -> None:
    qt = dev.qt
    exp = qt.find_cap(0, vf.devfn, 0x10)
    qt.cfg_write(0, vf.devfn, exp + 8, qt.cfg_read(0, vf.devfn, exp + 8, 2) | 0x8000, 2)
    qt.cfg_write(0, vf.devfn, 0x04, 0x0006, 2)


def test_contract_and_pf_only(dev: Tacc, pf: Func) -> None:
    """hw 1.4, CAPS bit on the PF only; a VF reads 0 at the admin registers and its
    writes there do nothing (VF2 is not stopped, the PF's status does not move)."""
    assert pf.r32(hw.TACC_REG_VERSION) == HW_VERSION
    vf1, vf2 = setup_vfs(dev, pf)
    assert not vf1.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VF_MIGRATION
    assert admin(pf, 0x7F, 1) == ST["TACC_VFMIG_ST_BAD_OP"]
    for op in (hw.TACC_VFMIG_OP_STOP, hw.TACC_VFMIG_OP_LOG_START, hw.TACC_VFMIG_OP_SAVE):
        vf1.w64(hw.TACC_REG_VFMIG_ADDR, 0x1000)
        vf1.w64(hw.TACC_REG_VFMIG_LEN, 1 << 20)
        vf1.w32(hw.TACC_REG_VFMIG_LOG_PGSHIFT, 12)
        vf1.w64(hw.TACC_REG_VFMIG_LOG_LEN, 1 << 20)
        vf1.w32(hw.TACC_REG_VFMIG_CMD, op | 2 << hw.TACC_VFMIG_CMD_FN_SHIFT)
    for reg in range(hw.TACC_REG_VFMIG_CMD, hw.TACC_REG_VFMIG_END, 4):
        assert vf1.r32(reg) == 0
    assert pf.r32(hw.TACC_REG_VFMIG_STATUS) == ST["TACC_VFMIG_ST_BAD_OP"]
    assert pf.r64(hw.TACC_REG_VFMIG_ADDR) == 0 and pf.r64(hw.TACC_REG_VFMIG_LEN) == 0
    assert vf_state(pf, 2) == hw.TACC_VFMIG_RUNNING
    works(dev, vf2, 1)
    # a VF number that is not enabled
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 3) == ST["TACC_VFMIG_ST_BAD_FN"]
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 0) == ST["TACC_VFMIG_ST_BAD_FN"]
    dev.enable_vfs(0)


def test_stop_save_flr_load_resume(dev: Tacc, pf: Func) -> None:
    """A job on VF1 stopped with its first copy on the link: STOPPING until that copy
    lands, then STOPPED with the second copy waiting; saved, VF1 reset by FLR and its
    window scribbled over while VF2 runs, loaded, resumed: the job completes with
    the data."""
    vf1, vf2 = setup_vfs(dev, pf)
    works(dev, vf1, 2)
    n = WIN
    src, data = pattern(dev, n, 3)
    dst = dev.alloc(n)
    job, ds = vf1.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n),
                             d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, dst, n)])
    vf1.submit(0, ds)
    dev.qt.clock_step(3000)  # the H2D copy is on the link (~17 us)
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
    assert vf_state(pf, 1) == hw.TACC_VFMIG_STOPPING
    blob = save(dev, pf, 1)
    assert vf1.cqes(0) == []  # the D2H copy has not run
    assert vf1.cnt("h2d_bytes") == n + 8192 and vf1.cnt("d2h_bytes") == 8192
    magic, ver, hsz, fn, _, _, total, rlen, dlen, hwv, rver, _, _ = HDR.unpack_from(blob)
    assert (magic, ver, hsz, fn) == (hw.TACC_VFSTATE_MAGIC, 1, HDR.size, 1)
    assert HDR.size == hw.STRUCTS["tacc_vfstate_hdr"]["size"]
    assert (total, dlen, hwv, rver) == (len(blob), WIN, HW_VERSION, 1)
    assert total == HDR.size + rlen + dlen
    crc = struct.unpack_from("<I", blob, OFF_CRC)[0]
    assert zlib.crc32(blob[:OFF_CRC] + bytes(4) + blob[OFF_CRC + 4:]) == crc
    assert blob[HDR.size + rlen:HDR.size + rlen + n] == data.tobytes()

    # VF1 reset by FLR, its window overwritten by the PF; VF2 runs meanwhile
    vf_flr(dev, vf1)
    assert vf1.r32(hw.TACC_QUEUE_BASE(0) + hw.TACC_Q_CTRL) == 0
    junk = dev.alloc(WIN)
    dev.qt.memwrite(junk, b"\xa5" * WIN)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, junk, DEVMEM_VA + (64 << 20),
                                 WIN)]).status == 0
    works(dev, vf2, 4)
    assert vf_state(pf, 1) == hw.TACC_VFMIG_STOPPED  # an FLR does not end the stop

    assert load(dev, pf, 1, blob) == 0
    assert vf1.r32(hw.TACC_QUEUE_BASE(0) + hw.TACC_Q_CTRL) & hw.TACC_Q_CTRL_ENABLE
    dev.qt.clock_step(10**6)
    assert vf1.cqes(0) == []  # still stopped
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
    assert vf_state(pf, 1) == hw.TACC_VFMIG_RUNNING
    dev.qt.clock_step(10**7)
    cq = vf1.cqes(0)
    assert [(c.job, c.status) for c in cq] == [(job, 0)]
    np.testing.assert_array_equal(np.frombuffer(dev.qt.memread(dst, n), np.uint8), data)
    assert vf1.cnt("d2h_bytes") == n + 8192  # its counters came back too
    works(dev, vf1, 5)
    works(dev, pf, 6)
    dev.enable_vfs(0)


def dirty_pages(dev: Tacc, pf: Func, fn: int, iova: int, length: int) -> set[int]:
    """LOG_REPORT of [iova, +length): the dirty page numbers (4 KiB)."""
    nbytes = (length // 4096 + 63) // 64 * 8
    buf = dev.alloc(nbytes)
    pf.w64(hw.TACC_REG_VFMIG_ADDR, buf)
    pf.w64(hw.TACC_REG_VFMIG_LEN, nbytes)
    pf.w64(hw.TACC_REG_VFMIG_LOG_IOVA, iova)
    pf.w64(hw.TACC_REG_VFMIG_LOG_LEN, length)
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_REPORT, fn) == 0
    assert pf.r64(hw.TACC_REG_VFMIG_RESULT) == nbytes
    bits = np.unpackbits(np.frombuffer(dev.qt.memread(buf, nbytes), np.uint8), bitorder="little")
    return {iova // 4096 + int(i) for i in np.flatnonzero(bits)}


def pages(a: int, n: int) -> set[int]:
    return set(range(a // 4096, (a + n - 1) // 4096 + 1))


def test_dirty_log_exact(dev: Tacc, pf: Func) -> None:
    """The bitmap holds exactly the pages VF1's DMA wrote (a D2H copy's data and its
    CQE), nothing for reads, nothing for the PF's or VF2's writes; cleared on read."""
    vf1, vf2 = setup_vfs(dev, pf)
    base, span = 0, 64 << 20  # ring areas and test data
    pf.w64(hw.TACC_REG_VFMIG_LOG_IOVA, base)
    pf.w64(hw.TACC_REG_VFMIG_LOG_LEN, span)
    pf.w32(hw.TACC_REG_VFMIG_LOG_PGSHIFT, 11)
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_START, 1) == ST["TACC_VFMIG_ST_BAD_ARG"]
    pf.w32(hw.TACC_REG_VFMIG_LOG_PGSHIFT, 12)
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_START, 1) == 0
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_START, 1) == ST["TACC_VFMIG_ST_BAD_STATE"]
    assert vf_state(pf, 1) == hw.TACC_VFMIG_STATE_LOGGING | hw.TACC_VFMIG_RUNNING
    assert dirty_pages(dev, pf, 1, base, span) == set()

    src, data = pattern(dev, 3 * 4096, 7)
    assert vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 3 * 4096)]).status == 0
    cqe_page = pages(vf1.cq_addr(0) + 32 * (vf1.cq_head[0] - 1), 32)
    assert dirty_pages(dev, pf, 1, base, span) == cqe_page  # a read dirties nothing

    dst = dev.alloc(5 * 4096) + 100  # 10000 bytes from page offset 100: 3 pages
    assert vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, dst, 10000)]).status == 0
    cqe_page = pages(vf1.cq_addr(0) + 32 * (vf1.cq_head[0] - 1), 32)
    assert dirty_pages(dev, pf, 1, base, span) == pages(dst, 10000) | cqe_page
    assert dirty_pages(dev, pf, 1, base, span) == set()  # cleared on read
    np.testing.assert_array_equal(np.frombuffer(dev.qt.memread(dst, 10000), np.uint8),
                                  data[:10000])

    # the PF's and VF2's writes are not VF1's
    works(dev, pf, 8)
    works(dev, vf2, 9)
    assert dirty_pages(dev, pf, 1, base, span) == set()

    # a report of part of the range: only that part, only its bits cleared
    dst2 = dev.alloc(2 * 4096)
    assert vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, dst2, 2 * 4096)]).status == 0
    assert dirty_pages(dev, pf, 1, dst2, 4096) == pages(dst2, 1)
    assert dirty_pages(dev, pf, 1, dst2, 2 * 4096) == pages(dst2 + 4096, 1)
    # outside the logged range, or a buffer too small: BAD_ARG
    pf.w64(hw.TACC_REG_VFMIG_LOG_IOVA, span)
    pf.w64(hw.TACC_REG_VFMIG_LOG_LEN, 4096)
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_REPORT, 1) == ST["TACC_VFMIG_ST_BAD_ARG"]
    pf.w64(hw.TACC_REG_VFMIG_LOG_IOVA, 0)
    pf.w64(hw.TACC_REG_VFMIG_LOG_LEN, span)
    pf.w64(hw.TACC_REG_VFMIG_LEN, 8)
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_REPORT, 1) == ST["TACC_VFMIG_ST_BAD_ARG"]
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_STOP, 1) == 0
    assert admin(pf, hw.TACC_VFMIG_OP_LOG_REPORT, 1) == ST["TACC_VFMIG_ST_BAD_STATE"]
    assert vf_state(pf, 1) == hw.TACC_VFMIG_RUNNING
    dev.enable_vfs(0)


def flip(blob: bytes, off: int) -> bytes:
    b = bytearray(blob)
    b[off] ^= 0x10
    return bytes(b)


def test_hostile_blobs_refused(dev: Tacc, pf: Func) -> None:
    """Truncated, damaged, foreign, wrong-version and forged blobs are refused with
    their status; VF1 keeps its state, the PF and VF2 keep working; the real blob
    then loads and VF1 runs."""
    vf1, vf2 = setup_vfs(dev, pf)
    vf1.w32(hw.TACC_REG_SCRATCH, 0x1111)
    vf2.w32(hw.TACC_REG_SCRATCH, 0x2222)
    blob1 = save(dev, pf, 1)
    blob2 = save(dev, pf, 2)
    rlen = HDR.unpack_from(blob1)[7]
    assert struct.unpack_from(">I", blob1, HDR.size + Q0_SQ_SIZE)[0] == vf1.sq_size
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 2) == 0
    vf1.w32(hw.TACC_REG_SCRATCH, 0x3333)  # VF1's state after the save
    forged = bytearray(blob1)
    struct.pack_into(">I", forged, HDR.size + Q0_SQ_SIZE, 3)  # not a power of two
    bumped = bytearray(blob1)
    struct.pack_into("<H", bumped, OFF_VERSION, 2)
    cases = {
        "truncated": (blob1, len(blob1) - 100, "BAD_LENGTH"),
        "header only": (blob1[:32], None, "BAD_LENGTH"),
        "padded": (blob1 + bytes(8), None, "BAD_LENGTH"),
        "flipped register": (flip(blob1, HDR.size + 40), None, "BAD_CRC"),
        "flipped memory": (flip(blob1, HDR.size + rlen + 4096), None, "BAD_CRC"),
        "not a blob": (flip(blob1, 0), None, "BAD_MAGIC"),
        "another VF's": (blob2, None, "WRONG_FN"),
        "wrong version": (recrc(bumped), None, "BAD_VERSION"),
        "forged state": (recrc(forged), None, "BAD_DATA"),
    }
    for name, (blob, length, status) in cases.items():
        assert load(dev, pf, 1, blob, length) == ST[f"TACC_VFMIG_ST_{status}"], name
        assert vf1.r32(hw.TACC_REG_SCRATCH) == 0x3333, name
        assert vf1.r32(hw.TACC_QUEUE_BASE(0) + hw.TACC_Q_SQ_SIZE) == vf1.sq_size, name
    # a window of another size
    pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), WIN // 2)
    assert load(dev, pf, 1, blob1) == ST["TACC_VFMIG_ST_MISMATCH"]
    pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), WIN)
    # a running VF takes no state
    assert load(dev, pf, 2, blob2) == ST["TACC_VFMIG_ST_BAD_STATE"]
    assert vf2.r32(hw.TACC_REG_SCRATCH) == 0x2222
    works(dev, pf, 10)
    works(dev, vf2, 11)
    assert vf1.r32(hw.TACC_REG_SCRATCH) == 0x3333
    # the real one
    assert load(dev, pf, 1, blob1) == 0
    assert vf1.r32(hw.TACC_REG_SCRATCH) == 0x1111
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
    works(dev, vf1, 12)
    dev.enable_vfs(0)


@pytest.mark.parametrize("op", ["SAVE", "LOAD"])
def test_save_load_need_a_stopped_vf(dev: Tacc, pf: Func, op: str) -> None:
    """SAVE and LOAD of a running or still-stopping VF are refused; a PF reset ends
    every stop and log."""
    (vf1,) = setup_vfs(dev, pf, 1)
    buf = dev.alloc(4 << 20)
    pf.w64(hw.TACC_REG_VFMIG_ADDR, buf)
    pf.w64(hw.TACC_REG_VFMIG_LEN, 4 << 20)
    code = getattr(hw, f"TACC_VFMIG_OP_{op}")
    assert admin(pf, code, 1) == ST["TACC_VFMIG_ST_BAD_STATE"]
    n = WIN
    src = dev.alloc(n)
    vf1.submit(0, vf1.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)])[1])
    dev.qt.clock_step(2000)
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
    assert vf_state(pf, 1) == hw.TACC_VFMIG_STOPPING
    assert admin(pf, code, 1) == ST["TACC_VFMIG_ST_BAD_STATE"]
    pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
    assert vf_state(pf, 1) == hw.TACC_VFMIG_RUNNING
    dev.enable_vfs(0)


def test_pf_migration_waits_for_a_vf_migration(tmp_path: Path) -> None:
    """The PF's own migration section does not carry the VF migration state: migrate
    fails while a VF is stopped for one (the source runs on) and succeeds after."""
    src, pf, (vf1,) = source_with_vfs(1)
    try:
        assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
        src.qt.qmp.cmd("migrate", uri=f"file:{tmp_path / 'state'}")
        assert wait_migration(src)["status"] == "failed"
        assert "a VF is stopped or dirty-logged for a VF migration" in src.qt.log()
        assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
        works(src, vf1, 13)
        migrate_to(src, tmp_path / "state")
    finally:
        src.close()


def test_stopped_vf_holds_a_waiting_completion(dev: Tacc, pf: Func) -> None:
    """A completion waiting for CQ space is not written while the VF is stopped, even
    when its owner frees the space; RESUME writes it."""
    (vf1,) = setup_vfs(dev, pf, 1)
    vf1.setup_queue(0, cq_size=2)  # one usable entry
    nop = bytes([hw.TACC_OP_NOP]) + bytes(127)
    (j1, d1), (j2, d2) = vf1.job_of(0, [nop]), vf1.job_of(0, [nop])
    vf1.submit(0, d1 + d2)
    dev.qt.clock_step(10**6)
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
    assert vf_state(pf, 1) == hw.TACC_VFMIG_STOPPED
    assert [c.job for c in vf1.cqes(0)] == [j1]  # moves CQ_HEAD: room for j2's
    dev.qt.clock_step(10**6)
    assert vf1.r32(hw.TACC_QUEUE_BASE(0) + hw.TACC_Q_CQ_TAIL) == 1
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
    dev.qt.clock_step(10**6)
    assert [(c.job, c.status) for c in vf1.cqes(0)] == [(j2, 0)]
    dev.enable_vfs(0)


def test_stopped_vf_takes_no_samples(dev: Tacc, pf: Func) -> None:
    """A stopped VF's sample timer stands still, also when its owner programs it again;
    RESUME starts it."""
    (vf1,) = setup_vfs(dev, pf, 1)
    vf1.w64(hw.TACC_REG_SAMPLE_BASE, dev.alloc(16 * hw.TACC_SAMPLE_SIZE))
    vf1.w32(hw.TACC_REG_SAMPLE_SIZE, 16)
    vf1.w32(hw.TACC_REG_SAMPLE_PERIOD, hw.TACC_SAMPLE_MIN_PERIOD_NS)
    dev.qt.clock_step(3 * hw.TACC_SAMPLE_MIN_PERIOD_NS + 1000)
    assert vf1.r32(hw.TACC_REG_SAMPLE_PROD) == 3
    assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
    vf1.w32(hw.TACC_REG_SAMPLE_PERIOD, hw.TACC_SAMPLE_MIN_PERIOD_NS)
    dev.qt.clock_step(5 * hw.TACC_SAMPLE_MIN_PERIOD_NS)
    assert vf1.r32(hw.TACC_REG_SAMPLE_PROD) == 3
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
    dev.qt.clock_step(2 * hw.TACC_SAMPLE_MIN_PERIOD_NS + 1000)
    assert vf1.r32(hw.TACC_REG_SAMPLE_PROD) == 5
    dev.enable_vfs(0)


BIG_WIN = 64 << 20  # a VF window many slices long
SLICE = 4 << 20     # x-host-slice of this test's device
PROBE = 4096        # bytes of each probe of the window: the first, across two slices, the last
PROBES = [0, SLICE - PROBE // 2, 5 * SLICE + 12345 * 8, BIG_WIN - PROBE]


def test_save_and_load_run_a_slice_per_turn() -> None:
    """SAVE and LOAD of a 64 MiB window with 4 MiB slices (hw 1.6): STATUS reads BUSY
    until the last slice, and no entry into the device does more than a slice of
    work: the longest holds under half of all entries' CPU (before, the whole
    window's CRC and copy ran inside the CMD write: the longest entry was all of it).
    The blob's CRC, summed slice by slice, is zlib's CRC of the whole blob; it loads
    back, and the window moved under a SAVE ends it with BAD_STATE."""
    d = Tacc(f"sriov-max-vfs=1,devmem-size={256 << 20},x-host-slice={SLICE}")
    try:
        pf = d.pf
        pf.reset()
        vf, = d.enable_vfs(1)
        pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), 128 << 20)
        pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), BIG_WIN)
        vf.reset()
        vf.set_ptbr(0, d.map_default(devmem=BIG_WIN))
        host = d.alloc(PROBE)
        for i, off in enumerate(PROBES):  # window bytes at and across slice boundaries
            d.qt.memwrite(host, bytes([i + 1]) * PROBE)
            assert vf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA + off,
                                         PROBE)]).status == 0
        assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
        d.qt.clock_step(10**7)
        assert admin(pf, hw.TACC_VFMIG_OP_QUERY, 1) == 0
        size = pf.r64(hw.TACC_REG_VFMIG_RESULT)
        buf = d.alloc(size)
        pf.w64(hw.TACC_REG_VFMIG_ADDR, buf)
        pf.w64(hw.TACC_REG_VFMIG_LEN, size)
        for op in (hw.TACC_VFMIG_OP_SAVE, hw.TACC_VFMIG_OP_LOAD):
            d.qom_set("x-worst-turn-ns", 0)
            assert admin(pf, op, 1) == 0, op
            turn, all_ns = d.qom_get("x-worst-turn-ns"), d.qom_get("x-entry-cpu-ns")
            print(f"op {op}: longest entry {turn / 1e6:.1f} ms of {all_ns / 1e6:.1f} ms")
            # measured: 45-53 of 340-614 ms alone, 50 of 117 ms beside the device layer
            # under xdist (one slice's page faults); whole in one write: 209 of 209 ms
            assert turn < all_ns // 2, (op, turn, all_ns)
            if op == hw.TACC_VFMIG_OP_SAVE:
                blob = bytearray(d.qt.memread(buf, size))
                hdr = HDR.unpack_from(blob)
                assert recrc(blob) == blob  # the CRC field is zlib's over the whole
                assert hdr[0] == hw.TACC_VFSTATE_MAGIC and len(blob) == size
                win = HDR.size + hdr[7]  # the window part, after the registers
                for i, off in enumerate(PROBES):  # each slice's bytes where they belong
                    assert blob[win + off:win + off + PROBE] == bytes([i + 1]) * PROBE, off
                    blob[win + off:win + off + PROBE] = bytes([0x80 + i]) * PROBE
                blob = recrc(blob)  # LOAD takes other bytes back: only they and the
                for off in PROBES:  # CRC are written (64 MiB over qtest takes minutes)
                    d.qt.memwrite(buf + win + off, blob[win + off:win + off + PROBE])
                d.qt.memwrite(buf + OFF_CRC, blob[OFF_CRC:OFF_CRC + 4])
        assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
        for i, off in enumerate(PROBES):  # LOAD wrote each slice where it belongs
            assert vf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + off, host,
                                         PROBE)]).status == 0
            assert d.qt.memread(host, PROBE) == bytes([0x80 + i]) * PROBE, off
        assert admin(pf, hw.TACC_VFMIG_OP_STOP, 1) == 0
        d.qt.clock_step(10**7)
        # the PF moves the window while a SAVE runs (16 slices: the next register
        # write comes long before the last): it ends, refused
        pf.w32(hw.TACC_REG_VFMIG_CMD, hw.TACC_VFMIG_OP_SAVE | 1 << hw.TACC_VFMIG_CMD_FN_SHIFT)
        pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), 64 << 20)
        for _ in range(BUSY_READS):
            st = pf.r32(hw.TACC_REG_VFMIG_STATUS)
            if st != hw.TACC_VFMIG_ST_BUSY:
                break
        assert st == ST["TACC_VFMIG_ST_BAD_STATE"], st
    finally:
        d.close()


def test_stale_fifo_slot_of_a_loaded_state_is_not_used(dev: Tacc, pf: Func) -> None:
    """A state whose empty FIFO slot 0 says "listed" (a forged blob with a good CRC: the
    device's checks take it, the slot is not in use) loads, resumes, and after an FLR the
    VF runs a job in that slot as an ordinary command (before: it waited for a LIST that
    never came, the job never completed, FLR or not; found by the 10,000-state RESUMING
    fuzz of tests/vm/test_vfio_migration.py at state 89)."""
    vf1, vf2 = setup_vfs(dev, pf)
    works(dev, vf1, 1)
    blob = save(dev, pf, 1)
    forged = bytearray(blob)
    assert forged[HDR.size + Q0_FIFO0_LISTED] == 0
    forged[HDR.size + Q0_FIFO0_LISTED] = 1
    assert load(dev, pf, 1, recrc(forged)) == 0
    assert admin(pf, hw.TACC_VFMIG_OP_RESUME, 1) == 0
    vf_flr(dev, vf1)
    vf1.reset()
    vf1.set_ptbr(0, dev.map_default(devmem=WIN))
    works(dev, vf1, 2)
    works(dev, vf2, 3)
    dev.enable_vfs(0)
