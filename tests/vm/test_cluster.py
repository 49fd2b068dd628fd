"""In each node of the cluster boot (scripts/test-vm --config cluster: two VMs side by side,
host time): the node's taccd answers the peer's clock exchange, captures the pipeline
twins (one stage per node, over TCP on the link-local network) and keeps the captures in
$TACC_VM_OUT/cluster/{bad,good}; tests/cluster/test_merge_real.py merges both nodes'
captures on the host after the boot.  Not in the single-VM boots (no peer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
NODE = int(os.environ.get("TACC_NODE", "-1"))


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
    d = start_taccd(sock, root, "--no-always-on", "--clock-exchange", _addr(NODE))
    yield sock
    d.terminate()
    d.wait(60)


def _trace(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TACCD_SOCKET": str(sock)}
    return subprocess.run([str(BIN / "tacc"), "trace", *args], env=env, text=True,
                          capture_output=True, timeout=600)


def _capture_twin(sock: Path, variant: str) -> tuple[Path, dict]:
    out = Path(os.environ["TACC_VM_OUT"]) / "cluster" / variant
    out.parent.mkdir(parents=True, exist_ok=True)
    r = _trace(sock, "start", "-o", str(out), "--peers", _addr(1 - NODE))
    assert r.returncode == 0, r.stderr
    try:
        env = {**os.environ, "TACC_API_TRACE": "1"}
        w = subprocess.run([str(BIN / "tacc"), "run", "pipeline", "--variant", variant,
                            "--json"], env=env, text=True, capture_output=True, timeout=600)
        assert w.returncode == 0, w.stdout + w.stderr
    finally:
        time.sleep(0.3)
        s = _trace(sock, "stop", "--json")
    assert s.returncode == 0, s.stderr
    res = json.loads(w.stdout)["results"][0]
    (out.parent / f"result-{variant}.json").write_text(json.dumps(res))
    return out, res


@pytest.mark.parametrize("variant", ["bad", "good"])
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
    host = cap.read("host")
    assert (host["kind"] == HostKind.NET_TX).sum() > 0
    assert (host["kind"] == HostKind.NET_RX).sum() > 0
    nc = cap.read("net_clock")
    assert len(nc) >= 1, "no clock exchange with the peer's taccd"
    assert set(nc["peer_node"].tolist()) == {f"node{1 - NODE}".encode()}
    pairs = cap.read("clock_sync")
    assert (pairs["hostclk"] != 0).all(), "clock_sync pairs without the host clock"
