"""Per-VF policy set by the PF (TACC_CAP_VF_POLICY, hw 1.2), enforced by the device:
queue masks (a queue outside the mask cannot be enabled), device-memory windows
(beyond the window faults), arbitration weights (deficit round-robin over bytes:
a function's share of an engine's bytes is its weight share, exactly, under the
qtest stepped clock).  Bad register values are refused and logged
(LOG_GUEST_ERROR), QEMU keeps running.  docs/hardware.md "Per-VF policy".

One QEMU of its own for the module, with -d guest_errors so the refusals can be
read from its log.
"""

from __future__ import annotations

import struct

import pytest
from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import DEVMEM_VA, Tacc

QMASK = hw.TACC_REG_QUEUE_MASK


def vf_qmask(vf: int) -> int:
    """TACC_REG_VF_QUEUE_MASK(vf), vf 0-based."""
    return hw.TACC_REG_QUEUE_MASK + 4 + 4 * vf


def weight_reg(fn: int) -> int:
    """TACC_REG_ARB_WEIGHT(fn)."""
    return 0x480 + 4 * fn


def q_reg(q: int, r: int) -> int:
    return 0x1000 + q * 0x100 + r


@pytest.fixture(scope="module")
def pdev():
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc("sriov-max-vfs=4", extra=["-d", "guest_errors"])
    d.root0 = d.map_default(0x2000_0000, 256 << 20)
    yield d
    d.close()


@pytest.fixture
def ppf(pdev):
    if pdev.vfs:
        pdev.enable_vfs(0)
    pdev.pf.reset()
    pdev.pf.set_ptbr(0, pdev.root0)
    pdev.reset_alloc()
    return pdev.pf


def log_mark(dev: Tacc) -> int:
    with open(dev.qt.log_path, "rb") as f:
        return len(f.read())


def log_since(dev: Tacc, mark: int) -> str:
    with open(dev.qt.log_path, "rb") as f:
        return f.read()[mark:].decode(errors="replace")


def vfs_with(dev: Tacc, pf, n: int, window: int = 32 << 20, mapped: int = 32 << 20,
             queues: tuple[int, ...] = (0, 1, 2, 3)):
    vfs = dev.enable_vfs(n)
    for i in range(n):
        pf.w64(0x400 + 16 * i, (64 << 20) * (i + 1))
        pf.w64(0x408 + 16 * i, window)
    for vf in vfs:
        vf.reset(queues=0)
        for q in queues:
            vf.setup_queue(q)
        vf.set_ptbr(0, dev.map_default(devmem=mapped))
    return vfs


def test_caps_version_and_defaults(ppf, pdev):
    assert ppf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VF_POLICY
    assert ppf.r32(hw.TACC_REG_VERSION) == 1 << 16 | 2
    assert ppf.r32(QMASK) == hw.TACC_QUEUE_MASK_ALL == 0xF
    for vf in range(4):
        assert ppf.r32(vf_qmask(vf)) == 0xF
        assert ppf.r32(weight_reg(vf + 1)) == 1
    vf1, vf2 = pdev.enable_vfs(2)
    assert vf1.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VF_POLICY
    assert vf1.r32(QMASK) == 0xF and vf2.r32(QMASK) == 0xF


def test_queue_mask_enforced_by_device(ppf, pdev):
    """VF1 gets queues 0 and 2: it reads that mask; enabling queue 1 or 3 is
    refused (Q_CTRL reads back without ENABLE, a doorbell there runs nothing),
    logged; queues 0 and 2 run; VF2 keeps all four."""
    ppf.w32(vf_qmask(0), 0x5)
    assert ppf.r32(vf_qmask(0)) == 0x5
    mark = log_mark(pdev)
    vf1, vf2 = vfs_with(pdev, ppf, 2, queues=())
    assert vf1.r32(QMASK) == 0x5 and vf2.r32(QMASK) == 0xF
    for q in range(4):
        vf1.setup_queue(q)
        vf2.setup_queue(q)
    on = [bool(vf1.r32(q_reg(q, hw.TACC_Q_CTRL)) & hw.TACC_Q_CTRL_ENABLE) for q in range(4)]
    assert on == [True, False, True, False]
    assert all(vf2.r32(q_reg(q, hw.TACC_Q_CTRL)) & hw.TACC_Q_CTRL_ENABLE for q in range(4))
    log = log_since(pdev, mark)
    assert "fn1: queue 1 is outside the function's QUEUE_MASK 0x5: enable refused" in log
    assert "fn1: queue 3 is outside" in log and "fn2: queue" not in log
    # a job on a refused queue never runs: no CQE, SQ_HEAD stays, no command counted
    job, ds = vf1.job_of(1, [desc(hw.TACC_OP_NOP)])
    vf1.submit(1, ds)
    pdev.qt.clock_step(10**7)
    assert vf1.cqes(1) == []
    assert vf1.r32(q_reg(1, hw.TACC_Q_SQ_HEAD)) == 0
    assert vf1.cnt("cmds_completed") == 0
    for q in (0, 2):
        assert vf1.run_job(q, [desc(hw.TACC_OP_NOP)]).status == 0
    assert vf2.run_job(3, [desc(hw.TACC_OP_NOP)]).status == 0
    # a VF function reset keeps the PF's policy
    vf1.reset(queues=0)
    assert vf1.r32(QMASK) == 0x5


