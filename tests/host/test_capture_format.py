"""Capture writer/reader: round trip, crash safety, clear errors, framing robustness."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tacc.capture import (
    CaptureEmptyError,
    CaptureError,
    CaptureNotFoundError,
    CaptureTruncatedError,
    CaptureVersionError,
    CaptureWriter,
    framing,
    open_capture,
)
from tacc.capture.schema import DRIVER_DTYPE, DriverKind

META = {"node": "n0", "devices": [{"pci": "0000:01:00.0", "vf": 0,
                                   "link": {"gen": 4, "width": 8, "mps": 256}}]}


def _driver(n: int, start: int = 0) -> np.ndarray:
    d = np.zeros(n, DRIVER_DTYPE)
    d["t_ns"] = np.arange(start, start + n) * 1000
    d["kind"] = int(DriverKind.SUBMIT)
    d["tag"] = np.arange(start, start + n)
    return d


def _write(path: Path, n: int = 1000, chunk_bytes: int = 104 * 100) -> None:
    with CaptureWriter(path, META, chunk_bytes=chunk_bytes) as w:
        w.append("driver", _driver(n))
        assert w.string_id("copy_h2d") == 1
        assert w.string_id("copy_h2d") == 1


def test_round_trip(tmp_path: Path) -> None:
    _write(tmp_path / "c")
    cap = open_capture(tmp_path / "c")
    assert cap.complete and cap.problems == []
    assert cap.meta["version"] == 1 and cap.node == "n0"
    chunks = list(cap.chunks("driver"))
    assert len(chunks) == 10 and all(len(c) == 100 for c in chunks)
    assert np.array_equal(cap.read("driver"), _driver(1000))
    assert cap.strings[1] == "copy_h2d"
    assert cap.count("api") == 0


def test_small_appends_are_buffered(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path / "c", META, chunk_bytes=104 * 64) as w:
        for i in range(100):
            w.append("driver", _driver(3, 3 * i))
    cap = open_capture(tmp_path / "c")
    assert [len(c) for c in cap.chunks("driver")] == [64, 64, 64, 64, 44]
    assert np.array_equal(cap.read("driver")["tag"], np.arange(300))


def test_wrong_dtype_rejected(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path / "c", META) as w, pytest.raises(CaptureError):
        w.append("driver", np.zeros(3, dtype=[("x", "<u8")]))


def test_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(CaptureNotFoundError, match="no such capture"):
        open_capture(tmp_path / "nope")
    (tmp_path / "e").mkdir()
    with pytest.raises(CaptureEmptyError, match="no meta.json"):
        open_capture(tmp_path / "e")
    with CaptureWriter(tmp_path / "z", META):
        pass
    with pytest.raises(CaptureEmptyError, match="no records"):
        open_capture(tmp_path / "z")


def test_wrong_version(tmp_path: Path) -> None:
    _write(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    meta["version"] = 99
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    from tacc.capture.schema import FORMAT_MINOR

    with pytest.raises(CaptureVersionError,
                       match=rf"version 99\.{FORMAT_MINOR} is newer than this tacc reads"):
        open_capture(tmp_path / "c")


def test_wrong_stream_schema(tmp_path: Path) -> None:
    _write(tmp_path / "c")
    p = tmp_path / "c" / "streams" / "driver.tcs"
    raw = p.read_bytes()
    with open(p, "rb") as f:
        info, start = framing.read_file_header(f, "x")
    info["schema"] = 7
    p.write_bytes(framing.encode_file_header(info) + raw[start:])
    with pytest.raises(CaptureVersionError, match="schema version 7"):
        open_capture(tmp_path / "c")


def test_truncated_complete_capture(tmp_path: Path) -> None:
    _write(tmp_path / "c")
    p = tmp_path / "c" / "streams" / "driver.tcs"
    os.truncate(p, p.stat().st_size - 50)
    with pytest.raises(CaptureTruncatedError, match="truncated"):
        open_capture(tmp_path / "c")


def test_incomplete_capture_readable(tmp_path: Path) -> None:
    _write(tmp_path / "c")
    (tmp_path / "c" / "complete").unlink()
    p = tmp_path / "c" / "streams" / "driver.tcs"
    os.truncate(p, p.stat().st_size - 50)
    cap = open_capture(tmp_path / "c")
    assert not cap.complete
    assert cap.count("driver") == 900
    assert any("truncated chunk payload" in m for m in cap.problems)


def test_exception_in_with_leaves_incomplete(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), CaptureWriter(tmp_path / "c", META) as w:
        w.append("driver", _driver(10))
        raise RuntimeError("boom")
    cap = open_capture(tmp_path / "c")
    assert not cap.complete and cap.count("driver") == 10


def test_kill_9_leaves_readable_capture(tmp_path: Path) -> None:
    out = tmp_path / "k"
    code = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_capture_format import _driver, META
        from tacc.capture import CaptureWriter
        w = CaptureWriter({str(out)!r}, META, chunk_bytes=104 * 50)
        i = 0
        while True:
            w.append("driver", _driver(7, i)); i += 7
            if i == 700: print("go", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"go"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cap = open_capture(out)
    assert not cap.complete
    d = cap.read("driver")
    assert len(d) >= 700 and len(d) % 50 == 0
    assert np.array_equal(d["tag"], np.arange(len(d)))


# ----------------------------------------------------------------- framing --
ITEM = 8


def _stream(nchunks: int, per: int) -> tuple[bytes, int, list[bytes]]:
    hdr = framing.encode_file_header({"stream": "x", "schema": 1})
    payloads = [np.arange(i * per, (i + 1) * per, dtype="<u8").tobytes() for i in range(nchunks)]
    body = b"".join(framing.encode_chunk(i, per, p) for i, p in enumerate(payloads))
    return hdr + body, len(hdr), payloads


def _parse(buf: bytes, start: int, strict: bool) -> list[bytes]:
    f = io.BytesIO(buf)
    framing.read_file_header(f, "x")
    return [p for _, p in framing.iter_payloads(f, start, ITEM, strict, "x")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nchunks=st.integers(1, 6), per=st.integers(1, 20), cut=st.floats(0, 1),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=3),
       strict=st.booleans())
def test_framing_damage(nchunks: int, per: int, cut: float, flips: list[tuple[float, int]],
                        strict: bool) -> None:
    buf, start, payloads = _stream(nchunks, per)
    data = bytearray(buf)
    damage_at = len(data)
    for pos_f, x in flips:
        pos = start + int(pos_f * (len(data) - start - 1))
        data[pos] ^= x
        damage_at = min(damage_at, pos)
    end = start + int(cut * (len(data) - start))
    if end < len(data):
        damage_at = min(damage_at, end)
    data = data[:end]
    try:
        got = _parse(bytes(data), start, strict)
    except CaptureError as exc:  # the only exception allowed
        assert strict
        assert "\n" not in str(exc)
        return
    # every chunk wholly before the damage is kept, in order, intact
    chunk_len = framing.CHUNK_HEADER_SIZE + per * ITEM
    whole_before = (damage_at - start) // chunk_len
    assert len(got) >= whole_before
    assert got == payloads[: len(got)]


_GOOD_HEADER = framing.encode_file_header({"stream": "x", "schema": 1, "dtype": [["a", "<u8"]]})


def _garbage() -> st.SearchStrategy[bytes]:
    """Random bytes; random bytes behind the right magic (the later checks); and a valid
    header with one bit flipped anywhere but the reserved u16 at offset 10."""
    flip = st.tuples(st.integers(0, len(_GOOD_HEADER) - 1), st.integers(0, 7)).filter(
        lambda t: t[0] not in (10, 11)).map(
        lambda t: _GOOD_HEADER[:t[0]] + bytes([_GOOD_HEADER[t[0]] ^ (1 << t[1])])
        + _GOOD_HEADER[t[0] + 1:])
    return st.one_of(st.binary(max_size=200),
                     st.binary(max_size=200).map(lambda b: framing.FILE_MAGIC + b), flip,
                     st.integers(0, len(_GOOD_HEADER) - 1).map(lambda n: _GOOD_HEADER[:n]))


@given(_garbage())
def test_header_garbage(blob: bytes) -> None:
    """Garbage is rejected with a one-line CaptureError, never accepted, never another
    exception."""
    with pytest.raises(CaptureError) as exc:
        framing.read_file_header(io.BytesIO(blob), "x")
    assert str(exc.value).startswith("x: ") and "\n" not in str(exc.value)


def test_header_good_is_accepted() -> None:
    info, off = framing.read_file_header(io.BytesIO(_GOOD_HEADER + b"rest"), "x")
    assert info["stream"] == "x" and off == len(_GOOD_HEADER)


# ------------------------------------------------------------ device events --
def _dev_events(n: int) -> np.ndarray:
    from tacc.capture.schema import DEVICE_EVENTS_DTYPE, DeviceEventKind

    e = np.zeros(n, DEVICE_EVENTS_DTYPE)
    e["t_ns"] = np.arange(n) * 1000 + 7
    e["fid"] = np.arange(n) % 2
    e["kind"] = np.where(np.arange(n) % 2, int(DeviceEventKind.PM), int(DeviceEventKind.MMU_FAULT))
    e["ctx"], e["queue"], e["tag"] = 3, 1, np.arange(n) + 100
    e["addr"], e["arg"], e["status"] = 0xDEAD_0000, 3, -5
    return e


def test_device_events_layout() -> None:
    from tacc.capture.schema import DEVICE_EVENTS_DTYPE, STREAMS

    assert STREAMS["device_events"] == (1, DEVICE_EVENTS_DTYPE)
    assert DEVICE_EVENTS_DTYPE.itemsize == 64
    off = {k: v[1] for k, v in DEVICE_EVENTS_DTYPE.fields.items()}
    assert off["t_ns"] == 0 and off["tag"] % 8 == 0 and off["addr"] % 8 == 0
    assert off["ctx"] % 4 == 0 and off["status"] % 4 == 0 and off["name_id"] % 4 == 0


def test_device_events_round_trip(tmp_path: Path) -> None:
    ev = _dev_events(300)
    with CaptureWriter(tmp_path / "c", META, chunk_bytes=64 * 50) as w:
        sid = w.string_id("mmu_fault 0000:01:00.0 unmapped read")
        ev["name_id"] = sid
        for i in range(0, 300, 7):  # as they arrive: many small appends
            w.append("device_events", ev[i:i + 7])
    cap = open_capture(tmp_path / "c")
    assert cap.complete and cap.problems == []
    got = cap.read("device_events")
    assert np.array_equal(got, ev)
    assert [len(c) for c in cap.chunks("device_events")] == [50] * 6
    assert cap.strings[int(got["name_id"][0])].startswith("mmu_fault")
    assert cap.count("device_events") == 300
    assert json.loads((tmp_path / "c" / "complete").read_text())["streams"][
        "device_events"]["records"] == 300
    assert cap.time_range == (7, 299 * 1000 + 7)


def test_device_events_truncated_chunk(tmp_path: Path) -> None:
    ev = _dev_events(200)
    with CaptureWriter(tmp_path / "c", META, chunk_bytes=64 * 50) as w:
        w.append("driver", _driver(10))
        w.append("device_events", ev)
    p = tmp_path / "c" / "streams" / "device_events.tcs"
    os.truncate(p, p.stat().st_size - 30)
    with pytest.raises(CaptureTruncatedError, match="device_events"):
        open_capture(tmp_path / "c")
    (tmp_path / "c" / "complete").unlink()  # as a killed writer leaves it
    cap = open_capture(tmp_path / "c")
    assert not cap.complete
    assert np.array_equal(cap.read("device_events"), ev[:150])
    assert any("device_events" in m for m in cap.problems)


def test_old_capture_without_device_events_reads_empty(tmp_path: Path) -> None:
    """A capture written before the stream existed: no file, no marker entry."""
    _write(tmp_path / "c")
    (tmp_path / "c" / "streams" / "device_events.tcs").unlink()
    for f in ("meta.json", "complete"):
        doc = json.loads((tmp_path / "c" / f).read_text())
        del doc["streams"]["device_events"]
        (tmp_path / "c" / f).write_text(json.dumps(doc))
    cap = open_capture(tmp_path / "c")
    assert cap.complete and cap.problems == []
    assert "device_events" not in cap.streams and cap.count("device_events") == 0
    e = cap.read("device_events")
    assert len(e) == 0 and e.dtype.names is not None and "kind" in e.dtype.names
    assert cap.count("driver") == 1000


def test_writer_directory_meta_modes_and_a_second_close(tmp_path: Path) -> None:
    """A capture may go into an existing empty directory, not a non-empty one; meta.json
    gets the creation time (unless the caller gave one) and the writer keeps what it wrote;
    the stream files are 0644 (less the umask); closing twice is closing once."""
    d = tmp_path / "cap"
    d.mkdir()
    t0 = time.time()
    w = CaptureWriter(d, META)
    on_disk = json.loads((d / "meta.json").read_text())
    assert w.meta == on_disk and t0 <= on_disk["created_unix"] <= time.time()
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (d / "streams").iterdir()}
    assert modes and set(modes.values()) == {0o644 & ~umask}, modes
    w.append("driver", np.zeros(3, DRIVER_DTYPE))
    w.close()
    w.close()
    assert open_capture(d).read("driver").shape == (3,)
    with pytest.raises(CaptureError, match="exists and is not empty"):
        CaptureWriter(d, META)
    given_time = CaptureWriter(tmp_path / "c2", {**META, "created_unix": 5.0})
    given_time.close()
    assert json.loads((tmp_path / "c2" / "meta.json").read_text())["created_unix"] == 5.0


def test_peer_port_range_and_link_bandwidth_by_direction() -> None:
    """A clock-exchange peer's port is 1..65535; a function's modelled bandwidth is the link
    model's for that direction (read completions and posted writes differ), in the
    capture's time."""
    from tacc.capture.clockx import parse_peer
    from tacc.capture.devinfo import Function
    from tacc.model.link import link_max_payload_bw

    assert parse_peer("10.0.0.1:1") == ("10.0.0.1", 1)
    assert parse_peer("10.0.0.1:65535") == ("10.0.0.1", 65535)
    for bad in ("10.0.0.1:0", "10.0.0.1:65536"):
        with pytest.raises(ValueError, match="out of range"):
            parse_peer(bad)
    f = Function(0, "0000:01:00.0", "0000:01:00.0", 0, 4, 16, 256, 1e9, 2.0, 0)
    for direction in ("h2d", "d2h"):
        assert f.max_bw(direction) == link_max_payload_bw(4, 16, 256, direction, f.mrrs,
                                                          f.rcb) / 2.0
    assert f.max_bw("h2d") != f.max_bw("d2h")


