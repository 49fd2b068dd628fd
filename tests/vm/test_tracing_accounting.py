"""In-guest: snoop, record and a taccd capture each account for every job exactly once
and agree with the device's counters; a killed taccd leaves a readable, incomplete
capture; accel-bpftrace fails with one line when it cannot run.

The BPF program is compiled once for the session (fixture ``program`` in conftest.py,
shared with test_e2e_real.py) and reused; taccd and the CLI runs compile their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timing
from tacc.capture import open_capture
from tacc.capture.schema import DriverKind, DropSource, HostKind
from tacc.devices import discover
from tacc.runtime import uapi

NJOBS = 40
BIN = Path(sys.executable).parent
READY = "Ctrl-C to end"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _start_tool(args: list[str], timeout: float = 240.0) -> tuple[subprocess.Popen[str], str]:
    """Start accel-bpftrace and wait until its probes are attached (its ready line)."""
    p = subprocess.Popen([str(BIN / "accel-bpftrace"), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    err = ""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ln = p.stderr.readline()
        if not ln:
            break
        err += ln
        if READY in ln:
            return p, err
    p.kill()
    out, rest = p.communicate(timeout=30)
    pytest.fail(f"accel-bpftrace {' '.join(args)} never became ready: {err}{rest}")


def _stop_tool(p: subprocess.Popen[str], err: str) -> tuple[str, str]:
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=120)
    return out, err + rest


def _jobs_completed(pci: Path) -> int:
    return int((pci / "counters" / "jobs_completed").read_text())


def _gt() -> tuple[int, int]:
    """The device model's own totals (jobs, commands) over all functions, via QMP."""
    from tacc.guest_qmp import PF_QOM, GuestQMP

    with GuestQMP() as q:
        return (int(q.qom_get(PF_QOM, "x-gt-jobs")),
                int(q.qom_get(PF_QOM, "x-gt-cmds")))


class Truth:
    """sysfs jobs_completed and the device's x-gt-jobs/x-gt-cmds around a workload."""

    def __init__(self, pci: Path) -> None:
        self.pci = pci
        self.jobs0 = _jobs_completed(pci)
        self.gt0 = _gt()

    def check(self, njobs: int, ncmds: int) -> None:
        assert _jobs_completed(self.pci) - self.jobs0 == njobs
        gj, gc = _gt()
        assert (gj - self.gt0[0], gc - self.gt0[1]) == (njobs, njobs * ncmds)


def _workload(node: Path, njobs: int = NJOBS, tag_base: int = 0x5A5A0000) -> None:
    fd = uapi.open_node(str(node))
    try:
        uapi.submit_nops(fd, njobs, ncmds=2, tag_base=tag_base)
    finally:
        os.close(fd)


def test_snoop_program_counts_every_job(program: object, pf_accel: Path, pf_pci: Path) -> None:
    from tacc.bpftrace.program import Filters

    prog = program  # type: ignore[assignment]
    prog.reset()
    prog.configure(Filters(pid=os.getpid()))
    prog.attach("snoop")
    truth = Truth(pf_pci)
    try:
        _workload(pf_accel)
        time.sleep(0.2)
        ev = prog.drain()
    finally:
        prog.detach()
    st = prog.stats()
    sub = ev[ev["kind"] == DriverKind.SUBMIT]
    done = ev[ev["kind"] == DriverKind.JOB_DONE]
    assert st.dropped == 0
    assert st.driver_missed == 0, "the kernel skipped driver handlers (BPF recursion guard)"
    assert len(sub) == NJOBS and len(done) == NJOBS
    assert len(set(zip(done["x"].tolist(), done["a"].tolist(), strict=True))) == NJOBS
    assert set(sub["pid"].tolist()) == {os.getpid()}
    assert list(sub["v"]) == [2] * NJOBS
    truth.check(NJOBS, 2)


