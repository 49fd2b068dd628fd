"""Stateful fuzz of the device's features combined (docs/hardware.md section 8): one
QEMU with the PF behind a pcie-root-port (2 VFs possible) and a virtio-tacc-pci linked
to it; hypothesis interleaves PF/VF jobs whose addresses include the root port's
config space (ECAM) and the device's own BARs, virtio jobs, TLP capture on and off
(its ring in RAM or in ECAM), root-port config writes (Slot Control power, Link
Control, Secondary Bus Reset), SR-IOV enable/disable, FLR, function and virtio resets,
clock steps, and a guest eject of the PF (ACPI PCI hotplug; a new QEMU then).

Invariants: every qtest reply within 5 s (QEMU neither died nor wedged its main
loop) and, while the PF is there and powered, its ID register after every reset.
Recorded over every QEMU of the run: the longest entry into the device (QOM
``x-worst-turn-ns``, read before each eject and at the end) and the peak RSS
(``VmHWM``); the long run holds them to the promise of docs/hardware.md section 9.
Fixed seed.  TACC_FUZZ_COMBO_STEPS steps (default 1,000) in the device layer, 200,000
under ``@pytest.mark.long``."""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tacc import hw
from tacc.testing.qtest import ECAM_BASE, QEMU, QTestError
from tacc.testing.taccdev import DEVMEM_VA, PF_BARS, Tacc
from tacc.testing.virtiodev import Job, VirtioTacc, device_arg

REPLY_TIMEOUT = 5.0
HOST_VA = 0x20_0000_0000  # 2 MiB of guest RAM
BAR_VA = 0x30_0000_0000  # the PF's BAR0
ECAM_VA = 0x40_0000_0000 + (1 << 30)  # the root port's and the PF's ECAM pages
RP = Tacc.RP_DEVFN
RP_ECAM = ECAM_BASE + (RP << 12)  # bus 0
PF_ECAM = ECAM_BASE + (1 << 20)  # bus 1, devfn 0
WIN = "devmem-base=0x4000000,devmem-size=0x4000000"
VT_HOST_VA, VT_DEV_VA = 0x1000_0000, 0x40_0000_0000
EXP_RP = None  # the root port's PCIe capability (found at boot)

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
ADDRS = [HOST_VA, HOST_VA + 64, DEVMEM_VA, DEVMEM_VA + 4096, BAR_VA, BAR_VA + 0x1000,
         ECAM_VA, ECAM_VA + 0x68, ECAM_VA + 0x18, ECAM_VA + 0x1000 + 0x04,
         ECAM_VA + 0x1000 + 0x88, 0, 2**64 - 8]


def shape(raw: bytes, ctx: int) -> bytes:
    """A descriptor from random bytes: opcode in range, addresses mostly from ADDRS
    (RAM, device memory, own BAR0, the root port's and the PF's config space)."""
    b = bytearray(raw)
    b[0] %= hw.TACC_OP_MAX
    b[1] = 0
    struct.pack_into("<H", b, 2, ctx)
    words = list(struct.unpack_from("<QQQ", b, 24))
    for i in range(3):
        if words[i] % 4:
            words[i] = (ADDRS[words[i] % len(ADDRS)] + (words[i] >> 40) % 16 * 8) & (2**64 - 1)
    struct.pack_into("<QQQ", b, 24, *words)
    if b[0] in (hw.TACC_OP_COPY_H2D, hw.TACC_OP_COPY_D2H, hw.TACC_OP_COPY_D2D,
                hw.TACC_OP_FILL):
        ln = struct.unpack_from("<Q", b, 40)[0]
        struct.pack_into("<Q", b, 40, ln % (96 << 10))
    elif b[0] == hw.TACC_OP_GEMM:
        dm = [v % 33 for v in struct.unpack_from("<IIIIII", b, 48)]
        struct.pack_into("<IIIIII", b, 48, *dm)
    elif b[0] == hw.TACC_OP_ELTWISE:
        n = struct.unpack_from("<Q", b, 48)[0] % 8193
        struct.pack_into("<QI", b, 48, n, b[56] % 7)
    return bytes(b)


raw_desc = st.binary(min_size=128, max_size=128)


