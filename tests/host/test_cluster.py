"""Merging captures of several nodes (docs/cluster.md) on synthetic captures of
the two-node pipeline (tacc.capture.synth_cluster): node ids, both clock alignments and
their bounds (hypothesis), cross-node messages and flows, the perfetto_manifest, the
cross-node rules, the clock exchange over loopback, the pipeline workload on the
simulator and `run-vm NODES=N` with a stand-in QEMU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from tacc.analyze.cluster_rules import analyze_cluster
from tacc.capture import clockx, open_capture
from tacc.capture import synth_cluster as sc
from tacc.cli import main
from tacc.timeline.cluster import ClusterError, load_view, parse_renames
from tacc.timeline.convert import convert
from tacc.timeline.manifest import write_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    out = {}
    for v in ("bad", "good"):
        out[v] = sc.write(sc.pipeline(v), tmp_path_factory.mktemp(v))
    return out


# ---------------------------------------------------------------- alignment --
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(gap=st.integers(-10**12, 10**12), seed=st.integers(0, 10**6),
       variant=st.sampled_from(["bad", "good"]))
def test_every_stated_bound_contains_the_truth(tmp_path: Path, gap: int, seed: int,
                                               variant: str) -> None:
    """Whatever the boot gap (either node first) and the one-way delays: the host-clock
    and the network offsets each lie within their stated bound of the true offset, the
    network bound is at least half the best round trip, and every message goes forward in
    time after alignment."""
    md = sc.pipeline(variant, seed=seed, boot_gap=gap)
    paths = sc.write(md, tempfile.mkdtemp(dir=tmp_path))  # one per example (hypothesis)
    view = load_view(paths)
    truth = sc.truth_offset(md)
    nc = view.clocks[1]
    assert nc.used == "hostclk"
    for o in (nc.hostclk, nc.network):
        assert o is not None
        assert abs(o.offset_ns - truth) <= o.bound_ns, (o, truth)
    assert nc.network.bound_ns >= nc.network.detail["best_half_round_trip_ns"]
    m = view.messages
    assert len(m) and (m["tx"] < m["rx"]).all() and (m["send_start"] < m["recv_end"]).all()


def test_network_alignment_when_no_host_clock(tmp_path: Path) -> None:
    md = sc.pipeline("bad", host_clock=(True, False))
    view = load_view(sc.write(md, tmp_path))
    nc = view.clocks[1]
    assert nc.hostclk is None and nc.used == "network"
    assert abs(nc.network.offset_ns - sc.truth_offset(md)) <= nc.network.bound_ns
    m = view.messages
    assert (m["tx"] < m["rx"]).all()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_node_without_clock_pairs_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    md = sc.pipeline("bad", host_clock=(True, False), exchanges=False)
    a, b = sc.write(md, tmp_path)
    rc, err = _cli(capsys, "timeline", str(a), str(b), "-o", str(tmp_path / "m.pftrace"))
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "node node1 has no clock pairs to align it with node0" in lines[0]
    # --align network on captures with host-clock pairs only: also one line
    md = sc.pipeline("bad", exchanges=False)
    a, b = sc.write(md, tmp_path / "h")
    rc, err = _cli(capsys, "cluster", "offsets", str(a), str(b), "--align", "network")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert "it has only hostclk alignment" in err


def test_two_captures_one_node_id_refused_unless_renamed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = sc.pipeline("bad", names=("vm", "vm"))
    a, b = sc.write(md, tmp_path)
    out = tmp_path / "m.pftrace"
    rc, err = _cli(capsys, "timeline", str(a), str(b), "-o", str(out))
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "have the same node id 'vm'" in err and f"--rename {b}=NAME" in err
    assert not out.exists() or out.stat().st_size == 0
    # renamed: the merge is made; the exchanges name the peer "vm" (both nodes' id), so
    # the alignment is the host clock's
    rc, err = _cli(capsys, "timeline", str(a), str(b), "-o", str(out), "--rename",
                   f"{b}=vm-b")
    assert rc == 0, err
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    roots = {p.track_descriptor.name for p in tr.packet if p.HasField("track_descriptor")
             and not p.track_descriptor.HasField("parent_uuid")}
    assert {"vm", "vm-b"} <= roots
    with pytest.raises(ClusterError, match="accepted: CAPTURE=NAME"):
        parse_renames(["novalue"])
    rc, err = _cli(capsys, "timeline", str(a), str(b), "-o", str(out), "--rename",
                   f"{tmp_path}/nope=x", "--rename", f"{b}=vm-b")
    assert rc == 2 and "no such capture" in err  # a --rename naming no argument: usage


def test_capture_without_node_id_refused(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = sc.write(sc.pipeline("bad"), tmp_path)
    meta = json.loads((b / "meta.json").read_text())
    meta["node"] = ""
    (b / "meta.json").write_text(json.dumps(meta))
    rc, err = _cli(capsys, "cluster", "offsets", str(a), str(b))
    assert rc == 1 and "names no node" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ timeline --
def test_merged_trace_flows_cross_nodes_forward(twins: dict[str, list[Path]],
                                                tmp_path: Path) -> None:
    out = tmp_path / "m.pftrace"
    convert(twins["bad"], out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}

    def root(u: int) -> str:
        while tracks[u].HasField("parent_uuid"):
            u = tracks[u].parent_uuid
        return tracks[u].name

    names = {t.name for t in tracks.values()}
    assert {"net tx -> node1", "net rx <- node0", "net tx -> node0", "net rx <- node1"} <= names
    steps: dict[int, list[tuple[int, str, str]]] = {}
    for p in tr.packet:
        if p.HasField("track_event"):
            u = p.track_event.track_uuid
            for f in p.track_event.flow_ids:
                if f >> 56 == 0xFF:
                    steps.setdefault(f, []).append((p.timestamp, root(u), tracks[u].name))
    assert len(steps) == 4  # one tag per batch
    for ev in steps.values():
        nodes = {n for _, n, _ in ev}
        assert nodes == {"node0", "node1"}, ev
        # node 1's device work of the tag lies after node 0's packet left, after alignment
        tx0 = min(t for t, _, n in ev if n == "net tx -> node1")
        rx1 = min(t for t, _, n in ev if n == "net rx <- node0")
        dev1 = [t for t, nd, n in ev if nd == "node1" and n.startswith("compute")]
        assert tx0 < rx1 and dev1 and min(dev1) > rx1, ev
    meta_json = [p for p in tr.packet if p.HasField("chrome_events")]
    assert meta_json, "no tacc metadata"


def test_manifest_places_per_node_traces_as_the_merge(twins: dict[str, list[Path]],
                                                      tmp_path: Path) -> None:
    z = write_manifest(twins["bad"], tmp_path / "pn")
    doc = json.loads((tmp_path / "pn" / "perfetto_manifest.json").read_text())["perfetto_manifest"]
    assert doc["version"] == 1 and doc["trace_time"] == {"clock": "MONOTONIC",
                                                         "file": "node0.pftrace"}
    f0, f1 = doc["files"]
    assert f0 == {"path": "node0.pftrace", "machine": {"name": "node0"}}
    assert f1["machine"] == {"name": "node1"}
    assert f1["clocks"]["sync_to"] == {"file": "node0.pftrace", "clock": "MONOTONIC"}
    assert doc["attributes"]["tacc.node1.align"] == "hostclk"
    import zipfile
    assert sorted(zipfile.ZipFile(z).namelist()) == ["node0.pftrace", "node1.pftrace",
                                                     "perfetto_manifest.json"]

    # "the source clock reads T when the reference reads T + offset_ns": node 1's first
    # device slice placed by the manifest lands where the merged trace has it
    def first_compute(path: Path, node: str | None) -> int:
        tr = pb.Trace()
        tr.ParseFromString(path.read_bytes())
        tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
                  if p.HasField("track_descriptor")}

        def root(u: int) -> str:
            while tracks[u].HasField("parent_uuid"):
                u = tracks[u].parent_uuid
            return tracks[u].name

        return min(p.timestamp for p in tr.packet if p.HasField("track_event")
                   and tracks[p.track_event.track_uuid].name.startswith("compute")
                   and (node is None or root(p.track_event.track_uuid) == node))

    merged = tmp_path / "m.pftrace"
    convert(twins["bad"], merged)
    placed = first_compute(tmp_path / "pn" / "node1.pftrace", None) + f1["clocks"]["offset_ns"]
    assert abs(placed - first_compute(merged, "node1")) <= 1_000  # rate over ~30 ms


# --------------------------------------------------------------------- rules --
def test_pipeline_bubble_bad_twin_only(twins: dict[str, list[Path]]) -> None:
    bad = analyze_cluster(load_view(twins["bad"]))
    good = analyze_cluster(load_view(twins["good"]))
    b = [f for f in bad if f.rule == "pipeline_bubble"]
    assert {f.node for f in b} == {"node0", "node1"}
    for f in b:
        ev = f.evidence
        assert ev["peer"] == ("node1" if f.node == "node0" else "node0")
        assert ev["link"] == f"{ev['peer']} -> {f.node}"
        assert 0 < f.time_lost_ns == ev["bubble_ns"] <= ev["span_ns"]
        assert f.time_ranges and all(a < z for a, z in f.time_ranges)
    assert not [f for f in good if f.rule == "pipeline_bubble"], [f.title for f in good]
    assert not [f for f in bad + good if f.rule == "network_bound"]


def test_pipeline_span_starts_at_the_first_message(tmp_path: Path) -> None:
    """Device work long before the pipeline (node 0 uploaded its weights 5 s before its
    peer answered) is not pipeline time: the bubble share is over the message window.
    Before, the rule took the span from the first device job, and the bad twin's bubble
    (~70 % of the pipeline) read as 1 % of a 5 s span: no finding."""
    bad = load_view(sc.write(sc.pipeline("bad", setup_ns=5_000_000_000), tmp_path / "b"))
    good = load_view(sc.write(sc.pipeline("good", setup_ns=5_000_000_000), tmp_path / "g"))
    b = {f.node: f for f in analyze_cluster(bad) if f.rule == "pipeline_bubble"}
    assert set(b) == {"node0", "node1"}, list(b)
    assert b["node0"].evidence["span_ns"] < 1_000_000_000, b["node0"].evidence
    assert not [f for f in analyze_cluster(good) if f.rule == "pipeline_bubble"]


def test_network_bound_on_wide_activations_only(tmp_path: Path) -> None:
    """A slow link (2 MB/s): 512 KiB activations per batch are network bound, 8 KiB
    ones are not."""
    slow = sc.Net(latency_ns=200_000, bytes_per_ns=0.002)
    wide = load_view(sc.write(sc.pipeline("good", nbytes=512 << 10, net=slow), tmp_path / "w"))
    narrow = load_view(sc.write(sc.pipeline("good", nbytes=8 << 10, net=slow), tmp_path / "n"))
    fw = [f for f in analyze_cluster(wide) if f.rule == "network_bound"]
    assert {f.evidence["link"] for f in fw} >= {"node0 -> node1"}
    assert not [f for f in analyze_cluster(narrow) if f.rule == "network_bound"]


def test_cluster_analyze_cli_json(twins: dict[str, list[Path]], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.json"
    assert main(["cluster", "analyze", *map(str, twins["bad"]), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tacc-cluster-findings"
    assert {f["rule"] for f in doc["findings"]} == {"pipeline_bubble"}
    assert doc["cluster"]["nodes"][1]["used"] == "hostclk"
    assert main(["cluster", "offsets", *map(str, twins["bad"])]) == 0
    text = capsys.readouterr().out
    assert "node1: aligned by hostclk" in text and "network  offset" in text


# ---------------------------------------------------------- clock exchange --
def test_clock_exchange_over_loopback() -> None:
    r = clockx.Responder("127.0.0.1", 0)
    port = r.sock.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        import select
        while not stop.is_set():
            if select.select([r.sock], [], [], 0.05)[0]:
                r.on_readable()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    q = clockx.Requester([f"127.0.0.1:{port}"], burst=5)
    try:
        recs = q.poll(0.0)
    finally:
        stop.set()
        th.join(2)
        q.close()
        r.close()
    assert len(recs) >= 3, f"{q.lost} lost"
    off, half = clockx.offsets(recs)
    # one clock: the true offset is 0, within half the round trip of every exchange
    assert (np.abs(off) <= half).all() and (half > 0).all()
    assert (recs["t1"] <= recs["t2"]).all() and (recs["t3"] <= recs["t4"]).all()


def test_clock_exchange_ignores_garbage_and_bad_peer() -> None:
    r = clockx.Responder("127.0.0.1", 0)
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"junk", r.sock.getsockname())
    s.sendto(b"TCX1" + bytes(60), r.sock.getsockname())
    import time
    time.sleep(0.05)
    r.on_readable()
    assert r.answered == 0
    r.close()
    s.close()
    for bad in ("x.y", "1.2.3.4:99999", "1.2.3.4:port"):
        with pytest.raises(ValueError, match="peer"):
            clockx.parse_peer(bad)


# ------------------------------------------------------------------ workload --
def test_pipeline_workload_on_the_simulator() -> None:
    """Both stages in one process (two threads, loopback): checked against numpy; the
    sender's tag rides to the receiver."""
    from tacc.runtime import Context
    from tacc.workloads import run

    for bad in (True, False):
        res: dict[int, object] = {}

        def stage1(bad: bool = bad, res: dict[int, object] = res) -> None:
            with Context(sim=True) as c:
                res[1] = run("pipeline", c, bad, role=1, peer="127.0.0.1", port=7519,
                             batches=2, micro=2)

        t = threading.Thread(target=stage1)
        t.start()
        with Context(sim=True) as c:
            r0 = run("pipeline", c, bad, role=0, peer="127.0.0.1", port=7519, batches=2,
                     micro=2, timeout=30)
        t.join(60)
        r1 = res[1]
        assert r0.checked and r1.checked  # type: ignore[attr-defined]
        assert r0.expected_findings == (["pipeline_bubble"] if bad else [])
        assert r0.extra["messages"] == (2 if bad else 4)
        assert r0.extra["bytes_sent"] == r1.extra["bytes_received"]  # type: ignore[attr-defined]


