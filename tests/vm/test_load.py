"""In-guest: ``tacc run load``'s twins (docs/workloads.md "load") with their weights on the
NVMe scratch disk (scripts/run-vm NVME=1: the extras boot), each under a real capture (the
session's BPF program, tests/vm/test_e2e_real.py's recorder): the block reads the kernel
issued for the load are the bytes the workload read, the uploads the tensors' bytes, the
rule ``load_serialised`` fires on the bad twin only with its estimate within 25 % of the
measured difference of the twins' load times (storage time made to flow, below), and the
timeline draws one flow per tensor from its block reads to its H2D command."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_e2e_real import OUT, Recorder, recorder  # noqa: F401 (the fixture)

TOLERANCE = 0.25  # the rule's estimate against bad - good (docs/analysis.md)


def test_load_from_nvme_checked() -> None:
    """Without a capture (make test): the good twin's weights written to the NVMe disk,
    read back with O_DIRECT and uploaded, the device's bytes equal to the file's."""
    from tacc.runtime import Context
    from tacc.workloads.load import load

    with Context() as ctx:
        r = load(ctx, bad=False, scale=1, storage=_nvme())
    assert r.checked and r.extra["o_direct"], r
    assert r.extra["bytes_read"] >= r.extra["file_bytes"] - 4096, r.extra


# Storage time in guest time: under `-icount shift=0,sleep=off` an idle guest's clock jumps
# from timer to timer while QEMU's I/O thread serves a request on the host, so a 128 KiB
# read took 0.01 to 153 ms of guest time, whatever the host took (QEMU's NVMe models no
# latency).  busy_vcpu keeps the workload's vCPU busy whenever the workload waits: guest
# time then flows with executed instructions, in proportion to the host time QEMU spends
# on the request.  The spinner shares the workload's one vCPU at SCHED_IDLE (it runs only
# when the workload cannot), so it adds no instructions while the workload runs (on the
# other vCPU it would: under -icount the vCPUs' instructions are one clock).  The captured
# twins stay `make test-long` for their time (the recorder's four captures).
_long = pytest.mark.long
# Storage time still follows the host's load (a 128 KiB read took 0.1 to 1.1 ms of guest
# time from one run to the next, the host at load 4-10): each twin runs ROUNDS times,
# alternating, and the fastest run of each is kept (host delays only add time).
ROUNDS = 2


@contextlib.contextmanager
def busy_vcpu(pid: int) -> Iterator[None]:
    """Process ``pid`` (and the threads it starts) on one vCPU, with a SCHED_IDLE busy loop
    on the same vCPU for the duration: that vCPU never idles, so the guest's clock counts
    instructions through every storage wait of the process."""
    old = os.sched_getaffinity(pid)
    cpu = min(old)
    spin = (f"import os; os.sched_setaffinity(0, {{{cpu}}}); "
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "while True: pass")
    os.sched_setaffinity(pid, {cpu})
    p = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield
    finally:
        p.kill()
        p.wait()
        os.sched_setaffinity(pid, old)


def _nvme() -> str:
    dev = os.environ.get("TACC_NVME_DEV", "")
    assert dev, ("no NVMe scratch disk (TACC_NVME_DEV): this file runs in the extras boot "
                 "(scripts/run-vm NVME=1)")
    return dev


@pytest.fixture(scope="module")
def loads(recorder: Recorder) -> dict[str, tuple[Path, dict[str, Any]]]:  # noqa: F811
    _nvme()
    out = {}
    for i in range(ROUNDS):
        for v in ("bad", "good"):
            with busy_vcpu(recorder.worker.pid):
                path, results, _ = recorder.capture(f"load-{v}-{i}",
                                                    [("load", v == "bad", {"scale": 2})])
            if v not in out or results[0]["wall_ns"] < out[v][1]["wall_ns"]:
                out[v] = (path, results[0])
    return out


def _kdevs(path: str) -> set[int]:
    """The kernel's dev_t (major << 20 | minor) of the NVMe disks.  Under native NVMe
    multipath (Debian's nvme_core.multipath=Y) the namespace's node (nvme0n1, 259:1 here)
    is a head disk whose requests the block layer issues on a hidden path disk (nvme0c0n1,
    259:0), the dev the block tracepoints report, which sysfs does not list: the disks
    of the node's major (blkext), which only the NVMe disks use in the test VM."""
    major = os.major(os.stat(path).st_rdev)
    return {(major << 20) | m for m in range(16)}


@_long
def test_block_reads_are_the_bytes_read_and_uploads_the_tensors(loads: dict) -> None:
    from tacc.analyze.data import load
    from tacc.capture import open_capture
    from tacc.capture.schema import BlockOp, DropSource, HostKind, Opcode

    devs = list(_kdevs(_nvme()))
    for v, (path, r) in loads.items():
        assert r["checked"] and r["extra"]["o_direct"], r
        cap = open_capture(path)
        assert cap.format_version >= (1, 13)
        h = cap.read("host")
        pids = set(cap.read("api")["pid"].tolist())
        mine = h[np.isin(h["dev"], devs) & (h["kind"] == HostKind.BLOCK_COMPLETE)
                 & [p in pids for p in h["pid"].tolist()]]
        reads = mine[mine["prev_state"] == BlockOp.READ]
        # the file's writes from any process: the fsync writes back from the workload, the
        # kernel's flusher threads may have taken some pages first (the disk has no other
        # writer)
        disk = h[np.isin(h["dev"], devs) & (h["kind"] == HostKind.BLOCK_COMPLETE)]
        writes = disk[disk["prev_state"] == BlockOp.WRITE]
        # O_DIRECT: every byte the workload read is one block read's, no more
        assert int(reads["size"].sum()) == r["extra"]["bytes_read"], (
            v, devs, np.unique(h["dev"]).tolist(), reads["size"])
        assert len(reads) >= r["extra"]["read_requests"] + 1  # + the header's page
        # the file written before the load; a block record the BPF program missed is a
        # counted drop (a completion interrupt on a CPU running the program's sched_switch
        # handler: the kernel skips the nested run; the spinner's switches make it likely)
        dr = cap.read("drops")
        lost = int(dr["count"][dr["source"] == DropSource.HOST].sum()) if len(dr) else 0
        # One run in six wrote 63 of the 64 chunks with no drop counted (sector 3840's
        # request absent from both block_rq_issue and block_rq_complete; not understood):
        # one request more is allowed here, the reads above are exact.
        missing = r["extra"]["file_bytes"] - int(writes["size"].sum())
        assert 0 <= missing <= (lost + 1) * int(writes["size"].max()), (v, lost, writes["size"])
        assert writes["t_ns"].max() < (reads["t_ns"] - reads["dur_ns"]).min()
        assert (reads["dur_ns"] > 0).all()
        d = load(cap)
        up = d.cmds.sel(d.cmds.opcode == Opcode.COPY_H2D)
        t0 = int((reads["t_ns"] - reads["dur_ns"]).min())
        assert int(up.bytes[up.ts >= t0].sum()) == r["bytes_h2d"] == r["params"]["tensor_bytes"]


@_long
def test_rule_on_bad_only_estimate_within_25_percent(loads: dict) -> None:
    from tacc.analyze.engine import analyze
    from tacc.capture import open_capture

    found = {v: analyze(open_capture(p)) for v, (p, _) in loads.items()}
    rules = {v: sorted(f.rule for f in fs) for v, fs in found.items()}
    bad = [f for f in found["bad"] if f.rule == "load_serialised"]
    wall = {v: r["wall_ns"] for v, (_, r) in loads.items()}
    # The twins' load times (the workload's clock, first read to last upload) under
    # busy_vcpu: their difference is what the pipelining hid.  Outside the reads (the
    # workload's clock of its preadv calls): recorded beside it.
    own = {v: r["wall_ns"] - r["extra"]["read_ns"] for v, (_, r) in loads.items()}
    measured = wall["bad"] - wall["good"]
    summary = {"rules": rules, "wall_ns": wall, "outside_reads_ns": own,
               "measured_ns": measured,
               "findings": {v: [f.to_json() for f in fs] for v, fs in found.items()},
               "results": {v: r for v, (_, r) in loads.items()}}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "load.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    assert "load_serialised" not in rules["good"], rules
    assert rules["good"] == [], rules  # the good twin: no finding at all
    assert len(bad) == 1, rules
    f = bad[0]
    print(f"load: bad {wall['bad'] / 1e6:.1f} ms, good {wall['good'] / 1e6:.1f} ms, outside "
          f"reads {own['bad'] / 1e6:.2f} / {own['good'] / 1e6:.2f} ms, estimate "
          f"{f.time_lost_ns / 1e6:.2f} ms, evidence {f.evidence}")
    assert measured > 0, wall
    assert abs(f.time_lost_ns - measured) <= TOLERANCE * measured, (f.time_lost_ns, measured)
    assert f.evidence["phases"] == loads["bad"][1]["params"]["tensors"], f.evidence
    assert f.evidence["upload_bytes"] == loads["bad"][1]["bytes_h2d"]


@_long
def test_timeline_one_flow_per_tensor(loads: dict, tmp_path: Path) -> None:
    """Per tensor one flow through its block reads (the storage track), its read, copy and
    upload ranges, its copy_h2d call and the device's H2D command, in time order."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.timeline.convert import convert

    devs = {f"block {d >> 20}:{d & 0xFFFFF}" for d in _kdevs(_nvme())}
    for v, (path, r) in loads.items():
        out = tmp_path / f"{v}.pftrace"
        convert([path], out)
        tr = pb.Trace()
        tr.ParseFromString(out.read_bytes())
        tracks = {p.track_descriptor.uuid: p.track_descriptor.name for p in tr.packet
                  if p.HasField("track_descriptor")}
        names = {e.iid: e.name for p in tr.packet for e in p.interned_data.event_names}
        flows: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
        storage = 0
        for p in tr.packet:
            e = p.track_event
            if not p.HasField("track_event") or e.type != pb.TrackEvent.TYPE_SLICE_BEGIN:
                continue
            tname, name = tracks[e.track_uuid], names[e.name_iid]
            storage += tname in devs and name == "block read"
            for fl in e.flow_ids:
                flows[fl].append((p.timestamp, tname, name))
        assert storage >= r["extra"]["read_requests"], (v, storage)
        tensor = [sorted(f) for f in flows.values() if any(n.startswith("tensor ")
                                                           for _, _, n in f)]
        assert len(tensor) == r["params"]["tensors"], (v, len(tensor))
        for f in tensor:
            steps = [n for _, _, n in f]
            name = next(n for n in steps if n.startswith("tensor ")).rsplit(":", 1)[0]
            assert [n for n in steps if n.startswith("tensor ")] == [
                f"{name}: read", f"{name}: copy", f"{name}: upload"], steps
            assert steps.count("block read") >= 1, steps
            assert steps.index("block read") < steps.index(f"{name}: copy"), steps
            assert any(t == "PCIe H2D" or "H2D" in t for _, t, _ in f), f
