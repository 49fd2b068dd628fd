"""Trace ring: one record per command, fields, drop-and-count, write-back."""

import struct

from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.taccdev import DEVMEM_VA, LinkModel


def test_trace_records(dev, pf):
    wb = dev.alloc(4096)
    pf.trace_enable(size=64, wb=wb)
    n = 10000
    src = dev.alloc(n)
    job, ds = pf.job_of(2, [desc(hw.TACC_OP_NOP),
                            d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)], tag=0x77)
    pf.submit(2, ds)
    dev.qt.clock_step(10**8)
    cq = pf.cqes(2)[0]
    assert pf.r32(hw.TACC_REG_TRACE_PROD) == 2
    r = pf.trace_read(0, 2, 64)
    assert [x.seq for x in r] == [0, 1]
    assert r[0].opcode == hw.TACC_OP_NOP and r[0].engine == hw.TACC_ENGINE_LOCAL
    assert r[1].opcode == hw.TACC_OP_COPY_H2D and r[1].engine == hw.TACC_ENGINE_DMA_H2D
    for i, x in enumerate(r):
        assert x.version == hw.TACC_TRACE_VERSION and x.queue == 2 and x.func == 0
        assert x.job == job and x.tag == 0x77 and x.index == i and x.status == 0
        assert x.t_fetch <= x.t_start < x.t_end
    assert r[0].t_start == cq.start and r[1].t_end == cq.end and r[1].t_start == r[0].t_end
    # H2D payload TLPs: the root port's completions, cut at its RCB (64 B)
    assert r[1].bytes == n and r[1].tlps == LinkModel().h2d_bytes(n)[2] == -(-n // 64)
    assert struct.unpack("<II", dev.qt.memread(wb, 8)) == (2, 0)
    assert pf.cnt("trace_records") == 2


def test_trace_drop_never_overwrites(dev, pf):
    pf.trace_enable(size=8)
    g0 = dev.qom_get("x-gt-trace-dropped")
    job, ds = pf.job_of(0, [desc(hw.TACC_OP_NOP) for _ in range(20)])
    pf.submit(0, ds)
    dev.qt.clock_step(10**8)
    assert pf.r32(hw.TACC_REG_TRACE_PROD) == 8
    assert pf.r32(hw.TACC_REG_TRACE_DROPPED) == 12 and pf.cnt("trace_dropped") == 12
    assert dev.qom_get("x-gt-trace-dropped") - g0 == 12
    assert [r.seq for r in pf.trace_read(0, 8, 8)] == list(range(8))  # not overwritten
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_TRACE
    # the consumer catches up: records resume, the seq gap shows the drop
    pf.w32(hw.TACC_REG_TRACE_CONS, 8)
    pf.run_job(0, [desc(hw.TACC_OP_NOP)])
    assert pf.trace_read(8, 9, 8)[0].seq == 20
    assert pf.cnt("trace_records") == 9


def test_sampling(dev, pf):
    base = dev.alloc(64 * 1048)
    pf.w64(hw.TACC_REG_SAMPLE_BASE, base)
    pf.w32(hw.TACC_REG_SAMPLE_SIZE, 4)
    pf.run_job(0, [desc(hw.TACC_OP_NOP)])
    t0 = dev.qt.clock()
    pf.w32(hw.TACC_REG_SAMPLE_PERIOD, 100_000)
    dev.qt.clock_step(650_000)  # 6 periods, ring of 4: 2 dropped
    assert pf.r32(hw.TACC_REG_SAMPLE_PROD) == 4
    assert pf.r32(hw.TACC_REG_SAMPLE_DROPPED) == 2
    for i in range(4):
        raw = dev.qt.memread(base + i * 1048, 1048)
        ver, nslots, seq, clk = struct.unpack_from("<IIQQ", raw)
        slots = struct.unpack_from("<128Q", raw, 24)
        assert ver == 1 and nslots == 128 and seq == i
        assert clk == t0 + (i + 1) * 100_000
        assert slots[hw.FUNC_COUNTERS["cmds_completed"]] == 1
        assert slots[64 + hw.GLOBAL_COUNTERS["uptime_ticks"]] == clk
    pf.w32(hw.TACC_REG_SAMPLE_PERIOD, 0)