def test_program_from_the_compile_cache_counts_every_job(program: object, pf_accel: Path,
                                                          pf_pci: Path) -> None:
    """The session's program (conftest ``program``) is in the compile cache: another Program of
    the same text, at another ring size, loads from the cache (no clang) and accounts for
    every job of a workload as the compiled one does, against the device's own totals;
    its tables (config, per-CPU stats, the top hash) work as bcc's."""
    from tacc.bpftrace import preflight
    from tacc.bpftrace.program import Filters, Program

    prog = Program(preflight.all_checks(bcc=True), rb_pages=256, host=True)
    try:
        assert prog.cached and not prog.warnings, prog.cache_note
        # what the compile printed travels with the entry (checked clean by test_e2e_real)
        assert prog.compile_log == program.compile_log  # type: ignore[attr-defined]
        # the events map the kernel made is the size asked, not the compiled entry's 4096
        # pages (the reader maps 256 pages of it)
        fdinfo = dict(ln.split(":", 1) for ln in Path(
            f"/proc/self/fdinfo/{prog.bpf['events'].map_fd}").read_text().splitlines())
        assert (prog.rb_size, int(fdinfo["max_entries"])) == (256 * 4096, 256 * 4096), fdinfo
        prog.reset()
        prog.configure(Filters(pid=os.getpid()))
        prog.attach("snoop")
        truth = Truth(pf_pci)
        _workload(pf_accel)
        time.sleep(0.2)
        ev = prog.drain()
        prog.attach("top")
        _workload(pf_accel, 10)
        time.sleep(0.1)
        top = prog.top()
        st = prog.stats()
    finally:
        prog.close()
    sub = ev[ev["kind"] == DriverKind.SUBMIT]
    done = ev[ev["kind"] == DriverKind.JOB_DONE]
    assert (st.dropped, st.missed) == (0, 0)
    assert len(sub) == NJOBS and len(done) == NJOBS and set(sub["pid"].tolist()) == {os.getpid()}
    assert st.emitted == len(ev)
    assert top[os.getpid()]["jobs"] == 10 and top[os.getpid()]["cmds"] == 20
    truth.check(NJOBS + 10, 2)


def test_latency_and_top_aggregate_in_kernel(program: object, pf_accel: Path) -> None:
    from tacc.bpftrace.program import Filters

    prog = program  # type: ignore[assignment]
    prog.reset()
    prog.configure(Filters(pid=os.getpid()))
    prog.attach("latency")
    try:
        _workload(pf_accel, 10)
        time.sleep(0.1)
    finally:
        prog.detach()
    h = prog.latency()
    totals = {which: sum(sum(s.values()) for (d, q, w), s in h.items() if w == which)
              for which in (0, 1, 2)}
    assert totals[0] == 10 and totals[2] == 10
    prog.reset()
    prog.attach("top")
    try:
        _workload(pf_accel, 10)
        time.sleep(0.1)
    finally:
        prog.detach()
    top = prog.top()
    assert top[os.getpid()]["jobs"] == 10 and top[os.getpid()]["cmds"] == 20


def test_snoop_cli_json_accounts_for_every_job(pf_accel: Path, pf_pci: Path) -> None:
    p, err = _start_tool(["snoop", "--json", "--duration", "300", "-p", str(os.getpid())])
    truth = Truth(pf_pci)
    _workload(pf_accel)
    time.sleep(0.5)
    out, err = _stop_tool(p, err)
    lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    rows = [r for r in lines if r.get("event") in ("submit", "done")]
    summ = [r for r in lines if r.get("event") == "summary"]
    assert p.returncode == 0, err
    assert summ and summ[0]["lost"] == 0, err
    mine = [r for r in rows if r["tag"] >> 16 == 0x5A5A]
    assert sum(r["event"] == "done" for r in mine) == NJOBS
    assert sum(r["event"] == "submit" for r in mine) == NJOBS
    assert len({r["seqno"] for r in mine if r["event"] == "done"}) == NJOBS
    truth.check(NJOBS, 2)