# ------------------------------------------------------ clocks, by hand --
def test_clock_fit_of_pairs_at_one_tick_compose_and_invert_near_realtime() -> None:
    """Pairs all read at one device tick: the nominal drift, the offset their brackets'
    mean midpoint; compose adds the bounds and the residuals' rms in quadrature; invert
    is exact for host realtime values (~1.7e18 ns, beyond float64's integers)."""
    from tacc.capture.clock import LinearClock, compose, fit_pairs

    c = fit_pairs(np.array([1000, 1000], np.uint64), np.array([5000, 5100]),
                  np.array([5200, 5300]), 1.5, "t")
    # midpoints 5100 and 5200: offset 5150 at x0 (residuals +-50, brackets +-100)
    assert (c.x0, c.y0, c.drift, c.npairs) == (1000, 5150, 1.5, 2)
    assert (c.residual_rms_ns, c.residual_max_ns, c.bracket_ns) == (50.0, 50.0, 100.0)
    outer = LinearClock(0, 10, 2.0, residual_rms_ns=3.0, residual_max_ns=4.0, bracket_ns=5.0,
                        npairs=7)
    inner = LinearClock(100, 0, 0.5, residual_rms_ns=4.0, residual_max_ns=1.0,
                        bracket_ns=2.0, npairs=3)
    k = compose(outer, inner)
    assert (k.x0, k.y0, k.drift) == (100, 10, 1.0)
    assert (k.residual_rms_ns, k.residual_max_ns, k.bracket_ns, k.npairs) == (5.0, 5.0, 7.0, 3)
    assert k.convert(np.array([300], np.uint64)).tolist() == [210]
    rt = 1_700_000_000_123_456_789
    c = LinearClock(x0=0, y0=rt, drift=1.0)
    y = np.array([rt + 1, rt + 777, rt + 10**9 + 3], np.uint64)
    assert c.invert(y).tolist() == [1, 777, 10**9 + 3]


