"""Trace records of version 3 in captures (capture minor 12): the ring reader copies the
128-byte records' FLOPs, bytes and list fields into the device_trace stream; older
captures (72-byte records) read widened, those columns zero; the GEMM shape solver of
the roofline rules recovers m, n, k from a record."""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
from math import isqrt
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from realcaps import DATA, extract
from tacc import hw
from tacc.analyze import roofline
from tacc.capture import CaptureWriter, open_capture
from tacc.capture import writer as w
from tacc.capture.schema import (
    DEVICE_TRACE_DTYPE,
    DEVICE_TRACE_V2_DTYPE,
    FORMAT_MINOR,
    TRACE_REC3_SIZE,
    TRACE_REC_DTYPE,
    TRACE_V3_TAIL,
)
from tacc.daemon.devring import RingView
from tacc.runtime import uapi

V3_FIELDS = [n for n, _ in TRACE_V3_TAIL]
# struct tacc_trace_rec3's names of the version-3 fields (docs/hardware.md), in order
C_V3 = {"flops": "flops", "bytes_read": "devmem_rd", "bytes_written": "devmem_wr",
        "list_id": "list_id", "list_index": "list_index", "dtype": "dtype", "subop": "sub_op"}


def test_rec3_tail_matches_the_generated_contract() -> None:
    """The stream's version-3 columns are struct tacc_trace_rec3's fields after the
    version-2 record, same offsets (from 64) and sizes (tacc.hw from tacc_hw.h)."""
    fields = {f["name"]: f for f in hw.STRUCTS["tacc_trace_rec3"]["fields"]}
    assert hw.STRUCTS["tacc_trace_rec3"]["size"] == TRACE_REC3_SIZE == 128
    off = DEVICE_TRACE_DTYPE.fields["flops"][1]
    for ours, theirs in C_V3.items():
        dt, o = DEVICE_TRACE_DTYPE.fields[ours][:2]
        assert (o - off + 64, dt.itemsize) == (fields[theirs]["offset"], fields[theirs]["size"])
    # the stream's first 72 bytes are the layout before minor 12
    for n in DEVICE_TRACE_V2_DTYPE.names:
        assert DEVICE_TRACE_DTYPE.fields[n] == DEVICE_TRACE_V2_DTYPE.fields[n]


class FakeRing3:
    """A mapped trace ring as the driver lays it out (header page, then records of
    ``rec_size`` bytes), the device's producer index advanced by ``produce``."""

    def __init__(self, entries: int, rec_size: int) -> None:
        self.entries, self.rec_size = entries, rec_size
        self.buf = bytearray(4096 + entries * rec_size)
        self.prod = self.seq = 0
        self.expect: list[bytes] = []  # each record's 64 bytes + 32-byte tail (or zeros)
        self._hdr()

    def _hdr(self) -> None:
        h = uapi.drm_tacc_trace_header(version=1, rec_size=self.rec_size, entries=self.entries,
                                       rec_version=3 if self.rec_size == 128 else 2,
                                       data_offset=4096, prod=self.prod, epoch=1)
        self.buf[:ctypes.sizeof(h)] = bytes(h)

    def produce(self, tails: list[tuple[int, ...]], rng: np.random.Generator) -> None:
        for t in tails:
            r = np.zeros(1, TRACE_REC_DTYPE)
            r["version"] = 3 if self.rec_size == 128 else 2
            r["seq"], r["tag"], r["opcode"] = self.seq, rng.integers(1, 2**63), 4
            r["t_start"], r["t_end"] = 1000 * self.seq, 1000 * self.seq + 10
            rec = r.tobytes()
            tail = np.zeros(1, np.dtype(TRACE_V3_TAIL))
            for n, v in zip(V3_FIELDS, t, strict=True):
                tail[n] = v
            off = 4096 + (self.prod % self.entries) * self.rec_size
            rsvd = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()  # not kept
            body = rec + tail.tobytes() + rsvd if self.rec_size == 128 else rec
            self.buf[off:off + self.rec_size] = body
            self.expect.append(rec + (tail.tobytes() if self.rec_size == 128 else bytes(32)))
            self.prod += 1
            self.seq += 1
        self._hdr()

    def advance(self, cons: int) -> tuple[int, int]:
        return self.prod, 0


