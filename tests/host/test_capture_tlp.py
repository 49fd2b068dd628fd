"""The capture's TLP stream (format 1, minor 7; docs/capture-format.md "TLP stream"):
records round trip, the timeline shows them on the PF's two TLP tracks with one read
flow per request (tacc.pcie.perfetto's matching), and captures of minors 0-6, which
have no TLP stream, still read (as empty), analyse and convert."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from tacc.analyze.engine import analyze
from tacc.capture import CaptureWriter, open_capture
from tacc.capture.schema import CLOCK_DTYPE, FORMAT_MINOR, TLP_DTYPE, TLP_REC_DTYPE
from tacc.model import link as linkmodel
from tacc.pcie import CPLD, F_UP, MRD
from tacc.timeline.convert import convert

DATA = Path(__file__).parent / "data"
PF = "0000:01:00.0"
META = {"node": "n0", "devices": [
    {"pci": PF, "pf": PF, "vf": 0, "link": {"gen": 4, "width": 16, "mps": 256, "mrrs": 512},
     "devmem": 1 << 28, "clock_hz": 1e9, "time_scale": 1.0, "tlb_entries": 128}]}
N = 64 << 10  # a page-aligned 64 KiB host read: 128 requests of 512 B, 1024 completions
T0 = 2_000_000_000  # device ticks (ns) of the first TLP; mono = ticks + 1_000_000


def _tlps() -> np.ndarray:
    """The TLPs of that read as the device records them (docs/hardware.md section 11)."""
    reqs, cpls = linkmodel.read_requests(N, 512), linkmodel.completions(N, 512, 64)
    r = np.zeros(reqs + cpls, TLP_DTYPE)
    per = cpls // reqs
    i = np.arange(reqs)
    r["kind"][:reqs], r["flags"][:reqs], r["payload"][:reqs] = MRD, F_UP, 512
    r["tag"][:reqs], r["link_bytes"][:reqs] = i % 32, 24
    r["t_ps"][:reqs] = (T0 + i * 20) * 1000
    j = np.arange(cpls)
    c = slice(reqs, None)
    r["kind"][c], r["payload"][c], r["link_bytes"][c] = CPLD, 64, 84
    r["tag"][c] = (j // per) % 32
    r["byte_count"][c] = 512 - 64 * (j % per)
    r["t_ps"][c] = (T0 + 600 + (j // per) * 20) * 1000 + (j % per) * 2000
    r["seq"] = np.arange(len(r))
    return r[np.argsort(r["t_ps"], kind="stable")]


def _write(path: Path, tlp: bool = True) -> np.ndarray:
    recs = _tlps()
    with CaptureWriter(path, META) as w:
        clk = np.zeros(3, CLOCK_DTYPE)
        clk["devclk"] = T0 + np.array([-1_000_000, 0, 1_000_000])
        clk["mono_before"] = clk["devclk"].astype(np.int64) + 1_000_000 - 100
        clk["mono_after"] = clk["mono_before"] + 200
        w.append("clock_sync", clk)
        if tlp:
            w.append("tlp", recs)
    return recs


def test_stream_layout_is_the_record_and_a_fid() -> None:
    assert TLP_DTYPE.names[:len(TLP_REC_DTYPE.names)] == TLP_REC_DTYPE.names
    assert TLP_DTYPE.itemsize == TLP_REC_DTYPE.itemsize + 8 and FORMAT_MINOR >= 7


def test_round_trip_and_timeline_tracks_and_read_flows(tmp_path: Path) -> None:
    recs = _write(tmp_path / "cap")
    cap = open_capture(tmp_path / "cap")
    got = cap.read("tlp")
    assert cap.format_version == (1, FORMAT_MINOR)
    assert np.array_equal(got, recs)
    res = convert([tmp_path / "cap"], tmp_path / "t.json", fmt="json")
    assert not res.problems
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert {"TLPs down (H2D)", "TLPs up (D2H)"} <= names
    x = [e for e in ev if e["ph"] == "X" and e["name"].split()[0] in ("MRd", "CplD")]
    assert len(x) == len(recs)
    assert {e["name"] for e in x} == {"MRd 512 B", "CplD 64 B"}
    starts = {e["id"]: e["ts"] for e in ev if e["ph"] == "s"}
    ends = [e for e in ev if e["ph"] == "f"]
    assert len(starts) == len(ends) == linkmodel.read_requests(N, 512)
    # each read's latency on the capture's clock: request -> its last completion
    first = {}
    for e in sorted((e for e in ev if e["ph"] in ("t", "f")), key=lambda e: e["ts"]):
        first.setdefault(e["id"], e["ts"])
    assert {round((first[i] - t) * 1000) for i, t in starts.items()} == {600}
    # Perfetto (protobuf) too, with the tracks named
    convert([tmp_path / "cap"], tmp_path / "t.pftrace")
    raw = (tmp_path / "t.pftrace").read_bytes()
    assert b"TLPs down (H2D)" in raw and b"TLPs up (D2H)" in raw


@pytest.mark.parametrize("minor", range(0, 7))
def test_older_minors_read_without_a_tlp_stream(tmp_path: Path, minor: int) -> None:
    """A capture of minor 0-6 (meta.json minor k, no tlp.tcs) reads the stream as empty
    and still converts; the minor-0 capture of the old writer (tests/host/data) too."""
    p = tmp_path / f"v1.{minor}"
    _write(p, tlp=False)
    (p / "streams" / "tlp.tcs").unlink()
    meta = json.loads((p / "meta.json").read_text())
    meta["streams"].pop("tlp")
    if minor:
        meta["minor"] = minor
    else:
        meta.pop("minor")
    (p / "meta.json").write_text(json.dumps(meta))
    cap = open_capture(p)
    assert cap.format_version == (1, minor)
    t = cap.read("tlp")
    assert len(t) == 0 and t.dtype == TLP_DTYPE
    assert convert([p], tmp_path / "t.json", fmt="json").problems == []


def test_minor_0_capture_of_the_old_writer(tmp_path: Path) -> None:
    sys.path.insert(0, str(DATA))
    import make_capture_v1_0

    out = tmp_path / "capture-v1.0"
    make_capture_v1_0.main(str(out))
    for name in ("meta.json", "complete"):
        shutil.copyfile(DATA / "capture-v1.0" / name, out / name)
    cap = open_capture(out)
    assert cap.format_version == (1, 0) and not (out / "streams" / "tlp.tcs").exists()
    assert len(cap.read("tlp")) == 0
    analyze(cap)
    res = convert([out], tmp_path / "t.json", fmt="json")
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert not [e for e in ev if e.get("name") == "thread_name"
                and e["args"]["name"].startswith("TLPs")], res
