"""The software PCIe analyzer in the guest (docs/hardware.md section 11):
``tacc pcie capture`` of a known copy, decoded by the real tshark with
tools/tacc-tlp.lua: every TLP, the count the link formula gives, the right types and
lengths; the capture needs CAP_PERFMON (tacc-user gets EACCES); the Perfetto export
has the read flows."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tacc.model import link as linkmodel
from tacc.testing.pcicfg import DEVCTL, pcie_word

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "tools/tacc-tlp.lua"
N = 64 << 10
COPY = f"""
import numpy as np
from tacc.runtime import Context
with Context() as ctx:
    x = ctx.host_buffer(({N},), dtype=np.uint8)
    x.array[:] = 7
    d = ctx.device_buffer(({N},), dtype=np.uint8, page_size=4096)
    s = ctx.stream()
    s.copy_h2d(d, x)
    s.copy_d2h(x, d)
    s.synchronize()
"""
FIELDS = ["kind", "fmt_type", "up", "ctrl", "payload", "length", "link_bytes", "tag",
          "byte_count"]


def as_user(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=tacc-user", "--regid=tacc", "--init-groups",
                           "--inh-caps=-all", "env", "HOME=/tmp", *cmd],
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture(scope="module")
def capture() -> Iterator[tuple[Path, dict]]:
    # under /tmp itself: tacc-user must reach the file (pytest's tmp dirs are 0700)
    d = Path(tempfile.mkdtemp(prefix="tacc-pcie-"))
    out = d / "copy.pcapng"
    r = subprocess.run(["tacc", "pcie", "capture", "-o", str(out),
                        "--no-ctrl", "--json", "--", sys.executable, "-c", COPY],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    os.chmod(d, 0o755)
    os.chmod(out, 0o644)
    yield out, json.loads(r.stdout.splitlines()[-1])
    shutil.rmtree(d)


def test_capture_needs_perfmon(capture):
    code = ("import errno, sys\nfrom tacc.pcie.ring import TlpRing\n"
            "try:\n    TlpRing('/dev/accel/accel0')\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\n    sys.exit(3)\n")
    r = as_user([sys.executable, "-c", code])
    assert r.returncode == 3 and "needs CAP_PERFMON" in r.stdout, (r.stdout, r.stderr)
    r = as_user(["tacc", "pcie", "capture", "-o", "/tmp/u.pcapng",
                 "-t", "0.1"])
    assert r.returncode == 1 and "CAP_PERFMON" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not Path("/tmp/u.pcapng").exists()


def _devctl_sizes(pci: Path) -> tuple[int, int]:
    """(MPS, MRRS) in a function's PCIe Device Control."""
    ctl = pcie_word(pci, DEVCTL)
    return 128 << (ctl >> 5 & 7), 128 << (ctl >> 12 & 7)


def test_device_uses_the_mps_linux_programmed(pf_pci: Path) -> None:
    """Linux sets the PF's Max_Payload_Size to its root port's (q35's supports 128 B:
    dmesg "Max Payload Size set to 128 (was 256, max 256)"); the device's Device Control
    holds it and the link model uses it (tacc/max_payload_bytes: LINK_PARAMS).  Before,
    QEMU kept DevCtl's MPS field read-only: it read back 256 and the device sent 256 B
    writes to a root port of 128 B (what a real one rejects as malformed TLPs)."""
    port = pf_pci.resolve().parent
    mps, mrrs = _devctl_sizes(pf_pci)
    assert mps == _devctl_sizes(port)[0] == 128, (mps, _devctl_sizes(port))
    assert int((pf_pci / "tacc/max_payload_bytes").read_text()) == mps
    assert int((pf_pci / "tacc/max_read_request_bytes").read_text()) == mrrs == 512


