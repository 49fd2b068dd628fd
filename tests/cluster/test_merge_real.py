"""On the host, after the cluster boot (scripts/test-vm --config cluster): the two nodes'
REAL captures of the pipeline twins (tests/vm/test_cluster.py) merged.  Run by test-vm
with TACC_CLUSTER_RESULTS = the nodes' output directories (os.pathsep-separated); not
part of the host layer.

Acceptance: the captures merge; every cross-node message goes forward in time
after alignment (its first packet sent before its last packet received, its send started
before its receive returned); each stated offset bound contains the HOSTCLK truth (every
network exchange's interval, the network estimate and the host-clock estimate agree
within their bounds); pipeline_bubble fires on the bad twin only, and network_bound on
the bad network twin (pipeline_cut) only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from tacc.analyze.cluster_rules import analyze_cluster
from tacc.capture import open_capture
from tacc.capture.clock import compose
from tacc.capture.clockx import offsets
from tacc.timeline.cluster import host_fit, load_view
from tacc.timeline.convert import convert
from tacc.timeline.manifest import write_manifest

DIRS = [Path(p) for p in os.environ.get("TACC_CLUSTER_RESULTS", "").split(os.pathsep) if p]


@pytest.fixture(scope="module", params=["bad", "good", "cut-bad", "cut-good"])
def variant(request: pytest.FixtureRequest) -> str:
    if len(DIRS) != 2:
        pytest.fail("TACC_CLUSTER_RESULTS must name the two nodes' output directories "
                    "(scripts/test-vm --config cluster sets it)")
    return str(request.param)


def _caps(variant: str) -> list[Path]:
    return [d / "cluster" / variant for d in DIRS]


def _save(name: str, data: object) -> None:
    (DIRS[0].parent.parent / name).write_text(json.dumps(data, indent=1, default=str))


def test_merge_forward_in_time_and_bounds_contain_hostclk(variant: str,
                                                         tmp_path: Path) -> None:
    view = load_view(_caps(variant))
    assert view.names == ["node0", "node1"]
    nc = view.clocks[1]
    assert nc.used == "hostclk" and nc.hostclk is not None and nc.network is not None
    m = view.messages
    res = json.loads((DIRS[0] / "cluster" / f"result-{variant}.json").read_text())
    assert len(m) == 2 * res["extra"]["messages"], (len(m), res["extra"])
    assert (m["send_start"] < m["recv_end"]).all()
    # the device work a message caused on its receiver (its tag, after the receive
    # returned: chosen on the receiver's own clock) starts after the send started
    caused = []
    for k in (0, 1):
        dev = view.caps[k].read("device_trace")
        clk = compose(nc.align, view.caps[k].device_clock(0)) if k else \
            view.caps[k].device_clock(0)
        t_dev = clk.convert(dev["t_start"])
        for msg in m[m["dst"] == k]:
            # both on the receiver's clock (mapped alike): the selection needs no alignment
            sel = t_dev[(dev["tag"] == msg["tag"]) & (t_dev >= msg["recv_end"])]
            if len(sel):
                caused.append(int(sel.min()) - int(msg["send_start"]))
    assert caused, "no device work caused by a message"
    assert min(caused) > 0, f"device work before the send that caused it: {min(caused)} ns"
    both = (m["tx"] != 0) & (m["rx"] != 0)
    lag = (m["rx"] - m["tx"])[both]
    if any(len(c.read("host")) for c in view.caps):  # BPF captures (cluster-bpf)
        # a message's packets are the sender's while it is in send() and the receiver's
        # while it is in recv(): the bad twins' receivers wait in recv() for each message;
        # the good twins' overlap, so a message may be all buffered before its recv() starts,
        # or leave from the ACK path once the window fills (cut-good: 7 of 16 under load)
        if variant in ("bad", "cut-bad"):
            assert both.sum() >= len(m) // 2, f"only {both.sum()} of {len(m)} with packets"
        assert (lag > 0).all(), f"packets received before they were sent: {lag[lag <= 0]}"
    # the HOSTCLK truth at each exchange: node1 mono - node0 mono through the host clock
    f0, f1 = host_fit(view.caps[0]), host_fit(view.caps[1])
    assert f0 is not None and f1 is not None
    host_bound = nc.hostclk.bound_ns
    rows = []
    for k, sign in ((0, 1.0), (1, -1.0)):
        recs = view.caps[k].read("net_clock")
        off, half = offsets(recs)
        t_req = ((recs["t1"] + recs["t4"]) // 2).astype(np.int64)
        # the requester's time -> host -> the other node's time
        fa, fb = (f0, f1) if k == 0 else (f1, f0)
        h = fa.clock.convert(t_req.view(np.uint64))
        other = fb.clock.invert(h)
        truth = (other - t_req).astype(np.float64)  # peer - requester
        err = np.abs(off - truth)
        assert (err <= half + host_bound).all(), (
            f"node{k}'s exchanges: |offset - hostclk truth| {err.max():.0f} ns beyond "
            f"half round trip + host-clock bound {host_bound:.0f} ns")
        rows.append({"node": k, "exchanges": len(recs), "max_err_ns": float(err.max()),
                     "min_half_rtt_ns": float(half.min()),
                     "median_half_rtt_ns": float(np.median(half)), "sign": sign})
    gap = abs(nc.network.offset_ns - nc.hostclk.offset_ns)
    assert gap <= nc.network.bound_ns + nc.hostclk.bound_ns, (gap, nc.network, nc.hostclk)
    _save(f"cluster-merge-{variant}.json", {"view": view.metadata(), "exchanges": rows,
                                             "lag_ns": [int(x) for x in lag],
                                             "caused_after_send_ns": caused,
                                             "network_vs_hostclk_ns": gap})
    # one merged Perfetto trace; cross-node flows step forward in time
    out = tmp_path / "merged.pftrace"
    convert(_caps(variant), out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    steps: dict[int, list[int]] = {}
    for p in tr.packet:
        if p.HasField("track_event"):
            for fid in p.track_event.flow_ids:
                if fid >> 56 == 0xFF:
                    steps.setdefault(fid, []).append(p.timestamp)
    assert len(steps) >= len(np.unique(m["tag"])), "a message tag without a cross-node flow"
    # and the per-node traces + perfetto_manifest
    z = write_manifest(_caps(variant), tmp_path / "pn")
    doc = json.loads((tmp_path / "pn" / "perfetto_manifest.json").read_text())
    ent = doc["perfetto_manifest"]["files"][1]
    assert ent["clocks"]["offset_ns"] == -round(nc.hostclk.offset_ns)
    assert z.exists()


def test_each_rule_fires_on_its_bad_twin_only(variant: str) -> None:
    """pipeline_bubble on pipeline's bad twin (one batch in flight), network_bound on
    pipeline_cut's (the model cut after its wide layer); neither on a good twin.  The
    twins' messages are the ones the link's speed on host time decides: a good twin may
    also be network bound on a loaded host (pipeline's good twin beside the strict boot:
    51 % of the pipeline with a message in flight and both devices idle at 0.54 MB/s,
    against 21-30 % idle; the good cut's 8 x 32 KiB at 0.94 MB/s: 277 ms), so
    network_bound is not asserted absent on them; the bad cut, 16x the bytes, loses more
    to the link than the good cut (1,085 ms against 317 ms in that run)."""
    found = analyze_cluster(load_view(_caps(variant)))
    rules = sorted({f.rule for f in found})
    _save(f"cluster-findings-{variant}.json", [f.to_json() for f in found])
    if variant == "bad":
        assert "pipeline_bubble" in rules, found
        nodes = {f.node for f in found if f.rule == "pipeline_bubble"}
        assert nodes, found
    elif variant == "cut-bad":
        assert "network_bound" in rules, found
        assert "pipeline_bubble" not in rules, [f.title for f in found]
        good = [f.time_lost_ns for f in analyze_cluster(load_view(_caps("cut-good")))
                if f.rule == "network_bound"]
        bad = [f.time_lost_ns for f in found if f.rule == "network_bound"]
        assert max(bad) > max(good, default=0), (bad, good)
    elif variant in ("good", "cut-good"):
        assert not set(rules) - {"network_bound"}, [f.title for f in found]
    else:
        assert not rules, [f.title for f in found]


def test_captures_name_their_nodes(variant: str) -> None:
    for i, p in enumerate(_caps(variant)):
        cap = open_capture(p)
        assert cap.meta["node"] == f"node{i}"
        icount = cap.meta["icount"]
        assert not (icount and icount.get("enabled")), f"not on host time: {icount}"
