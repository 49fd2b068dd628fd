"""VM pauses in captures (hw 1.7 VM_PAUSED_NS, capture minor 14): the clock_sync column,
the pauses a capture reads from it, the host clock fitted across them, and the timeline's
``VM paused`` track."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tacc.capture import CaptureWriter, open_capture
from tacc.capture.schema import CLOCK_DTYPE
from tacc.counters import functions
from tacc.counters.fakesys import make_function
from tacc.counters.sampler import clock_pairs
from tacc.devices import parse_clock_sync
from tacc.testing.captures import write_older_stream
from tacc.timeline.convert import convert

HOST0 = 1_796_396_800_000_000_000  # the host's realtime clock, ns
PCI = "0000:01:00.0"


def test_clock_sync_columns_three_to_five() -> None:
    c = parse_clock_sync("10 5000 20\n30 5020 41 900\n50 5040 61 920 7000\n"
                         "# a comment\nnot a pair\n1 2\n", 3)
    assert c["devclk"].tolist() == [5000, 5020, 5040]
    assert c["hostclk"].tolist() == [0, 900, 920]
    assert c["vm_paused_ns"].tolist() == [0, 0, 7000]
    assert c["fid"].tolist() == [3, 3, 3]


@pytest.mark.parametrize("line", ["100 7 110 5555", "100 7 110 5555 42"])
def test_counters_sampler_reads_the_kernels_clock_sync(tmp_path: Path, line: str) -> None:
    """``tacc counters record`` pairs the device clock from the same sysfs file taccd reads,
    whatever columns the kernel prints (it took only lines of exactly three: none of
    tacc.ko's four-column lines)."""
    make_function(tmp_path / "sys")
    fn = functions(tmp_path / "sys")[0]
    (fn.path / "tacc" / "clock_sync").write_text(f"{line}\n{line}\n")
    got = clock_pairs(fn, 0)
    cols = [int(v) for v in line.split()]
    assert len(got) == 2 and got["mono_before"][0] == 100 and got["devclk"][0] == 7
    assert got["hostclk"][0] == cols[3]
    assert got["vm_paused_ns"][0] == (cols[4] if len(cols) > 4 else 0)


def _pairs(pauses: dict[int, int], n: int = 10, fid: int = 0) -> np.ndarray:
    """``n`` clock pairs 100 ms of guest time apart; ``pauses``: pair index -> host ns the
    VM stood still just before that pair (guest and device clocks stood with it)."""
    clk = np.zeros(n, CLOCK_DTYPE)
    clk["mono_before"] = 1_000_000_000 + np.arange(n) * 100_000_000
    clk["mono_after"] = clk["mono_before"] + 3_000
    clk["devclk"] = clk["mono_before"] + 500
    stood = np.zeros(n, np.int64)
    for i, ns in pauses.items():
        stood[i:] += ns
    mid = (clk["mono_before"] + clk["mono_after"]) // 2
    clk["hostclk"] = (HOST0 + mid + stood).astype(np.uint64)
    clk["vm_paused_ns"] = (5_000_000 + stood).astype(np.uint64)  # 5 ms before the capture
    clk["fid"] = fid
    return clk


def _capture(path: Path, clk: np.ndarray) -> Path:
    with CaptureWriter(path, {"node": "h", "devices": [{"pci": PCI, "clock_hz": 1e9}]}) as w:
        w.append("clock_sync", clk)
    return path


def test_pauses_read_from_the_steps(tmp_path: Path) -> None:
    clk = _pairs({3: 83_100_000, 7: 9_767_000_000})
    cap = open_capture(_capture(tmp_path / "c", clk))
    p = cap.vm_pauses()
    assert p["paused_ns"].tolist() == [83_100_000, 9_767_000_000]
    assert p["t_lo"].tolist() == [int(clk["mono_after"][2]), int(clk["mono_after"][6])]
    assert p["t_hi"].tolist() == [int(clk["mono_before"][3]), int(clk["mono_before"][7])]
    # the host clock fitted across the pauses gives back every pair's host time less the
    # pauses so far: exact, as without pauses (it had fitted a line through two steps)
    hc = cap.host_clock()
    assert hc is not None and hc.drift == 1.0
    mid = (clk["mono_before"] + clk["mono_after"]) // 2
    want = clk["hostclk"].astype(np.int64) - clk["vm_paused_ns"].astype(np.int64)
    assert hc.convert(mid.astype(np.uint64)).tolist() == want.tolist()
    # the device clock's fit is untouched by them (device time stood still too)
    assert cap.device_clock(0).residual_max_ns <= 1


def test_no_pause_no_track(tmp_path: Path) -> None:
    cap = open_capture(_capture(tmp_path / "c", _pairs({})))
    assert len(cap.vm_pauses()) == 0
    out = tmp_path / "t.json"
    convert([tmp_path / "c"], out, fmt="json")
    names = [e.get("args", {}).get("name") for e in json.loads(out.read_text())["traceEvents"]
             if e.get("ph") == "M"]
    assert "VM paused" not in names


def test_an_older_minors_clock_sync_reads_no_pause(tmp_path: Path) -> None:
    """Minor 13's clock_sync records (40 bytes, no vm_paused_ns) widen with 0: no pauses."""
    old = np.dtype([(n, CLOCK_DTYPE.fields[n][0]) for n in CLOCK_DTYPE.names
                    if n != "vm_paused_ns"])
    assert old.itemsize == 40
    rec = np.zeros(4, old)
    new = _pairs({2: 50_000_000}, n=4)
    for n in old.names:
        rec[n] = new[n]
    cap = open_capture(write_older_stream(tmp_path / "c", "clock_sync", rec,
                                          {"node": "h", "devices": [{"pci": PCI}]}))
    assert cap.read("clock_sync")["vm_paused_ns"].tolist() == [0, 0, 0, 0]
    assert len(cap.vm_pauses()) == 0


def test_timeline_draws_each_pause(tmp_path: Path) -> None:
    clk = _pairs({4: 83_100_000})
    _capture(tmp_path / "c", clk)
    out = tmp_path / "t.json"
    convert([tmp_path / "c"], out, fmt="json")
    ev = json.loads(out.read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in ev
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    sl = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("VM paused")]
    assert len(sl) == 1 and tracks[sl[0]["tid"]] == "VM paused"
    assert sl[0]["name"] == "VM paused 83.1 ms (host time)"
    assert sl[0]["args"]["paused_ns"] == 83_100_000
    # over the guest-time interval between the pairs around it (Chrome JSON: us)
    lo, hi = int(clk["mono_after"][3]), int(clk["mono_before"][4])
    assert sl[0]["dur"] == pytest.approx((hi - lo) / 1e3)
    # the Perfetto trace carries the track as well
    pf = tmp_path / "t.pftrace"
    convert([tmp_path / "c"], pf)
    assert b"VM paused 83.1 ms (host time)" in pf.read_bytes()