def test_tshark_decodes_every_tlp_of_a_known_copy(capture, pf_pci: Path):
    """The formula (docs/hardware.md section 9) for a page-aligned 64 KiB H2D + D2H:
    128 read requests of 512 B, 1024 completions of 64 B (RCB), 512 writes of 128 B
    (the MPS Linux programmed, test above); the runtime's fences add 8-byte writes."""
    mps = int((pf_pci / "tacc/max_payload_bytes").read_text())
    path, info = capture
    if not shutil.which("tshark"):
        pytest.fail("tshark is not installed (scripts/setup.sh installs it)")
    r = as_user(["tshark", "-X", f"lua_script:{LUA}", "-r", str(path), "-T", "fields",
                 "-E", "separator=,", *sum((["-e", f"tacc_tlp.{f}"] for f in FIELDS), [])])
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rows = [dict(zip(FIELDS, ln.split(","), strict=True)) for ln in r.stdout.splitlines()]
    assert len(rows) == info["records"] and info["dropped"] == 0
    kinds = collections.Counter(int(x["kind"]) for x in rows)
    reqs, cpls = linkmodel.read_requests(N, 512), linkmodel.completions(N, 512, 64)
    wr = [x for x in rows if x["kind"] == "1" and x["payload"] != "8"]
    assert (kinds[0], kinds[2], len(wr)) == (reqs, cpls, linkmodel.payload_tlps(N, mps)) \
        == (128, 1024, N // mps)
    assert kinds[1] - len(wr) == sum(1 for x in rows if x["kind"] == "1" and x["payload"] == "8")
    for x in rows:
        k, n = int(x["kind"]), int(x["payload"])
        assert x["fmt_type"] == {0: "0x20", 1: "0x60", 2: "0x4a"}[k]
        assert (x["up"] == "1") == (k != 2) and x["ctrl"] == "0"
        assert int(x["length"]) == -(-n // 4)
        assert int(x["link_bytes"]) == n + (20 if k == 2 else 24 if k == 1 else 24 - n)
    assert {int(x["payload"]) for x in rows if x["kind"] == "0"} == {512}
    assert {int(x["payload"]) for x in rows if x["kind"] == "2"} == {64}
    assert sum(int(x["payload"]) for x in rows if x["kind"] == "2") == N
    assert sum(int(x["payload"]) for x in wr) == N
    s = info["summary"]
    assert s["h2d_cmd"]["CplD"] == cpls and s["d2h_cmd"]["MRd"] == reqs


def test_perfetto_timeline_has_tracks_and_read_flows(capture, tmp_path):
    path, _ = capture
    out = tmp_path / "tlps.json"
    r = subprocess.run(["tacc", "pcie", "timeline", str(path), "-o",
                        str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"TLPs down (H2D)", "TLPs up (D2H)"}
    starts = [e for e in ev if e["ph"] == "s"]
    ends = [e for e in ev if e["ph"] == "f"]
    assert len(starts) == len(ends) == 128  # one flow per read request
    # request -> first completion: the modelled read latency (600 ns)
    first = {}
    for e in ev:
        if e["ph"] in ("t", "f") and e["id"] not in first:
            first[e["id"]] = e["ts"]
    lat = {round((first[s["id"]] - s["ts"]) * 1000) for s in starts}
    assert lat == {600}


# ----------------------------------------------- the TLP stream of a capture --
def _counter_deltas(cap, fid: int) -> tuple[dict[str, int], tuple[int, int]]:
    c = cap.read("counters")
    c = c[c["fid"] == fid]
    assert len(c) >= 2, len(c)
    names = ["h2d_tlps", "d2h_tlps", "d2h_req_tlps", "h2d_bytes", "d2h_bytes",
             "h2d_link_bytes", "d2h_link_bytes", "dllp_h2d_bytes", "dllp_d2h_bytes",
             "ctrl_h2d_tlps", "ctrl_d2h_tlps", "ctrl_h2d_link_bytes", "ctrl_d2h_link_bytes",
             "ctrl_dllp_h2d_bytes", "ctrl_dllp_d2h_bytes"]
    return ({n: int(c[n][-1]) - int(c[n][0]) for n in names},
            (int(c["devclk"][0]), int(c["devclk"][-1])))


def test_taccd_tlp_stream_agrees_with_the_counters(pf_pci: Path) -> None:
    """``tacc trace start --tlp`` (taccd, no BPF): the capture's tlp stream holds every
    TLP of a known copy (64 KiB up and down), agreeing exactly with the device counters
    sampled in the same capture (docs/hardware.md section 11, "Agreement with the
    counters"), control traffic counted alike; no drops.  tacc-user asking for the stream
    gets one line naming CAP_PERFMON and no capture."""
    from tacc.capture import open_capture
    from tacc.capture.schema import DropSource
    from tacc.daemon.protocol import request
    from tacc.pcie import CPLD, F_CTRL, F_UP, MRD, MWR
    from tacc.testing.taccd import start_taccd

    d = Path(tempfile.mkdtemp(prefix="tacc-tlp-"))  # tacc-user must reach the socket
    os.chmod(d, 0o755)
    sock, out = d / "taccd.sock", d / "cap"
    t0 = time.monotonic()
    phase: dict[str, float] = {}
    p = start_taccd(sock, d, "--no-bpf", "--no-always-on", "--no-cdi")
    try:
        phase["taccd"] = time.monotonic() - t0
        os.chmod(sock, 0o666)
        r = as_user(["tacc", "trace", "--socket", str(sock), "start", "--tlp",
                     "-o", str(d / "u")])
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, (r.stdout, r.stderr)
        assert "CAP_PERFMON" in r.stderr and not (d / "u").exists(), r.stderr
        phase["refused"] = time.monotonic() - t0
        rep = request({"cmd": "start", "output": str(out),
                       "options": {"tlp": True, "device": pf_pci.name, "host_events": False}},
                      str(sock), timeout=120.0)
        assert rep["ok"], f"{rep}\n{(d / 'taccd.log').read_text()[-2000:]}"
        end = time.monotonic() + 30
        while not request({"cmd": "status"}, str(sock))["capture"]["records"].get("counters"):
            assert time.monotonic() < end, "no counter sample in 30 s"
            time.sleep(0.05)
        phase["started"] = time.monotonic() - t0
        exec(COPY, {})  # in this process: its imports are paid once (guest time)
        phase["copied"] = time.monotonic() - t0
        rep = request({"cmd": "stop"}, str(sock), timeout=120.0)
        assert rep["ok"], rep
        phase["stopped"] = time.monotonic() - t0
        # the same copy again, filtered in the device: read requests of the PF, no
        # control traffic (`tacc trace start --tlp-kinds mrd --tlp-funcs 0 --tlp-no-ctrl`)
        rep = request({"cmd": "start", "output": str(d / "mrd"),
                       "options": {"tlp": True, "device": pf_pci.name, "host_events": False,
                                   "tlp_kinds": ["mrd"], "tlp_funcs": [0],
                                   "tlp_no_ctrl": True}}, str(sock), timeout=120.0)
        assert rep["ok"], rep
        exec(COPY, {})
        rep = request({"cmd": "stop"}, str(sock), timeout=120.0)
        assert rep["ok"], rep
    finally:
        p.terminate()
        p.wait(30)
    phase["filtered"] = time.monotonic() - t0
    only = open_capture(d / "mrd")
    assert only.meta["options"]["tlp_kinds"] == ["mrd"]
    t = only.read("tlp")
    assert len(t) == linkmodel.read_requests(N, 512) == 128, len(t)  # the H2D half's MRds
    assert (t["kind"] == MRD).all() and not (t["flags"] & F_CTRL).any()
    assert (t["func"] == 0).all()
    if os.environ.get("TACC_VM_OUT"):  # guest seconds per phase, for the notes
        (Path(os.environ["TACC_VM_OUT"]) / "tlp-stream-phases.json").write_text(
            json.dumps(phase))
    cap = open_capture(out)
    assert cap.format_version[1] >= 7 and cap.meta["options"]["tlp"] is True
    fid = [f.pci for f in cap.functions].index(pf_pci.name)
    dc, (c0, c1) = _counter_deltas(cap, fid)
    t = cap.read("tlp")
    drops = cap.read("drops")
    assert int(drops["count"][drops["source"] == DropSource.TLP].sum()) == 0
    ticks = t["t_ps"] // 1000
    t = t[(t["fid"] == fid) & (ticks > c0) & (ticks <= c1)]
    up, ctrl = (t["flags"] & F_UP) != 0, (t["flags"] & F_CTRL) != 0
    got = {
        "h2d_tlps": int((~up & ~ctrl).sum()),
        "d2h_tlps+req": int((up & ~ctrl).sum()),
        "h2d_link": int(t["link_bytes"][~up & ~ctrl].sum()),
        "d2h_link": int(t["link_bytes"][up & ~ctrl].sum()),
        "h2d_bytes": int(t["payload"][(t["kind"] == CPLD) & ~ctrl].sum()),
        "d2h_bytes": int(t["payload"][(t["kind"] == MWR) & ~ctrl].sum()),
        "ctrl_h2d": int((~up & ctrl).sum()), "ctrl_d2h": int((up & ctrl).sum()),
        "ctrl_h2d_link": int(t["link_bytes"][~up & ctrl].sum()),
        "ctrl_d2h_link": int(t["link_bytes"][up & ctrl].sum()),
    }
    want = {
        "h2d_tlps": dc["h2d_tlps"], "d2h_tlps+req": dc["d2h_tlps"] + dc["d2h_req_tlps"],
        "h2d_link": dc["h2d_link_bytes"] - dc["dllp_h2d_bytes"],
        "d2h_link": dc["d2h_link_bytes"] - dc["dllp_d2h_bytes"],
        "h2d_bytes": dc["h2d_bytes"], "d2h_bytes": dc["d2h_bytes"],
        "ctrl_h2d": dc["ctrl_h2d_tlps"], "ctrl_d2h": dc["ctrl_d2h_tlps"],
        "ctrl_h2d_link": dc["ctrl_h2d_link_bytes"] - dc["ctrl_dllp_h2d_bytes"],
        "ctrl_d2h_link": dc["ctrl_d2h_link_bytes"] - dc["ctrl_dllp_d2h_bytes"],
    }
    assert got == want, (got, want)
    # the known copy: the link formula's counts (as the pcapng test above)
    cmd = t[~ctrl]
    assert int((cmd["kind"] == MRD).sum()) == linkmodel.read_requests(N, 512) == 128
    assert int((cmd["kind"] == CPLD).sum()) == linkmodel.completions(N, 512, 64) == 1024
    mps = int((pf_pci / "tacc/max_payload_bytes").read_text())
    assert int(((cmd["kind"] == MWR) & (cmd["payload"] == mps)).sum()) == N // mps
    assert got["ctrl_h2d"] + got["ctrl_d2h"] > 0  # descriptor fetches, CQEs, MSI-X, records