_tail = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                  st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
                  st.integers(0, 2**16 - 1), st.integers(0, 255), st.integers(0, 255))


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(_tail, max_size=20), min_size=1, max_size=6),
       log_entries=st.integers(4, 5), v3=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_ring_view_copies_v3_fields(batches: list[list[tuple[int, ...]]], log_entries: int,
                                   v3: bool, seed: int) -> None:
    """Random records in a wrapping ring, drained in random batches: each stream record
    is the ring record's first 64 bytes, the fid, zero padding and its FLOPs, bytes, list
    id and index, dtype and sub-op (all zero from a version-2 ring); reserved bytes
    dropped."""
    rng = np.random.default_rng(seed)
    entries = 1 << log_entries
    f = FakeRing3(entries, TRACE_REC3_SIZE if v3 else 64)
    v = RingView(f.buf, 7, f.advance)
    got = []
    for b in batches:
        b = b[:entries]  # at most a ring between drains: nothing dropped
        f.produce(b, rng)
        got.append(v.drain().records)
    recs = np.concatenate(got)
    assert recs.dtype == DEVICE_TRACE_DTYPE and len(recs) == len(f.expect)
    raw = recs.view(np.uint8).reshape(len(recs), DEVICE_TRACE_DTYPE.itemsize)
    want = np.frombuffer(b"".join(f.expect), np.uint8).reshape(len(recs), 96)
    assert np.array_equal(raw[:, :64], want[:, :64])
    assert np.array_equal(raw[:, 72:], want[:, 64:])
    assert np.all(recs["fid"] == 7) and not raw[:, 66:72].any()
    if recs.size:
        exp = [t for b in batches for t in b[:entries]]
        assert recs["flops"].tolist() == ([t[0] for t in exp] if v3 else [0] * len(exp))


def test_ring_view_refuses_other_record_sizes() -> None:
    f = FakeRing3(16, 96)
    with pytest.raises(Exception, match="trace record size 96"):
        RingView(f.buf, 0, f.advance)


def test_old_real_fixture_reads_widened() -> None:
    """A real capture of an older minor (tests/host/data/real-mixed, format 1.1): its device_trace
    stream is the 72-byte layout, read widened: every column it has equal to the file's
    bytes, the version-3 columns zero, no record of version 3."""
    with tempfile.TemporaryDirectory() as td:
        cap = open_capture(extract(DATA / "real-mixed.tar.xz", Path(td)))
        major, minor = cap.format_version
        assert (major, minor) < (1, 12)
        info = cap.info("device_trace")
        assert info is not None and info.file_dtype == DEVICE_TRACE_V2_DTYPE
        recs = cap.read("device_trace")
        assert recs.dtype == DEVICE_TRACE_DTYPE and len(recs) > 500
        raw = b"".join(bytes(p) for p in _payloads(info))
        old = np.frombuffer(raw, DEVICE_TRACE_V2_DTYPE)
        for n in TRACE_REC_DTYPE.names + ("fid",):
            assert np.array_equal(recs[n], old[n]), n
        for n in V3_FIELDS:
            assert not recs[n].any(), n
        assert int(recs["version"].max()) <= 2
        part = cap.read("device_trace", ["tag", "flops"])
        assert np.array_equal(part["tag"], old["tag"]) and not part["flops"].any()


def _payloads(info: object) -> list[bytes]:
    from tacc.capture import framing

    out = []
    with open(info.path, "rb") as f:  # type: ignore[attr-defined]
        for ref in info.chunks:  # type: ignore[attr-defined]
            out.append(framing.read_payload(f, ref, "t"))
    return out


def test_newer_minor_layout_reads_own_fields(tmp_path: Path) -> None:
    """A later minor's longer device_trace record (today's fields and one more): today's
    fields picked out of it."""
    newer = np.dtype(DEVICE_TRACE_DTYPE.descr + [("later", "<u8")])
    recs = np.zeros(5, newer)
    recs["tag"] = np.arange(5) + 10
    recs["flops"] = np.arange(5) * 1000
    recs["later"] = 99
    with CaptureWriter(tmp_path / "c", {"devices": [{"pci": "0000:01:00.0"}]}) as cw:
        f = tmp_path / "c" / "streams" / "device_trace.tcs"
        mine = cw._streams.pop("device_trace", None)  # today's, opened by the writer
        if mine is not None:
            os.close(mine.fd)
            f.unlink()
        s = w._Stream(f, "device_trace", 1, newer)
        s.write_chunk(recs)
        cw._streams["device_trace"] = s  # closed, and counted in the marker, by the writer
    cap = open_capture(tmp_path / "c")
    got = cap.read("device_trace")
    assert got.dtype == DEVICE_TRACE_DTYPE
    assert got["tag"].tolist() == list(range(10, 15))
    assert got["flops"].tolist() == [0, 1000, 2000, 3000, 4000]


def test_minor_is_14() -> None:
    assert FORMAT_MINOR == 14
    doc = (Path(__file__).resolve().parents[2] / "docs" / "capture-format.md").read_text()
    assert "| 12 | trace records of version 3" in doc
    assert "| 13 | block I/O operation" in doc
    assert "| 14 | VM pauses" in doc