def test_an_added_function_takes_its_pfs_link_clock_and_scale() -> None:
    """A function seen only by its hotplug event (a VF enabled during the capture) is
    described as its PF on the same bus: link, clock rate, time scale; its own fid, pci,
    VF number and kind; another bus takes the first PF; no PF at all, the defaults."""
    import dataclasses

    from tacc.capture.devinfo import Function
    from tacc.capture.reader import Capture

    pf0 = Function(0, "0000:01:00.0", "0000:01:00.0", 0, 3, 8, 128, 2e9, 2.0, 1 << 30,
                   kind="pf")
    pf1 = dataclasses.replace(pf0, fid=1, pci="0000:02:00.0", pf="0000:02:00.0", gen=5)
    vf = Capture._like_pf([pf0, pf1], 5, "0000:02:00.3", 3)
    assert vf == dataclasses.replace(pf1, fid=5, pci="0000:02:00.3", pf="0000:02:00.0", vf=3,
                                     kind="vf")
    other = Capture._like_pf([pf0, pf1], 6, "0000:09:00.0", 0)
    assert other == dataclasses.replace(pf0, fid=6, pci="0000:09:00.0", kind="pf")
    bare = Capture._like_pf([], 7, "func7", 0)
    assert (bare.fid, bare.pci, bare.pf, bare.vf, bare.gen, bare.width, bare.mps,
            bare.clock_hz, bare.time_scale, bare.devmem) == (7, "func7", "func7", 0, 4, 16,
                                                             256, 1e9, 1.0, 0)


