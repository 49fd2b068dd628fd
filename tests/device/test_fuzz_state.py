"""Stateful device fuzz (issue 14): a hypothesis RuleBasedStateMachine drives one
QEMU through qtest with BAR0/BAR2/config-space/MSI-X-table writes, descriptors in
guest memory, doorbells, function resets, FLR, SR-IOV enable/disable and clock
steps; examples are separated by QMP ``system_reset``.

Invariants: every qtest reply arrives within 5 s of wall time (QEMU neither died
nor wedged its main loop), and the PF's ID register reads the magic after every
reset.  Fixed seed (``derandomize``), so a failure reproduces.  20,000 steps in
the device layer, 200,000 under ``@pytest.mark.long``.  Addresses deliberately
include the device's own BARs and the ECAM window (re-entrancy), and a context
maps device VAs onto BAR0.
"""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tacc import hw
from tacc.testing.qtest import ECAM_BASE, QTestError
from tacc.testing.taccdev import DEVMEM_VA, PF_BARS, VF_BARS, Tacc

REPLY_TIMEOUT = 5.0
HOST_VA = 0x20_0000_0000  # 2 MiB of guest RAM in the fuzz context
BAR_VA = 0x30_0000_0000  # the PF's BAR0 (64 KiB) in the fuzz context
FUZZ_CTX = 0
SR, MSIX, PM, EXP = 0x148, 0x60, 0x40, 0x80  # capability offsets (tacc-pci.c)

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
small = st.one_of(st.integers(0, 64), st.sampled_from([0, 1, 2, 3, 4095, 4096, 4097, 2**31]))
dims = st.one_of(st.integers(0, 24), st.sampled_from([4096, 4097, 2**31, 2**32 - 1]))


def dev_addr():
    return st.one_of(
        st.builds(lambda o: HOST_VA + o, st.integers(0, (2 << 20) + 64)),
        st.builds(lambda o: DEVMEM_VA + o, st.integers(0, (2 << 20) + 64)),
        st.builds(lambda o: BAR_VA + o, st.integers(0, 0x10000)),
        st.sampled_from([0, 4, 2**39, 2**64 - 8]), u64)


def bus_addr():
    """Host (bus) addresses for MSI-X and write-backs: RAM, own BARs, ECAM."""
    return st.one_of(
        st.integers(0x0010_0000, 0x00FF_FFF8),
        st.builds(lambda b, o: b + o, st.sampled_from(sorted(PF_BARS.values()) +
                                                      sorted(VF_BARS.values())),
                  st.integers(0, 0x2000).map(lambda v: v & ~3)),
        st.builds(lambda o: ECAM_BASE + (1 << 15) + o, st.integers(0, 0x1FF).map(lambda v: v * 4)),
        u64)


ADDRS = [HOST_VA, HOST_VA + 64, HOST_VA + (2 << 20) - 8, DEVMEM_VA, DEVMEM_VA + 4096,
         DEVMEM_VA + (2 << 20) - 4, BAR_VA, BAR_VA + 0x1000, BAR_VA + 0x50, 0, 4, 2**39,
         2**64 - 8]


