"""In-guest: a real device event reaches a taccd capture's ``device_events`` stream and
survives ``kill -9`` of taccd.

The event is a runtime-PM suspend/resume cycle of the PF: the driver reports both
transitions on its ``tacc`` netlink group (TACC_EVENT_PM, info = new PCI state).  The
capture runs without the device trace ring (its consumer keeps the device powered) and
without periodic clock-sync reads (each read resumes the device).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from tacc.capture import open_capture
from tacc.capture.errors import CaptureEmptyError
from tacc.capture.schema import DEVICE_EVENTS_DTYPE, DeviceEventKind
from tacc.daemon.protocol import request
from tacc.timeline.convert import convert

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _taccd(sock: Path, root: Path) -> subprocess.Popen[str]:
    from tacc.testing.taccd import start_taccd

    # --no-bpf: device events come over netlink; a BPF compile would cost ~30 s of the
    # VM layer (the driver's tacc_pm tracepoint is checked against sysfs elsewhere)
    return start_taccd(sock, root, "--no-bpf")


def _wait_rpm(pci: Path, want: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while (pci / "power/runtime_status").read_text().strip() != want:
        assert time.monotonic() < end, f"{pci.name}: runtime_status never {want}"
        time.sleep(0.05)


def _pm_counts(pci: Path) -> tuple[int, int]:
    return (int((pci / "tacc/pm_suspends").read_text()),
            int((pci / "tacc/pm_resumes").read_text()))


def test_pm_cycle_is_a_device_event_and_survives_kill(tmp_path: Path, pf_pci: Path) -> None:
    sock = tmp_path / "taccd.sock"
    out = tmp_path / "cap"
    power = pf_pci / "power"
    old = {k: (power / k).read_text().strip() for k in ("control", "autosuspend_delay_ms")}
    d = _taccd(sock, tmp_path)
    try:
        st = request({"cmd": "status"}, str(sock))
        assert st["ok"], st
        assert not [w for w in st["warnings"] if "netlink" in w], st["warnings"]
        rep = request({"cmd": "start", "output": str(out),
                       "options": {"device_trace": False, "clock_hz": 0.0,
                                   "host_events": False}}, str(sock), timeout=300.0)
        assert rep["ok"], f"{rep}\n{(tmp_path / 'taccd.log').read_text()}"
        devices = json.loads((out / "meta.json").read_text())["devices"]
        fid = [x["pci"] for x in devices].index(pf_pci.name)
        # a stable start: the PF active and kept so (no spontaneous autosuspend)
        (power / "control").write_text("on")
        _wait_rpm(pf_pci, "active")
        s0, r0 = _pm_counts(pf_pci)
        t0 = time.monotonic_ns()
        (power / "autosuspend_delay_ms").write_text("0")
        (power / "control").write_text("auto")
        _wait_rpm(pf_pci, "suspended")
        (power / "control").write_text("on")
        _wait_rpm(pf_pci, "active")
        t1 = time.monotonic_ns()
        assert _pm_counts(pf_pci) == (s0 + 1, r0 + 1)

        def mine(cap_path: Path) -> np.ndarray:
            try:
                cap = open_capture(cap_path)
            except CaptureEmptyError:  # nothing flushed yet: every stream but events is off
                return np.zeros(0, DEVICE_EVENTS_DTYPE)
            ev = cap.read("device_events")
            ev = ev[(ev["fid"] == fid) & (ev["t_ns"] >= t0) & (ev["t_ns"] <= t1)]
            return ev

        # taccd flushes every second: wait until both transitions are on disk, then kill
        for _ in range(300):  # up to 60 s: 9p reads of a busy host
            ev = mine(out)
            if len(ev) >= 2:
                break
            time.sleep(0.2)
        st = request({"cmd": "status"}, str(sock))["capture"]
        assert st["records"].get("device_events", 0) >= 2, st
        d.send_signal(signal.SIGKILL)
        d.wait(10)
    finally:
        if d.poll() is None:
            d.kill()
            d.wait(10)
        (power / "autosuspend_delay_ms").write_text(old["autosuspend_delay_ms"])
        (power / "control").write_text(old["control"])

    cap = open_capture(out)
    assert not cap.complete and any("interrupted" in p for p in cap.problems), cap.problems
    ev = mine(out)
    # exactly the cycle: suspended (D3hot) then resumed (D0), on the PF, in order
    assert ev["kind"].tolist() == [DeviceEventKind.PM] * 2, ev
    assert ev["arg"].tolist() == [3, 0]
    assert ev["t_ns"][0] < ev["t_ns"][1]
    assert (ev["ctx"] == 0xFFFFFFFF).all() and (ev["queue"] == 0xFFFF).all()
    assert [cap.strings[int(i)] for i in ev["name_id"]] == [
        f"pm {pf_pci.name} D3 (suspended)", f"pm {pf_pci.name} D0 (resumed)"]
    res = convert([out], None, summary=True)
    assert res.device_events.get("pm", 0) >= 2, res.device_events
    print(f"device_events fid {fid}: {ev[['t_ns', 'kind', 'arg']].tolist()}; "
          f"capture {cap.count('device_events')} device events; timeline {res.device_events}")


def _accel_node(pci: Path, timeout: float = 60.0) -> Path:
    end = time.monotonic() + timeout
    while True:
        nodes = list((pci / "accel").glob("accel*")) if (pci / "accel").exists() else []
        if nodes:
            return Path("/dev/accel") / nodes[0].name
        assert time.monotonic() < end, f"{pci.name}: no accel node"
        time.sleep(0.1)


def test_vf_enabled_mid_capture_is_described_and_drawn(tmp_path: Path, pf_pci: Path) -> None:
    """A VF enabled during a taccd capture gets the next fid: its commands are in the
    device trace under that fid, the reader describes it (from the marker, and from its
    hotplug event when taccd was killed) and the timeline and the analysis take it."""
    import os
    import shutil

    from tacc.analyze.engine import analyze
    from tacc.runtime import uapi

    numvfs = pf_pci / "sriov_numvfs"
    if int(numvfs.read_text() or 0):
        pytest.skip("VFs already enabled by the VM configuration")
    sock, out, killed = tmp_path / "taccd.sock", tmp_path / "cap", tmp_path / "killed"
    d = _taccd(sock, tmp_path)
    try:
        rep = request({"cmd": "start", "output": str(out),
                       "options": {"host_events": False}}, str(sock), timeout=300.0)
        assert rep["ok"], rep
        numvfs.write_text("1")
        try:
            vf = (pf_pci / "virtfn0").resolve()
            fd = uapi.open_node(str(_accel_node(vf)))
            try:
                end = time.monotonic() + 60
                while request({"cmd": "status"}, str(sock))["capture"]["devices"] < 2:
                    assert time.monotonic() < end, "taccd never took the VF"
                    time.sleep(0.1)
                uapi.submit_nops(fd, 5, ncmds=2, tag_base=0x7F7F0000)
            finally:
                os.close(fd)
            end = time.monotonic() + 60
            while True:  # flushed every second: on disk before the copy a kill leaves
                dt = open_capture(out).read("device_trace")
                if ((dt["tag"] >> 16) == 0x7F7F).sum() == 10:
                    break
                assert time.monotonic() < end, "the VF's trace records never reached disk"
                time.sleep(0.2)
            shutil.copytree(out, killed)
            (killed / "complete").unlink(missing_ok=True)
            rep = request({"cmd": "stop"}, str(sock), timeout=300.0)
            assert rep["ok"], rep
        finally:
            numvfs.write_text("0")
    finally:
        if d.poll() is None:
            d.kill()
            d.wait(10)
    for path, complete in ((out, True), (killed, False)):
        cap = open_capture(path)
        assert cap.complete is complete
        assert [(f.fid, f.pci, f.vf) for f in cap.functions] == [
            (0, pf_pci.name, 0), (1, vf.name, 1)], path.name
        assert cap.functions[1].pf == pf_pci.name
        dt = cap.read("device_trace")
        mine = dt[(dt["tag"] >> 16) == 0x7F7F]
        assert len(mine) == 10 and set(mine["fid"].tolist()) == {1}
        t = cap.device_clock(1).convert(mine["t_start"])
        t0, t1 = cap.time_range
        assert ((t >= t0) & (t <= t1)).all()
        res = convert([path], tmp_path / f"{path.name}.pftrace", summary=True)
        assert f"device {vf.name} (VF1)" in res.summary, res.summary
        analyze(cap)  # takes every function; raises on a fid it cannot describe


def test_hang_devcoredump_in_the_capture_and_on_the_timeline(tmp_path: Path, pf_pci: Path,
                                                              pf_accel: Path) -> None:
    """A forced hang during a capture: tacc.ko's devcoredump is copied into the capture
    (devcoredump/1.txt, the PF's job-timeout dump), freed from /sys/class/devcoredump by
    taccd once copied, and placed on the timeline as a devcoredump instant on the PF at
    the dump's time, carrying the job's tag."""
    import errno

    from tacc.devcoredump import dumps_of, parse
    from tacc.guest_qmp import PF_QOM, GuestQMP
    from test_driver_basic import DEVICE, OP_H2D, Dev, copy

    for old in dumps_of(pf_pci.name):
        (old / "data").write_text("1")
    sock, out = tmp_path / "taccd.sock", tmp_path / "cap"
    d = _taccd(sock, tmp_path)
    try:
        rep = request({"cmd": "start", "output": str(out),
                       "options": {"device_trace": False, "host_events": False}}, str(sock),
                      timeout=300.0)
        assert rep["ok"], rep
        with GuestQMP() as qmp, Dev(pf_accel) as a:
            h, dv = a.bo(8192), a.bo(8192, DEVICE)
            qmp.qom_set(PF_QOM, "x-fi-hang-engine", 0)
            try:
                hung = a.submit([copy(OP_H2D, h.handle, dv.handle, 4096, tag=0xd0d0)], queue=0)
                assert a.wait(hung, timeout_s=30) == -errno.ETIMEDOUT
            finally:
                qmp.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        time.sleep(1.5)  # taccd collects at its next flush (every second)
        assert request({"cmd": "stop"}, str(sock), timeout=120.0)["ok"]
    finally:
        d.terminate()
        d.wait(30)
    assert dumps_of(pf_pci.name) == []  # taccd freed the dump it copied
    dump = parse((out / "devcoredump" / "1.txt").read_text())
    assert dump.reason == "job timeout" and dump.device == pf_pci.name
    assert dump.job["tag"] == "0xd0d0"
    cap = open_capture(out)
    fid = [x["pci"] for x in cap.meta["devices"]].index(pf_pci.name)
    ev = cap.read("device_events")
    ev = ev[ev["kind"] == DeviceEventKind.DEVCOREDUMP]
    assert len(ev) == 1 and ev["fid"][0] == fid and ev["arg"][0] == 1
    assert int(ev["t_ns"][0]) == dump.time_ns and int(ev["tag"][0]) == 0xD0D0
    res = convert([out], None, summary=True)
    assert res.device_events.get("devcoredump") == 1, res.device_events


# ------------------------------------------------------------ who may ask ---
def _ask_all(state: dict, sock: str, out: str) -> dict:
    """In an unprivileged process: every request kind taccd serves, with the options that
    each need CAP_PERFMON (docs/taccd.md "Who may ask what"); the replies."""
    from tacc.daemon.protocol import request as req

    start = {
        "trace": {"device_trace": True, "api": False},
        "api": {"device_trace": False, "api": True, "counters_hz": 0.0},
        "counters": {"device_trace": False, "api": False, "counters_hz": 20.0},
        "tlp": {"tlp": True},
    }
    got = {"ping": req({"cmd": "ping"}, sock), "status": req({"cmd": "status"}, sock)}
    for name, opts in start.items():
        got["start_" + name] = req({"cmd": "start", "output": out, "options": opts}, sock)
    got["stop"] = req({"cmd": "stop"}, sock)
    return got


def _status(state: dict, sock: str) -> dict:
    from tacc.daemon.protocol import request as req

    return req({"cmd": "status"}, sock)


def test_taccd_serves_each_request_by_the_drivers_rule(pf_pci: Path) -> None:
    """taccd runs as root and serves anyone who can reach its socket: each request kind
    follows the driver's rule for the client's credentials (SO_PEERCRED, SO_PEERPIDFD,
    CapEff).  tacc-user (no capabilities) is refused a capture with device trace rings,
    runtime API rings or the PF's counters and device events (each named in the one-line
    error, nothing opened), the TLP stream, and stopping root's capture; its status has
    neither the PF's always-on telemetry, the device events nor root's capture, while
    ping and status are served.  tacc-user with CAP_PERFMON sees all of it.  Before:
    every capture but a TLP one started for tacc-user, and status showed it the PF's
    counters, queue statistics and every tenant's device events."""
    import tempfile

    from tacc.testing.unpriv import CAP_PERFMON
    from test_isolation_rings import UserProc

    top = Path(tempfile.mkdtemp(prefix="taccd-who-", dir="/tmp"))
    top.chmod(0o755)  # tacc-user reaches the socket (mode 0660 for taccd's group: 0666 here)
    sock, out = top / "taccd.sock", top / "user-cap"
    d = _taccd(sock, top)
    user, perfmon = UserProc(), UserProc(caps=(CAP_PERFMON,))
    try:
        sock.chmod(0o666)
        end = time.monotonic() + 30
        while not request({"cmd": "status"}, str(sock))["always_on"]:
            assert time.monotonic() < end, "no always-on sample of the PF"
            time.sleep(0.2)
        got = user.call(_ask_all, str(sock), str(out))
        assert got["ping"] == {"ok": True}
        st = got["status"]
        assert st["ok"] and pf_pci.name in st["devices"], st
        assert st["always_on"] == {} and st["device_events"] == [], st
        for name, what in (("trace", "device trace rings"), ("api", "runtime API rings"),
                           ("counters", "the PF's counters"), ("counters", "device events")):
            rep = got["start_" + name]
            assert not rep["ok"] and what in rep["error"], (name, rep)
            assert rep["error"].startswith("this capture needs CAP_PERFMON for: "), rep
        assert "device trace rings" not in got["start_api"]["error"]
        assert "the PF's counters" not in got["start_api"]["error"]  # counters_hz 0
        assert got["start_tlp"]["error"].startswith("the TLP stream needs CAP_PERFMON"), got
        assert got["stop"] == {"ok": False, "error": "no capture is running"}, got["stop"]
        assert not out.exists()
        # root's capture: tacc-user may neither stop nor see it; CAP_PERFMON sees it all
        rep = request({"cmd": "start", "output": str(top / "root-cap"),
                       "options": {"device_trace": False, "api": False,
                                   "clock_hz": 0.0}}, str(sock), timeout=300.0)
        assert rep["ok"], f"{rep}\n{(top / 'taccd.log').read_text()}"
        again = user.call(_ask_all, str(sock), str(out))
        assert not again["stop"]["ok"] and "needs CAP_PERFMON" in again["stop"]["error"], again
        assert again["status"]["capture"] is None and again["status"]["mode"] == "capture"
        seen = perfmon.call(_status, str(sock))
        assert pf_pci.name in seen["always_on"], seen
        assert seen["capture"]["path"] == str(top / "root-cap"), seen
        assert request({"cmd": "stop"}, str(sock))["ok"]
    finally:
        user.close()
        perfmon.close()
        d.send_signal(signal.SIGTERM)
        d.wait(60)
