"""Hypothesis fuzz of descriptor fields: every descriptor ends in a documented
status, one CQE per job, and the device keeps working (no crash, hang, assert).

Each example is a batch of descriptors behind one doorbell; >= 2,000
descriptors in total.
"""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tacc import hw
from tacc.testing.taccdev import DEVMEM_VA

BATCH = 20
EXAMPLES = 110
FUZZ_CTX = 3
HOST_VA = 0x20_0000_0000  # 2 MiB of host memory in the fuzz context
DEV_VA = DEVMEM_VA  # 2 MiB of device memory in the fuzz context
STATUSES = set(range(hw.TACC_ST_BAD_INDEX + 1))  # enum tacc_status (hw 1.3: 8, 9, 10)

u64 = st.integers(0, 2**64 - 1)
addr = st.one_of(
    st.builds(lambda o: HOST_VA + o, st.integers(0, (2 << 20) + 4096)),
    st.builds(lambda o: DEV_VA + o, st.integers(0, (2 << 20) + 4096)),
    st.sampled_from([0, 1, 4, 2**39, 2**64 - 8, HOST_VA - 8, DEV_VA + (2 << 20) - 4]),
    u64,
)
length = st.one_of(st.integers(0, 3 << 20), st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64 - 1]),
                   u64)
dim = st.one_of(st.integers(0, 24), st.sampled_from([4096, 4097, 2**31, 2**32 - 1]))
f32bits = st.one_of(st.sampled_from([0, 0x3F800000, 0x7FC00000, 0x7F800000, 0x80000000]),
                    st.integers(0, 2**32 - 1))


@st.composite
def descriptor(draw):
    op = draw(st.one_of(st.integers(0, hw.TACC_OP_MAX), st.integers(0, 255)))
    flags = draw(st.integers(0, 255)) | hw.TACC_DESC_F_LAST
    ctx = draw(st.sampled_from([FUZZ_CTX, FUZZ_CTX, FUZZ_CTX, 4, 15, 16, 65535]))
    tag = draw(u64)
    kind = draw(st.sampled_from(["copy", "gemm", "elt", "fence", "rows", "list", "raw"]))
    if kind == "copy":
        payload = struct.pack("<QQQ", draw(addr), draw(addr), draw(length))
    elif kind == "gemm":
        m, n, k = draw(dim), draw(dim), draw(dim)
        if m * n * k > 1 << 16 and max(m, n, k) <= 4096:
            m = min(m, 16)  # keep real compute small; limits are still probed
        lds = [draw(st.one_of(st.integers(0, 64), st.sampled_from([4096, 65536, 2**32 - 1])))
               for _ in range(3)]
        payload = struct.pack("<QQQIIIIIIII", draw(addr), draw(addr), draw(addr), m, n, k,
                              *lds, draw(f32bits), draw(f32bits))
    elif kind == "elt":
        payload = struct.pack("<QQQQII", draw(addr), draw(addr), draw(addr),
                              draw(st.one_of(st.integers(0, 5000), length)),
                              draw(st.integers(0, 6)), draw(f32bits))
    elif kind == "fence":
        payload = struct.pack("<QQ", draw(addr), draw(u64))
    elif kind == "rows":  # SOFTMAX / NORM / GATHER shapes, dtypes and flags (hw 1.3);
        # NORM's nflags, reserved word and statistics address (hw 1.5)
        payload = struct.pack("<QQQQIIIIIBBBBIIQ", draw(addr), draw(addr), draw(addr),
                              draw(addr), draw(dim), draw(dim), draw(dim), draw(dim),
                              draw(f32bits), *(draw(st.integers(0, 3)) for _ in range(5)),
                              draw(st.integers(0, 1)), draw(addr))
    elif kind == "list":  # a LIST: count, patches, params (hw 1.3)
        payload = struct.pack("<QQIIII16IQ", draw(addr), draw(addr),
                              draw(st.one_of(st.integers(0, 8), st.sampled_from([65536, 65537]))),
                              draw(st.integers(0, 3)), draw(st.integers(0, 3)), 0,
                              *(draw(st.integers(0, 2**32 - 1)) for _ in range(16)), 0)
    else:
        payload = draw(st.binary(min_size=104, max_size=104))
    return op, flags, ctx, tag, payload


