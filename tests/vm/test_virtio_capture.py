"""One real capture of the mixed workload on virtio-tacc, in the
extras boot (VIRTIO=1).

As tests/vm/test_e2e_real.py does on the PF: taccd's capture engine
(``tacc.daemon.session.CaptureSession``, the code behind ``taccd`` capture mode) with the
session's one BPF program (conftest ``program``), every function taccd discovers, and the
mixed workload run by test_e2e_real's worker process (API tracing on) on the virtio node.
The capture names the function by its PCI address and kind ``virtio``; every job
submitted on it has its completion; the backend's KICK and DISPATCH trace records join
the API call and the engine command by the user tag, in time order; the timeline's
events are monotonic per track and its flows run API -> driver -> device.  Also
``tacc devices`` and ``tacc cdi generate`` on the boot's real sysfs.

Figures are written under ``$TACC_VM_OUT/virtio-capture/``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_e2e_real import MIXED, Worker

OUT = Path(os.environ.get("TACC_VM_OUT") or "/tmp/tacc-e2e") / "virtio-capture"
EV_KICK, EV_DISPATCH = 0xF0, 0xF1  # tacc_hw.h TACC_TRACE_EV_VIRTIO_*, checked by a host test
SLACK_NS = 2000  # the clock conversion's error bound (test_e2e_real: within 2 us)


def _save(name: str, data: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=1, default=str) + "\n")


def _virtio_fn() -> Any:
    from tacc.devices import discover

    found = [f for f in discover() if f.kind == "virtio" and f.accel]
    if not found:
        pytest.skip("no virtio-tacc function bound in this boot (VIRTIO=1; extras has one)")
    return found[0]


class Captured:
    def __init__(self, path: Path, fid: int, pci: str, results: list[dict[str, Any]],
                 wpid: int) -> None:
        self.path, self.fid, self.pci, self.results, self.wpid = path, fid, pci, results, wpid


@pytest.fixture(scope="module")
def mixed(program: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """The mixed workload on the virtio node under a capture of every function."""
    from tacc.bpftrace.program import Filters
    from tacc.daemon.session import CaptureSession, Options
    from tacc.devices import discover

    v = _virtio_fn()
    out = tmp_path_factory.mktemp("virtio-cap") / "mixed"
    worker = Worker()
    try:
        fns = discover()
        fid = [f.pci for f in fns].index(v.pci)
        program.reset()
        program.configure(Filters())
        sess = CaptureSession(out, fns, Options(counters_hz=10.0, clock_hz=4.0),
                              program=program, tool="test_virtio_capture", node="virtio")
        program.attach("record", host=True, autotrace=True)
        stop = threading.Event()
        err: list[BaseException] = []

        def loop() -> None:
            try:
                while not stop.is_set():
                    sess.tick()
                    stop.wait(0.05)
            except BaseException as exc:  # noqa: BLE001 - reported below
                err.append(exc)

        th = threading.Thread(target=loop, daemon=True)
        t0 = time.monotonic()
        th.start()
        try:
            time.sleep(0.2)
            results = worker.run(MIXED, [v.pci])
            time.sleep(0.2)
        finally:
            stop.set()
            th.join(30)
            program.detach()
            summary = sess.close(complete=True)
        assert not err, err
        _save("capture.json", {"summary": summary, "wall_s": time.monotonic() - t0,
                               "results": results})
        yield Captured(out, fid, v.pci, results, worker.pid)
    finally:
        worker.close()


def test_capture_names_the_virtio_function_and_loses_nothing(mixed: Captured) -> None:
    from tacc.capture import open_capture

    cap = open_capture(mixed.path)
    assert cap.complete and not cap.problems, cap.problems  # clock pairs for every function
    meta = json.loads((mixed.path / "meta.json").read_text())
    d = meta["devices"][mixed.fid]
    assert (d["pci"], d["kind"], d["vf"]) == (mixed.pci, "virtio", 5), d
    assert cap.functions[mixed.fid].name == f"{mixed.pci} (virtio)"
    drops = cap.read("drops")
    assert int(drops["count"][drops["source"] != 4].sum()) == 0, drops  # 4: late samples
    assert all(r["device"] == mixed.pci and r.get("checked", True) for r in mixed.results), \
        mixed.results
    dt = cap.read("device_trace")
    assert set(dt["func"][dt["fid"] == mixed.fid].tolist()) == {5}  # TACC_FN_VIRTIO


def test_every_job_submitted_on_virtio_has_its_completion(mixed: Captured) -> None:
    """The frontend's tacc_submit and tacc_job_done tracepoints: every (context, seqno)
    submitted on the function completes, once, with its tag."""
    from tacc.capture import open_capture
    from tacc.capture.schema import DriverKind

    drv = open_capture(mixed.path).read("driver")
    drv = drv[drv["fid"] == mixed.fid]

    def jobs(kind: DriverKind) -> list[tuple[int, int, int]]:
        s = drv[drv["kind"] == kind]
        return sorted(zip(s["ctx"].tolist(), s["job"].tolist(), s["tag"].tolist(),
                          strict=True))

    sub, done, start = (jobs(DriverKind.SUBMIT), jobs(DriverKind.JOB_DONE),
                        jobs(DriverKind.JOB_START))
    assert len(sub) >= 50, len(sub)  # the mixed workload's jobs, on this function
    assert sub == done == start, (len(sub), len(done), len(start),
                                  sorted(set(sub) ^ set(done))[:10])
    assert {t >> 32 for _, _, t in sub if t} == {mixed.wpid}


def test_kick_and_dispatch_join_api_call_and_command_by_tag(mixed: Captured) -> None:
    """API call -> virtqueue kick -> backend dispatch -> engine command, one tag, times
    non-decreasing: each command's job has a DISPATCH record with its tag and device job
    number; the DISPATCH's kick time is a KICK record's; the API call that made the tag
    started before that kick and the command started after the dispatch."""
    from tacc.capture import open_capture

    cap = open_capture(mixed.path)
    clk = cap.device_clock(mixed.fid)
    dt = cap.read("device_trace")
    dt = dt[dt["fid"] == mixed.fid]
    api = cap.read("api")
    api = api[api["tag"] != 0]
    api_start = {int(t): int(s) for t, s in zip(api["tag"].tolist(), api["t_start"].tolist(),
                                                strict=True)}
    ev = dt["opcode"] >= 0xF0
    cmds, kicks, disp = dt[~ev], dt[dt["opcode"] == EV_KICK], dt[dt["opcode"] == EV_DISPATCH]
    assert len(kicks) and len(disp) and set(dt["opcode"][ev].tolist()) == {EV_KICK, EV_DISPATCH}
    by_job = {(int(c), int(j)): r for c, j, r in zip(disp["ctx"].tolist(),
                                                     disp["job"].tolist(), disp, strict=True)}
    kick_t = {int(t): int(tag) for t, tag in zip(kicks["t_start"].tolist(),
                                                 kicks["tag"].tolist(), strict=True)}
    assert len(by_job) == len(disp)  # one dispatch per device job
    # each kick carries its first job's tag: a tag some dispatch of that kick has
    first = {int(d["t_fetch"]): [] for d in disp}
    for d in disp:
        first[int(d["t_fetch"])].append(int(d["tag"]))
    # every dispatch's kick time is a KICK record's, whose tag is one of that kick's jobs'
    assert first and set(first) <= set(kick_t), sorted(set(first) - set(kick_t))[:10]
    assert [t for t, tags in first.items() if kick_t[t] not in tags] == [], "kick tags"
    bad: list[Any] = []
    joined = 0
    for c in cmds[cmds["tag"] != 0]:
        d = by_job.get((int(c["ctx"]), int(c["job"])))
        tag = int(c["tag"])
        if d is None or int(d["tag"]) != tag or int(d["t_fetch"]) not in kick_t:
            bad.append(("no dispatch/kick", hex(tag), int(c["job"])))
            continue
        kick, dsp, start = (int(x) for x in clk.convert(
            np.array([d["t_fetch"], d["t_start"], c["t_start"]], np.uint64)))
        a = api_start.get(tag)
        if a is None or not (a <= kick + SLACK_NS and kick <= dsp <= start):
            bad.append((hex(tag), a, kick, dsp, start))
        joined += 1
    _save("join.json", {"commands": int(len(cmds)), "joined": joined, "kicks": int(len(kicks)),
                        "dispatches": int(len(disp)), "bad": bad[:20]})
    assert not bad, bad[:10]
    assert joined >= 50, joined


def test_timeline_of_the_virtio_capture_is_monotonic_with_whole_flows(mixed: Captured) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.capture import open_capture
    from tacc.capture.schema import DriverKind
    from tacc.timeline.convert import convert

    cap = open_capture(mixed.path)
    out = mixed.path.parent / "mixed.pftrace"  # the guest's own tmpfs, not the out mount
    res = convert([mixed.path], out, summary=True)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    out.unlink()
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    te = [p for p in tr.packet if p.HasField("track_event")]

    def name(p: Any) -> str:
        return tracks[p.track_event.track_uuid].name

    def parent(p: Any) -> str:
        return tracks.get(tracks[p.track_event.track_uuid].parent_uuid,
                          pb.TrackDescriptor()).name

    group = f"device {mixed.pci} (virtio)"
    vtracks = {name(p) for p in te if parent(p) == group}
    assert "virtio kicks" in vtracks and any(n.startswith("virtio dispatch q")
                                             for n in vtracks), vtracks
    assert any(n.startswith("PCIe H2D") for n in vtracks), vtracks
    last: dict[int, int] = {}
    for p in te:  # every track's events in time order
        u = p.track_event.track_uuid
        assert p.timestamp >= last.get(u, 0), tracks[u].name
        last[u] = p.timestamp
    begins = sum(p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN for p in te)
    ends = sum(p.track_event.type == pb.TrackEvent.TYPE_SLICE_END for p in te)
    assert begins == ends
    # flows: API call -> submit -> kick/dispatch/command(s) -> completion, per job's tag
    where: dict[int, set[str]] = defaultdict(set)
    terms: dict[int, int] = defaultdict(int)
    for p in te:
        for f in p.track_event.flow_ids:
            where[f].add("api" if name(p).endswith("API") else parent(p).split(" ")[0])
        for f in p.track_event.terminating_flow_ids:
            terms[f] += 1
    mask = (1 << 56) - 1
    flows = {f & mask: f for f in where}
    drv = cap.read("driver")
    drv = drv[drv["fid"] == mixed.fid]
    done = {int(t) for t in drv["tag"][drv["kind"] == DriverKind.JOB_DONE] if t}
    missing = [hex(t) for t in done if t not in flows
               or not {"api", "driver", "device"} <= where[flows[t]] or terms[flows[t]] != 1]
    _save("timeline.json", {"events": res.events, "tracks": res.tracks,
                            "virtio_tracks": sorted(vtracks), "flows": len(done),
                            "missing": missing[:20]})
    assert done and not missing, missing[:10]


def test_analysis_of_the_virtio_capture(mixed: Captured) -> None:
    """The rules read the virtio function's commands (its kick and dispatch records are
    not commands): the mixed workload's per-command rules fire on it, and every
    finding's time ranges lie in the capture."""
    from tacc.analyze.engine import analyze, to_json
    from tacc.analyze.rules import Thresholds
    from tacc.capture import open_capture

    cap = open_capture(mixed.path)
    th = Thresholds()
    doc = to_json(cap, analyze(cap, th), th)
    _save("findings.json", doc)
    got = {f["rule"] for f in doc["findings"]}
    t0, t1 = cap.time_range
    for f in doc["findings"]:
        for a, b in f["time_ranges"]:
            assert t0 <= a <= b <= t1, f
    # tlb_thrash from the walks: virtio-tacc's binds are not in the driver stream
    assert {"small_transfers", "serialized_copies", "tlb_thrash"} <= got, got