def _both_stages(name: str, bad: bool, port: int, **kw: object) -> tuple[object, object]:
    from tacc.runtime import Context
    from tacc.workloads import run

    res: dict[int, object] = {}

    def stage1() -> None:
        with Context(sim=True) as c:
            res[1] = run(name, c, bad, role=1, peer="127.0.0.1", port=port, **kw)

    t = threading.Thread(target=stage1)
    t.start()
    with Context(sim=True) as c:
        r0 = run(name, c, bad, role=0, peer="127.0.0.1", port=port, timeout=30, **kw)
    t.join(60)
    return r0, res[1]


def test_pipeline_cut_twins_on_the_simulator() -> None:
    """The network-bound twins compute the same answer (checked against numpy on both
    nodes); the bad twin's cut after the wide layer puts 16x the bytes on the link."""
    sent = {}
    for bad in (True, False):
        r0, r1 = _both_stages("pipeline_cut", bad, 7521, batches=2, d_wide=1024)
        assert r0.checked and r1.checked  # type: ignore[attr-defined]
        assert r0.expected_findings == (["network_bound"] if bad else [])  # type: ignore[attr-defined]
        assert r0.params["cut"] == (1 if bad else 2)  # type: ignore[attr-defined]
        assert r0.extra["messages"] == 8  # type: ignore[attr-defined]
        sent[bad] = r0.extra["bytes_sent"]  # type: ignore[attr-defined]
        assert r1.extra["bytes_received"] == sent[bad]  # type: ignore[attr-defined]
    assert sent[True] == 4 * sent[False]  # d_wide 1024 against d_narrow 256