class Rig:
    """The QEMU under test and what the machine needs of it."""

    def __init__(self) -> None:
        global EXP_RP
        self.d = Tacc("sriov-max-vfs=2", extra=device_arg(props=WIN), root_port="")
        d, qt = self.d, self.d.qt
        qt.reply_timeout = REPLY_TIMEOUT
        EXP_RP = qt.find_cap(0, RP, 0x10)
        root = d.pt.new_root()
        d.pt.map(root, DEVMEM_VA, 0, 32 << 20, devmem=True, huge=True)
        d.pt.map(root, HOST_VA, 0x0400_0000, 2 << 20, huge=True)
        d.pt.map(root, BAR_VA, PF_BARS[0], 0x10000)
        d.pt.map(root, ECAM_VA, RP_ECAM, 0x1000)
        d.pt.map(root, ECAM_VA + 0x1000, PF_ECAM, 0x1000)
        d.pt.flush()
        d.fuzz_root = root
        self.v = VirtioTacc(d)
        self.gone = False
        self.worst_turn_ns = 0  # the longest entry into the device, this QEMU
        self.peak_rss_kib = 0  # VmHWM of this QEMU

    def sample(self) -> None:
        """The PF's longest entry so far (while it exists) and QEMU's peak RSS."""
        if not self.gone:
            self.worst_turn_ns = max(self.worst_turn_ns, self.d.qom_get("x-worst-turn-ns"))
        try:
            with open(f"/proc/{self.d.qt.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))
        except FileNotFoundError:  # QEMU already ended: the alive invariant says why
            pass

    def close(self) -> None:
        self.sample()
        Figures.worst_turn_ns = max(Figures.worst_turn_ns, self.worst_turn_ns)
        Figures.peak_rss_kib = max(Figures.peak_rss_kib, self.peak_rss_kib)
        Figures.qemus += 1
        self.d.close()


class Figures:
    """Over every QEMU a run started (an eject ends one)."""

    worst_turn_ns = 0
    peak_rss_kib = 0
    qemus = 0

    @classmethod
    def reset(cls) -> None:
        cls.worst_turn_ns = cls.peak_rss_kib = cls.qemus = 0


class ComboMachine(RuleBasedStateMachine):
    rig: Rig
    steps = 0

    @initialize()
    def start(self):
        if self.rig.gone:  # the PF was ejected: a new QEMU
            self.rig.close()
            ComboMachine.rig = Rig()
        d = self.rig.d
        d.qt.flush()
        d.qt.qmp.cmd("system_reset")
        self.restore()
        d.vfs = []
        self.vctx = -1
        self.seq: dict[tuple[int, int], int] = {}
        if self.rig.v.init():
            self.vctx = self.rig.v.ctx_create()
            st_, h = self.rig.v.bo_create(self.vctx, 1 << 20, devmem=True)
            if st_ == hw.TACC_VIRTIO_OK:
                self.rig.v.bind(self.vctx, h, VT_DEV_VA, 1 << 20)
            a = d.alloc(64 << 10) if d.data_next + (64 << 10) < 0x1F00_0000 else 0x0300_0000
            hh = self.rig.v.bo_host(self.vctx, a, 64 << 10)
            self.rig.v.bind(self.vctx, hh, VT_HOST_VA, 64 << 10)
        self.check_id()

    def restore(self):
        """Root port bus numbers and window, the PF's BARs and decode, its context."""
        d, qt = self.rig.d, self.rig.d.qt
        with qt.deferred():
            qt.ecam_enable()
            d._setup_root_port()
            for bar, addr in PF_BARS.items():
                qt.set_bar(1, 0, 0x10 + 4 * bar, addr, True)
            qt.cfg_write(1, 0, 0x04, 0x0006, 2)
            for t, data in d.pt.tables.items():
                qt.memwrite(t, bytes(data))
            d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
            d.pf.set_ptbr(0, d.fuzz_root)
            for q in range(2):
                d.pf.setup_queue(q, sq_size=64, cq_size=64)

    def check_id(self):
        assert self.rig.d.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC

    def func(self, i):
        d = self.rig.d
        return d.pf if i == 0 or i > len(d.vfs) else d.vfs[i - 1]

    @precondition(lambda self: not self.rig.gone)
    @rule(fn=st.integers(0, 2), q=st.integers(0, 1), descs=st.lists(raw_desc, min_size=1,
                                                                      max_size=4))
    def pf_job(self, fn, q, descs):
        f = self.func(fn)
        ds = [shape(r, 0) for r in descs]
        ds[-1] = ds[-1][:1] + bytes([hw.TACC_DESC_F_LAST]) + ds[-1][2:]
        with self.rig.d.qt.deferred():
            f.submit(q, ds)

    @precondition(lambda self: self.vctx >= 0)
    @rule(ring=st.integers(0, 1), descs=st.lists(raw_desc, min_size=1, max_size=3),
          kick=st.booleans())
    def virtio_job(self, ring, descs, kick):
        v = self.rig.v
        key = (self.vctx, ring)
        self.seq[key] = self.seq.get(key, 0) + 1
        cmds = []
        for r in descs:
            b = bytearray(shape(r, self.vctx))
            if b[0] == hw.TACC_OP_FILL:  # FILL takes a VA of a devmem binding here
                struct.pack_into("<Q", b, 24, VT_DEV_VA + b[30] * 64)
            cmds.append(bytes(b))
        if v.buf_next + (64 << 10) >= 0x2000_0000:
            return  # the driver's buffer area is used up until the next example
        v.subq.add([v.batch([Job(self.vctx, ring, self.seq[key], cmds)])], 64)
        if kick:
            v.subq.kick()
        v.subq.pop()

    @precondition(lambda self: not self.rig.gone)
    @rule(on=st.booleans(), where=st.sampled_from(["ram", "ecam", "bar"]),
          funcs=st.sampled_from([0, 1, 1 << 5, 0x3F]))
    def tlp_capture(self, on, where, funcs):
        pf = self.rig.d.pf
        base = {"ram": 0x0500_0000, "ecam": RP_ECAM, "bar": PF_BARS[0]}[where]
        with self.rig.d.qt.deferred():
            pf.w32(hw.TACC_REG_TLPCAP_CTRL, 0)
            pf.w64(hw.TACC_REG_TLPCAP_BASE, base)
            pf.w32(hw.TACC_REG_TLPCAP_SIZE, 1024)
            pf.w32(hw.TACC_REG_TLPCAP_FUNCS, funcs)
            pf.w64(hw.TACC_REG_TLPCAP_WB, base + 0x1000 if where == "ram" else base)
            pf.w32(hw.TACC_REG_TLPCAP_CTRL, hw.TACC_TLPCAP_CTRL_ENABLE if on else 0)

    @precondition(lambda self: not self.rig.gone)
    @rule(q=st.integers(0, 1), where=st.sampled_from(["ecam-rp", "ecam-pf", "ram"]))
    def cq_base(self, q, where):
        pf = self.rig.d.pf
        b = 0x1000 + 0x100 * q
        base = {"ecam-rp": RP_ECAM, "ecam-pf": PF_ECAM, "ram": pf.cq_addr(q)}[where]
        with self.rig.d.qt.deferred():
            pf.w32(b + hw.TACC_Q_CTRL, 0)
            pf.w64(b + hw.TACC_Q_CQ_BASE, base)
            pf.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
            pf.tail[q] = pf.cq_head[q] = 0

    @precondition(lambda self: not self.rig.gone)
    @rule(reg=st.sampled_from([0x18, 0x10, 0x18, 0x08]), v=st.integers(0, 0xFFFF))
    def root_port_cfg(self, reg, v):
        """Slot Control (power, indicators), Link Control, Device Control."""
        qt = self.rig.d.qt
        qt.cfg_write(0, RP, EXP_RP + reg, v, 2)
        qt.cfg_write(0, RP, EXP_RP + reg, 0x0100 if reg == 0x18 else 0, 2)  # power on again
        self.restore()

    @precondition(lambda self: not self.rig.gone)
    @rule()
    def secondary_bus_reset(self):
        qt = self.rig.d.qt
        v = qt.cfg_read(0, RP, 0x3E, 2)
        qt.cfg_write(0, RP, 0x3E, v | 0x40, 2)
        qt.cfg_write(0, RP, 0x3E, v & ~0x40, 2)
        self.rig.d.vfs = []
        self.restore()
        self.check_id()

    @precondition(lambda self: not self.rig.gone)
    @rule(n=st.integers(0, 2))
    def sriov(self, n):
        d = self.rig.d
        d.enable_vfs(n)
        for i, vf in enumerate(d.vfs):
            d.pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(i), (64 << 20) * (i + 2))
            d.pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(i), 16 << 20)
            vf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
            vf.setup_queue(0, sq_size=64, cq_size=64)
            vf.set_ptbr(0, d.fuzz_root)

    @precondition(lambda self: not self.rig.gone)
    @rule(kind=st.sampled_from(["flr", "ctrl", "virtio"]))
    def reset(self, kind):
        d, qt = self.rig.d, self.rig.d.qt
        if kind == "flr":
            exp = qt.find_cap(1, 0, 0x10)
            qt.cfg_write(1, 0, exp + 8, qt.cfg_read(1, 0, exp + 8, 2) | 0x8000, 2)
            d.vfs = []
        elif kind == "ctrl":
            d.pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
        else:
            self.rig.v.reset()
            self.vctx = -1
        self.restore()
        self.check_id()

    @rule(ns=st.one_of(st.integers(1, 5000), st.integers(1, 10**6)))
    def clock_step(self, ns):
        self.rig.d.qt.clock_step(ns)

    @precondition(lambda self: not self.rig.gone)
    @rule(n=st.integers(0, 40))
    def eject_pf(self, n):
        if n:  # rare: it ends this QEMU's PF
            return
        qt = self.rig.d.qt
        self.rig.sample()
        qt.outl(0xCD0, 0)
        qt.outl(0xCC8, 1)
        qt.clock_step(1000)
        self.rig.gone = True
        self.vctx = -1

    @invariant()
    def alive(self):
        ComboMachine.steps += 1
        if self.rig.d.qt.proc.poll() is not None:
            pytest.fail(f"QEMU ended: {self.rig.d.qt.died()}")


