"""taccd pure-Python parts: trace-ring draining, capture sessions (complete and killed),
the control socket, tacc trace, the uAPI mirror, the systemd unit."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.capture import open_capture
from tacc.capture.schema import TRACE_REC_DTYPE, DropSource
from tacc.daemon.devring import RingView
from tacc.daemon.main import Daemon
from tacc.daemon.protocol import request
from tacc.daemon.session import CaptureSession, Options
from tacc.devices import TaccFunction, discover, parse_clock_sync
from tacc.runtime import uapi

ROOT = Path(__file__).resolve().parents[2]
TACC = str(Path(sys.executable).parent / "tacc")


class FakeRing:
    def __init__(self, entries: int = 8) -> None:
        self.entries = entries
        self.buf = bytearray(4096 + entries * 64)
        self.prod = self.dropped = 0
        self.seq = 0
        self.epoch = 1
        self._hdr()

    def _hdr(self) -> None:
        h = uapi.drm_tacc_trace_header(version=1, rec_size=64, entries=self.entries, rec_version=1,
                             data_offset=4096, prod=self.prod, dropped=self.dropped,
                             epoch=self.epoch)
        self.buf[:ctypes.sizeof(h)] = bytes(h)

    def produce(self, n: int, skip: int = 0) -> None:
        self.seq += skip
        self.dropped += skip
        for _ in range(n):
            r = np.zeros(1, TRACE_REC_DTYPE)
            r["seq"], r["version"], r["tag"] = self.seq, 1, 100 + self.seq
            off = 4096 + (self.prod % self.entries) * 64
            self.buf[off:off + 64] = r.tobytes()
            self.prod += 1
            self.seq += 1
        self._hdr()

    def advance(self, cons: int) -> tuple[int, int]:
        return self.prod, self.dropped


def test_ring_view_drains_wraps_and_counts_drops() -> None:
    f = FakeRing()
    v = RingView(f.buf, 3, f.advance)
    f.produce(5)
    r = v.drain()
    assert list(r.records["seq"]) == [0, 1, 2, 3, 4] and r.dropped == 0
    assert set(r.records["fid"]) == {3}
    f.produce(6, skip=2)  # wraps; 2 records the device dropped
    r = v.drain()
    assert list(r.records["seq"]) == list(range(7, 13))
    assert r.dropped == 2 and r.seq_gaps == 2
    assert v.total_records == 11 and v.total_dropped == 2


def test_clock_sync_parse() -> None:
    c = parse_clock_sync("10 5000 20\n30 5020 41\n", 2)
    assert list(c["devclk"]) == [5000, 5020] and list(c["fid"]) == [2, 2]


def _fake_sysfs(tmp: Path) -> str:
    d = tmp / "sys/bus/pci/devices/0000:01:00.0"
    (d / "tacc").mkdir(parents=True)
    (d / "counters").mkdir()
    (d / "vendor").write_text("0x7acc\n")
    for k, v in {"clock_hz": "1000000000", "link_speed": "16.0 GT/s PCIe", "link_width": "8",
                 "time_scale": "1", "queue_stats": "# q\n0 5 0 0 0 5\n",
                 "clock_sync": "100 7 110\n"}.items():
        (d / "tacc" / k).write_text(v)
    (d / "counters" / "jobs_completed").write_text("5\n")
    return str(tmp)


def test_discover_and_session_complete(tmp_path: Path) -> None:
    fns = discover(_fake_sysfs(tmp_path))
    assert [f.pci for f in fns] == ["0000:01:00.0"] and fns[0].devid == 0x100
    assert fns[0].meta()["link"]["gen"] == 4
    opts = Options(device_trace=False, api=False, counters_hz=1000.0)
    s = CaptureSession(tmp_path / "cap", fns, opts, tool="test")
    s.tick()
    s.drop(DropSource.DRIVER, 3)
    summary = s.close()
    assert summary["drops"] == {"driver": 3}
    cap = open_capture(tmp_path / "cap")
    assert cap.complete and cap.count("clock_sync") >= 2 and cap.count("counters") >= 2
    assert int(cap.read("drops")["count"].sum()) == 3
    assert cap.read("counters")["jobs_completed"][0] == 5


def test_session_disk_bound_counts_drops(tmp_path: Path) -> None:
    fn = TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None)
    s = CaptureSession(tmp_path / "cap", [fn], Options(device_trace=False, api=False,
                                                       counters_hz=0, max_bytes=2000,
                                                       host_events=False), tool="test")
    from tacc.bpftrace.events import EV_DTYPE

    ev = np.zeros(50, EV_DTYPE)
    ev["kind"] = 2
    ev["ts"] = 1
    s.drain_bpf(ev[:10])  # 1040 bytes: kept
    s.drain_bpf(ev[10:])  # over the bound: counted as dropped
    s.close()
    cap = open_capture(tmp_path / "cap")
    assert cap.count("driver") == 10
    assert int(cap.read("drops")["count"].sum()) == 40


KILL_SCRIPT = textwrap.dedent("""
    import sys, time, numpy as np
    from tacc.daemon.session import CaptureSession, Options
    from tacc.devices import TaccFunction
    from tacc.bpftrace.events import EV_DTYPE
    from pathlib import Path
    fn = TaccFunction("0000:01:00.0", 0x100, Path("/nonexistent"), False, 0, "0000:01:00.0", None)
    s = CaptureSession(sys.argv[1], [fn], Options(device_trace=False, api=False,
                       counters_hz=0, host_events=False, flush_s=0.0), tool="test")
    ev = np.zeros(100, EV_DTYPE); ev["kind"] = 2; ev["ts"] = 5
    s.drain_bpf(ev); s.tick()
    print("ready", flush=True)
    time.sleep(60)
""")


def test_killed_capture_is_readable_and_incomplete(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "cap")],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    cap = open_capture(tmp_path / "cap")
    assert not cap.complete and cap.count("driver") == 100
    assert any("interrupted" in x for x in cap.problems)


def test_daemon_control_socket_and_tacc_trace(tmp_path: Path) -> None:
    sysroot = _fake_sysfs(tmp_path)
    sock = str(tmp_path / "taccd.sock")
    d = Daemon(sock, tmp_path / "caps", interval=0.01, bpf=False, sysroot=sysroot)
    d.netlink = None
    t = threading.Thread(target=d.run, daemon=True)
    # signal handlers can only be set from the main thread: run the loop by hand
    d.run = None  # type: ignore[assignment]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for key, _ in d.sel.select(0.02):
                key.data()
            if d.session is not None:
                d.session.tick()
            if d.always_on is not None:
                d.always_on.tick(d.functions)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        assert request({"cmd": "ping"}, sock)["ok"]
        st = request({"cmd": "status"}, sock)
        assert st["mode"] == "always-on" and st["devices"] == ["0000:01:00.0"]
        out = tmp_path / "c1"
        env = {**os.environ, "TACCD_SOCKET": sock}
        r = subprocess.run([TACC, "trace", "start", "-o", str(out),
                            "--no-host"], env=env, text=True, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"capturing to {out}" in r.stdout
        r2 = request({"cmd": "start", "output": str(tmp_path / "c2")}, sock)
        assert not r2["ok"] and "already running" in r2["error"]
        time.sleep(0.2)
        r = subprocess.run([TACC, "trace", "stop"], env=env,
                           text=True, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert open_capture(out).complete
        r = subprocess.run([TACC, "trace", "stop"], env=env,
                           text=True, capture_output=True, timeout=60)
        assert r.returncode == 1 and r.stderr.strip() == "tacc: error: no capture is running"
        bad = request({"cmd": "start", "options": {"bogus": 1}}, sock)
        assert not bad["ok"] and "bogus" in bad["error"]
    finally:
        stop.set()
        t.join(5)
        d.close()


def test_tacc_trace_without_daemon(tmp_path: Path) -> None:
    env = {**os.environ, "TACCD_SOCKET": str(tmp_path / "none.sock")}
    r = subprocess.run([TACC, "trace", "status"], env=env,
                       text=True, capture_output=True, timeout=60)
    assert r.returncode == 1 and "taccd is not running" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


UAPI_C = """
#include <stdio.h>
#include <stddef.h>
#include "drm/tacc_accel.h"
#define P(s, f) printf(#s "." #f " %zu %zu\\n", offsetof(struct s, f), sizeof(((struct s *)0)->f));
int main(void) {
    P(drm_tacc_get_param, value) P(drm_tacc_trace_open, mmap_size)
    P(drm_tacc_trace_header, data_offset) P(drm_tacc_trace_header, epoch)
    P(drm_tacc_trace_advance, dropped) P(drm_tacc_submit, seqno) P(drm_tacc_submit, cmd_size)
    P(drm_tacc_wait, status) P(drm_tacc_cmd, size) P(drm_tacc_cmd, rsvd)
    printf("ioctl %lu %lu %lu %lu %lu\\n", (unsigned long)DRM_IOCTL_TACC_SUBMIT,
           (unsigned long)DRM_IOCTL_TACC_WAIT, (unsigned long)DRM_IOCTL_TACC_TRACE_OPEN,
           (unsigned long)DRM_IOCTL_TACC_TRACE_ADVANCE, (unsigned long)DRM_IOCTL_TACC_TRACE_CLOSE);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_uapi_mirror_matches_header(tmp_path: Path) -> None:
    src = tmp_path / "u.c"
    src.write_text(UAPI_C)
    exe = tmp_path / "u"
    subprocess.run(["cc", "-I", str(ROOT / "kernel/include/uapi"), "-o", str(exe), str(src)],
                   check=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, text=True, capture_output=True).stdout
    m = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()}
    cmap = {n: getattr(uapi, n) for n in ("drm_tacc_get_param", "drm_tacc_trace_open",
                                          "drm_tacc_trace_header", "drm_tacc_trace_advance",
                                          "drm_tacc_submit", "drm_tacc_wait", "drm_tacc_cmd")}
    for key, vals in m.items():
        if key == "ioctl":
            continue
        off, size = vals
        s, f = key.split(".")
        fld = getattr(cmap[s], f)
        assert (fld.offset, fld.size) == (int(off), int(size)), key
    assert [int(x) for x in m["ioctl"]] == [
        uapi.DRM_IOCTL_TACC_SUBMIT, uapi.DRM_IOCTL_TACC_WAIT, uapi.DRM_IOCTL_TACC_TRACE_OPEN,
        uapi.DRM_IOCTL_TACC_TRACE_ADVANCE, uapi.DRM_IOCTL_TACC_TRACE_CLOSE]
    assert ctypes.sizeof(uapi.drm_tacc_cmd) == 128


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "taccd.service"
    text = (ROOT / "tools/systemd/taccd.service").read_text()
    # verify needs the ExecStart binary to exist: point it at this venv's taccd
    taccd = Path(sys.executable).parent / "taccd"
    if taccd.exists():
        text = text.replace("/usr/local/bin/taccd", str(taccd))
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], text=True,
                       capture_output=True, timeout=60)
    errs = [ln for ln in r.stderr.splitlines() if "taccd.service" in ln]
    assert r.returncode == 0 and not errs, r.stderr