def test_pipeline_no_peer_one_line() -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "tacc"), "run", "pipeline", "--sim",
                        "--variant", "bad"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TACC_NODE": "0", "TACC_PIPELINE_TIMEOUT": "1",
                            "TACC_PIPELINE_PEER": "127.0.0.1"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not answer" in lines[0], r.stderr


# ------------------------------------------------------------------- run-vm --
FAKE_QEMU = r'''#!/usr/bin/python3
import os, re, subprocess, sys
argv = sys.argv[1:]
append = argv[argv.index("-append") + 1]
node = re.search(r"taccvm\.node=(\d+)", append).group(1)
cmd = re.search(r"taccvm\.cmd=(\S+)", append).group(1)
out = re.search(r"taccvm\.out=(\S+)", append).group(1)
assert "virtio-net-pci" in " ".join(argv) and "-icount" not in argv
netdev = argv[argv.index("-netdev") + 1]
assert "127.0.0.1" in netdev and "user" not in netdev
open(os.path.join(out, "argv"), "w").write("\n".join(argv))
st = subprocess.run(["bash", cmd], env={**os.environ, "TACC_NODE": node},
                    stdin=subprocess.DEVNULL).returncode
print(f"TACC-EXIT: {st}", flush=True)
sys.exit(((st + 1) << 1) | 1)
'''


