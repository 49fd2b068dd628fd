"""The load from storage (docs/workloads.md "load", docs/analysis.md "load_serialised"):
the rule on synthetic captures of both twins and on hand-made cases, its pipeline model,
the timeline's storage track and flow per tensor, and the workload on the simulator (the
VM's real captures: tests/vm/test_load.py)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.analyze.engine import analyze
from tacc.analyze.rules import Thresholds
from tacc.analyze.rules.load_serialised import flow_ns
from tacc.capture import open_capture
from tacc.capture.synth import LOAD_CHUNK, LOAD_TENSOR, NVME_DEV, generate


# The two-stage pipeline in closed form (and with a bounded number of staging buffers):
# the reference flow_ns is checked against.
def pipelined_ns(r: np.ndarray, u: np.ndarray, buffers: int | None = None) -> int:
    """Makespan of read phases ``r`` and upload phases ``u`` (in order) run as a two-stage
    pipeline: read i starts when read i-1 has finished (and, with ``buffers`` staging
    buffers, when the upload that last used its buffer, i - buffers, has); upload i when
    read i and upload i-1 have.  ``buffers`` None: as many as it takes, the makespan is
    then the longest of the first k reads and the uploads from k on (the overlap a load
    leaves on the table, whatever its buffering)."""
    r = np.asarray(r, np.int64)
    u = np.asarray(u, np.int64)
    if not len(r):
        return 0
    if buffers is None:
        return int(np.max(np.cumsum(r) + np.cumsum(u[::-1])[::-1]))
    rend: list[int] = []
    uend: list[int] = []
    for i in range(len(r)):
        free = uend[i - buffers] if i >= buffers else 0
        rend.append(max(rend[-1] if rend else 0, free) + int(r[i]))
        uend.append(max(uend[-1] if uend else 0, rend[-1]) + int(u[i]))
    return uend[-1]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("load")
    return {v: (root / v, generate(root / v, "load", v)) for v in ("bad", "good")}


def test_rule_fires_on_the_bad_twin_only_estimate_within_25_percent(twins: dict) -> None:
    bad = analyze(open_capture(twins["bad"][0]))
    assert [f.rule for f in bad] == ["load_serialised"], [(f.rule, f.title) for f in bad]
    assert analyze(open_capture(twins["good"][0])) == []
    f = bad[0]
    measured = twins["bad"][1]["wall_ns"] - twins["good"][1]["wall_ns"]
    assert measured > 0
    assert abs(f.time_lost_ns - measured) <= 0.25 * measured, (f.time_lost_ns, measured)
    ev = f.evidence
    # the synthetic run's own values: 8 tensors of 4 requests and the header's one
    assert ev["read_requests"] == 8 * (LOAD_TENSOR // LOAD_CHUNK) + 1
    assert ev["read_bytes"] == 8 * LOAD_TENSOR + 4096
    assert ev["upload_bytes"] == 8 * LOAD_TENSOR and ev["upload_commands"] == 8
    assert ev["phases"] == 8 and ev["overlap_ns"] == 0
    assert ev["reads_in_uploads"] == ev["uploads_in_reads"] == 0
    assert ev["block_dev"] == f"{NVME_DEV >> 20}:{NVME_DEV & 0xFFFFF}" == "259:0"
    # the bad twin reads on the workload's own thread (synth PID 4242, comm tacc-run)
    assert (ev["pid"], ev["comm"], ev["traced_api"]) == (4242, "tacc-run", True)
    assert ev["load_ns"] - ev["pipelined_ns"] == f.time_lost_ns
    assert len(f.time_ranges) == 8 and f.functions == ["0000:01:00.0"]
    assert "reader thread" in f.suggestion and f.severity == "high"


def test_rule_needs_block_operations_and_ignores_writes(twins: dict, tmp_path: Path) -> None:
    """A capture older than minor 13 records no block operation: the rule reads nothing
    from it; write requests of the same process are never reads."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(twins["bad"][0], old)
    meta = json.loads((old / "meta.json").read_text())
    meta["minor"] = 12
    (old / "meta.json").write_text(json.dumps(meta))
    assert not any(f.rule == "load_serialised" for f in analyze(open_capture(old)))
    from tacc.capture.schema import BlockOp, HostKind
    from tacc.capture.synth import PID, TID, Sim, w_load

    sim = Sim()
    w_load(sim, 10_000_000, 1, False)
    for h in sim.host:  # the bad twin's reads made writes
        blk = (h["kind"] == HostKind.BLOCK_COMPLETE) | (h["kind"] == HostKind.BLOCK_ISSUE)
        h["prev_state"][blk] = int(BlockOp.WRITE)
    sim.segments.append({"workload": "load", "variant": "bad", "t_start": 0, "t_end": 1})
    sim.write(tmp_path / "w")
    assert "load_serialised" not in {f.rule for f in analyze(open_capture(tmp_path / "w"))}
    assert PID and TID