def test_api_rings_adapter_enables_drains_and_disables(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """taccd's adapter over the runtime's real ring reader (tacc.runtime.apitrace)."""
    from tacc.capture.schema import API_DTYPE
    from tacc.daemon.apiring import ApiRings, available
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path))
    assert available() == (True, "")
    ring = apitrace.Ring(tmp_path / "tacc-api.4242", 4242, 4243, 8, enabled=False)
    other = apitrace.Ring(tmp_path / "tacc-api.77", 77, 77, 8, enabled=False)
    strings: dict[str, int] = {}
    api = ApiRings(lambda s: strings.setdefault(s, len(strings) + 1),
                   {"0000:01:00.0": 0}, pids={4242})
    api.scan()
    assert ring.enabled and not other.enabled
    dev = 1 << 8  # 0000:01:00.0
    for i in range(10):  # 8 slots: 2 dropped
        ring.emit(apitrace.NAME_ID["nop"], 100 + i, 200 + i, tag=i, dev=dev, args="q=0")
    recs, dropped = api.drain()
    assert recs.dtype == API_DTYPE and len(recs) == 8 and dropped == 2
    assert recs["tag"].tolist() == list(range(8)) and set(recs["fid"].tolist()) == {0}
    inv = {v: k for k, v in strings.items()}
    assert {inv[int(x)] for x in recs["name_id"]} == {"nop"}
    assert {inv[int(x)] for x in recs["args_id"]} == {"q=0"}
    api.close()
    assert not ring.enabled
    ring.close()
    other.close()


# ------------------------------------------------------------ device events --
PCI0 = "0000:01:00.0"


def _nl(event: int, **kw: object) -> dict[str, object]:
    """An event as tacc.daemon.netlink.decode returns it."""
    from tacc.daemon.netlink import EVENT_NAMES

    return {"recv_mono_ns": time.monotonic_ns(), "event": event, "device": PCI0, "minor": 0,
            "queue": 0, "info": 0, "addr": 0, "tag": 0, "seqno": 0,
            "timestamp": time.monotonic_ns(), "name": EVENT_NAMES.get(event, f"event{event}"),
            **kw}


def _session(tmp_path: Path, name: str = "cap", **kw: object) -> CaptureSession:
    fn = TaccFunction(PCI0, 0x100, tmp_path, False, 0, PCI0, None)
    opts = Options(device_trace=False, api=False, counters_hz=0, clock_hz=0,
                   host_events=False, **kw)  # type: ignore[arg-type]
    return CaptureSession(tmp_path / name, [fn], opts, tool="test")


def test_device_event_kinds_match_uapi() -> None:
    import re

    from tacc.capture.schema import DeviceEventKind
    from tacc.daemon.netlink import EVENT_NAMES

    hdr = (ROOT / "kernel/include/uapi/drm/tacc_accel.h").read_text()
    enum = {m[1]: int(m[2]) for m in re.finditer(r"TACC_EVENT_(\w+)\s*=\s*(\d+)", hdr)}
    assert len(enum) == 8
    for name, num in enum.items():
        assert DeviceEventKind[name] == num
        assert EVENT_NAMES[num] == name.lower()
    assert {k.value for k in DeviceEventKind} - set(enum.values()) == {9, 10, 11, 255}


def test_session_writes_device_events_as_they_arrive(tmp_path: Path) -> None:
    from tacc.capture.schema import NO_CTX, NO_FID, NO_QUEUE
    from tacc.capture.schema import DeviceEventKind as K

    s = _session(tmp_path)
    info = (1 << 31) | (1 << 28) | (1 << 24) | (2 << 16) | 7  # valid write unmapped q2 ctx 7
    t0 = time.monotonic_ns()
    s.device_event(_nl(1, queue=2, info=info, addr=0xBAD000, tag=0x5A5A0001, timestamp=t0))
    s.device_event(_nl(5, info=3, timestamp=t0 + 1))  # runtime suspend
    s.device_event(_nl(5, info=0, timestamp=t0 + 2))  # resume
    s.device_event(_nl(3, queue=0xFFFFFFFF, info=2, timestamp=t0 + 3))  # function reset
    s.device_event(_nl(2, ctx=4, pid=99, queue=1, tag=5, seqno=17, timestamp=t0 + 4))
    s.device_event(_nl(42, timestamp=t0 + 5))  # a newer driver's event
    s.device_event(_nl(5, device="0000:02:00.0", info=3, timestamp=t0 + 6))  # unknown fn
    vf = TaccFunction("0000:01:00.1", 0x101, tmp_path, True, 1, PCI0, None)
    s.add_function(vf)
    s.remove_function("0000:01:00.1")
    s.remove_function("0000:01:00.1")  # once only
    assert s.status()["records"]["device_events"] == 9
    s.close()
    cap = open_capture(tmp_path / "cap")
    assert cap.complete
    marker = json.loads((tmp_path / "cap" / "complete").read_text())
    assert "device_events" not in marker and len(marker["devices_added"]) == 1
    assert marker["tool_summary"]["records"]["device_events"] == 9
    e = cap.read("device_events")
    assert e["kind"].tolist() == [K.MMU_FAULT, K.PM, K.PM, K.RESET, K.HANG, K.OTHER, K.PM,
                                  K.HOTPLUG_ADD, K.HOTPLUG_REMOVE]
    assert e["fid"].tolist() == [0] * 6 + [NO_FID, 1, 1]
    f = e[0]
    assert (f["t_ns"], f["ctx"], f["queue"], f["addr"], f["tag"], f["arg"], f["status"]) == (
        t0, 7, 2, 0xBAD000, 0x5A5A0001, info, 1)  # ctx from FAULT_INFO, status = type
    assert e["arg"][1:3].tolist() == [3, 0] and e["queue"][1] == NO_QUEUE
    assert e["ctx"][1] == NO_CTX
    assert e["queue"][3] == NO_QUEUE and e["arg"][3] == 2
    assert (e["ctx"][4], e["pid"][4], e["queue"][4], e["seqno"][4]) == (4, 99, 1, 17)
    assert e["arg"][5] == 42
    assert e["arg"][7] == 1  # VF number
    detail = [cap.strings[int(i)] for i in e["name_id"]]
    assert detail[0] == f"mmu_fault {PCI0} unmapped write"
    assert detail[1] == f"pm {PCI0} D3 (suspended)" and detail[2] == f"pm {PCI0} D0 (resumed)"
    assert detail[5] == f"event42 {PCI0}"  # the decoder's name for a newer driver's event
    assert detail[6] == "pm 0000:02:00.0 D3 (suspended)"
    assert detail[7:] == ["hotplug add 0000:01:00.1 VF 1", "hotplug remove 0000:01:00.1 VF 1"]
    assert np.all(np.diff(e["t_ns"][:7]) > 0)