@pytest.mark.parametrize(("cmd", "want"), [("exit 0", [0, 0, 0]),
                                           ("exit $((TACC_NODE == 1 ? 7 : 0))", [0, 7, 0]),
                                           ("exit $((TACC_NODE + 3))", [3, 4, 5])])
def test_run_vm_cluster_statuses(tmp_path: Path, cmd: str, want: list[int]) -> None:
    q = tmp_path / "qemu"
    q.write_text(FAKE_QEMU)
    q.chmod(0o755)
    env = {**os.environ, "TACC_QEMU": str(q), "NODES": "3", "TIMEOUT": "60",
           "TACC_MAKE_CMD": cmd, "PYDISK": "0"}
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--make-cmd"],
                       env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    first = next((s for s in want if s), 0)
    assert r.returncode == first, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("run-vm: node")]
    assert [int(ln.split("status ")[1].split()[0]) for ln in lines] == want
    res = ROOT / "build/test-results/cluster"
    for i in range(3):
        assert (res / f"node{i}" / "console.log").exists()
        argv = (res / f"node{i}" / "out" / "argv").read_text()
        assert f"taccvm.node={i}" in argv


def test_run_vm_nodes_validated() -> None:
    for bad in ("0", "5", "x"):
        r = subprocess.run(["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--validate"],
                           env={"PATH": "/usr/bin:/bin", "NODES": bad}, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2 and r.stderr.startswith(f"run-vm: NODES={bad}:")
        assert "1 to 4" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _plain_env(**extra: str) -> dict[str, str]:
    """A plain shell's environment: none of the harness's variables (no TIMEOUT: make
    test's layers set it, a user's shell does not); no venv disk for the stand-in QEMU."""
    keep = ("PATH", "HOME", "LANG", "USER", "LOGNAME", "TERM")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, "PYDISK": "0", **extra}