def expected_static(op, ctx, payload):
    """Statuses decided by the descriptor alone (None: depends on memory)."""
    payload = payload.ljust(104, b"\0")
    if op >= hw.TACC_OP_MAX:
        return hw.TACC_ST_BAD_OPCODE
    if op in (hw.TACC_OP_NOP, hw.TACC_OP_BARRIER):
        return hw.TACC_ST_OK
    if op == hw.TACC_OP_FILL:  # window offsets, no context
        dst, n = struct.unpack_from("<QQ", payload, 0)
        if n == 0 or n >= 2**32 or n & 7:
            return hw.TACC_ST_BAD_LENGTH
        return hw.TACC_ST_BAD_ALIGN if dst & 7 else None
    if ctx >= hw.TACC_NUM_CONTEXTS:
        return hw.TACC_ST_BAD_CTX
    if op in (hw.TACC_OP_COPY_H2D, hw.TACC_OP_COPY_D2H, hw.TACC_OP_COPY_D2D):
        n = struct.unpack_from("<Q", payload, 16)[0]
        if n == 0 or n >= 2**32:
            return hw.TACC_ST_BAD_LENGTH
    if op in (hw.TACC_OP_FENCE, hw.TACC_OP_TIMESTAMP):
        if struct.unpack_from("<Q", payload, 0)[0] & 7:
            return hw.TACC_ST_BAD_ALIGN
    return None


def test_fuzz_descriptors(dev, pf):
    run_fuzz(dev, pf, EXAMPLES, derandomize=True)


@pytest.mark.long
def test_fuzz_descriptors_long(dev, pf):
    """>= 10,000 random descriptors (a new seed each run)."""
    run_fuzz(dev, pf, 500, derandomize=False)


def run_fuzz(dev, pf, examples, derandomize):
    root = dev.pt.new_root()
    host = dev.alloc(2 << 20, align=2 << 20)
    dev.pt.map(root, HOST_VA, host, 2 << 20, huge=True)
    dev.pt.map(root, DEV_VA, 32 << 20, 2 << 20, devmem=True, huge=True)
    dev.pt.flush()
    pf.setup_queue(0, sq_size=64, cq_size=64)
    pf.set_ptbr(FUZZ_CTX, root)
    pf.trace_enable(size=64)
    seen = {"n": 0, "status": {}}

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(descriptor(), min_size=BATCH, max_size=BATCH))
    def batch(descs):
        raw, jobs = [], []
        for i, (op, flags, ctx, tag, payload) in enumerate(descs):
            pf.job += 1
            jobs.append(pf.job)
            hdr = struct.pack("<BBHHHIIQ", op, flags, ctx, i, 0, pf.job, 0, tag)
            raw.append((hdr + payload).ljust(128, b"\0")[:128])
        c0 = pf.cnt("cmds_completed")
        pf.submit(0, raw)
        pf.dev.qt.clock_step(10**9)
        cq = pf.cqes(0)
        assert [c.job for c in cq] == jobs
        for c, (op, _, ctx, tag, payload) in zip(cq, descs, strict=False):
            assert c.status in STATUSES and c.tag == tag and c.queue == 0
            assert c.start <= c.end
            want = expected_static(op, ctx, payload)
            if want is not None:
                assert c.status == want, (op, ctx, payload.hex())
            seen["status"][c.status] = seen["status"].get(c.status, 0) + 1
        assert pf.cnt("cmds_completed") - c0 == BATCH
        assert pf.qstatus(0) & hw.TACC_Q_STATUS_IDLE and not pf.qstatus(0) & 2
        assert pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
        pf.w32(hw.TACC_REG_TRACE_CONS, pf.r32(hw.TACC_REG_TRACE_PROD))
        pf.w32(hw.TACC_REG_FAULT_CLEAR, 1)
        seen["n"] += BATCH

    batch()
    assert seen["n"] >= min(2000, examples * BATCH)
    # every documented error class was reached
    for s in (hw.TACC_ST_OK, hw.TACC_ST_BAD_OPCODE, hw.TACC_ST_BAD_LENGTH,
              hw.TACC_ST_MMU_FAULT, hw.TACC_ST_BAD_CTX, hw.TACC_ST_BAD_ALIGN):
        assert seen["status"].get(s, 0) > 0, seen
    # the device still does real work afterwards
    pf.setup_queue(0)
    assert pf.run_job(0, [struct.pack("<BBHHHIIQ", 0, 0, 0, 0, 0, 0, 0, 0).ljust(128, b"\0")
                          ]).status == 0
