"""tacc.ko and hw 1.3 (docs/uapi.md "SUBMIT with struct drm_tacc_cmd2"): the new
operations and command lists through the driver, one validator for the PF and the
virtio-tacc frontend (the same commands refused with the same errno), and a hostile
list run as the unprivileged tacc-user ending in an error completion.
"""

from __future__ import annotations

import errno
import mmap
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import PAYLOAD, desc
from tacc.runtime.device import devices
from tacc.testing.unpriv import call_as_tacc_user
from test_driver_basic import (
    DEVICE,
    HOST,
    Cmd,
    Dev,
    cmd2,
    copy,
    op,
    run_list,
    submit2,
)

OK = 0


def _node(kind: str, pf_accel: Path) -> Path:
    if kind == "pf":
        return pf_accel
    found = [d for d in devices() if d.virtio]
    if not found:
        pytest.skip("no virtio-tacc function in this boot (the extras boot has one)")
    return Path(found[0].devnode)


def f32bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def elt(op_: int, n: int, *, da: int = 0, dc: int = 0, scalar: float = 0.0) -> bytes:
    """An ELTWISE payload, its addresses zero (the driver writes them)."""
    return PAYLOAD["eltwise"].pack(0, 0, 0, n, op_, f32bits(scalar), da, dc, 0, 0, 0)


def norm(rows: int, cols: int, *, nflags: int = 0, eps: float = 1e-5) -> bytes:
    """A LAYER NORM payload (fp32), its addresses zero."""
    return PAYLOAD["norm"].pack(0, 0, 0, 0, rows, cols, cols, cols, f32bits(eps),
                                hw.TACC_NORM_LAYER, 0, 0, 0, nflags, 0, 0)


def errno_of(fn) -> int:
    try:
        fn()
    except OSError as e:
        return e.errno or 0
    return 0


class Bufs:
    """A mapped host BO and a device BO (auto-bound: their VAs are known)."""

    def __init__(self, dev: Dev, size: int = 1 << 20) -> None:
        self.dev, self.size = dev, size
        self.host = dev.bo(size, HOST)
        self.devbo = dev.bo(size, DEVICE)
        self.mem = dev.map(self.host.handle, size)

    def put(self, off: int, data: bytes) -> None:
        self.mem[off:off + len(data)] = data

    def get(self, off: int, n: int) -> bytes:
        return bytes(self.mem[off:off + n])


def run_list_job(dev: Dev, b: Bufs, listed: list[bytes], list_off: int, *, params=()) -> int:
    """The raw descriptors (device VAs) at host offset list_off, run by one LIST."""
    return run_list(dev, b.host.handle, b.mem, list_off, listed, params=params)


@pytest.mark.parametrize("kind", ["pf", "virtio"])
def test_ops_and_a_list_through_the_driver(pf_accel, kind):
    with Dev(_node(kind, pf_accel)) as dev:
        b = Bufs(dev)
        n = 1024
        x = np.linspace(-2, 2, n, dtype=np.float32)
        b.put(0, x.tobytes())
        h, d = b.host.handle, b.devbo.handle
        # H2D, EXP (cmd2), D2H: one job of both command forms
        jobs = [cmd2(hw.TACC_OP_COPY_H2D, PAYLOAD["copy"].pack(0, 0, 4 * n), [(h, 0), (d, 0)]),
                cmd2(hw.TACC_OP_ELTWISE, elt(hw.TACC_ELT_EXP, n, dc=hw.TACC_DT_BF16),
                     [(d, 0), (0, 0), (d, 8192)]),
                cmd2(hw.TACC_OP_COPY_D2H, PAYLOAD["copy"].pack(0, 0, 2 * n),
                     [(d, 8192), (h, 65536)])]
        assert dev.wait(submit2(dev, jobs)) == OK
        got = np.frombuffer(b.get(65536, 2 * n), ml_dtypes.bfloat16).astype(np.float64)
        ref = np.exp(x.astype(np.float64))
        assert np.all(np.abs(got - ref) <= 2.0 ** -7 * ref + 1e-5 * ref.max())
        # a LIST in host memory: two listed commands on the device BO's VAs
        va = b.devbo.va
        listed = [desc(hw.TACC_OP_ELTWISE, payload=PAYLOAD["eltwise"].pack(
                      va, 0, va + 16384, n, hw.TACC_ELT_SCALE, f32bits(3.0), 0, 0, 0, 0, 0)),
                  desc(hw.TACC_OP_COPY_D2D, payload=PAYLOAD["copy"].pack(
                      va + 16384, va + 32768, 4 * n))]
        assert run_list_job(dev, b, listed, 4096) == OK
        assert dev.run([copy(hw.TACC_OP_COPY_D2H, d, h, 4 * n, soff=32768,
                             doff=131072)]) == OK
        np.testing.assert_array_equal(np.frombuffer(b.get(131072, 4 * n), np.float32), x * 3)


