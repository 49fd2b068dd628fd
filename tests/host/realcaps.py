"""The host layer's real captures (recorded in the test VM, not generated) and readers of
the timeline's three outputs, shared by the host tests that check values against them.

tests/host/data/real-mixed.tar.xz: test_e2e_real's mixed workload (strict boot);
tests/host/data/fixtures/*.tar.xz: ``make fixtures`` (RECORDED.json: how, when, commit).
"""

from __future__ import annotations

import json
import re
import tarfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
FIXTURES = DATA / "fixtures"


def archives() -> dict[str, Path]:
    """name -> tar.xz of every real capture (the fixtures, and real-mixed)."""
    out = {"real-mixed": DATA / "real-mixed.tar.xz"}
    out.update({p.name[:-len(".tar.xz")]: p for p in sorted(FIXTURES.glob("*.tar.xz"))})
    return out


def extract(archive: Path, root: Path) -> Path:
    with tarfile.open(archive) as tf:
        names = tf.getnames()
        tf.extractall(root)  # noqa: S202 (our own fixtures; Python 3.11.2 has no filter=)
    top = sorted({n.split("/")[0] for n in names})
    assert len(top) == 1, (archive, top)
    return root / top[0]


def fixture_meta(name: str) -> dict[str, Any]:
    """NAME.json of a fixture: its runs, time scale, devices and the worker's results."""
    p = FIXTURES / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else {}


# ------------------------------------------------------------ the three views --
Key = tuple[str, str]  # (the track's group under its node, the track's name)


@dataclass
class View:
    """One timeline output reduced to what the three formats share: slices and counter
    points per track, keyed by (group, track) as the Chrome JSON's process/thread."""

    slices: dict[Key, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    args: dict[Key, list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))
    counters: dict[Key, list[tuple[int, float]]] = field(
        default_factory=lambda: defaultdict(list))


def read_perfetto(path: Path) -> View:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    tr = pb.Trace()
    tr.ParseFromString(path.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}

    def key(uuid: int) -> Key:
        t = tracks[uuid]
        top = t
        while top.parent_uuid in tracks and tracks[top.parent_uuid].parent_uuid in tracks:
            top = tracks[top.parent_uuid]
        return top.name, t.name

    ann: dict[int, str] = {}
    open_: dict[int, tuple[int, dict[str, float]]] = {}
    v = View()
    for p in tr.packet:
        for a in p.interned_data.debug_annotation_names:
            ann[a.iid] = a.name
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            assert e.track_uuid not in open_, "overlapping slices on one track"
            args = {ann[a.name_iid]: (a.double_value if a.HasField("double_value")
                                      else a.uint_value) for a in e.debug_annotations}
            open_[e.track_uuid] = (p.timestamp, args)
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            ts, args = open_.pop(e.track_uuid)
            k = key(e.track_uuid)
            v.slices[k].append((ts, p.timestamp))
            v.args[k].append(args)
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            v.counters[key(e.track_uuid)].append((p.timestamp, e.double_counter_value))
    assert not open_, "slices without an end"
    return v


def read_chrome_json(path: Path) -> View:
    doc = json.loads(path.read_text())
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"].split(": ", 1)[-1]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    v = View()
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"]:
            k = (procs[e["pid"]], threads[(e["pid"], e["tid"])])
            ts = round(e["ts"] * 1000)
            v.slices[k].append((ts, ts + round(e["dur"] * 1000)))
        elif e["ph"] == "C":
            v.counters[(procs[e["pid"]], e["name"])].append((round(e["ts"] * 1000),
                                                             e["args"]["value"]))
    return v


def read_html(path: Path) -> View:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>',
                  path.read_text(), re.S)
    assert m, "no data block in the HTML view"
    d = json.loads(m.group(1).replace("<\\/", "</"))
    tracks = {t["id"]: t for t in d["tracks"]}

    def key(i: int) -> Key:
        t = tracks[i]
        top = t
        while top["parent"] is not None and tracks[top["parent"]]["parent"] is not None:
            top = tracks[top["parent"]]
        return top["name"], t["name"]

    v = View()
    t0 = d["t0"]
    for tr, ts, dur, _name, _flow in d["slices"]:
        if dur >= 0:
            v.slices[key(tr)].append((ts + t0, ts + t0 + dur))
    for tr, pts in d["counters"].items():
        v.counters[key(int(tr))] = [(round(a + t0), val) for a, val in pts]
    return v