def test_queue_mask_writes_refused(ppf, pdev):
    """Zero, out-of-range, with VFs on, or from a VF: refused and logged."""
    mark = log_mark(pdev)
    for bad in (0, 0x10, 0x1F, 0xFFFFFFFF):
        ppf.w32(vf_qmask(1), bad)
        assert ppf.r32(vf_qmask(1)) == 0xF
    log = log_since(pdev, mark)
    assert "VF_QUEUE_MASK(1) = 0x0 not a non-empty mask of the VF's queues: refused" in log
    assert "VF_QUEUE_MASK(1) = 0x10 not a non-empty mask" in log
    ppf.w32(vf_qmask(1), 0x3)
    (vf1, vf2) = pdev.enable_vfs(2)
    mark = log_mark(pdev)
    ppf.w32(vf_qmask(1), 0x1)  # VFs on: refused, the VF keeps its queues
    assert ppf.r32(vf_qmask(1)) == 0x3 and vf2.r32(QMASK) == 0x3
    vf2.w32(vf_qmask(1), 0xF)  # a VF cannot write the PF's registers ...
    vf2.w32(QMASK, 0xF)  # ... nor its own mask
    assert vf2.r32(QMASK) == 0x3 and ppf.r32(vf_qmask(1)) == 0x3
    log = log_since(pdev, mark)
    assert "VF_QUEUE_MASK(1) = 0x1 while VFs are enabled: refused" in log
    assert log.count("fn2: bad write") == 2
    # a PF function reset with VFs on keeps their policy; VF disable + PF reset clears it
    ppf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
    assert vf2.r32(QMASK) == 0x3
    pdev.enable_vfs(0)
    ppf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
    assert ppf.r32(vf_qmask(1)) == 0xF
    assert ppf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC  # QEMU is fine


def test_weight_writes(ppf, pdev):
    mark = log_mark(pdev)
    ppf.w32(weight_reg(1), 7)
    ppf.w32(weight_reg(1), 256)
    ppf.w32(weight_reg(1), 0xFFFFFFFF)
    assert ppf.r32(weight_reg(1)) == 7
    ppf.w32(weight_reg(2), hw.TACC_ARB_WEIGHT_MAX)
    assert ppf.r32(weight_reg(2)) == 255
    log = log_since(pdev, mark)
    assert "ARB_WEIGHT(1) = 256 above 255: refused" in log
    assert ppf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


def test_devmem_window_bounds(ppf, pdev):
    """VF1's window is 4 MiB though its page tables map 32 MiB of device memory:
    it reads DEVMEM_SIZE 4 MiB, the window's last page works, the next byte is a
    DEVMEM_RANGE fault; a FILL (window offsets, no MMU) past it fails too."""
    (vf1,) = vfs_with(pdev, ppf, 1, window=4 << 20)
    assert vf1.r64(hw.TACC_REG_DEVMEM_SIZE) == 4 << 20
    src = pdev.alloc(8192)
    pdev.qt.memwrite(src, b"\x5a" * 8192)
    ok = vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + (4 << 20) - 4096, 4096)])
    assert ok.status == 0
    cq = vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + (4 << 20) - 4096, 8192)])
    assert cq.status == hw.TACC_ST_MMU_FAULT
    info = vf1.r32(hw.TACC_REG_FAULT_INFO)
    assert info & hw.TACC_FAULT_VALID
    assert (info & hw.TACC_FAULT_TYPE_MASK) >> hw.TACC_FAULT_TYPE_SHIFT == \
        hw.TACC_FAULT_DEVMEM_RANGE
    assert vf1.r64(hw.TACC_REG_FAULT_ADDR) == DEVMEM_VA + (4 << 20)
    fill = desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", (4 << 20) - 8, 16, 0))
    assert vf1.run_job(0, [fill]).status != 0
    # the PF's memory right above VF1's window is untouched
    dst = pdev.alloc(4096)
    assert ppf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + (68 << 20), dst,
                                  4096)]).status == 0
    assert pdev.qt.memread(dst, 4096) != b"\x5a" * 4096