def test_thresholds_are_beside_the_rule_and_in_the_docs() -> None:
    th = Thresholds()
    assert (th.load_min_read_bytes, th.load_max_overlap, th.load_min_phases,
            th.load_upload_ratio, th.idle_storage_bytes) == (1 << 20, 0.1, 3, 0.9, 256 << 10)
    doc = (Path(__file__).resolve().parents[2] / "docs/analysis.md").read_text()
    for k in ("load_min_read_bytes", "load_max_overlap", "load_min_phases",
              "load_upload_ratio", "idle_storage_bytes"):
        assert f"`{k}`" in doc, k


def test_pipelined_ns_values() -> None:
    # r = u: every read but the first hides an upload
    assert pipelined_ns(np.array([10, 10, 10]), np.array([10, 10, 10])) == 40
    # reads longer: the reads' sum and the last upload
    assert pipelined_ns(np.array([30, 30, 30]), np.array([10, 10, 10])) == 100
    # uploads longer: the first read and the uploads' sum
    assert pipelined_ns(np.array([5, 5, 5]), np.array([20, 20, 20])) == 65
    # one buffer: no overlap at all
    assert pipelined_ns(np.array([10, 10]), np.array([10, 10]), buffers=1) == 40
    assert pipelined_ns(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0
    # a short read behind a long upload: two buffers stall, enough buffers do not
    r, u = np.array([10, 1, 30, 30]), np.array([20, 20, 1, 1])
    assert pipelined_ns(r, u, buffers=2) == 91 and pipelined_ns(r, u) == 72


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1,
                max_size=40), st.integers(1, 4))
def test_pipelined_ns_bounds(ph: list[tuple[int, int]], buffers: int) -> None:
    """Never longer than serial, never shorter than either stage alone or than the first
    read plus the last upload; more buffers never slower."""
    r = np.array([a for a, _ in ph], np.int64)
    u = np.array([b for _, b in ph], np.int64)
    p = pipelined_ns(r, u, buffers)
    assert max(int(r.sum()) + int(u[-1]), int(r[0]) + int(u.sum())) <= p <= int((r + u).sum())
    assert pipelined_ns(r, u) <= pipelined_ns(r, u, buffers + 1) <= p
    assert pipelined_ns(r, u, len(r) + 1) == pipelined_ns(r, u)  # unbounded = enough
    if buffers == 1:
        assert p == int((r + u).sum())


def test_flow_ns_values() -> None:
    # storage, host, link: the longest stage's sum plus the others' first and last phases
    assert flow_ns([np.array([1, 1, 1]), np.array([5, 5, 5]), np.array([2, 2, 2])]) == 18
    # a long last link phase: both reads, the last host phase, then it (4 + 4 + 1 + 9)
    assert flow_ns([np.array([4, 4]), np.array([1, 1]), np.array([1, 9])]) == 18
    assert flow_ns([np.zeros(0, np.int64)] * 3) == 0 and flow_ns([]) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
                min_size=1, max_size=40))