def test_function_added_mid_capture_is_described(tmp_path: Path) -> None:
    """A VF enabled during the capture gets fid 1; the reader describes it from the
    marker, or, when taccd was killed, from its hotplug event with the PF's link."""
    import shutil

    s = _session(tmp_path)
    vf = TaccFunction("0000:01:00.1", 0x101, tmp_path, True, 1, PCI0, None)
    s.add_function(vf)
    s.writer.flush()  # what a killed taccd leaves: the chunks, no marker
    shutil.copytree(tmp_path / "cap", tmp_path / "killed")
    (tmp_path / "killed" / "complete").unlink(missing_ok=True)
    s.close()
    for name, complete in (("cap", True), ("killed", False)):
        cap = open_capture(tmp_path / name)
        assert cap.complete is complete
        assert [(f.fid, f.pci, f.vf) for f in cap.functions] == [
            (0, PCI0, 0), (1, "0000:01:00.1", 1)], name
        pf, v = cap.functions
        assert v.pf == PCI0 and (v.gen, v.width, v.mps) == (pf.gen, pf.width, pf.mps)
        assert v.time_scale == pf.time_scale and v.clock_hz == pf.clock_hz
        assert not [p for p in cap.problems if "not described" in p]


def test_device_filtered_capture_skips_other_functions(tmp_path: Path) -> None:
    s = _session(tmp_path, device=PCI0)
    s.device_event(_nl(5, device="0000:02:00.0", info=3))
    s.device_event(_nl(5, info=3))
    s.close()
    e = open_capture(tmp_path / "cap").read("device_events")
    assert e["fid"].tolist() == [0]


def test_killed_capture_keeps_flushed_device_events(tmp_path: Path) -> None:
    """Nothing is closed (as after kill -9): events flushed by a tick are on disk; one
    that arrived after the last flush is not."""
    s = _session(tmp_path, flush_s=0.0)
    s.device_event(_nl(1, info=(1 << 31) | (1 << 24) | 3, addr=0x1000))
    s.device_event(_nl(5, info=3))
    s.tick()  # the loop's tick: flushes every stream (flush_s = 0)
    s.opts.flush_s = 3600.0
    s.device_event(_nl(5, info=0))  # after the last flush
    s.tick()
    cap = open_capture(tmp_path / "cap")  # no close(): no complete marker
    assert not cap.complete and any("interrupted" in p for p in cap.problems)
    e = cap.read("device_events")
    assert e["kind"].tolist() == [1, 5] and e["arg"].tolist()[1] == 3
    assert cap.strings[int(e["name_id"][1])].startswith("pm ")


KILL_EVENTS_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tacc.daemon.session import CaptureSession, Options
    from tacc.devices import TaccFunction
    fn = TaccFunction("0000:01:00.0", 0x100, Path("/nonexistent"), False, 0, "0000:01:00.0",
                      None)
    s = CaptureSession(sys.argv[1], [fn], Options(device_trace=False, api=False,
                       counters_hz=0, clock_hz=0, host_events=False, flush_s=0.0), tool="test")
    for ev in (1, 5, 3):
        s.device_event({"event": ev, "device": "0000:01:00.0", "info": 3, "queue": 0,
                        "timestamp": time.monotonic_ns(), "name": "x"})
    s.tick()
    print("ready", flush=True)
    time.sleep(60)
