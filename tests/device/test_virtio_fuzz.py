"""Fuzz of virtio-tacc (docs/virtio.md): malformed virtqueue descriptors and
malformed control and submit messages from a seeded generator.  QEMU must never
crash or hang, every buffer the device can reach is used exactly once with a
documented status, a broken device recovers with a reset, and afterwards the
function, and the PF beside it, still work.

Default: 10,000 cases (about 9,000 messages in batches of 48 buffers per kick,
1,000 descriptor-level cases); ``-m long``: 100,000 with other seeds.
"""

from __future__ import annotations

import random
import struct

import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_gemm, desc
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import Tacc
from tacc.testing.virtiodev import (
    BO_CREATE,
    JOB,
    MEM_ENT,
    RESP,
    ST_NEEDS_RESET,
    SUBMIT_RESP,
    TRACE_SETUP,
    VM_BIND,
    VM_UNBIND,
    Job,
    VirtioTacc,
    device_arg,
    hdr,
)

CHUNK = 48  # buffers per kick (2 descriptors each)
STATUSES = set(range(10))  # enum tacc_virtio_status
HOST_VA, DEV_VA = 0x1000_0000, 0x40_0000_0000
PF_BAR0 = 0xC000_0000
CTRL_TYPES = [hw.TACC_VIRTIO_CTX_CREATE, hw.TACC_VIRTIO_CTX_DESTROY, hw.TACC_VIRTIO_BO_CREATE,
              hw.TACC_VIRTIO_BO_DESTROY, hw.TACC_VIRTIO_VM_BIND, hw.TACC_VIRTIO_VM_UNBIND,
              hw.TACC_VIRTIO_TRACE_SETUP, hw.TACC_VIRTIO_TRACE_CONSUME]