def run(rig: Rig, examples: int, steps: int) -> tuple[int, float]:
    ComboMachine.rig = rig
    ComboMachine.steps = 0
    t0 = time.monotonic()
    sm = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                  derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    try:
        ComboMachine.TestCase.settings = sm
        ComboMachine.TestCase().runTest()
    except QTestError as e:
        pytest.fail(f"after {ComboMachine.steps} steps: {e}")
    return ComboMachine.steps, time.monotonic() - t0


@pytest.fixture
def rig():
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    Figures.reset()
    r = Rig()
    yield r
    ComboMachine.rig.close()
    print(f"over {Figures.qemus} QEMU(s): longest entry into the device "
          f"{Figures.worst_turn_ns / 1e6:.3f} ms, peak RSS {Figures.peak_rss_kib >> 10} MiB")


def figures() -> tuple[int, int]:
    """The longest entry (ns) and peak RSS (KiB) over the run's QEMUs, the live one
    included."""
    r = ComboMachine.rig
    r.sample()
    return (max(Figures.worst_turn_ns, r.worst_turn_ns),
            max(Figures.peak_rss_kib, r.peak_rss_kib))


STEPS = int(os.environ.get("TACC_FUZZ_COMBO_STEPS", "1000"))
# docs/hardware.md section 9, "Host work": the longest entry into the device this fuzz may
# see (its commands are small: no slice of host work comes near it) and QEMU's peak RSS
TURN_BOUND_NS = 50_000_000
RSS_BOUND_KIB = 1 << 20


def test_fuzz_combinations(rig):
    n, secs = run(rig, examples=max(1, STEPS // 30), steps=50)
    print(f"combination fuzz: {n} steps in {secs:.1f} s")
    assert n >= STEPS


@pytest.mark.long
@pytest.mark.timeout(3600)  # 229,027 steps took 776 s at load ~10
def test_fuzz_combinations_long(rig):
    n, secs = run(rig, examples=2600, steps=100)
    turn, rss = figures()
    print(f"combination fuzz (long): {n} steps in {secs:.1f} s, longest entry "
          f"{turn / 1e6:.3f} ms, peak RSS {rss >> 10} MiB")
    assert n >= 200_000
    assert turn <= TURN_BOUND_NS
    assert rss <= RSS_BOUND_KIB