def test_tacc_devices_and_cdi_name_the_virtio_function(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """On the boot's sysfs: ``tacc devices`` lists the function with kind virtio, its
    node and driver; ``tacc cdi generate`` gives it an accel device (its node) and no
    vfio device (docs/containers.md)."""
    import argparse

    from tacc import cdi
    from tacc.cli import devices as cli_devices

    v = _virtio_fn()
    # the subcommand's parser and code in process (tacc.cli imports every subcommand:
    # seconds of guest time)
    parser = argparse.ArgumentParser(prog="tacc")
    cli_devices.add_parser(parser.add_subparsers())
    args = parser.parse_args(["devices", "--json"])
    assert args.func(args) == 0
    rows = {r["pci"]: r for r in json.loads(capsys.readouterr().out)}
    r = rows[v.pci]
    assert (r["kind"], r["driver"], r["accel"]) == ("virtio", "tacc-virtio", v.accel), r
    assert Path(r["accel"]).is_char_device()
    assert [x["kind"] for x in rows.values()][-1] == "virtio"  # after the PF and VFs
    assert {"pf", "vf"} <= {x["kind"] for x in rows.values()}
    paths = cdi.generate(tmp_path / "tacc.yaml")
    accel = {d["name"]: d for d in cdi.load(paths[cdi.ACCEL_KIND])["devices"]}
    vfio = {d["name"] for d in cdi.load(paths[cdi.VFIO_KIND])["devices"]}
    assert accel[v.pci]["containerEdits"]["deviceNodes"][0]["path"] == v.accel
    assert v.pci not in vfio and vfio  # the PF and VFs have IOMMU groups (strict)
