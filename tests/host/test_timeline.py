"""tacc timeline: decode the Perfetto output with the official protos, JSON, summary, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from tacc.capture import open_capture
from tacc.capture.synth import Sim, generate, run
from tacc.cli import main
from tacc.timeline import protoenc as pe
from tacc.timeline.convert import convert


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    p = tmp_path_factory.mktemp("tl") / "cap"
    truth = generate(p, [("mlp", False), ("map_churn", True), ("host_bound", True)])
    return p, truth


def _decode(path: Path) -> pb.Trace:
    tr = pb.Trace()
    tr.ParseFromString(path.read_bytes())
    return tr


def test_varint_padding_roundtrip() -> None:
    vals = np.array([0, 1, 127, 128, 300, 2**35, 2**63 - 1], np.uint64)
    rows = pe.packets(len(vals), pe.f_varint(8, vals) + pe.f_const_varint(10, 1))
    tr = pb.Trace()
    tr.ParseFromString(rows.tobytes())
    assert [p.timestamp for p in tr.packet] == vals.tolist()


def test_perfetto_every_event_flow_and_order(mixed: tuple[Path, dict], tmp_path: Path) -> None:
    cap_path, truth = mixed
    out = tmp_path / "t.pftrace"
    res = convert([cap_path], out)
    tr = _decode(out)
    cap = open_capture(cap_path)
    te = [p for p in tr.packet if p.HasField("track_event")]
    by_type: dict[int, int] = defaultdict(int)
    for p in te:
        by_type[p.track_event.type] += 1
    assert by_type[pb.TrackEvent.TYPE_SLICE_BEGIN] == by_type[pb.TrackEvent.TYPE_SLICE_END]
    names = {}
    for p in tr.packet:
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
    # every capture event is there: API calls, device commands, driver events
    begins = [p for p in te if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    instants = [p for p in te if p.track_event.type == pb.TrackEvent.TYPE_INSTANT]
    dev_ops = {"copy_h2d", "copy_d2h", "gemm"}
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}

    def on(kind: str, p: pb.TracePacket) -> bool:
        return tracks[p.track_event.track_uuid].name.startswith(kind)

    n_dev = sum(1 for p in begins if on("PCIe", p) or on("compute", p))
    assert n_dev == cap.count("device_trace")
    n_api = sum(1 for p in begins if tracks[p.track_event.track_uuid].name.endswith("API"))
    assert n_api == cap.count("api")
    drv = cap.read("driver")
    # kinds drawn as slices (BO_DESTROY, 8, is an instant on its own "bo free" track)
    span_kinds = np.isin(drv["kind"], [1, 7, 9, 10, 11, 12])
    n_drv_slices = sum(1 for p in begins if tracks[tracks[p.track_event.track_uuid]
                                                   .parent_uuid].name.startswith("driver"))
    n_drv_inst = sum(1 for p in instants if tracks[tracks[p.track_event.track_uuid]
                                                   .parent_uuid].name.startswith("driver"))
    assert n_drv_slices == int(span_kinds.sum())
    assert n_drv_inst == int((~span_kinds).sum())
    assert {names[p.track_event.name_iid] for p in begins if on("PCIe", p)} <= dev_ops
    # flows: every API flow reaches a device slice and terminates at a completion
    starts: dict[int, int] = defaultdict(int)
    terms: dict[int, int] = defaultdict(int)
    for p in te:
        for f in p.track_event.flow_ids:
            starts[f] += 1
        for f in p.track_event.terminating_flow_ids:
            terms[f] += 1
    api_flows = {f for p in begins if tracks[p.track_event.track_uuid].name.endswith("API")
                 for f in p.track_event.flow_ids}
    dev_tags = {int(t) for t in cap.read("device_trace")["tag"]}
    assert len(api_flows) >= len(dev_tags) > 0
    for f in api_flows:
        if (f & ((1 << 56) - 1)) in dev_tags:
            assert terms[f] == 1 and starts[f] >= 3  # API, submit, device (+more commands)
    assert set(terms) <= api_flows
    # timestamps monotonic per track in file order; slices properly paired
    last: dict[int, int] = {}
    open_: dict[int, int] = defaultdict(int)
    for p in te:
        u = p.track_event.track_uuid
        assert p.timestamp >= last.get(u, 0), tracks[u].name
        last[u] = p.timestamp
        if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[u] += 1
            assert open_[u] == 1
        elif p.track_event.type == pb.TrackEvent.TYPE_SLICE_END:
            open_[u] -= 1
            assert open_[u] == 0
    # clock metadata
    meta = [m for p in tr.packet for m in p.chrome_events.metadata if m.name == "tacc"]
    clk = json.loads(meta[0].json_value)["nodes"][0]["device_clocks"]["0000:01:00.0"]
    assert clk["pairs"] > 10 and clk["residual_rms_ns"] < 2000
    assert res.events > 0


def test_device_time_conversion_within_2us(mixed: tuple[Path, dict]) -> None:
    cap_path, truth = mixed
    cap = open_capture(cap_path)
    rec = cap.read("device_trace")
    clk = cap.device_clock(0)
    m = rec["fid"] == 0
    conv = clk.convert(rec["t_start"][m])
    # the ground truth in the synth is in (fid, t_end) order like the stream
    cm = truth["cmds"]
    o = np.lexsort((cm["t_end"], cm["fid"]))
    true = cm["t_start"][o][cm["fid"][o] == 0]
    err = np.abs(conv - true)
    assert err.max() < 2000, err.max()
    assert clk.bound_ns < 5000


def test_host_tracks_carry_process_and_thread_names(mixed: tuple[Path, dict],
                                                    tmp_path: Path) -> None:
    """the comm of the sched records names the processes and threads:
    Perfetto process/thread descriptors (decoded with the official protos), and the names
    of the tracks in the Perfetto, JSON and HTML views."""
    from tacc.capture.synth import PID, TID

    cap_path, _ = mixed
    out = tmp_path / "t.pftrace"
    convert([cap_path], out)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in _decode(out).packet
              if p.HasField("track_descriptor")}
    procs = {d.process.pid: d for d in tracks.values() if d.HasField("process")}
    threads = {(d.thread.pid, d.thread.tid): d for d in tracks.values() if d.HasField("thread")}
    assert procs[PID].process.process_name == "tacc-run", procs
    assert not procs[PID].HasField("parent_uuid")  # a process track is a root track
    th = threads[(PID, TID)]
    assert th.thread.thread_name == "tacc-run" and th.parent_uuid == procs[PID].uuid
    # the API, CPU (sched) and wakeup tracks of the thread are its children, named
    kids = {d.name for d in tracks.values() if d.parent_uuid == th.uuid}
    assert kids == {f"tacc-run tid {TID} API", f"tacc-run tid {TID} CPU",
                    f"tacc-run tid {TID} wakeups"}, kids
    # no unnamed host track remains
    unnamed = [d.name for d in tracks.values() if d.name.startswith(("tid ", "pid "))]
    assert not unnamed, unnamed
    # JSON: the process and thread names of the trace-event metadata
    js = tmp_path / "t.json"
    convert([cap_path], js, fmt="json")
    meta = [e for e in json.loads(js.read_text())["traceEvents"] if e["ph"] == "M"]
    pnames = {e["args"]["name"] for e in meta if e["name"] == "process_name"}
    tnames = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert f"node0: tacc-run pid {PID}" in pnames, pnames
    assert {f"tacc-run tid {TID} API", f"tacc-run tid {TID} CPU"} <= tnames, tnames
    # HTML: the track list carries the names and the OS ids
    page = tmp_path / "t.html"
    convert([cap_path], page, fmt="html")
    text = page.read_text()
    assert f'"name": "tacc-run tid {TID} CPU"' in text or f'"tacc-run tid {TID} CPU"' in text
    assert '"os": "thread"' in text or '"os":"thread"' in text


def test_merge_two_nodes_aligned(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    generate(a, "serialized_copies", "good", node="vm-a")
    # second VM booted 7 s before the first (same host clock), with another device clock,
    # and ran the same workload at the same host time
    sim = Sim(node="vm-b", seed=3, dev_offset=9_000_000_000, drift_ppm=-12.0,
              host_offset=1_700_000_000_000_000_000 - 7_000_000_000)
    run(sim, [("serialized_copies", False)], t_start=7_010_000_000)
    sim.write(b)
    out = tmp_path / "m.pftrace"
    convert([a, b], out)
    tr = _decode(out)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    roots = {d.name for d in tracks.values() if not d.HasField("parent_uuid")}
    assert roots == {"vm-a", "vm-b"}

    def first_dev(node: str) -> int:
        def root(u: int) -> str:
            while tracks[u].HasField("parent_uuid"):
                u = tracks[u].parent_uuid
            return tracks[u].name
        return min(p.timestamp for p in tr.packet if p.HasField("track_event")
                   and tracks[p.track_event.track_uuid].name.startswith("PCIe H2D")
                   and root(p.track_event.track_uuid) == node)

    # 7 s apart on their own monotonic clocks, together on the merged timeline
    assert abs(first_dev("vm-b") - first_dev("vm-a")) < 5_000


def test_json_and_summary(mixed: tuple[Path, dict], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    cap_path, _ = mixed
    out = tmp_path / "t.json"
    assert main(["timeline", str(cap_path), "-o", str(out), "--summary"]) == 0
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    cap = open_capture(cap_path)
    x = [e for e in ev if e["ph"] == "X"]
    assert len(x) >= cap.count("api") + cap.count("device_trace")
    assert {e["ph"] for e in ev} >= {"X", "i", "C", "M", "s", "t", "f"}
    s = capsys.readouterr().out
    assert "busy ms" in s and "PCIe H2D q0" in s and "top 10 slices" in s


@pytest.mark.long
def test_streaming_memory_bounded(tmp_path: Path) -> None:
    """Peak RSS of the conversion does not grow with capture length."""
    code = (
        "import sys; from tacc.timeline.convert import convert;"
        "convert([sys.argv[1]], sys.argv[2]);"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    rss = []
    for scale in (1, 4):
        p = tmp_path / f"c{scale}"
        generate(p, "tiny_transfers", "bad", scale=scale)
        r = subprocess.run([sys.executable, "-c", code, str(p), str(tmp_path / "o.pftrace")],
                           capture_output=True, text=True, check=True)
        rss.append(int(r.stdout.strip()))
        sz = sum(f.stat().st_size for f in (p / "streams").iterdir())
    assert sz > 40 << 20  # the big capture is larger than the import overhead
    assert rss[1] < rss[0] + 20_000, rss  # KiB: 4x the capture, same peak


@pytest.mark.parametrize("out", ["no/such/dir/x.pftrace", "."])
def test_unwritable_output_one_line(tmp_path: Path, out: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c"
    generate(p, "tiny_transfers", "good")
    code = main(["timeline", str(p), "-o", str(tmp_path / out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"tacc: error: {tmp_path / out}: ")


@pytest.mark.parametrize("damage", ["empty", "version", "truncated", "missing"])
def test_clear_error_line(tmp_path: Path, damage: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "c"
    if damage != "missing":
        generate(p, "tiny_transfers", "good")
    if damage == "empty":
        (p / "meta.json").write_text("")
    elif damage == "version":
        meta = json.loads((p / "meta.json").read_text())
        meta["version"] = 2
        (p / "meta.json").write_text(json.dumps(meta))
    elif damage == "truncated":
        f = p / "streams" / "device_trace.tcs"
        os.truncate(f, f.stat().st_size - 10)
    argv = ["timeline", str(p), "-o", str(tmp_path / "x.pftrace")]
    if damage == "truncated":  # one real process: exit status and stderr exactly
        r = subprocess.run([sys.executable, "-m", "tacc.cli", *argv], capture_output=True,
                           text=True)
        code, err = r.returncode, r.stderr
    else:
        code = main(argv)
        err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tacc: error: "), r.stderr
    assert "Traceback" not in err


def test_device_events_are_instants_on_events_track(mixed: tuple[Path, dict],
                                                    tmp_path: Path) -> None:
    cap_path, _ = mixed
    cap = open_capture(cap_path)
    ev = cap.read("device_events")
    assert len(ev) == 3  # synth: PF resume, an MMU fault, PF suspend
    out = tmp_path / "t.pftrace"
    convert([cap_path], out)
    tr = _decode(out)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    names = {e.iid: e.name for p in tr.packet for e in p.interned_data.event_names}
    ann = {e.iid: e.name for p in tr.packet for e in p.interned_data.debug_annotation_names}
    evt = [u for u, d in tracks.items() if d.name == "events"]
    assert len(evt) == 1
    assert tracks[tracks[evt[0]].parent_uuid].name == "device 0000:01:00.0"
    got = [p for p in tr.packet if p.HasField("track_event")
           and p.track_event.track_uuid == evt[0]]
    assert all(p.track_event.type == pb.TrackEvent.TYPE_INSTANT for p in got)
    assert all(not p.track_event.flow_ids and not p.track_event.terminating_flow_ids
               for p in got)
    assert [names[p.track_event.name_iid] for p in got] == ["pm", "mmu_fault", "pm"]
    ts = [p.timestamp for p in got]
    assert ts == sorted(ts) and ts == sorted(ev["t_ns"].tolist())
    fault = {ann[a.name_iid]: a.uint_value for a in got[1].track_event.debug_annotations}
    assert set(fault) == {"ctx", "queue", "tag", "addr", "arg", "status"}
    assert fault["addr"] == 0xDEAD_0000 and fault["ctx"] == 1 and fault["status"] == 1
    pm = [{ann[a.name_iid]: a.uint_value for a in p.track_event.debug_annotations}["arg"]
          for p in (got[0], got[2])]
    assert pm == [0, 3]  # resumed (D0), then suspended (D3hot)


def test_device_events_monotonic_across_chunks(tmp_path: Path) -> None:
    """taccd writes events in arrival order (hot-plug time vs driver timestamps), across
    chunks: per-track times stay monotonic, every event is kept, output is deterministic."""
    from tacc.capture import CaptureWriter
    from tacc.capture.schema import DEVICE_EVENTS_DTYPE, DRIVER_DTYPE, DeviceEventKind

    meta = {"node": "n0", "devices": [{"pci": f"0000:01:00.{i}", "vf": i} for i in range(3)]}
    cap = tmp_path / "c"
    times = [50_000, 10_000, 30_000, 20_000, 40_000, 5_000, 60_000, 1_000]
    with CaptureWriter(cap, meta, chunk_bytes=64 * 3) as w:  # 3 events per chunk
        w.append("driver", np.zeros(1, DRIVER_DTYPE))
        for i, t in enumerate(times):
            e = np.zeros(1, DEVICE_EVENTS_DTYPE)
            e["t_ns"], e["fid"], e["arg"] = t, i % 3, i
            e["kind"] = int(DeviceEventKind.PM if i % 2 else DeviceEventKind.HOTPLUG_ADD)
            w.append("device_events", e)
    assert len(list(open_capture(cap).chunks("device_events"))) == 3
    outs = []
    for k in range(2):
        res = convert([cap], tmp_path / f"t{k}.pftrace", summary=True)
        outs.append((tmp_path / f"t{k}.pftrace").read_bytes())
        assert res.device_events == {"hotplug_add": 4, "pm": 4}
        assert "device events: 8 (hotplug_add 4, pm 4)" in res.summary
    assert outs[0] == outs[1]
    tr = _decode(tmp_path / "t0.pftrace")
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    per: dict[int, list[int]] = defaultdict(list)
    for p in tr.packet:
        if p.HasField("track_event") and tracks[p.track_event.track_uuid].name == "events":
            per[p.track_event.track_uuid].append(p.timestamp)
    assert len(per) == 3 and sum(len(v) for v in per.values()) == 8
    for v in per.values():
        assert v == sorted(v)
    # fid 0: 50k (chunk 1), 20k (chunk 2), 60k (chunk 3); fid 1: 10k, 40k, 1k; fid 2: 30k,
    # 5k: an event older than the last one of its track in an earlier chunk is drawn at
    # that time
    by_parent = {tracks[tracks[u].parent_uuid].name: v for u, v in per.items()}
    assert by_parent["device 0000:01:00.0"] == [50_000, 50_000, 60_000]
    assert by_parent["device 0000:01:00.1 (VF1)"] == [10_000, 40_000, 40_000]
    assert by_parent["device 0000:01:00.2 (VF2)"] == [30_000, 30_000]


def test_capture_without_device_events_stream(tmp_path: Path) -> None:
    p = tmp_path / "c"
    generate(p, "tiny_transfers", "good")
    (p / "streams" / "device_events.tcs").unlink()
    (p / "complete").unlink()
    res = convert([p], tmp_path / "t.pftrace", summary=True)
    assert res.device_events == {} and "device events: 0" in res.summary
    tr = _decode(tmp_path / "t.pftrace")
    assert not any(p.track_descriptor.name == "events" for p in tr.packet
                   if p.HasField("track_descriptor"))


def test_findings_overlay_in_json_and_perfetto(mixed: tuple[Path, dict], tmp_path: Path) -> None:
    """Analysis findings on the timeline: a slice per time range (Chrome JSON in us, with the
    suggestion and the time lost in ms; Perfetto one track per rule under the first track,
    a range ending before it starts drawn empty), named "severity: title" (the rule without
    a title)."""
    from tacc.timeline.convert import FINDINGS_UUID_BASE

    cap_path, _ = mixed
    findings = [
        {"rule": "small_transfers", "severity": "high", "title": "many small copies",
         "time_ranges": [[2_000_000, 5_000_000], [9_000_000, 9_500_000]],
         "suggestion": "batch them", "time_lost_ns": 1_500_000, "id": "st1"},
        {"rule": "idle_gaps", "severity": "low", "time_ranges": [[7_000, 6_000]]},
    ]
    out = tmp_path / "f.json"
    convert([cap_path], out, fmt="json", findings=findings)
    ev = json.loads(out.read_text())["traceEvents"]
    assert {"ph": "M", "cat": "__metadata", "name": "process_name", "pid": 0,
            "args": {"name": "tacc findings"}} in ev
    got = [e for e in ev if e.get("cat") == "finding"]
    assert got == [
        {"ph": "X", "cat": "finding", "pid": 0, "tid": 0, "ts": 2000.0, "dur": 3000.0,
         "name": "high: many small copies",
         "args": {"suggestion": "batch them", "time_lost_ms": 1.5}},
        {"ph": "X", "cat": "finding", "pid": 0, "tid": 0, "ts": 9000.0, "dur": 500.0,
         "name": "high: many small copies",
         "args": {"suggestion": "batch them", "time_lost_ms": 1.5}},
        {"ph": "X", "cat": "finding", "pid": 0, "tid": 0, "ts": 7.0, "dur": -1.0,
         "name": "low: idle_gaps", "args": {"suggestion": "", "time_lost_ms": 0.0}}]
    out = tmp_path / "f.pftrace"
    convert([cap_path], out, findings=findings)
    tr = _decode(out)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    first = next(p.track_descriptor.uuid for p in tr.packet if p.HasField("track_descriptor"))
    rules = {tracks[u].name: u for u in tracks if u >= FINDINGS_UUID_BASE}
    assert rules == {"finding: idle_gaps": FINDINGS_UUID_BASE,
                     "finding: small_transfers": FINDINGS_UUID_BASE + 1}
    assert {tracks[u].parent_uuid for u in rules.values()} == {first}
    sl = [p for p in tr.packet if p.HasField("track_event")
          and p.track_event.track_uuid >= FINDINGS_UUID_BASE]
    assert [(p.timestamp, p.track_event.type, p.track_event.track_uuid) for p in sl] == [
        (2_000_000, pb.TrackEvent.TYPE_SLICE_BEGIN, FINDINGS_UUID_BASE + 1),
        (5_000_000, pb.TrackEvent.TYPE_SLICE_END, FINDINGS_UUID_BASE + 1),
        (9_000_000, pb.TrackEvent.TYPE_SLICE_BEGIN, FINDINGS_UUID_BASE + 1),
        (9_500_000, pb.TrackEvent.TYPE_SLICE_END, FINDINGS_UUID_BASE + 1),
        (7_000, pb.TrackEvent.TYPE_SLICE_BEGIN, FINDINGS_UUID_BASE),
        (7_000, pb.TrackEvent.TYPE_SLICE_END, FINDINGS_UUID_BASE)]
    b = sl[0].track_event
    assert b.name == "high: many small copies"
    ann = {a.name: (a.string_value or a.double_value) for a in b.debug_annotations}
    assert ann == {"severity": "high", "suggestion": "batch them", "id": "st1",
                   "time_lost_ms": 1.5}
    ann = {a.name: a.double_value for a in sl[4].track_event.debug_annotations
           if a.name == "time_lost_ms"}
    assert sl[4].track_event.name == "low: idle_gaps" and ann == {"time_lost_ms": 0.0}


def test_summary_slice_names_and_text_of_a_real_capture(tmp_path: Path) -> None:
    """The summary of a real capture (tlb_thrash-bad): per slice name the count and total
    of the Chrome JSON's slices of that name (a device command's JSON name quotes it:
    ``Memcpy HtoD (copy_h2d)``) with its zero-length instants, most time first; the
    text's tables carry their column heads and each name's row."""
    import re

    from realcaps import archives, extract

    p = extract(archives()["tlb_thrash-bad"], tmp_path)
    res = convert([p], tmp_path / "t.json", fmt="json", summary=True)
    doc = json.loads((tmp_path / "t.json").read_text())
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for e in doc["traceEvents"]:
        if e["ph"] in ("X", "i") and e["pid"]:
            m = re.fullmatch(r".* \((\w+)\)", e["name"])
            name = m.group(1) if m else e["name"]
            count[name] += 1
            total[name] += e.get("dur", 0) * 1000
    sn = res.summary_json["slice_names"]
    assert {r["name"]: r["count"] for r in sn} == count
    for r in sn:
        assert abs(r["total_ns"] - total[r["name"]]) <= count[r["name"]], r  # us, 3 decimals
    assert len(sn) > 3 and [r["total_ns"] for r in sn] == sorted(
        (r["total_ns"] for r in sn), reverse=True)
    lines = res.summary.splitlines()
    assert any(ln.split() == ["track", "slices", "busy", "ms", "busy", "%", "sleeping", "ms"]
               for ln in lines)
    assert any(ln.split() == ["slice", "name", "count", "total", "ms"] for ln in lines)
    for r in sn[:15]:
        assert any(ln.split()[-3:] == [*r["name"].split()[-1:], str(r["count"]),
                                       f"{r['total_ns'] / 1e6:.3f}"] for ln in lines), r


def test_fmt_bytes_binary_units() -> None:
    from tacc.timeline.summary import fmt_bytes

    assert [fmt_bytes(v) for v in (0, 1023, 1024, 1536, (1 << 20) - 1, 1 << 20, 3 << 30,
                                   -2048)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "1024.00 KiB", "1.00 MiB", "3.00 GiB",
        "-2.00 KiB"]


def test_chrome_json_metadata_and_categories_of_a_real_capture(tmp_path: Path) -> None:
    """The Chrome JSON of a real capture (tlb_thrash-bad): its metadata names the node,
    the capture, its kernel and each function's device clock, and the ranks; a slice's
    category is its group's first word (device, driver, host), else cpu_op for an API
    thread, os for the others (the device's commands carry their own: kernel, gpu_*)."""
    from realcaps import archives, extract

    p = extract(archives()["tlb_thrash-bad"], tmp_path)
    convert([p], tmp_path / "t.json", fmt="json")
    doc = json.loads((tmp_path / "t.json").read_text())
    cap = open_capture(p)
    meta = doc["metadata"]["tacc"]
    (node,) = meta["nodes"]
    assert (node["node"], node["capture"], node["kernel"]) == (cap.node, str(p),
                                                               cap.meta["kernel"])
    assert set(node["device_clocks"]) == {f.pci for f in cap.functions}
    # a rank per device function (HTA's view): "node pci", virtio-tacc's marked
    assert [r.split(" ")[:2] for r in meta["ranks"]] == [[cap.node, f.pci]
                                                         for f in cap.functions]
    procs = {e["pid"]: e["args"]["name"].split(": ", 1)[-1] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    seen = set()
    for e in doc["traceEvents"]:
        if e["ph"] != "X" or not e["pid"] or e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        word = procs[e["pid"]].split(" ", 1)[0]
        want = word if word in ("device", "driver", "host") else \
            "cpu_op" if threads[(e["pid"], e["tid"])].endswith(" API") else "os"
        assert e["cat"] == want, (procs[e["pid"]], threads[(e["pid"], e["tid"])], e["cat"])
        seen.add(want)
    assert seen >= {"driver", "cpu_op", "os"}