def test_unknown_streams_kept_with_their_declared_layout(tmp_path: Path) -> None:
    """A stream this reader does not know is read with the layout its header declares
    (1-byte records too) and its schema; one whose header declares no layout is left
    out; each is named in the problems."""
    from tacc.capture import framing
    from tacc.capture.schema import dtype_to_json
    from tacc.capture.synth import generate

    p = tmp_path / "c"
    generate(p, "tiny_transfers", "good")
    one = np.dtype([("k", "u1")])
    rec = np.arange(7, dtype=np.uint8).view(one)
    (p / "streams" / "x_one.tcs").write_bytes(
        framing.encode_file_header({"stream": "x_one", "schema": 3,
                                    "dtype": dtype_to_json(one)})
        + framing.encode_chunk(0, 4, rec[:4].tobytes()) + framing.encode_chunk(1, 3,
                                                                            rec[4:].tobytes()))
    (p / "streams" / "x_bare.tcs").write_bytes(
        framing.encode_file_header({"stream": "x_bare", "schema": 1})
        + framing.encode_chunk(0, 2, b"\0\0"))
    cap = open_capture(p)
    assert cap.other_streams == ["x_one"]
    info = cap.other_info("x_one")
    assert info is not None and info.schema == 3 and info.dtype == one
    assert cap.read("x_one")["k"].tolist() == list(range(7))
    assert [len(c) for c in cap.chunks("x_one")] == [4, 3]
    assert {"unknown stream 'x_one' ignored by the analysis",
            "unknown stream 'x_bare' ignored by the analysis"} <= set(cap.problems)