def make_desc(raw: bytes) -> bytes:
    """A descriptor from 128 random bytes: fields mostly in meaningful ranges
    (cheap for hypothesis: one binary draw, the shaping is plain Python)."""
    b = bytearray(raw)
    sel = b[2]
    b[0] = b[0] % (hw.TACC_OP_MAX + 1) if b[0] < 240 else b[0]
    struct.pack_into("<H", b, 2, FUZZ_CTX if sel < 200 else (1, 15, 16, 0xFFFF)[sel % 4])
    words = list(struct.unpack_from("<QQQ", b, 24))
    for i in range(3):  # addresses
        if words[i] % 4:
            words[i] = (ADDRS[words[i] % len(ADDRS)] +
                        (words[i] >> 40) % 256 * 4 * (sel & 1)) & (2**64 - 1)
    struct.pack_into("<QQQ", b, 24, *words)
    op = b[0]
    if op in (hw.TACC_OP_COPY_H2D, hw.TACC_OP_COPY_D2H, hw.TACC_OP_COPY_D2D):
        ln = struct.unpack_from("<Q", b, 40)[0]
        struct.pack_into("<Q", b, 40, ln % (256 << 10) if ln % 8 else (2**32 - 1, 2**32)[ln % 2])
    elif op == hw.TACC_OP_GEMM:
        dm = list(struct.unpack_from("<IIIIII", b, 48))
        dm = [v % 25 if v % 16 else (4096, 4097, 2**31, 65536)[v % 4] for v in dm]
        struct.pack_into("<IIIIII", b, 48, *dm)
    elif op == hw.TACC_OP_ELTWISE:
        n = struct.unpack_from("<Q", b, 48)[0]
        struct.pack_into("<QI", b, 48, n % 4097 if n % 16 else (2**26 + 1, 2**64 - 1)[n % 2],
                         b[56] % 7)
    return bytes(b)


descriptor = st.binary(min_size=128, max_size=128).map(make_desc)


# BAR0 offsets worth hitting (plus any aligned offset)
REGS = [hw.TACC_REG_CTRL, hw.TACC_REG_IRQ_STATUS, hw.TACC_REG_IRQ_MASK, hw.TACC_REG_SCRATCH,
        hw.TACC_REG_TLB_INV, hw.TACC_REG_FAULT_CLEAR, 0x100, 0x108, 0x178,
        hw.TACC_REG_TRACE_BASE, hw.TACC_REG_TRACE_SIZE, hw.TACC_REG_TRACE_CTRL,
        hw.TACC_REG_TRACE_CONS, hw.TACC_REG_TRACE_WB, hw.TACC_REG_SAMPLE_BASE,
        hw.TACC_REG_SAMPLE_SIZE, hw.TACC_REG_SAMPLE_PERIOD, hw.TACC_REG_SAMPLE_CONS,
        hw.TACC_REG_SAMPLE_WB, 0x400, 0x408, 0x430, 0x480, 0x490, hw.TACC_REG_DEVCLK,
        hw.TACC_REG_HOSTCLK] + [0x1000 + 0x100 * q + o for q in range(4) for o in
                                (0x00, 0x08, 0x0C, 0x18, 0x20, 0x24, 0x2C, 0x30)]
bar0_off = st.one_of(st.sampled_from(REGS), st.integers(0, 0xFFFF).map(lambda v: v & ~3))
CFG = [0x04, PM + 4, MSIX + 2, EXP + 8, 0x100 + 4, 0x100 + 8, 0x100 + 0x14, SR + 0x08,
       SR + 0x10, SR + 0x24, SR + 0x28, SR + 0x2C]
cfg_off = st.one_of(st.sampled_from(CFG), st.integers(0x40, 0xFFF))