def _drr_run(pdev, ppf, weights: tuple[int, int], sizes: tuple[int, int],
             counts: tuple[int, int]):
    """Both VFs queue `counts` H2D copies of `sizes` on queue 0, submitted before
    time moves; returns the grant order [(fn, bytes)] from the trace rings."""
    ppf.w32(weight_reg(1), weights[0])
    ppf.w32(weight_reg(2), weights[1])
    vfs = vfs_with(pdev, ppf, 2, queues=(0,))
    src = pdev.alloc(max(sizes))
    for vf in vfs:
        vf.trace_enable(size=256)
        vf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 4096)])  # warm TLB
    starts = [vf.r32(hw.TACC_REG_TRACE_PROD) for vf in vfs]
    jobs = []
    for vf, n, c in zip(vfs, sizes, counts, strict=True):
        jobs.append(vf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)
                                  for _ in range(c)])[1])
    for vf, ds in zip(vfs, jobs, strict=True):
        vf.submit(0, ds)
    pdev.qt.clock_step(10**9)
    recs = []
    for vf, s0, c in zip(vfs, starts, counts, strict=True):
        assert vf.r32(hw.TACC_REG_TRACE_PROD) == s0 + c
        recs += [(r.t_start, vf.fn, r.bytes) for r in vf.trace_read(s0, s0 + c)]
        assert vf.cqes(0)[-1].status == 0
    return [(fn, b) for _, fn, b in sorted(recs)]


def contended(order: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The grants while both functions still had work queued."""
    last = {fn: i for i, (fn, _) in enumerate(order)}
    return order[:min(last.values())]


def test_weights_are_byte_shares_exact(ppf, pdev):
    """Weights 1:3, victim 16 KiB copies, neighbour 64 KiB copies: per 16 turns
    the victim moves 4 x 16 KiB, the neighbour 3 x 64 KiB, so while both are
    backlogged the victim's share of the H2D engine's bytes is 1/4 to within one
    command (the DRR bound), and each 16-turn cycle is exactly 1:3."""
    order = _drr_run(pdev, ppf, (1, 3), (16 << 10, 64 << 10), (64, 48))
    both = contended(order)
    assert len(both) >= 80
    vb = sum(b for fn, b in both if fn == 1)
    nb = sum(b for fn, b in both if fn == 2)
    assert abs(nb - 3 * vb) <= 64 << 10, (vb, nb)
    # a whole number of cycles: cut at a point where the counts are 4k : 3k
    cuts = [i for i in range(1, len(both) + 1)
            if 3 * sum(fn == 1 for fn, _ in both[:i]) == 4 * sum(fn == 2 for fn, _ in both[:i])]
    assert cuts and cuts[-1] >= 70, cuts
    seg = both[:cuts[-1]]
    assert 3 * sum(b for fn, b in seg if fn == 1) == sum(b for fn, b in seg if fn == 2)


def test_equal_weights_share_bytes_not_commands(ppf, pdev):
    """Equal weights, 16 KiB against 48 KiB copies: three small copies per big
    one (equal bytes), where a command round-robin would give 1:1 commands."""
    order = _drr_run(pdev, ppf, (1, 1), (16 << 10, 48 << 10), (96, 32))
    both = contended(order)
    vb = sum(b for fn, b in both if fn == 1)
    nb = sum(b for fn, b in both if fn == 2)
    assert abs(vb - nb) <= 48 << 10, (vb, nb)
    assert sum(fn == 1 for fn, _ in both) >= 2.5 * sum(fn == 2 for fn, _ in both)


def test_big_commands_skip_rounds(ppf, pdev):
    """4 MiB copies against 256 KiB ones at weights 1:1: a 4 MiB grant needs 1024
    turns' worth of quantum (added in one step, not a loop per quantum); between
    two of the neighbour's grants the victim gets exactly 16 (equal bytes)."""
    order = _drr_run(pdev, ppf, (1, 1), (256 << 10, 4 << 20), (80, 4))
    both = contended(order)
    big = [i for i, (fn, _) in enumerate(both) if fn == 2]
    assert len(big) >= 3, order
    gaps = [sum(fn == 1 for fn, _ in both[a:b]) for a, b in zip(big, big[1:], strict=False)]
    assert gaps and all(g == 16 for g in gaps), gaps


def test_bad_length_does_not_stall_the_arbiter(ppf, pdev):
    """A copy of length 2^64 - 1 (BAD_LENGTH) while another VF contends: its cost is
    capped (found by test_fuzz.py hanging QEMU in an arbitration loop), it fails at
    once and the other VF's jobs run."""
    vf1, vf2 = vfs_with(pdev, ppf, 2, queues=(0,))
    src = pdev.alloc(4096)
    j1, d1 = vf1.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 2**64 - 1)])
    j2, d2 = vf2.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 4096)] * 4)
    old = pdev.qt.reply_timeout
    pdev.qt.reply_timeout = 30.0  # a hung QEMU fails the test instead of hanging it
    try:
        vf1.submit(0, d1)
        vf2.submit(0, d2)
        pdev.qt.clock_step(10**8)
        (c1,), (c2,) = vf1.cqes(0), vf2.cqes(0)
    finally:
        pdev.qt.reply_timeout = old
    assert (c1.job, c1.status) == (j1, hw.TACC_ST_BAD_LENGTH)
    assert (c2.job, c2.status) == (j2, hw.TACC_ST_OK)
