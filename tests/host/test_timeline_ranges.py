"""tacc timeline: tacc.range records on the thread's ranges track (nested) and projected
onto the device (first to last command of the calls inside each range)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from tacc.capture import CaptureWriter
from tacc.capture.schema import API_DTYPE, DEVICE_TRACE_DTYPE, Opcode
from tacc.timeline.convert import convert

T1, T2, T3 = (100 << 32) | 1, (100 << 32) | 2, (100 << 32) | 3


def _capture(path: Path) -> None:
    meta = {"node": "n0", "devices": [{"pci": "0000:01:00.0", "vf": 0, "clock_hz": 1e9}]}
    with CaptureWriter(path, meta) as w:
        rng, gemm = w.string_id("range"), w.string_id("gemm")
        rows = [  # name, args, t_start, t_end, tag (ranges are written when they end)
            (rng, "L0", 1100, 5000, 0), (gemm, "", 1200, 1300, T1),
            (gemm, "", 5200, 5300, T2), (rng, "L1", 5100, 9000, 0),
            (rng, "step 0", 1000, 10000, 0), (gemm, "", 12000, 12100, T3),
        ]
        a = np.zeros(len(rows), API_DTYPE)
        for i, (nm, args, t0, t1, tag) in enumerate(rows):
            a[i]["name_id"], a[i]["args_id"] = nm, w.string_id(args)
            a[i]["t_start"], a[i]["t_end"], a[i]["tag"] = t0, t1, tag
            a[i]["pid"] = a[i]["tid"] = 100
        w.append("api", a)
        cmds = [(T1, 2000, 3000), (T1, 3000, 4500), (T2, 6000, 8000), (T3, 13000, 14000)]
        d = np.zeros(len(cmds), DEVICE_TRACE_DTYPE)
        for i, (tag, t0, t1) in enumerate(cmds):
            d[i]["tag"], d[i]["t_fetch"], d[i]["t_start"], d[i]["t_end"] = tag, t0, t0, t1
            d[i]["opcode"], d[i]["engine"], d[i]["index"] = int(Opcode.GEMM), 2, i
        w.append("device_trace", d)


def test_ranges_on_the_thread_and_projected_on_the_device(tmp_path: Path) -> None:
    _capture(tmp_path / "c")
    out = tmp_path / "t.pftrace"
    convert([tmp_path / "c"], out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    names = {e.iid: e.name for p in tr.packet for e in p.interned_data.event_names}
    slices: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    open_: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for p in sorted((p for p in tr.packet if p.HasField("track_event")),
                    key=lambda p: p.timestamp):  # trace_processor's order
        e = p.track_event
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid].append((names[e.name_iid], p.timestamp))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:  # closes the innermost open slice
            nm, t0 = open_[e.track_uuid].pop()
            t = tracks[e.track_uuid]
            slices[f"{tracks[t.parent_uuid].name}/{t.name}"].append((nm, t0, p.timestamp))
    assert not any(open_.values())
    thread = sorted(slices["tid 100/tid 100 ranges"])
    assert thread == [("L0", 1100, 5000), ("L1", 5100, 9000), ("step 0", 1000, 10000)]
    assert sorted(slices["tid 100/tid 100 API"]) == [("gemm", 1200, 1300),
                                                     ("gemm", 5200, 5300),
                                                     ("gemm", 12000, 12100)]
    dev = sorted(slices["device 0000:01:00.0/ranges"])
    # L0: its gemm's two commands; L1: T2's; step 0: both; T3's call is in no range
    assert dev == [("L0", 2000, 4500), ("L1", 6000, 8000), ("step 0", 2000, 8000)]


def test_capture_without_ranges_has_no_ranges_tracks(tmp_path: Path) -> None:
    from tacc.capture.synth import generate

    generate(tmp_path / "c", "tiny_transfers", "good")
    convert([tmp_path / "c"], tmp_path / "t.pftrace")
    tr = pb.Trace()
    tr.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    assert not [p for p in tr.packet if p.HasField("track_descriptor")
                and p.track_descriptor.name.endswith("ranges")]