@pytest.mark.parametrize("kind", ["pf", "virtio"])
def test_norm_stats_through_the_driver(pf_accel, kind):
    """hw 1.5 NORM_STATS: op[4] receives each row's mean and 1/sqrt(var + eps), float32,
    on every function kind (the CAPS bit is reported)."""
    with Dev(_node(kind, pf_accel)) as dev:
        assert dev.param(2) & hw.TACC_CAP_NORM_STATS    # DRM_TACC_PARAM_CAPS
        b = Bufs(dev)
        rows, cols = 8, 64
        x = (np.random.default_rng(5).standard_normal((rows, cols)) * 2 + 1).astype(np.float32)
        gb = np.concatenate([np.ones(cols), np.zeros(cols)]).astype(np.float32)
        b.put(0, x.tobytes())
        b.put(65536, gb.tobytes())
        h, d = b.host.handle, b.devbo.handle
        cp = PAYLOAD["copy"]
        jobs = [cmd2(hw.TACC_OP_COPY_H2D, cp.pack(0, 0, x.nbytes), [(h, 0), (d, 0)]),
                cmd2(hw.TACC_OP_COPY_H2D, cp.pack(0, 0, gb.nbytes), [(h, 65536), (d, 65536)]),
                cmd2(hw.TACC_OP_NORM, norm(rows, cols, nflags=hw.TACC_NORM_F_STATS),
                     [(d, 0), (d, 131072), (d, 65536), (d, 65536 + 4 * cols), (d, 196608)]),
                cmd2(hw.TACC_OP_COPY_D2H, cp.pack(0, 0, 8 * rows), [(d, 196608), (h, 262144)])]
        assert dev.wait(submit2(dev, jobs)) == OK
        got = np.frombuffer(b.get(262144, 8 * rows), np.float32).astype(np.float64)
        xf = x.astype(np.float64)
        assert np.max(np.abs(got[:rows] - xf.mean(1))) <= 1e-6 * np.max(np.abs(xf))
        assert np.max(np.abs(got[rows:] * np.sqrt(xf.var(1) + 1e-5) - 1)) <= 1e-5


@pytest.mark.parametrize("kind", ["pf", "virtio"])
def test_one_validator_for_every_function_kind(pf_accel, kind):
    """The same bad commands, the same -EINVAL, on a PF and on virtio-tacc (the PF
    accepted a COPY with a value and non-zero unused GEMM fields; virtio refused them)."""
    with Dev(_node(kind, pf_accel)) as dev:
        b = Bufs(dev)
        h, d = b.host.handle, b.devbo.handle
        bad_v1 = {
            "copy_with_value": copy(hw.TACC_OP_COPY_H2D, h, d, 64),
            "gemm_with_elt_op": Cmd(opcode=hw.TACC_OP_GEMM, a=op(d), b=op(d), c=op(d), m=4, n=4,
                                    k=4, lda=4, ldb=4, ldc=4, elt_op=1),
            "gemm_ld_past_device_limit": Cmd(opcode=hw.TACC_OP_GEMM, a=op(d), b=op(d),
                                             c=op(d), m=1, n=4, k=4, lda=1 << 17, ldb=4,
                                             ldc=4),
            "relu_with_scalar": Cmd(opcode=hw.TACC_OP_ELTWISE, a=op(d), c=op(d), size=16,
                                    elt_op=2, scalar=f32bits(2.0)),
        }
        bad_v1["copy_with_value"].value = 1
        for name, c in bad_v1.items():
            assert errno_of(lambda c=c: dev.submit([c])) == errno.EINVAL, name
        bad_v2 = {
            "fill_is_kernel_only": cmd2(hw.TACC_OP_FILL, PAYLOAD["fill"].pack(0, 4096, 0), []),
            "unknown_dtype": cmd2(hw.TACC_OP_ELTWISE, elt(hw.TACC_ELT_EXP, 16, da=7),
                                  [(d, 0), (0, 0), (d, 4096)]),
            "address_field_set": cmd2(hw.TACC_OP_ELTWISE, PAYLOAD["eltwise"].pack(
                0, 0, 0x1000, 16, hw.TACC_ELT_EXP, 0, 0, 0, 0, 0, 0),
                [(d, 0), (0, 0), (d, 4096)]),
            "unused_operand_set": cmd2(hw.TACC_OP_ELTWISE, elt(hw.TACC_ELT_EXP, 16),
                                       [(d, 0), (0, 0), (d, 4096), (d, 0)]),
            "compute_on_host_bo": cmd2(hw.TACC_OP_ELTWISE, elt(hw.TACC_ELT_EXP, 16),
                                       [(h, 0), (0, 0), (d, 4096)]),
            "softmax_past_its_bo": cmd2(hw.TACC_OP_SOFTMAX, PAYLOAD["softmax"].pack(
                0, 0, 8192, 64, 64, 64, f32bits(1.0), 0, 0, 0, 0, 0, 0), [(d, 0), (d, 0)]),
            "list_id_zero": cmd2(hw.TACC_OP_LIST, PAYLOAD["list"].pack(
                0, 0, 1, 0, 0, 0, *([0] * 16), 0), [(h, 0)]),
            "list_past_its_bo": cmd2(hw.TACC_OP_LIST, PAYLOAD["list"].pack(
                0, 0, 65536, 0, 1, 0, *([0] * 16), 0), [(h, 0)]),
            # NORM's statistics (hw 1.5): 2 x 8 floats do not fit in the last 32 bytes
            "norm_stats_past_its_bo": cmd2(hw.TACC_OP_NORM, norm(
                8, 8, nflags=hw.TACC_NORM_F_STATS), [(d, 0), (d, 4096), (d, 8192), (d, 8224),
                                                     (d, b.size - 32)]),
            "norm_unknown_flag": cmd2(hw.TACC_OP_NORM, norm(8, 8, nflags=2),
                                      [(d, 0), (d, 4096), (d, 8192), (d, 8224)]),
            "norm_stats_operand_without_flag": cmd2(hw.TACC_OP_NORM, norm(8, 8), [
                (d, 0), (d, 4096), (d, 8192), (d, 8224), (d, 12288)]),
            "norm_stats_on_host_bo": cmd2(hw.TACC_OP_NORM, norm(
                8, 8, nflags=hw.TACC_NORM_F_STATS), [(d, 0), (d, 4096), (d, 8192), (d, 8224),
                                                     (h, 0)]),
        }
        for name, c in bad_v2.items():
            assert errno_of(lambda c=c: submit2(dev, [c])) == errno.EINVAL, name
        assert dev.run([Cmd(opcode=hw.TACC_OP_NOP)]) == OK  # the file still works