""")


def test_kill_9_keeps_device_events(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", KILL_EVENTS_SCRIPT, str(tmp_path / "cap")],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    cap = open_capture(tmp_path / "cap")
    assert not cap.complete
    assert cap.read("device_events")["kind"].tolist() == [1, 5, 3]


def test_device_events_disk_bound_counts_drops(tmp_path: Path) -> None:
    s = _session(tmp_path, max_bytes=64 * 2)
    for _ in range(5):
        s.device_event(_nl(5, info=3))
    st = s.status()
    assert st["records"]["device_events"] == 2 and st["drops"] == {"device_events": 3}
    s.close()
    cap = open_capture(tmp_path / "cap")
    assert cap.count("device_events") == 2
    d = cap.read("drops")
    assert d["source"].tolist() == [int(DropSource.DEVICE_EVENTS)] * 3


def test_daemon_routes_netlink_events_to_capture(tmp_path: Path) -> None:
    sysroot = _fake_sysfs(tmp_path)

    class FakeNetlink:
        errors = 0
        overflows = 0
        pending: list[dict[str, object]] = []

        def read(self) -> list[dict[str, object]]:
            out, self.pending = self.pending, []
            self.errors += self.overflows  # ENOBUFS seen while reading
            self.overflows = 0
            return out

        def close(self) -> None:
            pass

    d = Daemon(str(tmp_path / "s.sock"), tmp_path / "caps", always_on=False, bpf=False,
               sysroot=sysroot)
    if d.netlink is not None:
        d.netlink.close()
    nl = FakeNetlink()
    d.netlink = nl
    try:
        nl.pending = [_nl(5, info=3)]
        d._on_netlink()  # no capture: kept for status only
        d.start_capture(str(tmp_path / "c"), {"device_trace": False, "api": False,
                                              "host_events": False, "counters_hz": 0})
        nl.pending = [_nl(5, info=0), _nl(1, info=(1 << 31) | 5, addr=0x2000)]
        nl.overflows = 2
        d._on_netlink()
        assert d.status()["capture"]["records"]["device_events"] == 2
        assert len(d.status()["device_events"]) == 3
        # a function probed after taccd looked, its event read before its uevent
        d2 = Path(sysroot, "sys/bus/pci/devices/0000:02:00.0")
        (d2 / "tacc").mkdir(parents=True)
        (d2 / "vendor").write_text("0x7acc\n")
        nl.pending = [_nl(5, device="0000:02:00.0", info=0)]
        d._on_netlink()
        summary = d.stop_capture()["summary"]
        assert summary["drops"] == {"device_events": 2}
    finally:
        d.close()
    cap = open_capture(tmp_path / "c")
    e = cap.read("device_events")
    assert e["kind"].tolist() == [5, 1, 9, 5] and e["fid"].tolist() == [0, 0, 1, 1]
    assert cap.strings[int(e["name_id"][2])] == "hotplug add 0000:02:00.0 PF"


def test_ring_view_device_drops_from_before_the_capture_are_not_counted() -> None:
    # the device counts drops since the function's last reset and every write-back
    # reports that total; TRACE_OPEN seeds the header with it (tacc_trace_hw_setup)
    f = FakeRing()
    f.dropped = 500  # an earlier consumer's drops, in the header from the open on
    f._hdr()
    calls = []

    def advance(cons: int) -> tuple[int, int]:
        calls.append(cons)
        return f.advance(cons)

    v = RingView(f.buf, 0, advance)
    r = v.drain()
    assert len(r.records) == 0 and r.dropped == 0 and calls == []  # empty: no ioctl
    f.produce(3)  # first write-back: dropped = 500 still
    r = v.drain()
    assert len(r.records) == 3 and r.dropped == 0 and calls == [3]
    f.produce(2, skip=4)  # 4 new drops
    r = v.drain()
    assert r.dropped == 4 and r.seq_gaps == 4 and v.total_dropped == 4
    assert v.drain().dropped == 0 and calls == [3, 5]
    # a function reset (epoch + 1): indices restart, the base is the header's count again
    f.prod, f.dropped, f.seq, f.epoch = 0, 7, 0, 2
    f._hdr()
    f.produce(2)
    r = v.drain()
    assert len(r.records) == 2 and r.dropped == 0 and v.total_dropped == 4


class _FakeProgram:
    """A Program as the session uses it: ``reader`` (a RingReader over a bytearray ring,
    filled by ``produce``), ``drain``, ``stats``."""

    def __init__(self, events: np.ndarray, size: int = 1 << 22) -> None:
        from tacc.bpftrace.ringbuf import RingReader, stride_of

        self.dtype, self.size = events.dtype, size
        self.stride = stride_of(events.dtype.itemsize)
        self.cons, self.prod = bytearray(4096), bytearray(4096 + 2 * size)
        self.pos = 0
        self.reader = RingReader(self.cons, self.prod, size, events.dtype, 4096)
        self.stats_calls = 0
        self.produce(events)

    def produce(self, events: np.ndarray) -> None:
        it = self.dtype.itemsize
        fr = np.zeros(len(events), np.dtype({"names": ["len", "pg", "rec"],
                                             "formats": ["<u4", "<u4", self.dtype],
                                             "offsets": [0, 4, 8], "itemsize": self.stride}))
        fr["len"], fr["rec"] = it, events
        raw = fr.tobytes()
        off = self.pos & (self.size - 1)
        assert off + len(raw) <= self.size  # the fake does not wrap
        for base in (4096, 4096 + self.size):  # the data area is mapped twice
            self.prod[base + off:base + off + len(raw)] = raw
        self.pos += len(raw)
        self.prod[0:8] = self.pos.to_bytes(8, "little")

    def drain(self) -> np.ndarray:
        return self.reader.drain()

    def stats(self) -> object:
        from tacc.bpftrace.program import Stats

        self.stats_calls += 1
        return Stats(dropped=7, host_dropped=1, driver_missed=2)


def test_session_drains_bpf_in_slices_keeps_every_record(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from tacc.bpftrace.events import EV_DTYPE, HOST_BASE
    from tacc.daemon import session as smod
    from tacc.daemon.devring import DrainResult

    monkeypatch.setattr(smod, "BPF_SLICE", 1000)
    n = 3500
    ev = np.zeros(n, EV_DTYPE)
    ev["ts"] = np.arange(n) + 10**9
    ev["kind"] = 2
    ev["kind"][::10] = HOST_BASE + 1
    ev["dev"] = 0x100
    prog = _FakeProgram(ev)
    fn = TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None)
    s = CaptureSession(tmp_path / "cap", [fn], Options(device_trace=False, api=False,
                                                       counters_hz=0), program=prog,
                       tool="test")

    class Ring:
        drains = 0

        def drain(self) -> DrainResult:
            Ring.drains += 1
            return DrainResult(np.zeros(0, s.writer._streams["device_trace"].dtype), 0, 0)

        def close(self) -> None:
            pass

    s.rings[0] = Ring()  # type: ignore[assignment]
    s.tick(100.0)
    assert Ring.drains == 5  # before the first slice, between the four, after the last
    assert prog.reader.pending_bytes() == 0 and prog.stats_calls == 1
    s.tick(100.5)  # less than a second later: the drop counters are not read
    assert prog.stats_calls == 1
    summary = s.close()  # reads them once more
    assert prog.stats_calls == 2
    assert {k: summary["drops"][k] for k in ("driver", "host")} == {"driver": 9, "host": 1}
    assert {k: summary["records"][k] for k in ("driver", "host")} == {"driver": 3150,
                                                                       "host": 350}
    cap = open_capture(tmp_path / "cap")
    assert cap.read("driver")["t_ns"].tolist() == ev["ts"][ev["kind"] < HOST_BASE].tolist()
    assert len(cap.read("host")) == 350


def test_api_rings_scan_lists_the_directory_only_when_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tacc.daemon.apiring import ApiRings
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path))
    api = ApiRings(lambda s: 1, {})
    listed = []
    real = api.mod.list_rings
    monkeypatch.setattr(api.mod, "list_rings", lambda: listed.append(1) or real())
    old = time.time() - 60
    os.utime(tmp_path, (old, old))
    api.scan()
    api.scan()  # unchanged for long: not listed again
    assert len(listed) == 1
    ring = apitrace.Ring(tmp_path / "tacc-api.4242", 4242, 4242, 8, enabled=False)
    api.scan()  # the directory changed: listed, the new ring enabled
    api.scan()  # changed less than SETTLE_NS ago: listed again (coarse timestamps)
    assert len(listed) == 3 and ring.enabled
    os.utime(tmp_path, (old, old))
    api.scan()
    api.scan()
    assert len(listed) == 4
    api.close()
    ring.close()


def test_writer_chunks_from_pieces_are_byte_identical(tmp_path: Path) -> None:
    """The writer frames chunks from slices of the appended arrays (crc32 piece by piece,
    one writev): the file is what encode_chunk of the concatenated records gives."""
    from tacc.capture import CaptureWriter, framing
    from tacc.capture.schema import DRIVER_DTYPE, DROPS_DTYPE

    rng = np.random.default_rng(3)
    per = 4096 // DRIVER_DTYPE.itemsize
    w = CaptureWriter(tmp_path / "c", {"node": "n", "devices": []}, chunk_bytes=4096,
                      streams=("driver",))
    batches: list[list[np.ndarray]] = [[]]
    for i in range(120):
        n = int(rng.integers(0, 90)) if i % 7 else 0
        recs = rng.integers(0, 256, n * DRIVER_DTYPE.itemsize, np.uint8).view(DRIVER_DTYPE)
        w.append("driver", recs)
        batches[-1].append(recs)
        if i % 25 == 24:
            w.flush()
            batches.append([])
    for _ in range(70):  # many tiny appends
        w.append("driver", np.zeros(1, DRIVER_DTYPE))
        batches[-1].append(np.zeros(1, DRIVER_DTYPE))
    w.close()
    want = b""
    seq = 0
    pend = np.zeros(0, DRIVER_DTYPE)
    for b in batches:  # whole chunks as records arrive, the rest at each flush
        pend = np.concatenate([pend, *b])
        while len(pend):
            take = pend[:per]
            want += framing.encode_chunk(seq, len(take), take.tobytes())
            seq += 1
            pend = pend[per:]
    path = tmp_path / "c" / "streams" / "driver.tcs"
    with open(path, "rb") as f:
        _info, start = framing.read_file_header(f, "driver")
    assert path.read_bytes()[start:] == want
    assert open_capture(tmp_path / "c").count("driver") == sum(
        len(x) for b in batches for x in b)
    # one-record appends of a small record: more pieces per chunk than one writev takes
    w = CaptureWriter(tmp_path / "d", {"node": "n", "devices": []}, chunk_bytes=4096,
                      streams=("drops",))
    d = np.zeros(400, DROPS_DTYPE)
    d["count"] = np.arange(400)
    for i in range(400):
        w.append("drops", d[i:i + 1].copy())
    w.close()
    per = 4096 // DROPS_DTYPE.itemsize
    want = b"".join(framing.encode_chunk(i, len(d[j:j + per]), d[j:j + per].tobytes())
                    for i, j in enumerate(range(0, 400, per)))
    path = tmp_path / "d" / "streams" / "drops.tcs"
    with open(path, "rb") as f:
        _info, start = framing.read_file_header(f, "drops")
    assert path.read_bytes()[start:] == want


def test_session_bpf_drains_when_quiet_batched_when_busy(tmp_path: Path) -> None:
    from tacc.bpftrace.events import EV_DTYPE
    from tacc.daemon import session as smod

    def evs(n: int, t0: int) -> np.ndarray:
        e = np.zeros(n, EV_DTYPE)
        e["ts"], e["kind"], e["dev"] = np.arange(n) + t0, 2, 0x100
        return e

    prog = _FakeProgram(evs(0, 0))
    fn = TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None)
    s = CaptureSession(tmp_path / "cap", [fn], Options(device_trace=False, api=False,
                                                       counters_hz=0, clock_hz=0,
                                                       flush_s=100.0), program=prog,
                       tool="test")
    s.t_flush = 100.0
    t = 100.0
    prog.produce(evs(smod.BPF_IDLE, 0))  # quiet: drained at the next tick
    s.tick(t)
    assert s.counts["driver"] == smod.BPF_IDLE
    prog.produce(evs(1000, 10_000))  # busier: waits for the batch size or the age
    s.tick(t + 0.05)
    s.tick(t + 0.10)
    assert s.counts["driver"] == smod.BPF_IDLE
    s.tick(t + smod.BPF_MAX_AGE_S)
    assert s.counts["driver"] == smod.BPF_IDLE + 1000
    prog.produce(evs(smod.BPF_BATCH, 20_000))  # a batch's worth: drained at once
    s.tick(t + smod.BPF_MAX_AGE_S + 0.05)
    assert s.counts["driver"] == smod.BPF_IDLE + 1000 + smod.BPF_BATCH
    prog.produce(evs(500, 40_000))
    s.tick(t + smod.BPF_MAX_AGE_S + 0.10)  # not due; the end drains everything
    summary = s.close()
    assert summary["records"]["driver"] == smod.BPF_IDLE + 1500 + smod.BPF_BATCH
    assert prog.reader.pending_bytes() == 0


def test_counter_samples_on_a_grid_late_slots_are_drops(tmp_path: Path) -> None:
    fn = TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None)
    s = CaptureSession(tmp_path / "cap", [fn], Options(device_trace=False, api=False,
                                                       counters_hz=20, clock_hz=0,
                                                       host_events=False, flush_s=100.0),
                       tool="test")
    s.t_flush = 100.0
    assert s.counts["counters"] == 1  # the sample at the start, outside the grid
    # first sample; one a little early (the 50 ms loop's jitter); one 30 ms late: no drop
    for t in (100.0, 100.049, 100.13):
        s.tick(t)
    key = (int(DropSource.COUNTERS), 0xFFFF)
    assert s.counts["counters"] == 4 and key not in s.drops
    s.tick(100.115)  # not due (the next slot, .15, is more than half a period away)
    s.tick(100.36)  # the slots at .15 .20 .25 .30 .35 passed: one sample, four missed
    assert s.counts["counters"] == 5 and s.drops[key] == 4
    s.tick(100.39)  # due at .40, taken up to half a period early
    assert s.counts["counters"] == 6
    summary = s.close()
    assert summary["drops"]["counters"] == 4 and summary["records"]["counters"] == 7


def test_trace_ring_size_is_checked_before_any_device_is_touched() -> None:
    for ok in (0, 64, 4096, 32768):
        assert Options(trace_entries=ok).trace_entries == ok
    for bad in (1, 32, 100, 65536, -64):
        with pytest.raises(ValueError, match="power of two from 64 to 32768"):
            Options(trace_entries=bad)


def test_tlp_stream_needs_perfmon_and_a_pf(tmp_path: Path) -> None:
    """The TLP stream (format minor 7): a client without CAP_PERFMON is refused before
    anything is opened (one line naming it); a capture without a bound PF cannot have
    it (and leaves no directory); the ring size is checked like the trace ring's."""
    from tacc.daemon.main import DaemonError, may_perfmon
    from tacc.pcie.ring import TlpCaptureError

    assert may_perfmon(os.getpid(), 0)
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "--inh-caps=-all", "sleep", "30"])
    try:
        # until setpriv has exec'd sleep with the new credentials: setpriv keeps its
        # capabilities across the uid change (PR_SET_KEEPCAPS) until it execs, so Uid alone
        # can show 65534 while CapEff is still full (failed once with the device layer beside)
        for _ in range(500):
            if (Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep"
                    and Path(f"/proc/{p.pid}/status").read_text().find("Uid:\t65534") >= 0):
                break
            time.sleep(0.02)
        assert not may_perfmon(p.pid, 65534)
    finally:
        p.kill()
        p.wait()
    d = Daemon(str(tmp_path / "s.sock"), tmp_path / "caps", always_on=False, bpf=False,
               sysroot=_fake_sysfs(tmp_path))
    try:
        with pytest.raises(DaemonError, match=r"^the TLP stream needs CAP_PERFMON \(root\)"):
            d.handle({"cmd": "start", "output": str(tmp_path / "u"),
                      "options": {"tlp": True}}, (p.pid, 65534))
        assert not (tmp_path / "u").exists() and d.session is None
    finally:
        d.close()
    fns = discover(_fake_sysfs(tmp_path / "b"))
    with pytest.raises(TlpCaptureError, match="needs a PF in the capture"):
        CaptureSession(tmp_path / "cap", fns, Options(tlp=True, device_trace=False, api=False))
    assert not (tmp_path / "cap").exists()
    for bad in (32, 100, 1 << 19):
        with pytest.raises(ValueError, match="TLP ring entries"):
            Options(tlp_entries=bad)
    with pytest.raises(ValueError, match="tlp 1: true or false"):
        Options(tlp=1)  # type: ignore[arg-type]