def test_host_clock_exact_at_realtime_magnitudes(tmp_path: Path) -> None:
    """The host clock fit (CLOCK_MONOTONIC -> the host's realtime, ~1.7e18 ns) gives back
    each pair's host time to the nanosecond: no step through float64."""
    from tacc.capture.schema import CLOCK_DTYPE

    clk = np.zeros(5, CLOCK_DTYPE)
    clk["mono_before"] = np.arange(5) * 1_000_000_007 + 11
    clk["mono_after"] = clk["mono_before"] + 2000
    clk["devclk"] = clk["mono_before"] + 99
    mid = (clk["mono_before"] + clk["mono_after"]) // 2
    clk["hostclk"] = (1_700_000_000_123_456_789 + mid).astype(np.uint64)
    with CaptureWriter(tmp_path / "c", {"node": "h", "devices": [{"pci": "0000:01:00.0"}]}) as w:
        w.append("clock_sync", clk)
    hc = open_capture(tmp_path / "c").host_clock()
    assert hc is not None and hc.drift == 1.0
    assert hc.convert(mid.astype(np.uint64)).tolist() == clk["hostclk"].astype(np.int64).tolist()


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writev(2) may write less than asked (a signal, a disk nearly full): the writer
    writes the rest of the chunk in turn, and the capture reads back whole."""
    import tacc.capture.writer as wr

    real_write = os.write

    def short_writev(fd: int, bufs: list) -> int:
        return real_write(fd, b"".join(bytes(b) for b in bufs)[:10])

    monkeypatch.setattr(wr.os, "writev", short_writev)
    rec = np.zeros(300, DRIVER_DTYPE)
    rec["t_ns"] = np.arange(300) * 1000
    rec["kind"] = int(DriverKind.IOCTL)
    rec["pid"] = 77
    with CaptureWriter(tmp_path / "c", {"node": "h"}, chunk_bytes=4096) as w:
        w.append("driver", rec)
    monkeypatch.undo()
    back = open_capture(tmp_path / "c").read("driver")
    assert back.tobytes() == rec.tobytes()


def test_short_writes_of_a_stream_header_are_completed(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """write(2) of a stream's file header may write less than asked too: the writer
    writes the rest, and every stream reads back whole."""
    import tacc.capture.writer as wr

    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        return real_write(fd, bytes(data)[:7])

    def short_writev(fd: int, bufs: list) -> int:
        return short_write(fd, b"".join(bytes(b) for b in bufs))

    monkeypatch.setattr(wr.os, "write", short_write)
    monkeypatch.setattr(wr.os, "writev", short_writev)
    rec = np.zeros(30, DRIVER_DTYPE)
    rec["t_ns"] = np.arange(30) * 1000
    rec["pid"] = 78
    with CaptureWriter(tmp_path / "c", {"node": "h"}, chunk_bytes=4096) as w:
        w.append("driver", rec)
    monkeypatch.undo()
    cap = open_capture(tmp_path / "c")
    assert cap.problems == [], cap.problems
    assert cap.read("driver").tobytes() == rec.tobytes()


def test_an_older_layout_read_by_column(tmp_path: Path) -> None:
    """A stream written in an earlier minor's record layout (fewer fields) reads as the
    current layout, the fields it lacks zero; asked for some columns, exactly those."""
    from tacc.testing.captures import write_older_stream

    old = np.dtype([("t_ns", "<i8"), ("pid", "<u4"), ("tid", "<u4")])
    assert all(DRIVER_DTYPE.fields[n][0] == old.fields[n][0] for n in old.names)
    rec = np.zeros(3, old)
    rec["t_ns"], rec["pid"], rec["tid"] = [10, 20, 30], [1, 2, 3], [4, 5, 6]
    cap = open_capture(write_older_stream(tmp_path / "c", "driver", rec))
    whole = cap.read("driver")
    assert whole.dtype == DRIVER_DTYPE and whole["pid"].tolist() == [1, 2, 3]
    assert whole["kind"].tolist() == [0, 0, 0]
    some = cap.read("driver", ["tid", "t_ns"])
    assert some.dtype.names == ("tid", "t_ns")
    assert some["tid"].tolist() == [4, 5, 6] and some["t_ns"].tolist() == [10, 20, 30]


def test_append_to_an_unknown_stream_names_it(tmp_path: Path) -> None:
    with CaptureWriter(tmp_path / "c", {"node": "h"}) as w, \
            pytest.raises(CaptureError, match="unknown stream 'no_such'"):
        w.append("no_such", np.zeros(1, DRIVER_DTYPE))


def test_function_from_its_meta_description() -> None:
    """meta.json's device entry -> Function: its clock rate, link (rcb too) and time scale
    (the device's own, else the capture's, else 1); pf defaults to its own address, kind
    to pf or vf by its VF number."""
    from tacc.capture.devinfo import function_from_desc

    d = {"pci": "0000:01:00.2", "vf": 2, "clock_hz": 2.5e9, "time_scale": 3.0,
         "link": {"gen": 3, "width": 8, "mps": 128, "rcb": 128}}
    f = function_from_desc(4, d, {"time_scale": 7.0})
    assert (f.fid, f.pci, f.pf, f.vf, f.kind, f.clock_hz, f.time_scale, f.gen, f.width,
            f.mps, f.rcb) == (4, "0000:01:00.2", "0000:01:00.2", 2, "vf", 2.5e9, 3.0, 3, 8,
                              128, 128)
    del d["time_scale"]
    assert function_from_desc(4, d, {"time_scale": 7.0}).time_scale == 7.0
    pf = function_from_desc(0, {"pci": "0000:01:00.0"}, {})
    assert (pf.kind, pf.pf, pf.time_scale, pf.clock_hz) == ("pf", "0000:01:00.0", 1.0, 1e9)