def test_flow_ns_bounds(ph: list[tuple[int, int, int]]) -> None:
    """Two stages: pipelined_ns unbounded; three: never longer than serial, never shorter
    than any stage's sum, and a stage of zeros changes nothing."""
    r, h, g = (np.array(x, np.int64) for x in zip(*ph, strict=True))
    assert flow_ns([r, h]) == pipelined_ns(r, h)
    p = flow_ns([r, h, g])
    assert max(int(r.sum()), int(h.sum()), int(g.sum())) <= p <= int((r + h + g).sum())
    assert flow_ns([r, np.zeros_like(h), g]) == pipelined_ns(r, g)


def _disjoint(spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint intervals from (gap before, length) pairs."""
    s, e, t = [], [], 0
    for gap, n in spans:
        s.append(t + gap)
        e.append(t + gap + n)
        t += gap + n
    return np.array(s, np.int64), np.array(e, np.int64)


_SPANS = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), max_size=8)


@settings(max_examples=100, deadline=None)
@given(_SPANS, _SPANS)
def test_overlap_of_two_unions_by_cells(a: list[tuple[int, int]], b: list[tuple[int, int]]
                                        ) -> None:
    """_overlap: the length of the intersection of two sets of disjoint sorted intervals,
    as counted unit cell by unit cell."""
    from tacc.analyze.rules.load_serialised import _overlap

    as_, ae = _disjoint(a)
    bs, be = _disjoint(b)

    def cells(s: np.ndarray, e: np.ndarray) -> set[int]:
        return {t for x, y in zip(s.tolist(), e.tolist(), strict=True) for t in range(x, y)}

    assert _overlap(as_, ae, bs, be) == len(cells(as_, ae) & cells(bs, be))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2_000_000), st.integers(1, 800_000),
                          st.sampled_from([0, 1, 2, 3, 4])), min_size=0, max_size=30),
       st.integers(0, 2**32))
def test_rule_never_raises_on_random_block_records(tmp_path_factory: pytest.TempPathFactory,
                                                   recs: list, seed: int) -> None:
    """Block records anywhere (before, inside and after the uploads, any operation) beside
    a real upload stream: the rule returns findings or none, never an exception, and any
    finding's time lost is within the load's span."""
    from tacc.capture.schema import HostKind
    from tacc.capture.synth import PID, TID, Sim, w_load

    sim = Sim(seed=seed % 1000)
    w_load(sim, 10_000_000, 1, True)
    for h in sim.host:
        h["kind"][h["kind"] == HostKind.BLOCK_COMPLETE] = HostKind.BLOCK_ISSUE
    for t, d, op in recs:
        sim.add_host(HostKind.BLOCK_COMPLETE, 10_000_000 + t + d, pid=PID, tid=TID, dev=NVME_DEV,
                     size=256 << 10, prev_state=op, dur_ns=d)
    sim.segments.append({"workload": "load", "variant": "good", "t_start": 0, "t_end": 1})
    p = tmp_path_factory.mktemp("r")
    sim.write(p)
    for f in analyze(open_capture(p)):
        if f.rule == "load_serialised":
            assert 0 < f.time_lost_ns <= f.evidence["load_ns"]


def _trace(cap: Path, out: Path) -> tuple[dict, dict]:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.timeline.convert import convert

    convert([cap], out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    names = {e.iid: e.name for p in tr.packet for e in p.interned_data.event_names}
    by_flow: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    per_track: dict[str, list[str]] = defaultdict(list)
    for p in tr.packet:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if e.type != pb.TrackEvent.TYPE_SLICE_BEGIN:
            continue
        t = tracks[e.track_uuid]
        per_track[t.name].append(names[e.name_iid])
        for f in list(e.flow_ids) + list(e.terminating_flow_ids):
            by_flow[f].append((p.timestamp, t.name, names[e.name_iid]))
    return by_flow, per_track


@pytest.mark.parametrize("variant", ["bad", "good"])
def test_timeline_storage_track_and_one_flow_per_tensor(twins: dict, tmp_path: Path,
                                                        variant: str) -> None:
    """The block reads on the storage track (block 259:0, named by operation); per tensor
    one flow: its block reads, its read, copy and upload ranges, its copy_h2d call and the
    device's H2D command, in time order."""
    by_flow, per_track = _trace(twins[variant][0], tmp_path / "t.pftrace")
    assert per_track["block 259:0"].count("block read") == 8 * 4 + 1
    flows = [sorted(v) for v in by_flow.values()
             if any(n.startswith("tensor ") for _, _, n in v)]
    assert len(flows) == 8
    for fl in flows:
        steps = [n for _, _, n in fl]
        name = next(n for n in steps if n.startswith("tensor ")).split(":")[0]
        assert steps.count("block read") == LOAD_TENSOR // LOAD_CHUNK, steps
        assert [n for n in steps if n.startswith("tensor ")] == [
            f"{name}: read", f"{name}: copy", f"{name}: upload"], steps
        assert "copy_h2d" in steps and "copy_h2d" in [n for _, tr, n in fl if "H2D" in tr], fl
        assert steps.index("block read") < steps.index(f"{name}: copy") < steps.index(
            "copy_h2d"), steps
    from tacc.timeline.convert import convert

    html = tmp_path / "v.html"
    convert([twins[variant][0]], html, fmt="html")
    text = html.read_text()
    assert '"block 259:0"' in text and '"tensor h.1.mlp.c_proj: upload"' in text


def test_workload_on_the_simulator_reads_what_it_wrote(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both twins load the same bytes (checked against the tensors), read with O_DIRECT
    where the file system allows it; the file is a safetensors file."""
    from tacc.runtime import Context
    from tacc.workloads import load as L
    from tacc.workloads import run_twins

    monkeypatch.delenv("TACC_NVME_DEV", raising=False)
    path = tmp_path / "w.safetensors"
    with Context(sim=True) as ctx:
        bad, good = run_twins("load", ctx, storage=str(path))
    for r in (bad, good):
        assert r.checked and r.bytes_h2d == 8 * LOAD_TENSOR and r.params["tensors"] == 8
        assert r.extra["file_bytes"] == path.stat().st_size
        assert r.extra["bytes_read"] == r.extra["file_bytes"]  # the header is one page
        assert r.extra["read_requests"] == 8 * LOAD_TENSOR // L.READ_CHUNK
    assert bad.expected_findings == ["load_serialised"] and good.expected_findings == []
    raw = path.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + hlen])
    assert (8 + hlen) % 4096 == 0 and meta["__metadata__"]["format"] == "pt"
    tensors = L.make_tensors()
    for name, a in tensors.items():
        b0, b1 = meta[name]["data_offsets"]
        assert meta[name]["dtype"] == "F32" and meta[name]["shape"] == list(a.shape)
        assert raw[8 + hlen + b0:8 + hlen + b1] == a.tobytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        index, nread = L.read_header(fd)
    finally:
        os.close(fd)
    assert list(index) == list(tensors) and nread == 8 + hlen


def test_workload_refuses_bad_headers(tmp_path: Path) -> None:
    from tacc.workloads import load as L

    p = tmp_path / "bad.safetensors"
    for raw, why in (((1 << 40).to_bytes(8, "little") + b"{}", "header of"),
                     (b"\x01", "shorter than"),
                     ((21).to_bytes(8, "little") + b'{"w":{"dtype":"F16"}}', "only F32"),
                     ((20).to_bytes(8, "little") + b'{"w":{"dtype":"F32"}', "not JSON"),
                     ((21).to_bytes(8, "little") + b'{"w":{"dtype":"F32"}}', "data_offsets")):
        p.write_bytes(raw)
        fd = os.open(p, os.O_RDONLY)
        try:
            with pytest.raises(ValueError, match=why):
                L.read_header(fd)
        finally:
            os.close(fd)


def test_cli_storage_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tacc.cli import main as tacc_main

    path = tmp_path / "w.safetensors"
    assert tacc_main(["run", "load", "--sim", "--json", "--storage", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in out["results"]] == ["bad", "good"]
    assert all(r["checked"] and r["params"]["storage"] == str(path) for r in out["results"])
    assert tacc_main(["run", "tiny_transfers", "--sim", "--storage", str(path)]) == 2
    assert "--storage is for the storage workloads" in capsys.readouterr().err
