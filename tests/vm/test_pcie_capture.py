"""The software PCIe analyzer in the guest (issue 19, docs/hardware.md section 11):
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
from collections.abc import Iterator
from pathlib import Path

import pytest
from tacc.capture import devinfo

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
    assert r.returncode == 2 and "CAP_PERFMON" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not Path("/tmp/u.pcapng").exists()


def test_tshark_decodes_every_tlp_of_a_known_copy(capture):
    """The formula (docs/hardware.md section 9) for a page-aligned 64 KiB H2D + D2H:
    128 read requests of 512 B, 1024 completions of 64 B (RCB), 256 writes of 256 B;
    the runtime's fences add 8-byte writes."""
    path, info = capture
    if not shutil.which("tshark"):
        pytest.fail("tshark is not installed (scripts/setup.sh installs it)")
    r = as_user(["tshark", "-X", f"lua_script:{LUA}", "-r", str(path), "-T", "fields",
                 "-E", "separator=,", *sum((["-e", f"tacc_tlp.{f}"] for f in FIELDS), [])])
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rows = [dict(zip(FIELDS, ln.split(","), strict=True)) for ln in r.stdout.splitlines()]
    assert len(rows) == info["records"] and info["dropped"] == 0
    kinds = collections.Counter(int(x["kind"]) for x in rows)
    reqs, cpls = devinfo.read_requests(N, 512), devinfo.completions(N, 512, 64)
    wr = [x for x in rows if x["kind"] == "1" and x["payload"] != "8"]
    assert (kinds[0], kinds[2], len(wr)) == (reqs, cpls, devinfo.payload_tlps(N, 256)) \
        == (128, 1024, 256)
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