# ------------------------------------------------------------ GEMM shapes --
def _gemm_record(m: int, n: int, k: int, s_ab: int, s_c: int, bias: bool
                 ) -> tuple[int, int, int]:
    """docs/hardware.md "FLOPs and bytes of a command" for a GEMM of batch 1, beta 0."""
    flops = 2 * m * n * k + (m * n if bias else 0)
    rd = (m * k + k * n) * s_ab + (n * s_c if bias else 0)
    return flops, rd, m * n * s_c


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 512), n=st.integers(1, 4096), k=st.integers(1, 4096),
       ab=st.sampled_from([4, 2]), c=st.sampled_from([4, 2]), bias=st.booleans())
@example(m=4, n=1, k=1, ab=4, c=4, bias=True)  # a record 2x2x1 fits as well
def test_gemm_shape_solves_the_record(m: int, n: int, k: int, ab: int, c: int,
                                      bias: bool) -> None:
    """The solver returns a shape whose record is the given one (the same FLOPs, bytes
    read and written); when that record admits one shape only (with a bias, or without
    one when the weights are the larger operand, and the output size unambiguous), the
    shape itself.  A record can fit two: 4x1x1 and 2x2x1 fp32 with a bias both read 24
    bytes, write 16 and count 12 FLOPs."""
    flops, rd, wr = _gemm_record(m, n, k, ab, c, bias)
    s = roofline.gemm_shape(flops, rd, wr, ab, bias)
    assert s is not None
    assert _gemm_record(s.m, s.n, s.k, s.s_ab, s.s_c, s.bias) == (flops, rd, wr)
    x = m * n
    fits = {(x // d, d) for d in range(1, isqrt(x) + 1) if x % d == 0} | \
        {(d, x // d) for d in range(1, isqrt(x) + 1) if x % d == 0}
    fits = {(mm, nn) for mm, nn in fits
            if _gemm_record(mm, nn, k, ab, c, bias) == (flops, rd, wr)
            and (bias or mm * k <= k * nn)}
    if c == 4 and (bias or m * k <= k * n) and len(fits) == 1:
        assert (s.m, s.n, s.k, s.s_c) == (m, n, k, c)


def test_gemm_shape_of_an_ambiguous_record_is_one_that_fits() -> None:
    """4x1x1 and 2x2x1 (fp32, bias) have the same record: the solver gives one of them."""
    rec = _gemm_record(4, 1, 1, 4, 4, True)
    assert rec == _gemm_record(2, 2, 1, 4, 4, True)
    s = roofline.gemm_shape(*rec, 4, True)
    assert s is not None and (s.m, s.n, s.k) in {(4, 1, 1), (2, 2, 1)}


def test_gemm_shape_none_for_batched_attention() -> None:
    """QK^T over 4 heads (batch 4, m 1, n L, k 32): no batch-1 shape gives its record."""
    for seq in range(2, 64):
        flops, rd, wr = 2 * 4 * seq * 32, 4 * (32 + 32 * seq) * 4, 4 * seq * 4
        assert roofline.gemm_shape(flops, rd, wr, 4, False) is None, seq


def test_batch_to_ridge_reaches_it() -> None:
    s = roofline.GemmShape(1, 512, 128, 4, 4, False)
    ridge = 7575 / 300
    rows = roofline.batch_to_ridge(s, ridge)
    assert rows is not None

    def inten(b: int) -> float:
        return 2 * b * s.n * s.k / ((b * s.k + s.k * s.n) * 4 + b * s.n * 4)

    assert inten(rows) >= ridge > inten(rows - 1)


@pytest.mark.parametrize("err", [errno.EOPNOTSUPP, errno.EINVAL])
def test_trace_ring_falls_back_to_version_2(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """A driver refusing DRM_TACC_TRACE_F_V3 (EOPNOTSUPP: the device lacks it; EINVAL: a
    driver before uAPI 4) gets the ring opened again without it: version 2."""
    from tacc.daemon import devring

    opened: list[int] = []

    class FakeKernelRing:
        def __init__(self, node: str, req: int, arg: object, refused: object, *a: object
                     ) -> None:
            flags = int(arg.flags)  # type: ignore[attr-defined]
            opened.append(flags)
            if flags:
                raise refused(OSError(err, os.strerror(err)))  # type: ignore[operator]
            self.fd = -1
            self.mm = FakeRing3(16, 64).buf
            self.advance = lambda cons: (0, 0)

    monkeypatch.setattr(devring, "KernelRing", FakeKernelRing)
    r = devring.DeviceTraceRing("/dev/accel/accel0", 0, 0, v3=True)
    assert r.version == 2 and opened == [hw.DRM_TACC_TRACE_F_V3, 0]
    opened.clear()
    with pytest.raises(devring.TraceRingError):  # other refusals are not retried
        err = errno.EBUSY
        devring.DeviceTraceRing("/dev/accel/accel0", 0, 0, v3=True)
    assert opened == [hw.DRM_TACC_TRACE_F_V3]