def test_tlp_stream_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TLP stream's device-side filters (functions, kinds, address range, no control
    traffic) become the TLP ring's masks; bad ones are one line each; `tacc trace start`'s
    filter flags ask for the stream and reach taccd as these options."""
    from tacc.cli import trace as cli_trace

    o = Options(tlp=True, tlp_funcs=[0, 2], tlp_kinds=["mrd", "cpld"],
                tlp_addr=[0x1000, 0x2000], tlp_no_ctrl=True)
    assert o.tlp_filters() == (0b101, 0b101, (0x1000, 0x2000), True)
    assert Options(tlp=True).tlp_filters() == (0, 0, None, False)  # everything
    for bad, msg in ((dict(tlp_funcs=[32]), "function 32"), (dict(tlp_kinds=["io"]), "kind"),
                     (dict(tlp_addr=[9, 9]), "address range"), (dict(tlp_addr=[1]), "range"),
                     (dict(tlp_no_ctrl=1), "tlp_no_ctrl 1")):
        with pytest.raises(ValueError, match=msg):
            Options(**bad)  # type: ignore[arg-type]
    sent: list[dict] = []
    monkeypatch.setattr(cli_trace, "_call", lambda a, req: sent.append(req) or {"path": "x"})
    from tacc.cli import main

    assert main(["trace", "start", "-o", "x", "--tlp-kinds", "MRD,cpld", "--tlp-funcs", "0,1",
                 "--tlp-addr", "0x1000-0x3000", "--tlp-no-ctrl"]) == 0
    opts = sent[-1]["options"]
    assert opts["tlp"] is True and opts["tlp_kinds"] == ["mrd", "cpld"]
    assert opts["tlp_funcs"] == [0, 1] and opts["tlp_addr"] == [0x1000, 0x3000]
    assert opts["tlp_no_ctrl"] is True
    assert Options(**opts).tlp_filters() == (0b11, 0b101, (0x1000, 0x3000), True)
    assert main(["trace", "start", "-o", "x"]) == 0 and "tlp" not in sent[-1]["options"]
    assert main(["trace", "start", "-o", "x", "--tlp-addr", "9-3"]) == 2
    assert main(["trace", "start", "-o", "x", "--tlp-funcs", "pf"]) == 2


def test_session_captures_api_rings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture (no TLP stream) drains the runtime's API rings into its api stream: a
    regression test of the TLP stream's change to the session's collectors, which once
    left the API rings to close() (captures then had no API records)."""
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    ring = apitrace.Ring(tmp_path / "shm" / "tacc-api.4242", 4242, 4243, 8, enabled=False)
    fns = discover(_fake_sysfs(tmp_path))
    s = CaptureSession(tmp_path / "cap", fns, Options(device_trace=False, counters_hz=0.0))
    assert s.api is not None and not s.tlp_rings
    s.tick()
    for i in range(3):
        ring.emit(apitrace.NAME_ID["nop"], 100 + i, 200 + i, tag=i + 1, dev=1 << 8, args="")
    s.close()
    ring.close()
    assert open_capture(tmp_path / "cap").read("api")["tag"].tolist() == [1, 2, 3]


def test_api_raw_path_matches_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """taccd converts raw ring records by whole-array operations; the records
    are the ones the decoded reader's per-record path gives: names, argument strings
    (repeated and distinct, one truncated at 72 bytes), devices in and out of the
    capture, statuses, across a ring wrap."""
    from tacc.daemon.apiring import ApiRings, _RawRing
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path))
    ring = apitrace.Ring(tmp_path / "tacc-api.9", 9, 10, 16, enabled=True)
    fids = {"0000:01:00.0": 0, "0000:01:00.1": 1}
    devs = [1 << 8, (1 << 8) | 1, (2 << 8), apitrace.NO_DEV]
    argv = ["m=1 n=2", "", "x" * 100, "relu n=8", "m=1 n=2"]

    def fill(base: int, n: int) -> None:
        for i in range(n):
            ring.emit(i % len(apitrace.NAMES), base + i, base + 2 * i, tag=base + i,
                      nbytes=i * 64, dev=devs[i % 4], status=-(i % 3), args=argv[i % 5])
        ring.publish()

    out = []
    for path_kind in ("raw", "decoded"):
        strings: dict[str, int] = {}
        api = ApiRings(lambda s, t=strings: t.setdefault(s, len(t) + 1), fids)
        if path_kind == "decoded":  # the runtime's decoded reader, as without batching
            monkeypatch.setattr(api, "_open", lambda p: apitrace.open_reader(p))
        api.scan()
        r = next(iter(api.readers.values()))
        assert isinstance(r, _RawRing) == (path_kind == "raw")
        got = []
        for base in (1000, 2000):  # 12 + 12 records in 16 slots: the second batch wraps
            fill(base, 12)
            recs, dropped = api.drain()
            assert dropped == 0 and len(recs) == 12
            got.append(recs)
        inv = {v: k for k, v in strings.items()}
        recs = np.concatenate(got)
        out.append([(int(x["t_start"]), int(x["t_end"]), int(x["tag"]), int(x["bytes"]),
                     int(x["pid"]), int(x["tid"]), int(x["status"]), int(x["fid"]),
                     inv[int(x["name_id"])], inv[int(x["args_id"])]) for x in recs])
        api.readers.clear()
    assert out[0] == out[1]
    assert {row[7] for row in out[0]} == {0, 1, 0xFFFF}
    assert "x" * 72 in {row[9] for row in out[0]}
    ring.close()