def hostile_list(node: str) -> list[int]:
    """As tacc-user: a list with FILL, one with a BARRIER, one pointing at itself.  The three
    job statuses and whether the memory the FILL named is intact (1)."""
    with Dev(node) as dev:
        b = Bufs(dev)
        n = 256
        b.put(0, np.full(n, 7, np.float32).tobytes())
        h, d = b.host.handle, b.devbo.handle
        assert dev.run([copy(hw.TACC_OP_COPY_H2D, h, d, 4 * n)]) == OK
        fill = desc(hw.TACC_OP_FILL, payload=PAYLOAD["fill"].pack(0, 1 << 20, 0x4141))
        barrier = desc(hw.TACC_OP_BARRIER)
        selfref = desc(hw.TACC_OP_LIST, payload=PAYLOAD["list"].pack(
            b.host.va + 8192, 0, 1, 0, 9, 0, *([0] * 16), 0))
        st = [run_list_job(dev, b, [fill], 4096), run_list_job(dev, b, [barrier], 4096),
              run_list_job(dev, b, [selfref], 8192)]
        assert dev.run([copy(hw.TACC_OP_COPY_D2H, d, h, 4 * n, doff=65536)]) == OK
        intact = np.all(np.frombuffer(b.get(65536, 4 * n), np.float32) == 7)
        return [int(x) for x in st] + [int(intact)]


@pytest.mark.parametrize("kind", ["pf", "virtio"])
def test_hostile_list_as_tacc_user(pf_accel, kind):
    node = _node(kind, pf_accel)
    fill, barrier, selfref, intact = call_as_tacc_user(hostile_list, str(node))
    assert (fill, barrier, selfref) == (-errno.EINVAL,) * 3  # NOT_PERMITTED, BAD_LIST
    assert intact == 1  # the listed FILL wrote nothing


def test_trace_v3_records_carry_flops_and_list_id(pf_accel):
    """TRACE_OPEN with DRM_TACC_TRACE_F_V3: 128-byte records with FLOPs, bytes, list id."""
    from test_driver_basic import TRACE_CLOSE, TRACE_OPEN, TraceClose, TraceOpen
    with Dev(pf_accel) as dev:
        t = dev.ioctl(TRACE_OPEN, TraceOpen(flags=hw.DRM_TACC_TRACE_F_V3, entries=64))
        try:
            m = mmap.mmap(dev.fd, t.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ,
                          offset=t.mmap_offset)
            hdr = struct.unpack_from("<IIII", m, 0)
            assert hdr[1] == 128 and hdr[3] == hw.TACC_TRACE_VERSION_3
            b = Bufs(dev)
            va = b.devbo.va
            listed = [desc(hw.TACC_OP_ELTWISE, payload=PAYLOAD["eltwise"].pack(
                va, 0, va + 4096, 512, hw.TACC_ELT_GELU, 0, 0, 0, 0, 0, 0), tag=0x1234)]
            assert run_list_job(dev, b, listed, 0) == OK
            recs = [bytes(m[4096 + i * 128:4096 + (i + 1) * 128]) for i in range(2)]
            assert [r[1] for r in recs] == [hw.TACC_OP_ELTWISE, hw.TACC_OP_LIST]
            flops, rd, wr, list_id = struct.unpack_from("<QQQI", recs[0], 64)
            assert (flops, rd, wr, list_id) == (512 * 8, 2048, 2048, 7)
            assert struct.unpack_from("<Q", recs[0], 16)[0] == 0x1234
            m.close()
        finally:
            dev.ioctl(TRACE_CLOSE, TraceClose())