def test_record_accounts_for_every_job(tmp_path: Path, pf_accel: Path, pf_pci: Path) -> None:
    out = tmp_path / "rec"
    p, err = _start_tool(["record", "-o", str(out), "--duration", "300"])
    truth = Truth(pf_pci)
    _workload(pf_accel)
    time.sleep(0.5)
    _, err = _stop_tool(p, err)
    assert p.returncode == 0, err
    cap = open_capture(out)
    assert cap.complete
    drv = cap.read("driver")
    mine = drv[(drv["tag"] >> 16) == 0x5A5A]
    assert (mine["kind"] == DriverKind.JOB_DONE).sum() == NJOBS
    assert (mine["kind"] == DriverKind.SUBMIT).sum() == NJOBS
    _check_one_event_per_fact(mine)
    dt = cap.read("device_trace")
    dmine = dt[(dt["tag"] >> 16) == 0x5A5A]
    drops = cap.read("drops")
    dev_drops = int(drops["count"][drops["source"] == DropSource.DEVICE_TRACE].sum())
    # one record per command, or a counted drop; no drop at all unless the guest is slow
    assert len(dmine) + dev_drops >= 2 * NJOBS and len(dmine) <= 2 * NJOBS, (len(dmine),
                                                                            dev_drops)
    # no event lost (counter samples the sampling tick took late are not events)
    timing.check(int(drops["count"][drops["source"] != DropSource.COUNTERS].sum()) == 0,
                 f"drops {drops}")
    truth.check(NJOBS, 2)


def _check_one_event_per_fact(mine: np.ndarray) -> None:
    """the submit record has the driver's copy bytes (0 for NOPs) and command
    mix (BIT(NOP)); one job start record per job carries the doorbell's facts (no
    doorbell records: they held nothing else)."""
    sub = mine[mine["kind"] == DriverKind.SUBMIT]
    assert set(sub["arg"].tolist()) == {1} and set(sub["size"].tolist()) == {0}
    assert set(sub["ncmds"].tolist()) == {2}
    st = mine[mine["kind"] == DriverKind.JOB_START]
    assert len(st) == NJOBS and len(set(st["job"].tolist())) == NJOBS
    assert len(set(st["nsegs"].tolist())) > 1  # the SQ tail moves job by job
    assert not (mine["kind"] == DriverKind.DOORBELL).any()


def _check_sched_events(host: np.ndarray) -> None:
    """The raw-tracepoint sched records carry what the classic tracepoint would."""
    me = os.getpid()
    comm = Path("/proc/self/comm").read_text().strip().encode()
    sw = host[host["kind"] == HostKind.SCHED_SWITCH]
    out = sw[sw["tid"] == me]
    into = sw[sw["next_pid"] == me]
    assert len(out) > 0 and len(into) > 0, "the workload thread never switched out and in"
    assert set(out["comm"].tolist()) == {comm}
    assert set(into["next_comm"].tolist()) == {comm}
    # __trace_sched_switch_state: 0 (running), one TASK_REPORT bit, or TASK_REPORT_MAX
    # (0x100, preempted)
    assert set(sw["prev_state"].tolist()) <= {0, *(1 << i for i in range(9))}
    assert (out["prev_state"] == 1).any()  # it slept interruptibly waiting for the device
    wk = host[(host["kind"] == HostKind.SCHED_WAKEUP) & (host["tid"] == me)]
    assert len(wk) > 0 and set(wk["comm"].tolist()) == {comm}


def _taccd(sock: Path, root: Path) -> subprocess.Popen[str]:
    from tacc.testing.taccd import start_taccd

    return start_taccd(sock, root)


