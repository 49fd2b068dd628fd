"""Drive the tacc device model under qtest (no guest kernel).

The register map comes from kernel/include/tacc_hw.h (parsed, never copied):
``hw.TACC_REG_ID``, ``hw.FUNC_COUNTERS`` (name -> slot) ...  ``Tacc`` boots QEMU
with ``-accel qtest``, maps the PF's BARs itself, and offers rings, page
tables, descriptors and completions in guest RAM.  Used by tests/device and
tools/bench/bench_link.py.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from tacc import hw, model
from tacc.hw.records import CQE, TRACE, Cqe, TraceRec
from tacc.model import link as linkmodel
from tacc.testing.qtest import QTest, QTestError

# Guest RAM layout (QEMU -m 512M)
RING_BASE = 0x0010_0000  # per function 1 MiB: SQs, CQs, trace, samples
MSI_BASE = 0x00F0_0000  # MSI-X messages land here (one u32 per fn/vector)
PT_BASE = 0x0100_0000  # page-table pool (16 MiB)
PT_END = 0x0200_0000
DATA_BASE = 0x0200_0000  # test buffers
DATA_END = 0x2000_0000
DEVMEM_VA = 0x40_0000_0000  # device memory offset d is mapped at DEVMEM_VA + d

# MMIO layout we assign (no firmware under qtest)
PF_BARS = {0: 0xC000_0000, 2: 0xC001_0000, 4: 0xC002_0000}
VF_BARS = {0: 0xC010_0000, 2: 0xC020_0000, 4: 0xC030_0000}


class PageTables:
    """Builds tacc page tables (3 levels, 4 KiB / 2 MiB) in guest RAM."""

    def __init__(self, qt: QTest, pool: list[int]):
        self.qt = qt
        self.pool = pool  # [next free address]
        self.tables: dict[int, bytearray] = {}
        self.dirty: set[int] = set()

    def _alloc(self) -> int:
        a = self.pool[0]
        assert a + 4096 <= PT_END, "page-table pool exhausted"
        self.pool[0] += 4096
        self.tables[a] = bytearray(4096)
        self.dirty.add(a)
        return a

    def new_root(self) -> int:
        return self._alloc()

    def _entry(self, table: int, idx: int) -> int:
        return struct.unpack_from("<Q", self.tables[table], idx * 8)[0]

    def set_entry(self, table: int, idx: int, v: int):
        struct.pack_into("<Q", self.tables[table], idx * 8, v)
        self.dirty.add(table)

    def _next(self, table: int, idx: int) -> int:
        e = self._entry(table, idx)
        if e & hw.TACC_PTE_VALID and not e & hw.TACC_PTE_HUGE:
            return e & hw.TACC_PTE_ADDR_MASK
        t = self._alloc()
        self.set_entry(table, idx, t | hw.TACC_PTE_VALID)
        return t

    def map(self, root: int, va: int, pa: int, size: int, *, devmem=False, write=True,
            huge=False):
        flags = hw.TACC_PTE_VALID | (hw.TACC_PTE_WRITE if write else 0) | (
            hw.TACC_PTE_DEVMEM if devmem else 0)
        step = 1 << (21 if huge else 12)
        assert va % step == 0 and pa % step == 0
        end = va + size
        while va < end:
            l1 = self._next(root, (va >> 30) & 511)
            if huge:
                self.set_entry(l1, (va >> 21) & 511, pa | flags | hw.TACC_PTE_HUGE)
            else:
                l2 = self._next(l1, (va >> 21) & 511)
                self.set_entry(l2, (va >> 12) & 511, pa | flags)
            va += step
            pa += step

    def unmap(self, root: int, va: int):
        l1 = self._entry(root, (va >> 30) & 511) & hw.TACC_PTE_ADDR_MASK
        e1 = self._entry(l1, (va >> 21) & 511)
        if e1 & hw.TACC_PTE_HUGE:
            self.set_entry(l1, (va >> 21) & 511, 0)
        else:
            self.set_entry(e1 & hw.TACC_PTE_ADDR_MASK, (va >> 12) & 511, 0)

    def flush(self):
        for t in sorted(self.dirty):
            self.qt.memwrite(t, bytes(self.tables[t]))
        self.dirty.clear()


@dataclass
class Func:
    """One PCI function (PF or VF) as seen through its BARs."""

    dev: Tacc
    fn: int
    devfn: int
    bar0: int
    bar2: int
    bar4: int
    ring: int = 0
    sq_size: int = 256
    cq_size: int = 256
    tail: list = field(default_factory=lambda: [0] * 4)
    cq_head: list = field(default_factory=lambda: [0] * 4)
    job: int = 0

    # registers
    def r32(self, off):
        return self.dev.qt.readl(self.bar0 + off)

    def r64(self, off):
        return self.dev.qt.readq(self.bar0 + off)

    def w32(self, off, v):
        self.dev.qt.writel(self.bar0 + off, v)

    def w64(self, off, v):
        self.dev.qt.writeq(self.bar0 + off, v)

    def set_ptbr(self, ctx, root, valid=True):
        self.w64(hw.TACC_REG_CTX_PTBR(ctx), root | (hw.TACC_PTBR_VALID if valid else 0))

    def cnt(self, name=None, slot=None) -> int:
        slot = hw.FUNC_COUNTERS[name] if name else slot
        return self.dev.qt.readq(self.bar2 + 8 * slot)

    def counters(self) -> dict[str, int]:
        return {k: self.cnt(slot=v) for k, v in hw.FUNC_COUNTERS.items()}

    def gcnt(self, name) -> int:
        return self.dev.qt.readq(self.bar2 + hw.TACC_CNT_GLOBAL_PAGE +
                                 8 * hw.GLOBAL_COUNTERS[name])

    # rings
    def sq_addr(self, q):
        return self.ring + q * 0x20000

    def cq_addr(self, q):
        return self.ring + q * 0x20000 + 0x10000

    def trace_addr(self):
        return self.ring + 0x80000

    def sample_addr(self):
        return self.ring + 0xA0000

    def reset(self, queues=4, irq=False):
        """Function reset, then enable and set up the rings."""
        self.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
        self.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
        for q in range(queues):
            self.setup_queue(q, irq=irq)

    def setup_queue(self, q, sq_size=None, cq_size=None, irq=False):
        self.sq_size = sq_size or self.sq_size
        self.cq_size = cq_size or self.cq_size
        b = hw.TACC_QUEUE_BASE(q)
        self.w32(b + hw.TACC_Q_CTRL, 0)
        self.w64(b + hw.TACC_Q_SQ_BASE, self.sq_addr(q))
        self.w32(b + hw.TACC_Q_SQ_SIZE, self.sq_size)
        self.w64(b + hw.TACC_Q_CQ_BASE, self.cq_addr(q))
        self.w32(b + hw.TACC_Q_CQ_SIZE, self.cq_size)
        self.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE | (hw.TACC_Q_CTRL_IRQ if irq else 0))
        self.tail[q] = 0
        self.cq_head[q] = 0

    def submit(self, q, descs: list[bytes]):
        """Write descriptors at the SQ tail (wrapping) and ring the doorbell once."""
        sq = self.sq_addr(q)
        t = self.tail[q]
        while descs:
            n = min(len(descs), self.sq_size - t)
            self.dev.qt.memwrite(sq + t * 128, b"".join(descs[:n]))
            descs = descs[n:]
            t = (t + n) % self.sq_size
        self.tail[q] = t
        self.w32(hw.TACC_QUEUE_BASE(q) + hw.TACC_Q_SQ_TAIL, t)

    def cqes(self, q) -> list[Cqe]:
        tail = self.r32(hw.TACC_QUEUE_BASE(q) + hw.TACC_Q_CQ_TAIL)
        out = []
        h = self.cq_head[q]
        while h != tail:
            n = (tail - h) if tail > h else self.cq_size - h
            raw = self.dev.qt.memread(self.cq_addr(q) + h * 32, 32 * n)
            for i in range(n):
                job, st, qq, _, tag, s, e = CQE.unpack_from(raw, 32 * i)
                out.append(Cqe(job, st, qq, tag, s, e))
            h = (h + n) % self.cq_size
        if out:
            self.cq_head[q] = h
            self.w32(hw.TACC_QUEUE_BASE(q) + hw.TACC_Q_CQ_HEAD, h)
        return out

    def qstatus(self, q):
        return self.r32(hw.TACC_QUEUE_BASE(q) + hw.TACC_Q_STATUS)

    def job_of(self, q, descs, tag=0):
        """Stamp job number, indices and F_LAST on a list of descriptors."""
        self.job += 1
        out = []
        for i, d in enumerate(descs):
            b = bytearray(d)
            struct.pack_into("<H", b, 4, i)
            struct.pack_into("<I", b, 8, self.job)
            if tag:
                struct.pack_into("<Q", b, 16, tag)
            if i == len(descs) - 1:
                b[1] |= hw.TACC_DESC_F_LAST
            out.append(bytes(b))
        return self.job, out

    def run_job(self, q, descs, tag=0, step=None) -> Cqe:
        job, ds = self.job_of(q, descs, tag)
        self.submit(q, ds)
        self.dev.qt.clock_step(step or 10**9)
        cq = self.cqes(q)
        assert cq and cq[-1].job == job, (cq, job)
        return cq[-1]

    # trace ring
    def trace_enable(self, size=256, wb=0):
        self.w64(hw.TACC_REG_TRACE_BASE, self.trace_addr())
        self.w32(hw.TACC_REG_TRACE_SIZE, size)
        self.w64(hw.TACC_REG_TRACE_WB, wb)
        self.w32(hw.TACC_REG_TRACE_CTRL, 1)

    def trace_read(self, start, end, size=256) -> list[TraceRec]:
        out = []
        for i in range(start, end):
            raw = self.dev.qt.memread(self.trace_addr() + (i % size) * 64, 64)
            out.append(TraceRec(*TRACE.unpack(raw)[:-1]))
        return out


class Tacc:
    """A QEMU (qtest accelerator) with one tacc PF at 00:01.0, or (root_port) at
    01:00.0 behind a pcie-root-port at 00:01.0 (a real link: ASPM, link status)."""

    def __init__(self, props: str = "", extra: list[str] | None = None,
                 pre: list[str] | None = None, root_port: str | None = None):
        """pre: arguments before the device (an IOMMU must come first).
        root_port: the pcie-root-port's extra properties ("" for none)."""
        self.bus = 0 if root_port is None else 1
        pre = list(pre or [])
        if root_port is None:
            dev = "tacc,id=tacc0,addr=01.0"
        else:
            pre += ["-device", "pcie-root-port,id=rp0,bus=pcie.0,addr=01.0,chassis=1,slot=1"
                    + ("," + root_port if root_port else "")]
            dev = "tacc,id=tacc0,bus=rp0,addr=00.0"
        dev += "," + props if props else ""
        self.qt = QTest([*pre, "-device", dev, *(extra or [])])
        self.qt.settle = self.settle
        self.qt.ecam_enable()
        self.pt_pool = [PT_BASE]
        self.data_next = DATA_BASE
        devfn = 0x08
        if self.bus:
            self._setup_root_port()
            devfn = 0x00
        fns = self.qt.find_devices(hw.TACC_PCI_VENDOR_ID, hw.TACC_PCI_DEVICE_ID_PF, bus=self.bus)
        assert fns == [devfn], fns
        self.pf = self._setup_func(0, devfn, PF_BARS, 64)
        self.pt = PageTables(self.qt, self.pt_pool)
        self.vfs: list[Func] = []

    RP_DEVFN = 0x08

    def _setup_root_port(self):
        """Bus 1 behind the root port; its memory window covers PF_BARS/VF_BARS (below
        4 GiB: the PF's BARs are non-prefetchable, so they need the 32-bit window)."""
        qt, rp = self.qt, self.RP_DEVFN
        qt.cfg_write(0, rp, 0x18, 0x00_01_01_00)  # primary 0, secondary 1, subordinate 1
        lo, hi = PF_BARS[0], VF_BARS[4] + 0x10_0000 - 1
        qt.cfg_write(0, rp, 0x20, (lo >> 16) & 0xFFF0 | (hi & 0xFFF0_0000), 4)
        qt.cfg_write(0, rp, 0x04, 0x0006, 2)  # MEM | MASTER: the device's DMA goes through

    def _setup_func(self, fn, devfn, bars, bits):
        for bar, addr in bars.items():
            self.qt.set_bar(self.bus, devfn, 0x10 + 4 * bar, addr, bits == 64)
        self.qt.cfg_write(self.bus, devfn, 0x04, 0x0006, 2)  # MEM | MASTER
        f = Func(self, fn, devfn, bars[0], bars[2], bars[4])
        f.ring = RING_BASE + fn * 0x10_0000 if fn < 5 else 0
        return f

    def enable_vfs(self, n: int) -> list[Func]:
        """Enable n VFs through the PF's SR-IOV capability, map their BARs."""
        qt, bus, pf = self.qt, self.bus, self.pf.devfn
        sr = qt.find_ext_cap(bus, pf, 0x10)
        qt.cfg_write(bus, pf, sr + 0x08, 0, 2)  # VF disable first
        for bar, addr in VF_BARS.items():  # 64-bit VF BARs (hw 1.2): both halves
            qt.cfg_write(bus, pf, sr + 0x24 + 4 * bar, addr & 0xFFFFFFFF)
            qt.cfg_write(bus, pf, sr + 0x28 + 4 * bar, addr >> 32)
        qt.cfg_write(bus, pf, sr + 0x10, n, 2)  # NumVFs
        qt.cfg_write(bus, pf, sr + 0x08, 0x9 if n else 0, 2)  # VF Enable | VF MSE
        off = qt.cfg_read(bus, pf, sr + 0x14, 2)
        stride = qt.cfg_read(bus, pf, sr + 0x16, 2)
        sizes = {0: hw.TACC_BAR_REGS_SIZE, 2: hw.TACC_BAR_COUNTERS_SIZE, 4: 0x1000}
        self.vfs = []
        for i in range(n):
            devfn = pf + off + i * stride
            f = Func(self, i + 1, devfn, VF_BARS[0] + i * sizes[0], VF_BARS[2] + i * sizes[2],
                     VF_BARS[4] + i * sizes[4])
            f.ring = RING_BASE + (i + 1) * 0x10_0000
            qt.cfg_write(bus, devfn, 0x04, 0x0006, 2)  # VFs decode only with their own MEM
            self.vfs.append(f)
        return self.vfs

    def map_default(self, host: int = 0x2000_0000, devmem: int = 256 << 20) -> int:
        """A context root mapping guest RAM 1:1 and device memory at DEVMEM_VA
        (2 MiB pages)."""
        root = self.pt.new_root()
        self.pt.map(root, 0, 0, host, huge=True)
        self.pt.map(root, DEVMEM_VA, 0, devmem, devmem=True, huge=True)
        self.pt.flush()
        return root

    def alloc(self, size: int, align: int = 4096) -> int:
        a = (self.data_next + align - 1) & ~(align - 1)
        assert a + size <= DATA_END, "test data area exhausted"
        self.data_next = a + size
        return a

    def reset_alloc(self):
        self.data_next = DATA_BASE

    def settle(self, timeout: float = 120.0):
        """Wait (wall time; the virtual clock stands still) until the model is
        not stopped at a GEMM completion whose thread-pool worker is still
        computing: then the CQ shows every completion up to the clock."""
        end = time.monotonic() + timeout
        while self._gemm_wait():
            assert time.monotonic() < end, "a GEMM worker did not finish"
            time.sleep(0.002)

    def _gemm_wait(self) -> bool:
        try:
            return self.qom_get("x-gemm-wait")
        except QTestError:  # the PF was unplugged (its jobs are cancelled)
            return False

    def qom_get(self, prop):
        return self.qt.qmp.cmd("qom-get", path="/machine/peripheral/tacc0",
                               property=prop)

    def qom_set(self, prop, value):
        return self.qt.qmp.cmd("qom-set", path="/machine/peripheral/tacc0",
                               property=prop, value=value)

    def close(self):
        self.qt.close()