class Gen:
    """Seeded generator of hostile requests, biased to the checks' boundaries."""

    def __init__(self, seed: int, data: int):
        self.r = random.Random(seed)
        self.data = data  # 1 MiB of guest RAM the valid-looking BOs point at
        self.handles = [1, 2, 3]

    def u(self, bits: int) -> int:
        r = self.r
        return r.choice([0, 1, 2**bits - 1, 2**(bits - 1), r.getrandbits(bits),
                         r.getrandbits(bits), r.randrange(0, 64)])

    def addr(self) -> int:
        r = self.r
        return r.choice([self.data, self.data + r.randrange(0, 256) * 4096, self.data + 1,
                         PF_BAR0, 0xFEE0_0000, 0x1_0000_0000_0000, 2**64 - 4096, 0,
                         r.getrandbits(64) & ~0xFFF, r.getrandbits(64)])

    def size(self) -> int:
        r = self.r
        return r.choice([4096, 8192, 1 << 20, 0, 1, 4095, 2**32, 2**32 + 4096, 2**64 - 4096,
                         r.randrange(1, 64) * 4096, r.getrandbits(64)])

    def ctx(self) -> int:
        return self.r.choice([0, 0, 1, 2, 15, 16, 2**32 - 1, self.r.getrandbits(32)])

    def va(self) -> int:
        r = self.r
        return r.choice([HOST_VA, DEV_VA, HOST_VA + r.randrange(0, 64) * 4096, 1 << 39,
                         (1 << 39) - 4096, 0, HOST_VA + 8, r.getrandbits(64)])

    def body(self, typ: int) -> bytes:
        r = self.r
        if typ == hw.TACC_VIRTIO_BO_CREATE:
            n = r.choice([0, 1, 2, 3, r.randrange(0, 40)])
            size = self.size()
            dev = r.random() < 0.3
            b = BO_CREATE.pack(size & (2**64 - 1), hw.TACC_VIRTIO_BO_DEVMEM if dev else
                               r.choice([0, 0, 2, r.getrandbits(32)]), r.choice([n, n, n + 1,
                                                                                  2**32 - 1]))
            ln = r.choice([size, 4096, size // max(n, 1), 2**32 - 4096, r.getrandbits(32)])
            return b + b"".join(MEM_ENT.pack(self.addr(), ln & (2**32 - 1), 0) for _ in range(n))
        if typ == hw.TACC_VIRTIO_BO_DESTROY:
            return struct.pack("<II", r.choice([*self.handles, self.u(32)]), 0)
        if typ == hw.TACC_VIRTIO_VM_BIND:
            return VM_BIND.pack(r.choice([*self.handles, self.u(32)]), r.choice([0, 1, 2]),
                                self.va(), r.choice([0, 4096, self.u(64)]), self.size())
        if typ == hw.TACC_VIRTIO_VM_UNBIND:
            return VM_UNBIND.pack(self.va(), self.size())
        if typ == hw.TACC_VIRTIO_TRACE_SETUP:
            return TRACE_SETUP.pack(r.choice([0, self.data, self.data + 32, self.addr()]),
                                    r.choice([0, self.data + 0x80000, 7, self.addr()]),
                                    r.choice([64, 2, 1, 3, 1 << 20, (1 << 20) + 1, self.u(32)]),
                                    r.choice([0, 1, 2]))
        if typ == hw.TACC_VIRTIO_TRACE_CONSUME:
            return struct.pack("<II", self.u(32), 0)
        return b""

    def mutate(self, msg: bytes) -> bytes:
        r = self.r
        m = bytearray(msg)
        for _ in range(r.choice([0, 0, 1, 1, 2, 5])):
            how = r.random()
            if how < 0.3 and m:
                m = m[:r.randrange(0, len(m))]
            elif how < 0.5:
                m += bytes(r.getrandbits(8) for _ in range(r.choice([1, 4, 8, 16, 128])))
            elif m:
                i = r.randrange(0, len(m))
                m[i] = r.getrandbits(8)
        return bytes(m) or b"\0"  # zero-sized buffers are descriptor_round's

    def control(self) -> bytes:
        r = self.r
        typ = r.choice([*CTRL_TYPES, *CTRL_TYPES, hw.TACC_VIRTIO_SUBMIT, 0, 0x77, self.u(16)])
        h = hdr(typ & 0xFFFF, self.ctx(), self.u(64),
                version=r.choice([1, 1, 1, 1, 0, 2, 255]), flags=r.choice([0, 0, 0, 0, 1]))
        return self.mutate(h + self.body(typ))

    def command(self) -> bytes:
        r = self.r
        op = r.choice([hw.TACC_OP_NOP, hw.TACC_OP_COPY_H2D, hw.TACC_OP_COPY_D2H,
                       hw.TACC_OP_COPY_D2D, hw.TACC_OP_GEMM, hw.TACC_OP_FENCE, hw.TACC_OP_FILL,
                       hw.TACC_OP_BARRIER, hw.TACC_OP_TIMESTAMP, hw.TACC_OP_MAX,
                       r.getrandbits(8)])
        kw = {"flags": r.getrandbits(8), "ctx": self.u(16), "tag": self.u(64)}
        if op in (hw.TACC_OP_COPY_H2D, hw.TACC_OP_COPY_D2H, hw.TACC_OP_COPY_D2D):
            return d_copy(op, self.va(), self.va(), r.choice([8, 4096, 1 << 16, self.u(32)]),
                          **kw)
        if op == hw.TACC_OP_GEMM:
            m, n, k = (r.choice([1, 8, 16, 0, 4097]) for _ in range(3))
            return d_gemm(self.va(), self.va(), self.va(), m, n, k, k, n, n, **kw)
        if op == hw.TACC_OP_FILL:
            return desc(op, payload=struct.pack("<QQQ", self.va(), r.choice([8, 4096, 7, 0]),
                                                self.u(64)), **kw)
        return desc(op, payload=bytes(r.getrandbits(8) for _ in range(r.choice([0, 24]))),
                    **kw)

    def submit(self, seq: list[int]) -> bytes:
        r = self.r
        njobs = r.choice([1, 1, 2, 3, 0, 257, self.u(32)])
        jobs = b""
        for _ in range(min(njobs, 4)):
            ctx = r.choice([0, 0, 1, 16, self.u(32)])
            ring = r.choice([0, 1, 2, 3, 4, self.u(16)])
            ncmds = r.choice([1, 1, 2, 3, 0, 257, self.u(16)])
            seq[0] += 1
            s = r.choice([seq[0], seq[0], 0, seq[0] - 2, self.u(64)])
            jobs += JOB.pack(ctx & (2**32 - 1), ring & 0xFFFF, ncmds & 0xFFFF, s & (2**64 - 1),
                             self.u(64), r.choice([0, 0, 0, 1]))
            jobs += b"".join(self.command() for _ in range(min(ncmds, 3)))
        sub = struct.pack("<HBBIQII", r.choice([hw.TACC_VIRTIO_SUBMIT] * 6 + [1, self.u(16)]),
                          r.choice([1, 1, 1, 0, 2]), r.choice([0, 0, 0, 1]), 0, self.u(64),
                          njobs & (2**32 - 1), r.choice([0, 0, 0, 1]))
        return self.mutate(sub + jobs) if r.random() < 0.5 else sub + jobs


@pytest.fixture(scope="module")
def fz():
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc("sriov-max-vfs=2",
             extra=device_arg(props=f"devmem-base={192 << 20:#x},devmem-size={64 << 20:#x}"))
    d.qt.reply_timeout = 60.0  # a hang fails the test instead of blocking it
    yield d, VirtioTacc(d)
    d.close()


def alive(d: Tacc):
    if d.qt.proc.poll() is not None:  # died() itself waits 2 s for a live QEMU
        pytest.fail(d.qt.died())


def recover(v: VirtioTacc) -> int:
    """Re-initialise when the device marked itself broken; returns 1 if it did."""
    if v.status() & ST_NEEDS_RESET or not v.status():
        assert v.init()
        v.ctx_create()
        return 1
    return 0


def setup_ctx(v: VirtioTacc, data: int):
    """Two contexts, a host BO and a devmem BO bound, as real drivers make them."""
    assert v.init()
    for _ in range(2):
        v.ctx_create()
    st, h = v.bo_create(0, 1 << 20, [(data, 1 << 20)])
    assert st == 0 and v.bind(0, h, HOST_VA, 1 << 20) == 0
    st, h = v.bo_create(0, 1 << 20, devmem=True)
    assert st == 0 and v.bind(0, h, DEV_VA, 1 << 20) == 0


def message_round(v: VirtioTacc, g: Gen, n: int, seq: list[int]) -> int:
    """n messages on both queues in chunks; every buffer is used once."""
    done = 0
    while done < n:
        k = min(CHUNK, n - done)
        ctrl = [g.control() for _ in range(k // 2)]
        sub = [g.submit(seq) for _ in range(k - k // 2)]
        with v.qt.deferred():
            for m in ctrl:
                v.ctrlq.add([m], RESP.size)
            for m in sub:
                v.subq.add([m], SUBMIT_RESP.size + 16 * 4)
        v.ctrlq.kick()
        v.subq.kick()
        got = v.ctrlq.pop()
        assert len(got) == len(ctrl), (len(got), len(ctrl))
        for _, raw in got:
            assert RESP.unpack(raw)[0] in STATUSES
        used = []
        for _ in range(400):
            used += v.subq.pop()
            if len(used) == len(sub):
                break
            v.qt.clock_step(1_000_000)
        assert len(used) == len(sub), "submit buffers not all used: a hang"
        for _, raw in used:
            assert SUBMIT_RESP.unpack_from(raw)[0] in STATUSES
        done += k
    return n


def descriptor_round(v: VirtioTacc, g: Gen, n: int) -> tuple[int, int]:
    """n hostile descriptor chains; returns (cases, resets)."""
    r = g.r
    resets = 0
    for _ in range(n):
        q = r.choice(v.queues)
        kind = r.randrange(9)
        i = q.free[0]
        j = q.free[1]
        good = v.buf(hdr(hw.TACC_VIRTIO_CTX_CREATE))
        if kind == 0:  # no writable part
            q.raw_desc(i, good, 16, 0, 0)
        elif kind == 1:  # only writable
            q.raw_desc(i, good, 16, 2, 0)
        elif kind == 2:  # unmapped / MMIO / huge addresses
            q.raw_desc(i, g.addr(), r.choice([16, 4096, 2**32 - 1]), r.choice([0, 2]), 0)
        elif kind == 3:  # loop
            q.raw_desc(i, good, 16, 1, j)
            q.raw_desc(j, good, 16, 1 | 2, i)
        elif kind == 4:  # next out of the ring
            q.raw_desc(i, good, 16, 1, q.size + r.randrange(0, 1000))
        elif kind == 5:  # zero length parts
            q.raw_desc(i, good, 0, 1, j)
            q.raw_desc(j, good, 0, 2, 0)
        elif kind == 6:  # indirect table: bogus
            tbl = v.buf(struct.pack("<QIHH", g.addr(), 16, r.choice([0, 1, 4]),
                                    r.randrange(0, 4)) * 4)
            q.raw_desc(i, tbl, r.choice([64, 16, 0, 17, 2**32 - 16]), 4, 0)
        elif kind == 7:  # write part over the ring itself
            q.raw_desc(i, good, 16, 1, j)
            q.raw_desc(j, q.desc, 64, 2, 0)
        else:  # avail index jumps
            v.qt.memwrite(q.avail + 2, struct.pack("<H", (q.avail_idx + r.choice(
                [q.size + 1, 0x8000, 2])) & 0xFFFF))
            q.kick()  # QEMU marks it broken, or would re-read stale slots: reset
            assert v.init()
            v.ctx_create()
            resets += 1
            continue
        q.free.remove(i)
        q.heads[i] = ([i], 0, 0)
        if kind in (3, 5, 7):
            q.free.remove(j)
            q.heads[i] = ([i, j], 0, 0)
        q.raw_avail(i)
        q.kick()
        if q is v.subq:
            v.qt.clock_step(100_000)
        if not recover(v):
            q.pop()
        else:
            resets += 1
        alive(v.dev)
    return n, resets


def run(fz, seed: int, n_msgs: int, n_desc: int):
    d, v = fz
    data = d.alloc(1 << 20)
    g = Gen(seed, data)
    setup_ctx(v, data)
    seq = [0]
    total = message_round(v, g, n_msgs, seq)
    alive(d)
    n, resets = descriptor_round(v, g, n_desc)
    total += n
    alive(d)
    # the function still works after a reset ...
    setup_ctx(v, data)
    v.submit([Job(0, 0, 1, [desc(hw.TACC_OP_NOP)]),
              Job(0, 1, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEV_VA, 4096)])])
    [(st, nj, failed, _)] = v.wait_used()
    assert (st, nj, failed) == (0, 2, 0)
    # ... and so does the PF beside it
    d.pf.reset()
    d.pf.set_ptbr(0, d.map_default(0x2000_0000, 128 << 20))
    assert d.pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == 0
    return total, resets


def test_fuzz_virtio(fz):
    total, resets = run(fz, 16, 9_000, 1_000)
    assert total >= 10_000 and resets > 0


@pytest.mark.long
def test_fuzz_virtio_long(fz):
    total = 0
    for seed in range(100, 110):
        t, _ = run(fz, seed, 9_000, 1_000)
        total += t
    assert total >= 100_000