def _tacc(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TACCD_SOCKET": str(sock)}
    return subprocess.run([str(BIN / "tacc"), "trace", *args], env=env, text=True,
                          capture_output=True, timeout=360)


def test_taccd_capture_accounts_and_kill_leaves_incomplete(tmp_path: Path, pf_accel: Path,
                                                          pf_pci: Path) -> None:
    sock = tmp_path / "taccd.sock"
    d = _taccd(sock, tmp_path)
    try:
        r = _tacc(sock, "start", "-o", str(tmp_path / "c1"))
        assert r.returncode == 0, r.stderr + (tmp_path / "taccd.log").read_text()
        truth = Truth(pf_pci)
        _workload(pf_accel)
        time.sleep(0.5)
        r = _tacc(sock, "stop")
        assert r.returncode == 0, r.stderr
        cap = open_capture(tmp_path / "c1")
        assert cap.complete, cap.problems
        drv = cap.read("driver")
        mine = drv[(drv["tag"] >> 16) == 0x5A5A]
        assert (mine["kind"] == DriverKind.JOB_DONE).sum() == NJOBS
        assert (mine["kind"] == DriverKind.SUBMIT).sum() == NJOBS
        _check_one_event_per_fact(mine)
        dt = cap.read("device_trace")
        assert ((dt["tag"] >> 16) == 0x5A5A).sum() == 2 * NJOBS
        # nothing lost, host events included: the scheduler events are raw tracepoints (a
        # per-program recursion guard), so a wakeup that interrupts a kprobe handler is
        # no longer skipped by the kernel (a HOST drop failed CI once)
        drops = cap.read("drops")
        events = np.isin(drops["source"], [int(DropSource.DRIVER), int(DropSource.DEVICE_TRACE),
                                           int(DropSource.HOST), int(DropSource.API)])
        assert int(drops["count"][events].sum()) == 0, drops
        _check_sched_events(cap.read("host"))
        c = cap.read("counters")
        pf = c[c["fid"] == 0]
        assert int(pf["jobs_completed"][-1]) - int(pf["jobs_completed"][0]) >= NJOBS
        truth.check(NJOBS, 2)
        assert cap.count("clock_sync") >= 2
        # ioctl_events off: the same per-job facts, owner and all, no IOCTL
        # records; the ioctl tracepoints are not attached
        r = _tacc(sock, "start", "--no-ioctls", "-o", str(tmp_path / "c1j"))
        assert r.returncode == 0, r.stderr
        _workload(pf_accel, tag_base=0x4D4D0000)
        time.sleep(0.5)
        r = _tacc(sock, "stop")
        assert r.returncode == 0, r.stderr
        capj = open_capture(tmp_path / "c1j")
        drvj = capj.read("driver")
        assert not (drvj["kind"] == DriverKind.IOCTL).any()
        minej = drvj[(drvj["tag"] >> 16) == 0x4D4D]
        for kind in (DriverKind.SUBMIT, DriverKind.JOB_START, DriverKind.JOB_DONE):
            k = minej[minej["kind"] == kind]
            assert len(k) == NJOBS and (k["pid"] == os.getpid()).all(), kind
        _check_one_event_per_fact(minej)
        assert os.getpid() in capj.read("processes")["pid"]
        # second capture, killed once its first chunks are on disk
        r = _tacc(sock, "start", "-o", str(tmp_path / "c2"))
        assert r.returncode == 0, r.stderr
        _workload(pf_accel, 10, tag_base=0x6B6B0000)
        done = 0
        for _ in range(300):  # flushed every second; up to 60 s on a busy host
            time.sleep(0.2)
            drv2 = open_capture(tmp_path / "c2").read("driver")
            done = int(((drv2["tag"] >> 16 == 0x6B6B)
                        & (drv2["kind"] == DriverKind.JOB_DONE)).sum())
            if done == 10:
                break
        assert done == 10
        d.send_signal(signal.SIGKILL)
        d.wait(10)
        cap2 = open_capture(tmp_path / "c2")
        assert not cap2.complete
        assert any("interrupted" in x for x in cap2.problems), cap2.problems
        drv2 = cap2.read("driver")
        assert ((drv2["tag"] >> 16 == 0x6B6B) & (drv2["kind"] == DriverKind.SUBMIT)).sum() == 10
    finally:
        if d.poll() is None:
            d.kill()
            d.wait(10)


def test_bpftrace_one_line_failures() -> None:
    exe = str(BIN / "accel-bpftrace")
    # generous timeouts: under -icount sleep=off the guest clock runs on while a process
    # waits for 9p reads from a busy host
    r = subprocess.run([exe, "snoop", "--no-such-option"], text=True, capture_output=True,
                       timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(["su", "tacc-user", "-c", f"{exe} snoop --duration 1"], text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "root" in r.stderr
    r = subprocess.run([exe, "snoop", "-d", "0000:7f:00.0"], text=True, capture_output=True,
                       timeout=300)
    assert r.returncode == 1 and "no tacc device" in r.stderr
    r = subprocess.run([exe, "record", "-o", "/tmp/never", "--trace-entries", "100"],
                       text=True, capture_output=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "accel-bpftrace: trace ring entries 100: a power of two from 64 to 32768"], r.stderr
    assert not Path("/tmp/never").exists()


BT_DIR = Path(__file__).resolve().parents[2] / "tools" / "bpftrace"
# what each stock script prints after a NOP workload (None: attaches, prints no error)
BT_EXPECT = {"tacc_snoop.bt": "submit ncmds=2", "tacc_latency.bt": "@submit_to_done_ns",
             "tacc_ioctls.bt": "@calls", "tacc_dma.bt": None}


# make test runs tacc_snoop.bt (its per-job lines checked against the NOPs); each other
# script is one more bpftrace (LLVM) compile in the guest and runs in make test-long
@pytest.mark.parametrize("script", [s if s == "tacc_snoop.bt" else
                                    pytest.param(s, marks=pytest.mark.long)
                                    for s in sorted(BT_EXPECT)])
def test_stock_bpftrace_script_runs(script: str, pf_accel: Path) -> None:
    """Each tools/bpftrace script attaches, sees a workload for ~1 s, exits cleanly."""
    assert sorted(p.name for p in BT_DIR.glob("*.bt")) == sorted(BT_EXPECT)
    p = subprocess.Popen(["bpftrace", str(BT_DIR / script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    head = ""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        ln = p.stdout.readline()
        if not ln:
            break
        head += ln
        if ln.startswith("Attaching"):
            break
    try:
        assert "Attaching" in head, head + (p.stderr.read() if p.poll() is not None else "")
        # "Attaching" is printed before the probes are attached, and BEGIN runs before
        # them too: nothing tells when they are live, so give bpftrace time
        time.sleep(5)
        _workload(pf_accel, 5, tag_base=0x7E7E0000)
        time.sleep(1.0)
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)  # the debug kernel: >60 s
    out = head + out
    assert p.returncode == 0 and "ERROR" not in err, err
    want = BT_EXPECT[script]
    if want:
        assert want in out, out
    if script == "tacc_snoop.bt":
        assert sum(" done " in ln and "0x7e7e" in ln for ln in out.splitlines()) == 5, out


KO = Path(__file__).resolve().parents[2] / "build/modules" / os.uname().release / "tacc.ko"


@pytest.mark.skipif(not discover() or not KO.exists(), reason="no tacc device or module")
def test_without_module_one_line(pf_pci: Path) -> None:
    # run last: unloads and reloads the module (as test_driver_zz_reload does)
    exe = str(BIN / "accel-bpftrace")
    r = subprocess.run(["rmmod", "tacc"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"cannot unload tacc: {r.stderr.strip()}")
    try:
        r = subprocess.run([exe, "snoop"], text=True, capture_output=True, timeout=300)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [
            "accel-bpftrace: the tacc kernel module is not loaded (modprobe tacc)"]
    finally:
        subprocess.run(["insmod", str(KO)], capture_output=True, timeout=300)
        for _ in range(300):
            if list((pf_pci / "accel").glob("accel*")) if (pf_pci / "accel").exists() else []:
                break
            time.sleep(0.1)


BURST_JOBS = 200  # 400 commands into a ring of TRACE_MIN_ENTRIES (64) with no drain between


def test_tiny_trace_ring_records_plus_drops_equal_commands(tmp_path: Path, pf_accel: Path,
                                                           pf_pci: Path) -> None:
    """A capture whose device trace ring holds the minimum of records, under a burst of
    jobs nothing drains meanwhile: every command the device ran (x-gt-cmds) is a record
    of the capture or a counted drop of the PF's device trace."""
    from tacc.daemon.session import CaptureSession, Options
    from tacc.runtime.uapi import TRACE_MIN_ENTRIES

    out = tmp_path / "tiny"
    sess = CaptureSession(out, discover(), Options(trace_entries=TRACE_MIN_ENTRIES, api=False,
                                                   counters_hz=0.0, host_events=False),
                          tool="test_tracing_accounting")
    truth = Truth(pf_pci)
    try:
        _workload(pf_accel, BURST_JOBS, tag_base=0x5B5B0000)
        time.sleep(0.2)
    finally:
        sess.close(complete=True)
    truth.check(BURST_JOBS, 2)
    cap = open_capture(out)
    dt = cap.read("device_trace")
    dr = cap.read("drops")
    recs = dt[dt["fid"] == 0]
    dropped = int(dr["count"][(dr["source"] == DropSource.DEVICE_TRACE) & (dr["fid"] == 0)].sum())
    assert dropped >= 2 * BURST_JOBS - TRACE_MIN_ENTRIES, (len(recs), dropped)
    assert len(recs) + dropped == 2 * BURST_JOBS, (len(recs), dropped)
    assert set(((recs["tag"] >> 16) == 0x5B5B).tolist()) == {True}


# a BPF ring of one page (34 events of 112 bytes and their headers): make test-long (its
# own program compile, ~20 s of the boot)
@pytest.mark.long
def test_tiny_bpf_ring_records_plus_drops_equal_events(tmp_path: Path, pf_accel: Path,
                                                       pf_pci: Path) -> None:
    """A BPF ring buffer of one page under a burst of jobs nothing drains meanwhile: every
    SUBMIT and JOB_DONE of the jobs the device ran (x-gt-jobs) is a record read or a
    counted drop; then a capture through the same program under the same burst: its driver
    records are the program's emitted events and its DRIVER drops what the ring lost."""
    from tacc.bpftrace import preflight
    from tacc.bpftrace.program import Filters, Program
    from tacc.daemon.session import CaptureSession, Options

    prog = Program(preflight.all_checks(bcc=True), rb_pages=1, host=False)
    try:
        prog.reset()
        prog.configure(Filters(pid=os.getpid()))
        prog.attach("snoop")
        truth = Truth(pf_pci)
        try:
            _workload(pf_accel, BURST_JOBS, tag_base=0x5C5C0000)
            time.sleep(0.2)
        finally:
            prog.detach()
        truth.check(BURST_JOBS, 2)
        ev = prog.drain()
        st = prog.stats()
        assert set(ev["kind"].tolist()) <= {int(DriverKind.SUBMIT), int(DriverKind.JOB_DONE)}
        assert len(ev) == st.emitted and st.dropped > 0, (len(ev), st)
        assert st.emitted + st.dropped == 2 * BURST_JOBS, st
        print(f"one-page BPF ring, snoop: {st.emitted} read + {st.dropped} dropped",
              file=sys.__stderr__)

        prog.reset()
        prog.configure(Filters())
        out = tmp_path / "tiny-bpf"
        sess = CaptureSession(out, discover(), Options(api=False, counters_hz=0.0,
                                                       host_events=False),
                              program=prog, tool="test_tracing_accounting")
        prog.attach("record")
        try:
            _workload(pf_accel, BURST_JOBS, tag_base=0x5D5D0000)
            time.sleep(0.2)
        finally:
            prog.detach()
            st = prog.stats()
            sess.close(complete=True)
        cap = open_capture(out)
        drv = cap.read("driver")
        dr = cap.read("drops")
        lost = int(dr["count"][dr["source"] == DropSource.DRIVER].sum())
        assert st.dropped > 0 and st.driver_missed == 0, st
        print(f"one-page BPF ring, capture: {len(drv)} records + {lost} dropped",
              file=sys.__stderr__)
        assert (len(drv), lost) == (st.emitted, st.dropped), (len(drv), lost, st)
    finally:
        prog.close()


def test_ebpf_prints_the_program_it_would_load() -> None:
    """`accel-bpftrace CMD --ebpf` (bcc's tools' option): the program text each command
    builds from the loaded driver's tracepoints, byte for byte, without compiling it."""
    from tacc.bpftrace import bpfsrc

    root = Path("/sys/kernel/tracing")
    for cmd, pages in (("snoop", 1024), ("record", 4096)):
        extra = ["-o", "/tmp/unused-ebpf-cap"] if cmd == "record" else []
        r = subprocess.run([str(BIN / "accel-bpftrace"), cmd, *extra, "--ebpf"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        want, _ = bpfsrc.build_source(root, rb_pages=pages, host=False)
        assert r.stdout.rstrip("\n") == want.rstrip("\n")
        assert "BPF_RINGBUF_OUTPUT" in r.stdout
        assert not Path("/tmp/unused-ebpf-cap").exists()  # nothing recorded