# ------------------------------------------------------------- link model --
# Mirrors docs/hardware.md "Timing model" (and qemu/hw/tacc/tacc-model.c).
RATE_GT = {3: 8, 4: 16, 5: 32}
CHUNK = 64 * 1024


@dataclass
class LinkModel:
    gen: int = model.DEFAULT.link_gen
    width: int = model.DEFAULT.link_width
    mps: int = model.DEFAULT.mps
    mrrs: int = model.DEFAULT.mrrs
    rcb: int = model.DEFAULT.rcb
    tags: int = model.DEFAULT.tags
    posted_credits: int = model.DEFAULT.posted_credits
    posted_hdr_credits: int = model.DEFAULT.posted_hdr_credits
    cmd_ns: int = model.DEFAULT.cmd_latency_ns
    rd_ns: int = model.DEFAULT.read_latency_ns
    wr_ns: int = model.DEFAULT.write_latency_ns
    walk_ns: int = model.DEFAULT.walk_latency_ns

    @property
    def bw(self) -> float:
        """Link bytes per second, one direction (after encoding and SKP)."""
        return linkmodel.link_raw_bw(self.gen, self.width)

    # The formulas live in tacc.model.link (one implementation, also used by the
    # analysis' "modelled maximum" and the counters' share of the link).
    def t_link_ps(self, nbytes: int) -> int:
        return linkmodel.t_link_ps(nbytes, self.gen, self.width)

    def prefix(self, n: int, h2d: bool, host_off: int = 0,
               dev_off: int = 0) -> linkmodel.LinkCount:
        return linkmodel.link_prefix(linkmodel.H2D if h2d else linkmodel.D2H, n, self.mps,
                                   self.mrrs, self.rcb, host_off, dev_off)

    # host_off / dev_off: host-side and device-side start addresses (only their offset
    # modulo 4 KiB matters; 0 = aligned), see linkmodel.link_prefix.
    def h2d_bytes(self, n, host_off: int = 0, dev_off: int = 0):
        """(down, up, completions) link bytes of a host read of n bytes."""
        return linkmodel.h2d_link_bytes(n, self.mps, self.mrrs, host_off, dev_off, self.rcb)

    def d2h_bytes(self, n, host_off: int = 0, dev_off: int = 0):
        """(up, tlps) link bytes of a host write of n bytes."""
        return linkmodel.d2h_link_bytes(n, self.mps, host_off, dev_off)

    def step(self, a: int, c: int, h2d: bool, host_off: int = 0,
             dev_off: int = 0) -> linkmodel.LinkCount:
        """The link traffic of the step carrying payload [a, a + c): the TLPs and DLLPs
        that start in it (prefix differences, so the steps add up)."""
        return (self.prefix(a + c, h2d, host_off, dev_off)
                - self.prefix(a, h2d, host_off, dev_off))

    def step_bytes(self, a: int, c: int, h2d: bool, host_off: int = 0,
                   dev_off: int = 0) -> tuple[int, int]:
        """(down, up) link bytes of the link step carrying payload [a, a + c)."""
        return self.step(a, c, h2d, host_off, dev_off).bytes

    def step_ps(self, a: int, c: int, h2d: bool, host_off: int = 0, dev_off: int = 0) -> int:
        """Uncontended duration of that step: both directions' t_link and flow control."""
        return linkmodel.step_ps(linkmodel.H2D if h2d else linkmodel.D2H, a, c, self.gen,
                               self.width, self.mps, self.mrrs, self.rcb, self.tags,
                               self.rd_ns, self.wr_ns, self.posted_credits, host_off, dev_off,
                               self.posted_hdr_credits)

    def copy_ps(self, n: int, h2d: bool, walks: int = 0, host_off: int = 0,
                dev_off: int = 0) -> int:
        """Modelled duration of an uncontended COPY_H2D / COPY_D2H of n bytes."""
        t = (self.cmd_ns + self.walk_ns * walks) * 1000
        t += linkmodel.copy_link_ps(linkmodel.H2D if h2d else linkmodel.D2H, n, self.gen,
                                  self.width, self.mps, self.mrrs, self.rcb, self.tags,
                                  self.rd_ns, self.wr_ns, self.posted_credits, host_off,
                                  dev_off, self.posted_hdr_credits)
        return t + (self.rd_ns if h2d else self.wr_ns) * 1000

    def formula_bw(self, n: int, h2d: bool, host_off: int = 0, dev_off: int = 0) -> float:
        """Closed form (no steps): n / (T_cmd + T_lat + the busier direction's link bytes
        / BW, or the flow-control bound if longer), bytes/s."""
        c = self.prefix(n, h2d, host_off, dev_off)
        if h2d:
            fc = linkmodel.fc_ps(linkmodel.H2D, n, c.tlps[1], self.tags, self.rd_ns) * 1e-12
        else:  # a full pool first: the whole copy as one step after idle
            fc = linkmodel.PostedCredits(self.gen, self.width, self.mps, self.wr_ns,
                                       self.posted_hdr_credits,
                                       self.posted_credits).take(0, c.tlps[1], n) * 1e-12
        link = max(max(c.bytes) / self.bw, fc)
        t = (self.cmd_ns + (self.rd_ns if h2d else self.wr_ns)) * 1e-9 + link
        return n / t