def test_rings_drained_at_watermark_or_age(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The API rings are drained when a ring is 1/RING_WATERMARK full or RING_MAX_AGE_S
    after the last drain, not at every tick; nothing is lost in between and
    the capture's end drains the rest."""
    from tacc.daemon import session as sm
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    ring = apitrace.Ring(tmp_path / "shm" / "tacc-api.4242", 4242, 4243, 64, enabled=False)
    fns = discover(_fake_sysfs(tmp_path))
    s = CaptureSession(tmp_path / "cap", fns, Options(device_trace=False, counters_hz=0.0,
                                                      clock_hz=0.0, flush_s=1e9))
    assert s.api is not None
    t = 100.0
    s.tick(t)  # the first tick drains (age) and enables the ring
    tag = 0

    def emit(n: int) -> None:
        nonlocal tag
        for _ in range(n):
            tag += 1
            ring.emit(apitrace.NAME_ID["nop"], tag, tag + 1, tag=tag)
        ring.publish()

    emit(64 // sm.RING_WATERMARK - 1)  # below the watermark
    s.tick(t + 0.05)
    assert s.counts.get("api", 0) == 0, "drained below the watermark"
    emit(1)  # at the watermark
    s.tick(t + 0.1)
    assert s.counts["api"] == 64 // sm.RING_WATERMARK
    emit(3)
    s.tick(t + 0.15)
    assert s.counts["api"] == 64 // sm.RING_WATERMARK
    s.tick(t + 0.1 + sm.RING_MAX_AGE_S)  # the age limit
    assert s.counts["api"] == 64 // sm.RING_WATERMARK + 3
    emit(5)
    s.close()  # the end drains the rest
    ring.close()
    tags = open_capture(tmp_path / "cap").read("api")["tag"].tolist()
    assert tags == list(range(1, tag + 1))
    assert not s.drops


def _ring_counters(batches: list[tuple[list[int], list[int], int, int]]) -> tuple[object, list]:
    """A SampleRingCounters over a fake device ring: each drain returns the next batch
    (device seqs, devclks, cumulative dropped, epoch); values = seq * 10 + column."""
    from tacc.counters.device import SampleBatch
    from tacc.daemon import counters as dc

    class FakeRing:
        def __init__(self) -> None:
            self.i = 0

        def drain(self) -> SampleBatch:
            seq, clk, dropped, epoch = batches[self.i]
            self.i += 1
            s = np.array(seq, np.uint64)
            vals = s[:, None] * np.uint64(10) + np.arange(len(dc._ENTRY_SLOTS), dtype=np.uint64)
            return SampleBatch(s, np.array(clk, np.uint64),
                               vals.reshape(len(seq), len(dc._ENTRY_SLOTS)), dropped, epoch)

    sr = dc.SampleRingCounters.__new__(dc.SampleRingCounters)
    sr.fid, sr.ring, sr.dropped, sr.epoch, sr.base, sr.last = 3, FakeRing(), 0, 1, None, 0
    return sr, batches


def test_sample_ring_counters_columns_seq_and_drops() -> None:
    """The device's samples as capture records: each counter in its column, seq from 1 and
    continued across a ring restart (epoch), the device's drops counted once each."""
    from tacc.capture.schema import COUNTERS_DTYPE, FUNC_COUNTERS, GLOBAL_COUNTERS

    sr, _ = _ring_counters([([100, 101, 102], [5, 10, 15], 0, 1), ([], [], 0, 1),
                            ([105, 106], [30, 35], 2, 1),  # 103, 104 dropped
                            ([0, 1], [2, 7], 2, 2)])  # reset: the ring restarted
    r1, lost1 = sr.drain()  # type: ignore[attr-defined]
    assert r1.dtype == COUNTERS_DTYPE and lost1 == 0
    assert r1["seq"].tolist() == [1, 2, 3] and r1["devclk"].tolist() == [5, 10, 15]
    assert (r1["fid"] == 3).all()
    names = [n for n, _ in FUNC_COUNTERS] + ["g_" + n for n, _ in GLOBAL_COUNTERS]
    for col, name in enumerate(names):  # value = device seq * 10 + column
        assert r1[name].tolist() == [1000 + col, 1010 + col, 1020 + col], name
    r2, lost2 = sr.drain()  # type: ignore[attr-defined]
    assert len(r2) == 0 and lost2 == 0
    r3, lost3 = sr.drain()  # type: ignore[attr-defined]
    assert r3["seq"].tolist() == [6, 7] and lost3 == 2  # the gap shows the drop
    r4, lost4 = sr.drain()  # type: ignore[attr-defined]
    assert r4["seq"].tolist() == [8, 9] and lost4 == 0


def test_counters_source_option_is_checked() -> None:
    assert Options().counters_source == "host"  # device sampling keeps the device awake
    assert Options(counters_source="device").counters_source == "device"
    with pytest.raises(ValueError, match="counters_source 'cpu': one of device, host"):
        Options(counters_source="cpu")


def test_ring_entries_hold_seconds_of_samples() -> None:
    from tacc.daemon.counters import SAMPLE_RING_S, ring_entries

    assert ring_entries(20.0) == 128  # 80 samples in 4 s, the next power of two
    assert ring_entries(0.1) == 2
    assert ring_entries(10_000.0) == 2048  # the driver's maximum
    for hz in (1.0, 20.0, 100.0, 400.0):
        n = ring_entries(hz)
        assert n & (n - 1) == 0 and n >= SAMPLE_RING_S * hz


@settings(max_examples=60, deadline=None)
@given(vals=st.lists(st.binary(max_size=72).filter(lambda b: not b.endswith(b"\0")),
                     min_size=1, max_size=6),
       picks=st.lists(st.integers(0, 5), min_size=512, max_size=1500),
       collide=st.booleans())
def test_api_args_ids_by_hash_match_the_sorted_ones(vals: list[bytes], picks: list[int],
                                                     collide: bool) -> None:
    """The API consumer's args ids through a hash of each record's bytes equal the ids
    through sorting the strings, a hash collision (all multipliers 0: every record
    hashes alike) included."""
    from tacc.daemon import apiring

    col = np.array([vals[i % len(vals)] for i in picks], "S72")
    ta: dict[str, int] = {}
    tb: dict[str, int] = {}
    a = apiring.ApiRings(lambda s: ta.setdefault(s, len(ta)), {"x": 0})
    b = apiring.ApiRings(lambda s: tb.setdefault(s, len(tb)), {"x": 0})
    old = apiring._HASH_MUL
    try:
        if collide:
            apiring._HASH_MUL = np.zeros(9, np.uint64)
        got = a._intern_unique(col)
    finally:
        apiring._HASH_MUL = old
    want = b._intern_sorted(col)
    sa, sb = {v: k for k, v in ta.items()}, {v: k for k, v in tb.items()}
    assert [sa[i] for i in got.tolist()] == [sb[i] for i in want.tolist()]
    assert a._sid_cache.keys() == set(col.tolist())


def test_session_copies_then_frees_its_devcoredumps(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A devcoredump of a captured function taken during the capture is copied to
    devcoredump/1.txt, placed as a device event, and freed (a write to its data, the
    kernel's devcoredump ABI); one from before the capture is neither copied nor freed."""
    from tacc import devcoredump as dc
    from tacc.capture.schema import DeviceEventKind

    pci_dir = tmp_path / "pci" / PCI0
    pci_dir.mkdir(parents=True)
    monkeypatch.setattr(dc, "ROOT", tmp_path / "devcoredump")
    s = _session(tmp_path)
    texts = {}
    for n, t_ns in ((1, s.started_mono_ns + 5), (2, s.started_mono_ns - 5)):
        d = dc.ROOT / f"devcd{n}"
        d.mkdir(parents=True)
        (d / "failing_device").symlink_to(pci_dir)
        texts[n] = (f"{dc.HEADER}\nreason: job timeout\ndevice: {PCI0}\ntime_ns: {t_ns}\n"
                    "job: context 3 queue 0 tag 0xd0d0 seqno 7 pid 42\nend\n")
        (d / "data").write_text(texts[n])
    s._collect_devcoredumps()
    s.close()
    assert (tmp_path / "cap" / "devcoredump" / "1.txt").read_text() == texts[1]
    assert (dc.ROOT / "devcd1" / "data").read_text() == "1"  # freed
    assert (dc.ROOT / "devcd2" / "data").read_text() == texts[2]  # not this capture's
    assert not (tmp_path / "cap" / "devcoredump" / "2.txt").exists()
    ev = open_capture(tmp_path / "cap").read("device_events")
    ev = ev[ev["kind"] == DeviceEventKind.DEVCOREDUMP]
    assert len(ev) == 1 and int(ev["tag"][0]) == 0xD0D0 and int(ev["arg"][0]) == 1


def test_devcoredump_events_carry_the_dumps_job(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dump of the capture becomes one DEVCOREDUMP event with the job line's fields
    (ctx, queue, tag, seqno, pid; none without a job line), at the dump's time (one taken at
    the capture's start counts), numbered in order; a dump that does not parse is skipped
    without stopping the scan, and a dump already collected is not collected again."""
    from tacc import devcoredump as dc
    from tacc.capture.schema import NO_CTX, NO_QUEUE, DeviceEventKind

    pci_dir = tmp_path / "pci" / PCI0
    pci_dir.mkdir(parents=True)
    monkeypatch.setattr(dc, "ROOT", tmp_path / "devcoredump")
    s = _session(tmp_path)
    t0 = s.started_mono_ns
    dumps = {1: "not a devcoredump\n",
             2: f"{dc.HEADER}\nreason: job timeout\ndevice: {PCI0}\ntime_ns: {t0}\n"
                "job: context 3 queue 2 tag 0xd0d0 seqno 7 pid 42\nend\n",
             3: f"{dc.HEADER}\nreason: fatal\ndevice: {PCI0}\ntime_ns: {t0 + 9}\nend\n"}
    for n, text in dumps.items():
        d = dc.ROOT / f"devcd{n}"
        d.mkdir(parents=True)
        (d / "failing_device").symlink_to(pci_dir)
        (d / "data").write_text(text)
    s._collect_devcoredumps()
    (dc.ROOT / "devcd2" / "data").write_text(dumps[2])  # as if the free had not happened
    s._collect_devcoredumps()
    s.close()
    cap = open_capture(tmp_path / "cap")
    ev = cap.read("device_events")
    ev = ev[ev["kind"] == DeviceEventKind.DEVCOREDUMP]
    got = [tuple(int(r[k]) for k in ("t_ns", "fid", "ctx", "queue", "tag", "seqno", "pid", "arg"))
           for r in ev]
    assert got == [(t0, 0, 3, 2, 0xD0D0, 7, 42, 1),
                   (t0 + 9, 0, NO_CTX, NO_QUEUE, 0, 0, 0, 2)]
    assert [cap.strings[int(i)] for i in ev["name_id"]] == [
        f"devcoredump {PCI0} job timeout: devcoredump/1.txt",
        f"devcoredump {PCI0} fatal: devcoredump/2.txt"]
    assert (tmp_path / "cap" / "devcoredump" / "2.txt").read_text() == dumps[3]
    assert not (tmp_path / "cap" / "devcoredump" / "3.txt").exists()


def test_ring_sizes_and_tlp_filters_at_their_bounds() -> None:
    """Options accepts the uAPI's own bounds and refuses one past them; a value that is
    not an int (a float from JSON, a bool) is a one-line ValueError, not a TypeError from
    the arithmetic; a peer is parsed at once."""
    for lo, hi, field_name in ((uapi.TLPCAP_MIN_ENTRIES, uapi.TLPCAP_MAX_ENTRIES, "tlp_entries"),
                               (uapi.TRACE_MIN_ENTRIES, uapi.TRACE_MAX_ENTRIES, "trace_entries")):
        for ok in (lo, 2 * lo, hi):
            assert getattr(Options(**{field_name: ok}), field_name) == ok
        for bad in (lo // 2, 2 * hi, lo + 2, 3 * lo, float(lo), -1):
            with pytest.raises(ValueError, match="power of two from"):
                Options(**{field_name: bad})  # type: ignore[arg-type]
    assert Options(peers=["10.0.0.2:4000"]).peers == ["10.0.0.2:4000"]
    with pytest.raises(ValueError, match="peer 'nohost'"):
        Options(peers=["nohost"])
    with pytest.raises(ValueError, match="TLP filter function True"):
        Options(tlp_funcs=[True])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"TLP filter kind 'io': one of mrd, mwr, cpld$"):
        Options(tlp_kinds=["io"])
    with pytest.raises(ValueError, match="address range"):
        Options(tlp_addr=[-1, 5])
    assert Options(tlp_addr=[0, 1]).tlp_filters() == (0, 0, (0, 1), False)
    assert Options(tlp_funcs=[31]).tlp_filters()[0] == 1 << 31


def test_device_event_fields_default_to_zero_and_details_name_them(tmp_path: Path) -> None:
    """A netlink event's missing or zero fields are recorded as 0, the receive time stands in
    for a missing timestamp; the detail string names the fault type (or its number), read or
    write, a function reset's reason (queue 0xFFFF, the driver's value) and a VF count."""
    from tacc.capture.schema import NO_CTX, NO_FID, NO_QUEUE
    from tacc.capture.schema import DeviceEventKind as K

    s = _session(tmp_path)
    t0 = time.monotonic_ns()
    s.device_event({"event": 5, "recv_mono_ns": t0})  # no device, no fields
    s.device_event(_nl(9, timestamp=t0 + 1, name=""))  # HOTPLUG_ADD's number: not netlink's
    fault = (6 << 24) | 3  # a read, fault type 6 (mem_kind), ctx 3
    s.device_event(_nl(1, info=fault, queue=NO_QUEUE, timestamp=t0 + 2))
    s.device_event(_nl(1, info=(9 << 24), timestamp=t0 + 3))  # a type the header lacks
    s.device_event(_nl(3, queue=NO_QUEUE, info=4, timestamp=t0 + 4))  # function reset
    s.device_event(_nl(3, queue=1, info=4, timestamp=t0 + 5))  # queue reset
    s.device_event(_nl(6, info=2, timestamp=t0 + 6))
    s.device_event({"device": PCI0, "timestamp": t0 + 7})  # no event number, no queue
    s.close()
    cap = open_capture(tmp_path / "cap")
    e = cap.read("device_events")
    detail = [cap.strings[int(i)] for i in e["name_id"]]
    first = e[0]
    assert (first["t_ns"], first["fid"], first["kind"], first["arg"]) == (t0, NO_FID, K.PM, 0)
    assert [int(first[k]) for k in ("tag", "addr", "seqno", "pid", "status")] == [0] * 5
    assert (first["queue"], first["ctx"]) == (NO_QUEUE, NO_CTX)
    assert detail[0] == "pm D0 (resumed)"
    assert (e["kind"][1], e["arg"][1], e["queue"][1]) == (K.OTHER, 9, 0)
    assert detail[1] == f"other {PCI0}"
    assert (e["ctx"][2], e["queue"][2], e["status"][2]) == (3, NO_QUEUE, 6)
    assert detail[2] == f"mmu_fault {PCI0} mem_kind read"
    assert detail[3] == f"mmu_fault {PCI0} type 9 read"
    assert detail[4] == f"reset {PCI0} function reset, reason 4"
    assert detail[5] == f"reset {PCI0}" and e["queue"][5] == 1
    assert detail[6] == f"vf_enable {PCI0} 2 VFs" and e["arg"][6] == 2
    assert (e["kind"][7], e["arg"][7], e["queue"][7]) == (K.OTHER, 0, 0)


class _FakeTlpRing:
    """A TLP capture ring (tacc.pcie.ring.TlpRing) with records and drops to hand out."""

    def __init__(self) -> None:
        from tacc.capture.schema import TLP_REC_DTYPE

        self.recs = np.zeros(0, TLP_REC_DTYPE)
        self.dropped = 0
        self.closed = False

    def drain(self) -> np.ndarray:
        r, self.recs = self.recs, self.recs[:0]
        return r

    def close(self) -> None:
        self.closed = True


def test_tlp_records_get_the_capture_fid_of_their_function(tmp_path: Path) -> None:
    """A TLP's function on the PF's link (0 = PF, n = VF n) becomes that function's capture
    fid; a function outside the capture, or removed from it, gets NO_FID; every field of the
    ring's record is kept; the ring's drops are counted once each, against the PF."""
    from tacc.capture.schema import NO_FID, TLP_REC_DTYPE

    s = _session(tmp_path)
    ring = _FakeTlpRing()
    s.tlp_rings[0], s.tlp_dropped[0] = ring, 0
    for vf in (1, 2):
        s.add_function(TaccFunction(f"0000:01:00.{vf}", 0x100 + vf, tmp_path, True, vf, PCI0,
                                    None))
    s.add_function(TaccFunction("0000:05:00.1", 0x201, tmp_path, True, 3, "0000:05:00.0", None))
    recs = np.zeros(5, TLP_REC_DTYPE)
    recs["func"] = [0, 1, 2, 3, 7]
    recs["addr"] = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]
    recs["t_ps"] = [10, 20, 30, 40, 50]
    ring.recs, ring.dropped = recs, 3
    s._drain_devices()
    s.remove_function("0000:01:00.2")
    ring.recs, ring.dropped = recs[:3], 5
    s._drain_devices()
    ring.recs = recs[1:2]
    s.remove_function(PCI0)  # the PF goes: what its ring holds is written, then it is closed
    assert ring.closed and s.tlp_rings == {}
    summary = s.close()
    cap = open_capture(tmp_path / "cap")
    t = cap.read("tlp")
    assert t["fid"].tolist() == [0, 1, 2, NO_FID, NO_FID, 0, 1, NO_FID, 1]
    assert t["addr"].tolist() == [0x1000, 0x2000, 0x3000, 0x4000, 0x5000,
                                  0x1000, 0x2000, 0x3000, 0x2000]
    assert t["t_ps"].tolist() == [10, 20, 30, 40, 50, 10, 20, 30, 20]
    d = cap.read("drops")
    d = d[d["source"] == int(DropSource.TLP)]
    assert d["count"].tolist() == [3, 2] and d["fid"].tolist() == [0, 0]
    from tacc.capture.schema import STREAMS

    assert summary["records"] == {"tlp": 9, "device_events": 5}
    assert summary["bytes"] == sum(n * STREAMS[k][1].itemsize
                                   for k, n in summary["records"].items())
    assert summary["drops"] == {"tlp": 5} and summary["devices"] == 4
    assert summary["path"] == str(tmp_path / "cap") and summary["warnings"] == []


def test_function_removed_then_back_keeps_its_fid(tmp_path: Path) -> None:
    """A VF that goes and comes back (VFs re-enabled) keeps its fid: one HOTPLUG_ADD per
    appearance, one description in the marker (its fid, the time it appeared, its trace
    record version), its new TaccFunction in use; adding a present function does nothing."""
    from tacc.capture.schema import DeviceEventKind as K

    s = _session(tmp_path)
    t_before = time.monotonic_ns()
    vf = TaccFunction("0000:01:00.1", 0x101, tmp_path, True, 1, PCI0, None)
    s.add_function(vf)
    s.add_function(vf)  # already there
    s.remove_function(vf.pci)
    back = TaccFunction("0000:01:00.1", 0x101, tmp_path, True, 1, PCI0, None)
    s.add_function(back)
    assert s.functions[1] is back and s.removed == set()
    assert s.fid_of_dev == {0x100: 0, 0x101: 1} and s.fid_of_pci[vf.pci] == 1
    s.close()
    marker = json.loads((tmp_path / "cap" / "complete").read_text())
    (added,) = marker["devices_added"]
    assert added["fid"] == 1 and added["pci"] == vf.pci and added["trace_version"] == 2
    assert t_before <= added["t_ns"] <= time.monotonic_ns()
    cap = open_capture(tmp_path / "cap")
    e = cap.read("device_events")
    assert e["kind"].tolist() == [K.HOTPLUG_ADD, K.HOTPLUG_REMOVE, K.HOTPLUG_ADD]
    assert e["fid"].tolist() == [1, 1, 1] and e["arg"].tolist() == [1, 1, 1]
    assert e["t_ns"][0] == added["t_ns"] and np.all(np.diff(e["t_ns"].astype(np.int64)) > 0)
    assert [cap.strings[int(i)] for i in e["name_id"]] == [
        f"hotplug {w} 0000:01:00.1 VF 1" for w in ("add", "remove", "add")]


def test_session_meta_describes_the_capture(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """meta.json of a taccd capture (docs/capture-format.md): the node (the argument, else
    TACC_NODE_ID, else the host name), each function with its trace record version, the
    kernel, QEMU's version and machine from DMI, icount, the first function's time scale,
    the options, the tool, Python."""
    import platform
    import socket

    from tacc.daemon import session as sess

    machine = {"sys_vendor": "QEMU", "product_version": "pc-q35-10.0"}
    monkeypatch.setattr(sess, "machine_info", lambda: dict(machine))
    monkeypatch.setattr(sess, "icount_info", lambda: {"shift": None, "icount": 7})
    fn = TaccFunction(PCI0, 0x100, tmp_path, False, 0, PCI0, None)
    opts = Options(device_trace=False, api=False, counters_hz=0, clock_hz=0,
                   host_events=False, flush_s=2.0)
    want_opts = opts.to_json()
    monkeypatch.setenv("TACC_NODE_ID", "rack7")
    for name, node, want_node in (("a", "n1", "n1"), ("b", None, "rack7")):
        opts.flush_s = 2.0  # (close() sets it for its final flush)
        CaptureSession(tmp_path / name, [fn], opts, tool="test", node=node).close()
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        assert meta["node"] == want_node
        assert [d["trace_version"] for d in meta["devices"]] == [2]
        assert meta["devices"][0]["pci"] == PCI0
        assert meta["kernel"] == os.uname().release and meta["python"] == platform.python_version()
        assert meta["qemu"] == "pc-q35-10.0" and meta["machine"] == machine
        assert meta["icount"] == {"shift": None, "icount": 7}
        assert meta["time_scale"] == float(fn.meta()["time_scale"])
        assert meta["options"] == want_opts and meta["tool"] == "test"
    monkeypatch.delenv("TACC_NODE_ID")
    del machine["product_version"]
    CaptureSession(tmp_path / "c", [], opts).close()  # no function, the default tool
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["node"] == socket.gethostname() and meta["tool"] == "taccd"
    assert meta["qemu"] == "" and meta["time_scale"] == 1.0


class _FakeSampleRing:
    """A device's counter sample ring (SampleRingCounters): batches to hand out, lost
    samples, a failure to raise."""

    def __init__(self, entries: int = 16) -> None:
        from tacc.capture.schema import COUNTERS_DTYPE

        self.dtype = COUNTERS_DTYPE
        self.entries, self.batches, self.lost, self.closed = entries, [], 0, False
        self.fail: OSError | None = None
        self.seq = 0

    def add(self, n: int) -> None:
        r = np.zeros(n, self.dtype)
        r["seq"] = np.arange(self.seq, self.seq + n)
        self.seq += n
        self.batches.append(r)

    def pending(self) -> int:
        return sum(len(b) for b in self.batches)

    def drain(self) -> tuple[np.ndarray, int]:
        if self.fail:
            raise self.fail
        recs = np.concatenate(self.batches) if self.batches else np.zeros(0, self.dtype)
        self.batches, lost, self.lost = [], self.lost, 0
        return recs, lost

    def bracket(self) -> np.ndarray:
        return np.zeros(0, self.dtype)

    def close(self) -> None:
        self.closed = True


def test_device_rings_drained_at_watermark_or_age(tmp_path: Path) -> None:
    """A device's sample ring is drained when it is 1/RING_WATERMARK full or RING_MAX_AGE_S
    after its last drain; the TLP ring at every tick; a ring's lost samples are counters
    drops of its function; a ring that fails (device gone) is closed and named in a
    warning, and the capture goes on without it."""
    from tacc.daemon import session as sm

    s = _session(tmp_path, flush_s=1e9)
    ring, tlp = _FakeSampleRing(entries=4 * sm.RING_WATERMARK), _FakeTlpRing()
    s.sample_rings[0], s.tlp_rings[0], s.tlp_dropped[0] = ring, tlp, 0
    t = 100.0
    s.tick(t)  # the first tick: the age limit has passed
    ring.add(3)  # below the watermark (4)
    from tacc.capture.schema import TLP_REC_DTYPE

    tlp.recs = np.zeros(2, TLP_REC_DTYPE)
    s.tick(t + 0.05)
    assert s.counts.get("counters", 0) == 0 and s.counts["tlp"] == 2
    ring.add(1)  # at the watermark
    s.tick(t + 0.1)
    assert s.counts["counters"] == 4
    ring.add(1)
    ring.lost = 2
    s.tick(t + 0.1 + sm.RING_MAX_AGE_S * 0.8)
    assert s.counts["counters"] == 4
    s.tick(t + 0.1 + sm.RING_MAX_AGE_S * 1.2)  # the age limit
    assert s.counts["counters"] == 5 and s.drops == {(int(DropSource.COUNTERS), 0): 2}
    ring.fail = OSError("gone")
    s.tick(t + 1.0)
    assert s.warnings == ["fid 0: sample ring: gone"] and ring.closed and not s.sample_rings
    tlp.recs = np.zeros(1, TLP_REC_DTYPE)
    s.tick(t + 1.01)  # the others go on
    assert s.counts["tlp"] == 3
    summary = s.close()
    assert summary["warnings"] == ["fid 0: sample ring: gone"]
    c = open_capture(tmp_path / "cap").read("counters")
    assert c["seq"].tolist() == [0, 1, 2, 3, 4]


def test_peer_may_open_a_node_by_its_mode_bits(tmp_path: Path) -> None:
    """taccd's node check for a client (docs/taccd.md "Who may ask what"): the owner's,
    the group's or the others' read-write bits, as open() checks them; root always; no
    node never.  A client whose pidfd names no live process keeps only its uid."""
    from tacc.daemon.main import Peer

    node = tmp_path / "accel9"
    node.write_text("")
    os.chown(node, 1234, 555)
    owner, member, other = (Peer(1, 1234, frozenset(), False), Peer(1, 99, frozenset({555}), False),
                            Peer(1, 99, frozenset({7}), False))
    for mode, want in ((0o600, (True, False, False)), (0o660, (True, True, False)),
                       (0o640, (True, False, False)), (0o066, (False, True, True)),
                       (0o666, (True, True, True))):
        node.chmod(mode)
        got = tuple(p.may_open(str(node)) for p in (owner, member, other))
        assert got == want, (oct(mode), got)
    assert Peer(1, 0, frozenset(), True).may_open(str(node))
    assert not member.may_open(None) and not member.may_open(str(tmp_path / "none"))
    p = subprocess.Popen(["sleep", "30"])
    fd = os.pidfd_open(p.pid)
    p.kill()
    p.wait()
    gone = Peer.of((p.pid, 65534, fd))
    os.close(fd)
    assert not gone.perfmon and gone.gids == frozenset()
