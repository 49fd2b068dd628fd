"""In each node of the cluster boot (scripts/test-vm --config cluster: two VMs side by side,
host time): the node's taccd answers the peer's clock exchange, captures the pipeline
twins (one stage per node, over TCP on the link-local network) and keeps the captures in
$TACC_VM_OUT/cluster/{bad,good}; tests/cluster/test_merge_real.py merges both nodes'
captures on the host after the boot.  Not in the single-VM boots (no peer).

scripts/test-vm sets TACC_CLUSTER_BPF: the cluster boot (make test) captures without BPF
(API rings, device trace, clock pairs and exchanges); cluster-bpf (make test-long) with the
BPF program, as a user's capture does (the packets: host net tx/rx, and the driver's and
scheduler's events): the compile costs each node ~1-2 min of host wall on a loaded 2-core
host."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NODE = int(os.environ.get("TACC_NODE", "-1"))
BPF = os.environ.get("TACC_CLUSTER_BPF", "1") != "0"


def _addr(i: int) -> str:
    return f"169.254.0.{i + 1}"


@pytest.fixture(scope="module")
def taccd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.environ.get("TACC_NODES") != "2" or NODE not in (0, 1):
        pytest.fail("tests/vm/test_cluster.py runs in the cluster boot only "
                    "(scripts/test-vm --config cluster: TACC_NODES=2)")
    from tacc.testing.taccd import start_taccd

    root = tmp_path_factory.mktemp("taccd")
    sock = root / "taccd.sock"
    extra = ["--no-bpf"] if not BPF else []
    d = start_taccd(sock, root, "--no-always-on", "--clock-exchange", _addr(NODE), *extra)
    yield sock
    d.terminate()
    d.wait(60)


# capture directory -> (workload, bad twin): the pipeline twins (pipeline_bubble) and the
# network-bound twins (pipeline_cut: network_bound), two batches each
TWINS = {"bad": ("pipeline", True), "good": ("pipeline", False),
         "cut-bad": ("pipeline_cut", True), "cut-good": ("pipeline_cut", False)}


def _capture_twin(sock: Path, variant: str) -> tuple[Path, dict]:
    """taccd captures while this process runs its stage of the twin (in process: under
    host time each new Python process costs seconds of imports over 9p)."""
    from tacc.daemon import protocol
    from tacc.runtime import Context, apitrace
    from tacc.workloads import run

    out = Path(os.environ["TACC_VM_OUT"]) / "cluster" / variant
    out.parent.mkdir(parents=True, exist_ok=True)
    apitrace.set_process_enabled(True)
    rep = protocol.request({"cmd": "start", "output": str(out),
                            "options": {"peers": [_addr(1 - NODE)]}}, str(sock),
                           timeout=1800 if BPF else 300)
    assert rep.get("ok"), rep
    try:
        with Context() as ctx:
            # two batches (pipeline's bad twin: 2 messages each way; the others: 8)
            name, bad = TWINS[variant]
            res = run(name, ctx, bad, batches=2).to_json()
    finally:
        time.sleep(0.3)
        stop = protocol.request({"cmd": "stop"}, str(sock), timeout=300)
    assert stop.get("ok"), stop
    (out.parent / f"result-{variant}.json").write_text(json.dumps(res))
    return out, res


@pytest.mark.timeout(1800)  # with BPF the first capture compiles (> 600 s seen under load)
@pytest.mark.parametrize("variant", list(TWINS))
def test_pipeline_stage_captured(taccd: Path, variant: str) -> None:
    """The stage ran on this node's device, its results checked against numpy, and the
    capture holds the messages (API net_send/net_recv), the packets (host net tx/rx)
    and the clock exchanges with the peer's taccd (net_clock)."""
    from tacc.capture import open_capture
    from tacc.capture.schema import HostKind

    out, res = _capture_twin(taccd, variant)
    assert res["checked"], res
    assert res["extra"]["role"] == NODE
    cap = open_capture(out)
    assert cap.complete, cap.problems
    assert cap.meta["node"] == f"node{NODE}"
    names = {s for s in cap.strings.values()}
    assert {"net_send", "net_recv", "gemm"} <= names
    if BPF:
        host = cap.read("host")
        assert (host["kind"] == HostKind.NET_TX).sum() > 0
        assert (host["kind"] == HostKind.NET_RX).sum() > 0
    nc = cap.read("net_clock")
    assert len(nc) >= 1, "no clock exchange with the peer's taccd"
    assert set(nc["peer_node"].tolist()) == {f"node{1 - NODE}".encode()}
    pairs = cap.read("clock_sync")
    assert (pairs["hostclk"] != 0).all(), "clock_sync pairs without the host clock"
