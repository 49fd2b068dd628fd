"""A virtio-pci (modern) driver for virtio-tacc over qtest (docs/virtio.md).

The protocol's constants come from :mod:`tacc.hw` (generated from tacc_virtio.h,
never copied): ``hw.TACC_VIRTIO_CTX_CREATE`` ...  ``VirtioTacc`` finds the function
on a ``Tacc`` (tacc.testing.taccdev) QEMU, maps its BARs, walks its virtio PCI
capabilities, negotiates features, sets up split virtqueues in guest RAM and speaks
the control and submit protocols.  Used by tests/device/test_virtio*.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tacc import hw
from tacc.testing.taccdev import Tacc

HDR = struct.Struct("<HBBIQ")  # struct tacc_virtio_hdr
RESP = struct.Struct("<IIQ")  # struct tacc_virtio_resp
BO_CREATE = struct.Struct("<QII")
MEM_ENT = struct.Struct("<QII")
VM_BIND = struct.Struct("<IIQQQ")
VM_UNBIND = struct.Struct("<QQ")
TRACE_SETUP = struct.Struct("<QQII")
SUBMIT = struct.Struct("<HBBIQII")  # hdr + njobs + rsvd
JOB = struct.Struct("<IHHQQQ")
SUBMIT_RESP = struct.Struct("<IIII")
JOB_STATUS = struct.Struct("<QHHI")
FENCE = struct.Struct("<QII")
CONFIG = struct.Struct("<IIIIIIQII")
assert HDR.size == 16 and JOB.size == 32 and SUBMIT.size == 24 and FENCE.size == 16

# virtio 1.x constants (the virtio spec; not tacc's to define)
VIRTIO_VENDOR = 0x1AF4
ST_ACK, ST_DRIVER, ST_DRIVER_OK, ST_FEATURES_OK, ST_NEEDS_RESET = 1, 2, 4, 8, 64
F_VERSION_1, F_EVENT_IDX, F_ACCESS_PLATFORM = 32, 29, 33
CAP_COMMON, CAP_NOTIFY, CAP_ISR, CAP_DEVICE, CAP_SHM = 1, 2, 3, 4, 8
VRING_DESC_F_NEXT, VRING_DESC_F_WRITE = 1, 2

DEVFN = 0x10  # -device virtio-tacc-pci,addr=02.0
BARS = {1: 0xC040_0000, 2: 0xC041_0000, 4: 0xC042_0000}
VQ_BASE = 0x1F00_0000  # rings: 64 KiB per queue
BUF_BASE = 0x1F10_0000  # request/response buffers (bump allocated, 15 MiB)
BUF_END = 0x2000_0000
MSI_MSG = 0x00F8_0000  # the submit queue's MSI-X message lands here


def device_arg(pf_id: str = "tacc0", props: str = "") -> list[str]:
    """The -device argument pair for a Tacc(extra=...)."""
    dev = f"virtio-tacc-pci,tacc={pf_id},addr=02.0" + ("," + props if props else "")
    return ["-device", dev]


def hdr(typ: int, ctx: int = 0, tag: int = 0, version: int | None = None, flags: int = 0):
    v = hw.TACC_VIRTIO_MSG_VERSION if version is None else version
    return HDR.pack(typ, v, flags, ctx, tag)


@dataclass
class Job:
    ctx: int
    ring: int
    seqno: int
    cmds: list[bytes]
    tag: int = 0

    def pack(self) -> bytes:
        return JOB.pack(self.ctx, self.ring, len(self.cmds), self.seqno, self.tag, 0) + \
            b"".join(self.cmds)


class Queue:
    """A split virtqueue in guest RAM."""

    def __init__(self, drv: VirtioTacc, index: int, size: int):
        self.drv, self.index, self.size = drv, index, size
        base = VQ_BASE + index * 0x10000
        self.desc, self.avail, self.used = base, base + 0x4000, base + 0x8000
        self.free = list(range(size))
        self.avail_idx = 0
        self.last_used = 0
        self.heads: dict[int, tuple[list[int], int, int]] = {}  # head -> descs, in addr, len

    def add(self, out: list[bytes], in_len: int, in_descs: int = 1) -> int:
        """A buffer: each out part its own descriptor, then in_len writable bytes."""
        qt = self.drv.qt
        parts = [(self.drv.buf(p), len(p), 0) for p in out]
        in_addr = self.drv.buf(b"\0" * in_len) if in_len else 0
        step = -(-in_len // in_descs) if in_len else 0
        for i in range(in_descs if in_len else 0):
            n = min(step, in_len - i * step)
            parts.append((in_addr + i * step, n, VRING_DESC_F_WRITE))
        assert len(parts) <= len(self.free), "virtqueue full"
        ids = [self.free.pop(0) for _ in parts]
        with qt.deferred():
            for k, (a, n, fl) in enumerate(parts):
                nxt = ids[k + 1] if k + 1 < len(ids) else 0
                fl |= VRING_DESC_F_NEXT if k + 1 < len(ids) else 0
                qt.memwrite(self.desc + 16 * ids[k], struct.pack("<QIHH", a, n, fl, nxt))
            qt.memwrite(self.avail + 4 + 2 * (self.avail_idx % self.size),
                        struct.pack("<H", ids[0]))
            self.avail_idx = (self.avail_idx + 1) & 0xFFFF
            qt.memwrite(self.avail + 2, struct.pack("<H", self.avail_idx))
        self.heads[ids[0]] = (ids, in_addr, in_len)
        return ids[0]

    def raw_desc(self, i: int, addr: int, length: int, flags: int, nxt: int):
        self.drv.qt.memwrite(self.desc + 16 * i, struct.pack("<QIHH", addr, length, flags, nxt))

    def raw_avail(self, head: int):
        qt = self.drv.qt
        qt.memwrite(self.avail + 4 + 2 * (self.avail_idx % self.size), struct.pack("<H", head))
        self.avail_idx = (self.avail_idx + 1) & 0xFFFF
        qt.memwrite(self.avail + 2, struct.pack("<H", self.avail_idx))

    def set_used_event(self, v: int):
        self.drv.qt.memwrite(self.avail + 4 + 2 * self.size, struct.pack("<H", v & 0xFFFF))

    def kick(self):
        self.drv.qt.writew(self.drv.notify_addr(self.index), self.index)

    def used_idx(self) -> int:
        return struct.unpack("<H", self.drv.qt.memread(self.used + 2, 2))[0]

    def pop(self) -> list[tuple[int, bytes]]:
        """Used buffers since the last pop: (head, written bytes)."""
        out = []
        idx = self.used_idx()
        while self.last_used != idx:
            slot = self.used + 4 + 8 * (self.last_used % self.size)
            head, n = struct.unpack("<II", self.drv.qt.memread(slot, 8))
            self.last_used = (self.last_used + 1) & 0xFFFF
            ids, a, in_len = self.heads.pop(head, ([head], 0, 0))
            self.free.extend(ids)
            out.append((head, self.drv.qt.memread(a, min(n, in_len)) if n and a else b""))
        return out


class VirtioTacc:
    """virtio-tacc on a Tacc QEMU (created with device_arg() in its extra args)."""

    def __init__(self, dev: Tacc, devfn: int = DEVFN):
        self.dev, self.qt, self.devfn = dev, dev.qt, devfn
        qt = self.qt
        vd = qt.cfg_read(0, devfn, 0)
        assert vd == hw.TACC_VIRTIO_PCI_DEVICE_ID << 16 | VIRTIO_VENDOR, hex(vd)
        for bar, addr in BARS.items():
            size, is64 = qt.bar_size(0, devfn, 0x10 + 4 * bar)
            assert size and addr % size == 0, (bar, size)
            qt.set_bar(0, devfn, 0x10 + 4 * bar, addr, is64)
        qt.cfg_write(0, devfn, 0x04, 0x0006, 2)  # MEM | MASTER
        self.caps: dict[int, list[tuple[int, int, int, int, int]]] = {}
        p = qt.cfg_read(0, devfn, 0x34, 1)
        while p:
            if qt.cfg_read(0, devfn, p, 1) == 0x09:  # vendor specific: virtio
                typ, bar = qt.cfg_read(0, devfn, p + 3, 1), qt.cfg_read(0, devfn, p + 4, 1)
                sid = qt.cfg_read(0, devfn, p + 5, 1)
                off, ln = qt.cfg_read(0, devfn, p + 8), qt.cfg_read(0, devfn, p + 12)
                extra = qt.cfg_read(0, devfn, p + 16) if typ in (CAP_NOTIFY, CAP_SHM) else 0
                if typ == CAP_SHM:
                    off |= extra << 32
                    ln |= qt.cfg_read(0, devfn, p + 20) << 32
                self.caps.setdefault(typ, []).append((bar, off, ln, sid, extra))
            p = qt.cfg_read(0, devfn, p + 1, 1)
        self.common = self._addr(CAP_COMMON)
        self.devcfg = self._addr(CAP_DEVICE)
        bar, off, _, _, self.notify_mult = self.caps[CAP_NOTIFY][0]
        self.notify = BARS[bar] + off
        self.shm = {sid: BARS[b] + o for b, o, _, sid, _ in self.caps.get(CAP_SHM, [])}
        self.queues: list[Queue] = []
        self.features = 0
        self.buf_next = BUF_BASE

    def _addr(self, typ: int) -> int:
        bar, off, *_ = self.caps[typ][0]
        return BARS[bar] + off

    # ---------------------------------------------------------------- memory --
    def buf(self, data: bytes) -> int:
        if self.buf_next + len(data) + 64 > BUF_END:
            self.buf_next = BUF_BASE  # old requests are long used
        a = self.buf_next
        self.buf_next = (a + len(data) + 63) & ~63
        if data:
            self.qt.memwrite(a, data)
        return a

    def notify_addr(self, q: int) -> int:
        self.qt.writew(self.common + 22, q)
        return self.notify + self.qt.readw(self.common + 30) * self.notify_mult

    # ------------------------------------------------------------- transport --
    def status(self) -> int:
        return self.qt.readb(self.common + 20)

    def device_features(self) -> int:
        f = 0
        for sel in (0, 1):
            self.qt.writel(self.common + 0, sel)
            f |= self.qt.readl(self.common + 4) << (32 * sel)
        return f

    def reset(self):
        self.qt.writeb(self.common + 20, 0)
        assert self.status() == 0

    def init(self, want: int | None = None, msix: bool = False) -> bool:
        """Reset, negotiate (offered & want), set up both queues, DRIVER_OK.
        Returns False if the device refused FEATURES_OK."""
        qt = self.qt
        self.reset()
        qt.writeb(self.common + 20, ST_ACK)
        qt.writeb(self.common + 20, ST_ACK | ST_DRIVER)
        offered = self.device_features()
        self.features = offered if want is None else offered & want
        for sel in (0, 1):
            qt.writel(self.common + 8, sel)
            qt.writel(self.common + 12, (self.features >> (32 * sel)) & 0xFFFFFFFF)
        qt.writeb(self.common + 20, ST_ACK | ST_DRIVER | ST_FEATURES_OK)
        if not self.status() & ST_FEATURES_OK:
            return False
        if msix:
            self._msix_setup()
        self.queues = []
        for q in range(hw.TACC_VIRTIO_NUM_VQS):
            qt.writew(self.common + 22, q)
            size = qt.readw(self.common + 24)
            vq = Queue(self, q, size)
            qt.memset(vq.desc, 0xC000)
            qt.writeq(self.common + 32, vq.desc)
            qt.writeq(self.common + 40, vq.avail)
            qt.writeq(self.common + 48, vq.used)
            if msix:
                qt.writew(self.common + 26, q)
            qt.writew(self.common + 28, 1)
            self.queues.append(vq)
        qt.writeb(self.common + 20, ST_ACK | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK)
        self.buf_next = BUF_BASE
        return True

    def _msix_setup(self):
        qt = self.qt
        cap = qt.find_cap(0, self.devfn, 0x11)
        table = BARS[1] + (qt.cfg_read(0, self.devfn, cap + 4) & ~7)
        for v in range(3):
            qt.writeq(table + 16 * v, MSI_MSG + 4 * v)
            qt.writel(table + 16 * v + 8, 0x200 + v)
            qt.writel(table + 16 * v + 12, 0)
        qt.cfg_write(0, self.devfn, cap + 2, 0x8000, 2)
        qt.writew(self.common + 16, 2)  # config vector

    def config(self) -> dict[str, int]:
        raw = self.qt.memread(self.devcfg, CONFIG.size)
        keys = ("version", "caps", "func", "num_contexts", "num_rings", "max_job_cmds",
                "devmem_size", "page_entries", "rsvd")
        return dict(zip(keys, CONFIG.unpack(raw), strict=True))

    def has(self, bit: int) -> bool:
        return bool(self.features >> bit & 1)

    # ---------------------------------------------------------------- control --
    @property
    def ctrlq(self) -> Queue:
        return self.queues[hw.TACC_VIRTIO_VQ_CONTROL]

    @property
    def subq(self) -> Queue:
        return self.queues[hw.TACC_VIRTIO_VQ_SUBMIT]

    def ctrl_raw(self, req: bytes, in_len: int = RESP.size) -> bytes:
        q = self.ctrlq
        q.add([req], in_len)
        q.kick()
        used = q.pop()
        assert len(used) == 1, used  # the control queue answers before the kick returns
        return used[0][1]

    def ctrl(self, req: bytes) -> tuple[int, int]:
        raw = self.ctrl_raw(req)
        st, _, value = RESP.unpack(raw)
        return st, value

    def ctx_create(self) -> int:
        st, v = self.ctrl(hdr(hw.TACC_VIRTIO_CTX_CREATE))
        assert st == hw.TACC_VIRTIO_OK, st
        return v

    def ctx_destroy(self, ctx: int) -> int:
        return self.ctrl(hdr(hw.TACC_VIRTIO_CTX_DESTROY, ctx))[0]

    def bo_create(self, ctx: int, size: int, pages: list[tuple[int, int]] | None = None,
                  devmem: bool = False) -> tuple[int, int]:
        ents = [] if devmem else (pages or [])
        body = BO_CREATE.pack(size, hw.TACC_VIRTIO_BO_DEVMEM if devmem else 0, len(ents))
        body += b"".join(MEM_ENT.pack(a, n, 0) for a, n in ents)
        return self.ctrl(hdr(hw.TACC_VIRTIO_BO_CREATE, ctx) + body)

    def bo_host(self, ctx: int, addr: int, size: int, page_split: int = 0) -> int:
        """A host BO over guest RAM [addr, addr+size), optionally as page_split-byte
        pieces listed in reverse order (to test scattered pages)."""
        if page_split:
            pages = [(addr + o, page_split) for o in range(0, size, page_split)]
        else:
            pages = [(addr, size)]
        st, h = self.bo_create(ctx, size, pages)
        assert st == hw.TACC_VIRTIO_OK, st
        return h

    def bo_destroy(self, ctx: int, handle: int) -> int:
        return self.ctrl(hdr(hw.TACC_VIRTIO_BO_DESTROY, ctx) + struct.pack("<II", handle, 0))[0]

    def bind(self, ctx: int, handle: int, va: int, size: int, offset: int = 0,
             readonly: bool = False) -> int:
        fl = hw.TACC_VIRTIO_BIND_READONLY if readonly else 0
        return self.ctrl(hdr(hw.TACC_VIRTIO_VM_BIND, ctx) +
                         VM_BIND.pack(handle, fl, va, offset, size))[0]

    def unbind(self, ctx: int, va: int, size: int) -> int:
        return self.ctrl(hdr(hw.TACC_VIRTIO_VM_UNBIND, ctx) + VM_UNBIND.pack(va, size))[0]

    def trace_setup(self, base: int, entries: int, wb: int = 0, enable: int = 1) -> int:
        return self.ctrl(hdr(hw.TACC_VIRTIO_TRACE_SETUP) +
                         TRACE_SETUP.pack(base, wb, entries, enable))[0]

    # ----------------------------------------------------------------- submit --
    @staticmethod
    def batch(jobs: list[Job]) -> bytes:
        return SUBMIT.pack(hw.TACC_VIRTIO_SUBMIT, hw.TACC_VIRTIO_MSG_VERSION, 0, 0, 0,
                           len(jobs), 0) + b"".join(j.pack() for j in jobs)

    def submit(self, jobs: list[Job], kick: bool = True) -> int:
        """Queue one batch (one buffer); returns its head."""
        head = self.subq.add([self.batch(jobs)], SUBMIT_RESP.size + JOB_STATUS.size * len(jobs))
        if kick:
            self.subq.kick()
        return head

    def wait_used(self, n: int = 1, steps: int = 200, ns: int = 100_000):
        """Step the clock until n submit buffers are used; returns their parsed
        responses [(status, njobs, failed, [(seqno, status, index)])]."""
        out: list[tuple[int, int, int, list[tuple[int, int, int]]]] = []
        for _ in range(steps):
            for _, raw in self.subq.pop():
                st, nj, failed, _ = SUBMIT_RESP.unpack_from(raw)
                js = [JOB_STATUS.unpack_from(raw, SUBMIT_RESP.size + JOB_STATUS.size * i)[:3]
                      for i in range((len(raw) - SUBMIT_RESP.size) // JOB_STATUS.size)]
                out.append((st, nj, failed, js))
            if len(out) >= n:
                return out
            self.qt.clock_step(ns)
        raise TimeoutError(f"{len(out)} of {n} submit buffers used")

    def fence(self, ctx: int, ring: int) -> tuple[int, int, int]:
        a = self.shm[hw.TACC_VIRTIO_SHM_FENCES] + (ctx * hw.TACC_VIRTIO_NUM_RINGS + ring) * 16
        return FENCE.unpack(self.qt.memread(a, 16))

    def cnt(self, name: str) -> int:
        return self.qt.readq(self.shm[hw.TACC_VIRTIO_SHM_COUNTERS] + 8 * hw.FUNC_COUNTERS[name])