class DeviceMachine(RuleBasedStateMachine):
    d: Tacc
    steps = 0

    @initialize()
    def reset_machine(self):
        d = self.d
        d.qt.flush()  # queued qtest writes go before the QMP reset
        d.qt.qmp.cmd("system_reset")
        d.vfs = []
        restore(d, tables=True)
        self.check_id()

    def check_id(self):
        assert self.d.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC

    def func(self, i):
        d = self.d
        return d.pf if i == 0 or i > len(d.vfs) else d.vfs[i - 1]

    @rule(fn=st.integers(0, 4), off=bar0_off, v=u64, size=st.sampled_from([4, 4, 8]))
    def bar0_write(self, fn, off, v, size):
        f = self.func(fn)
        if off == hw.TACC_REG_CTRL and v & hw.TACC_CTRL_RESET and fn == 0:
            v &= ~hw.TACC_CTRL_RESET  # resets have their own rule (checks ID)
        with self.d.qt.deferred():  # sent with the next read (invariants still hold)
            if size == 8:
                f.w64(off & ~7, v)
            else:
                f.w32(off, v & 0xFFFFFFFF)

    @rule(fn=st.integers(0, 4), off=bar0_off, size=st.sampled_from([4, 8]))
    def bar0_read(self, fn, off, size):
        f = self.func(fn)
        f.r64(off & ~7) if size == 8 else f.r32(off)

    @rule(fn=st.integers(0, 4), slot=st.integers(0, 1023), hi=st.booleans())
    def bar2_read(self, fn, slot, hi):
        self.d.qt.readq(self.func(fn).bar2 + 8 * slot) if not hi else \
            self.d.qt.readl(self.func(fn).bar2 + 8 * slot + 4)

    @rule(fn=st.integers(0, 4), vec=st.integers(0, 5), addr=bus_addr(), data=u32,
          enable=st.booleans())
    def msix_entry(self, fn, vec, addr, data, enable):
        f = self.func(fn)
        qt = self.d.qt
        with qt.deferred():
            qt.writeq(f.bar4 + 16 * vec, addr)
            qt.writel(f.bar4 + 16 * vec + 8, data)
            qt.writel(f.bar4 + 16 * vec + 12, 0)
            qt.cfg_write(0, f.devfn, MSIX + 2, 0x8000 if enable else 0, 2)

    @rule(off=cfg_off, v=u32, size=st.sampled_from([1, 2, 4]), fn=st.integers(0, 4))
    def cfg_write(self, off, v, size, fn):
        f = self.func(fn)
        off &= ~(size - 1)
        if f.fn == 0 and off == EXP + 8:
            v &= ~0x8000  # FLR has its own rule
        if 0x10 <= off < 0x28 or (f.fn == 0 and off == 0x04):
            return  # keep the PF's BARs decoding (other rules cover disabled decode)
        with self.d.qt.deferred():
            self.d.qt.cfg_write(0, f.devfn, off, v & ((1 << (8 * size)) - 1), size)

    @rule(q=st.integers(0, 3), fn=st.integers(0, 4), irq=st.booleans(),
          sq=st.sampled_from([2, 16, 64]), cq=st.sampled_from([0, 2, 16, 64]))
    def setup_queue(self, q, fn, irq, sq, cq):
        f = self.func(fn)
        b = 0x1000 + 0x100 * q
        with self.d.qt.deferred():
            self._setup_queue(f, q, b, irq, sq, cq)

    @staticmethod
    def _setup_queue(f, q, b, irq, sq, cq):
        f.w32(b + hw.TACC_Q_CTRL, 0)
        f.w64(b + hw.TACC_Q_SQ_BASE, f.sq_addr(q))
        f.w32(b + hw.TACC_Q_SQ_SIZE, sq)
        f.w64(b + hw.TACC_Q_CQ_BASE, f.cq_addr(q))
        f.w32(b + hw.TACC_Q_CQ_SIZE, cq)
        f.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE | (hw.TACC_Q_CTRL_IRQ if irq else 0))

    @rule(q=st.integers(0, 3), fn=st.integers(0, 4),
          descs=st.lists(descriptor, min_size=1, max_size=6), tail=st.integers(0, 80))
    def submit(self, q, fn, descs, tail):
        f = self.func(fn)
        with self.d.qt.deferred():
            self.d.qt.memwrite(f.sq_addr(q), b"".join(descs))
            f.w32(0x1000 + 0x100 * q + hw.TACC_Q_SQ_TAIL, tail)

    @rule(q=st.integers(0, 3), fn=st.integers(0, 4), head=st.integers(0, 70))
    def cq_head(self, q, fn, head):
        self.func(fn).w32(0x1000 + 0x100 * q + hw.TACC_Q_CQ_HEAD, head)

    @rule(ns=st.one_of(st.integers(1, 2000), st.integers(1, 10**6)))
    def clock_step(self, ns):
        self.d.qt.clock_step(ns)

    @rule(kind=st.sampled_from(["ctrl", "flr", "ctrl"]))
    def reset(self, kind):
        d, qt = self.d, self.d.qt
        if kind == "flr":
            qt.cfg_write(0, 0x08, EXP + 8, qt.cfg_read(0, 0x08, EXP + 8, 2) | 0x8000, 2)
            d.vfs = []
            restore(d)
        else:
            restore(d)
            d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
        self.check_id()
        d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
        d.pf.set_ptbr(FUZZ_CTX, d.fuzz_root)

    @rule(n=st.integers(0, 5), raw=st.booleans())
    def sriov(self, n, raw):
        d = self.d
        if raw:  # what a guest may write, e.g. NumVFs > TotalVFs then VF Enable
            d.qt.cfg_write(0, 0x08, SR + 0x10, n, 2)
            d.qt.cfg_write(0, 0x08, SR + 0x08, 0x9, 2)
            d.vfs = []
        else:
            d.enable_vfs(min(n, 4))
            for i in range(len(d.vfs)):
                d.pf.w64(0x400 + 16 * i, (64 << 20) * (i + 1))
                d.pf.w64(0x408 + 16 * i, 32 << 20)

    @precondition(lambda self: len(self.d.vfs) > 0)
    @rule(i=st.integers(0, 3))
    def vf_reset(self, i):
        vf = self.d.vfs[i % len(self.d.vfs)]
        vf.reset()
        vf.set_ptbr(FUZZ_CTX, self.d.fuzz_root)

    @invariant()
    def count(self):
        DeviceMachine.steps += 1