def test_make_run_vm_cluster_without_timeout_waits_for_quiet_nodes(tmp_path: Path) -> None:
    # the README's `make run-vm NODES=2 CMD='echo node=$$TACC_NODE'` from a plain shell:
    # the nodes print nothing for over a second (a boot prints nothing for longer), which
    # must not count as a timeout when no TIMEOUT is set
    q = tmp_path / "qemu"
    q.write_text(FAKE_QEMU)
    q.chmod(0o755)
    r = subprocess.run(["make", "--no-print-directory", "-o", "setup", "run-vm", "NODES=2",
                        "CMD=sleep 1.5; echo node=$$TACC_NODE"], cwd=ROOT,
                       env=_plain_env(TACC_QEMU=str(q)), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "[node0] node=0" in r.stdout and "[node1] node=1" in r.stdout, r.stdout
    assert "timed out" not in r.stderr


def test_run_vm_cluster_timeout_still_kills(tmp_path: Path) -> None:
    q = tmp_path / "qemu"
    q.write_text(FAKE_QEMU)
    q.chmod(0o755)
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--make-cmd"],
                       env=_plain_env(TACC_QEMU=str(q), NODES="2", TIMEOUT="2",
                                      TACC_MAKE_CMD="sleep 60"),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 124, r.stderr
    assert "[node0] timed out after 2 s" in r.stderr, r.stderr


def test_cluster_boot_runs_make_run_vm_from_a_plain_environment(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    # scripts/test-vm's cluster boot also runs the README's `make run-vm NODES=2 CMD=...`
    # with none of the harness's variables (a TIMEOUT set here must not reach it)
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("test_vm", str(ROOT / "scripts/test-vm"))
    spec = importlib.util.spec_from_loader("test_vm", loader)
    tv = importlib.util.module_from_spec(spec)
    loader.exec_module(tv)
    assert "make_cluster_check(out)" in (ROOT / "scripts/test-vm").read_text()
    for var in ("TIMEOUT", "TEST_VM_TIMEOUT", "IOMMU", "NODES", "ICOUNT", "MAKEFLAGS"):
        monkeypatch.setenv(var, "1")
    assert not set(tv.plain_env(dict(os.environ))) & {"TIMEOUT", "NODES", "MAKEFLAGS"}
    q = tmp_path / "qemu"
    q.write_text(FAKE_QEMU.replace("import os", "import os, time; time.sleep(1.5)\nimport os"))
    q.chmod(0o755)
    assert tv.make_cluster_check(tmp_path, {"TACC_QEMU": str(q), "PYDISK": "0"},
                                 ("-o", "setup"))
    log = (tmp_path / "make-run-vm-nodes2.log").read_text()
    assert "[node0] node=0" in log and "[node1] node=1" in log


def test_synth_json_names_the_captures(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "synth", str(tmp_path / "c"), "--json"]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert paths == [str(tmp_path / "c" / n) for n in ("node0", "node1")]
    assert [open_capture(Path(p)).node for p in paths] == ["node0", "node1"]


def test_view_metadata_counts_and_hostclk_alignment(twins: dict[str, list[Path]]) -> None:
    """The merged view's metadata: messages, those with a packet on both sides and those
    forward in time, counted from its messages (the bad twin: 8, all with packets, all
    forward); node1 aligned by the host clock, its alignment's bracket the host-clock
    offset's bound over its samples, its bound the bracket plus its residual."""
    from tacc.timeline.cluster import open_view

    v = open_view([open_capture(p) for p in twins["bad"]])
    m = v.metadata()
    tx, rx = v.messages["tx"].astype(np.int64), v.messages["rx"].astype(np.int64)
    both = (tx != 0) & (rx != 0)
    assert (m["messages"], m["messages_with_packets"], m["packets_forward_in_time"]) == (
        len(v.messages), int(both.sum()), int((both & (tx < rx)).sum())) == (8, 8, 8)
    n1 = m["nodes"][1]
    assert (m["reference"], n1["node"], n1["used"]) == ("node0", "node1", "hostclk")
    a, h = n1["align_to_reference"], n1["hostclk"]
    assert a["bracket_ns"] == h["bound_ns"] and a["pairs"] == h["samples"]
    assert a["bound_ns"] == pytest.approx(a["residual_max_ns"] + a["bracket_ns"])


def test_clock_requester_schedule_against_a_silent_peer() -> None:
    """A burst at the first poll, then one exchange per peer when a period has passed or
    on the final poll; each unanswered request counted lost once (WAIT_S each)."""
    import socket

    from tacc.capture.schema import NET_CLOCK_DTYPE

    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    q = clockx.Requester([f"127.0.0.1:{silent.getsockname()[1]}"], hz=4.0, burst=2)
    got = []
    try:
        for now, final in ((10.0, False), (10.1, False), (10.3, False), (10.31, False),
                           (10.32, True)):
            r = q.poll(now, final)
            got.append((len(r), r.dtype == NET_CLOCK_DTYPE, q.lost))
    finally:
        q.close()
        silent.close()
    assert got == [(0, True, 2), (0, True, 2), (0, True, 3), (0, True, 3), (0, True, 4)]
    assert q.seq == 4
    # a closed port (refused): counted lost like silence, no error
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    q = clockx.Requester([f"127.0.0.1:{port}"], burst=2)
    try:
        assert len(q.poll(0.0)) == 0 and q.lost == 2
    finally:
        q.close()