def restore(d: Tacc, tables: bool = False):
    """After a system reset or FLR: ECAM, BARs, decoding, D0, context roots."""
    qt = d.qt
    with qt.deferred():
        _restore(d, qt, tables)


def _restore(d: Tacc, qt, tables: bool):
    qt.ecam_enable()
    for bar, addr in PF_BARS.items():
        qt.set_bar(0, 0x08, 0x10 + 4 * bar, addr, True)
    qt.cfg_write(0, 0x08, PM + 4, 0, 2)
    qt.cfg_write(0, 0x08, 0x04, 0x0006, 2)
    for t, data in d.pt.tables.items() if tables else ():  # the device may have
        qt.memwrite(t, bytes(data))                           # written over them
    d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
    d.pf.set_ptbr(FUZZ_CTX, d.fuzz_root)


@pytest.fixture(scope="module")
def fuzzdev():
    d = Tacc("sriov-max-vfs=4")
    root = d.pt.new_root()
    d.pt.map(root, DEVMEM_VA, 0, 32 << 20, devmem=True, huge=True)
    d.pt.map(root, HOST_VA, 0x0400_0000, 2 << 20, huge=True)
    d.pt.map(root, BAR_VA, PF_BARS[0], 0x10000)
    d.pt.flush()
    d.fuzz_root = root
    d.qt.reply_timeout = REPLY_TIMEOUT
    yield d
    d.close()


def run(d: Tacc, examples: int, steps: int) -> tuple[int, float]:
    DeviceMachine.d = d
    DeviceMachine.steps = 0
    t0 = time.monotonic()
    sm = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                  derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    try:
        DeviceMachine.TestCase.settings = sm
        with d.qt.deferred():  # writes travel with the next read: fewer round trips
            DeviceMachine.TestCase().runTest()
    except QTestError as e:
        pytest.fail(f"after {DeviceMachine.steps} steps: {e}")
    return DeviceMachine.steps, time.monotonic() - t0


STEPS = int(os.environ.get("TACC_FUZZ_STEPS", "20000"))


def test_fuzz_device_state(fuzzdev):
    # ~43-46 steps/example (hypothesis ends some early): 40 keeps n >= STEPS
    n, secs = run(fuzzdev, examples=max(1, STEPS // 40), steps=50)
    print(f"device state fuzz: {n} steps in {secs:.1f} s")
    assert n >= STEPS
    assert fuzzdev.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


@pytest.mark.long
def test_fuzz_device_state_long(fuzzdev):
    n, secs = run(fuzzdev, examples=2700, steps=100)  # ~80 steps/example
    print(f"device state fuzz (long): {n} steps in {secs:.1f} s")
    assert n >= 200_000
