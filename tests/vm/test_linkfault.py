"""Link faults in a real guest (docs/hardware.md "Link faults"): the
link degraded at run time through QMP (the PF's and its root port's Link Status, the
PCI core's and tacc.ko's sysfs follow), AER errors injected on the PF with QEMU's
``pcie_aer_inject_error`` (HMP through QMP ``human-monitor-command``, from the guest's
QMP channel): a correctable one is counted in the PCI core's ``aer_dev_correctable``,
an uncorrectable non-fatal one goes through the AER core's recovery and another
context's jobs keep completing with the right data."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tacc.guest_qmp import PF_QOM, GuestQMP

WORKER = """
import sys, time
import numpy as np
from tacc.runtime import Context
n = 64 << 10
with Context() as ctx:
    x = ctx.host_buffer((n,), dtype=np.uint8)
    y = ctx.host_buffer((n,), dtype=np.uint8)
    d = ctx.device_buffer((n,), dtype=np.uint8)
    s = ctx.stream()
    done, t_end = 0, None
    while t_end is None or time.monotonic() < t_end:
        x.array[:] = done % 251
        s.copy_h2d(d, x)
        s.copy_d2h(y, d)
        s.synchronize()
        assert (y.array == done % 251).all(), done
        done += 1
        if done == 1:
            print("ready", flush=True)
            sys.stdin.readline()  # the error was injected
            t_end = time.monotonic() + 0.3
print("done", done, flush=True)
"""


def hmp(cmd: str) -> str:
    with GuestQMP() as q:
        return q.execute("human-monitor-command", **{"command-line": cmd})


def aer_counts(dev: Path, kind: str) -> dict[str, int]:
    out = {}
    for ln in (dev / f"aer_dev_{kind}").read_text().splitlines():
        name, val = ln.split()
        out[name] = int(val)
    return out


def wait_for(pred, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def degraded(pf_pci: Path) -> Iterator[Path]:
    try:
        yield pf_pci
    finally:
        with GuestQMP() as q:
            q.qom_set(PF_QOM, "x-link-gen-now", 0)
            q.qom_set(PF_QOM, "x-link-width-now", 0)


def test_link_degraded_at_run_time_shows_in_sysfs(degraded: Path) -> None:
    """Gen4 x16 retrained to Gen3 x4: current_link_* of the PF and its root port and
    tacc.ko's link_speed/link_width say so; max_* stay; 0 restores the full link."""
    pf, rp = degraded, degraded.resolve().parent
    assert (pf / "tacc/link_width").read_text().strip() == "16"
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-link-gen-now", 3)
        q.qom_set(PF_QOM, "x-link-width-now", 4)
    for dev in (pf, rp):
        assert (dev / "current_link_speed").read_text().strip() == "8.0 GT/s PCIe", dev
        assert (dev / "current_link_width").read_text().strip() == "4", dev
    assert (pf / "max_link_width").read_text().strip() == "16"
    assert (pf / "tacc/link_speed").read_text().strip() == "8.0 GT/s PCIe"
    assert (pf / "tacc/link_width").read_text().strip() == "4"
    assert (pf / "tacc/max_link_width").read_text().strip() == "16"
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-link-gen-now", 0)
        q.qom_set(PF_QOM, "x-link-width-now", 0)
    assert (pf / "tacc/link_width").read_text().strip() == "16"
    assert (pf / "current_link_speed").read_text().strip() == "16.0 GT/s PCIe"


def test_correctable_aer_error_is_counted(pf_pci: Path) -> None:
    """A correctable Bad TLP injected on the PF reaches the root port's AER service:
    aer_dev_correctable BadTLP and TOTAL_ERR_COR grow by one, the root port counts it."""
    rp = pf_pci.resolve().parent
    c0 = aer_counts(pf_pci, "correctable")
    r0 = int((rp / "aer_rootport_total_err_cor").read_text())
    # -c takes a numeric status: PCI_ERR_COR_BAD_TLP
    assert hmp("pcie_aer_inject_error -c tacc0 0x40").startswith("OK id: tacc0")
    wait_for(lambda: aer_counts(pf_pci, "correctable")["BadTLP"] == c0["BadTLP"] + 1,
             "aer_dev_correctable BadTLP + 1")
    c1 = aer_counts(pf_pci, "correctable")
    assert c1["TOTAL_ERR_COR"] == c0["TOTAL_ERR_COR"] + 1, (c0, c1)
    assert int((rp / "aer_rootport_total_err_cor").read_text()) == r0 + 1


def test_nonfatal_aer_error_recovers_while_other_jobs_complete(pf_pci: Path) -> None:
    """An uncorrectable non-fatal Completion Timeout injected on the PF while another
    process's context copies and checks data: aer_dev_nonfatal counts it, the AER core
    calls tacc.ko's error_detected (channel io_normal) and mmio_enabled, the function
    recovers without a reset, and the other context's copies all complete correctly
    before and after."""
    n0 = aer_counts(pf_pci, "nonfatal")
    mark = f"tacc-test-nonfatal-{time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")
    w = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline().strip() == "ready"
        assert hmp("pcie_aer_inject_error tacc0 COMP_TIME").startswith("OK id: tacc0")
        wait_for(lambda: aer_counts(pf_pci, "nonfatal")["CmpltTO"] == n0["CmpltTO"] + 1,
                 "aer_dev_nonfatal CmpltTO + 1")
        w.stdin.write("\n")
        w.stdin.flush()
        out, err = w.communicate(timeout=120)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert w.returncode == 0, err
    assert out.split()[0] == "done" and int(out.split()[1]) > 1, out
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    log = log[log.rindex(mark):]
    name = pf_pci.name
    assert any("PCI error detected, channel state 1" in ln and name in ln
               for ln in log.splitlines()), log
    assert any("AER: device recovery successful" in ln for ln in log.splitlines()), log
    assert not any("function reset" in ln and name in ln for ln in log.splitlines()), log
    assert aer_counts(pf_pci, "nonfatal")["TOTAL_ERR_NONFATAL"] == \
        n0["TOTAL_ERR_NONFATAL"] + 1



FATAL_WORKER = """
import errno, sys, time
import numpy as np
from tacc.runtime import Context
from tacc.runtime.errors import DeviceError
n = 64 << 10
with Context() as ctx:
    x = ctx.host_buffer((n,), dtype=np.uint8)
    d = ctx.device_buffer((n,), dtype=np.uint8)
    s = ctx.stream()
    x.array[:] = 7
    s.copy_h2d(d, x)                       # engine 0 is hung: this job stays in flight
    # drm_sched pushes the job to the queue from its workqueue after SUBMIT returns; sleep
    # so that has happened before the error (the guest idles only once that work ran).
    # Without it the error came first in one fresh clone: the recovery ran with the job
    # still in the scheduler, which then pushed it onto the hung engine after the reset,
    # and it timed out (-ETIMEDOUT after 2 s) instead of failing with the reset (-EIO).
    time.sleep(0.05)
    print("submitted", flush=True)
    try:
        s.synchronize(timeout=60)
        print("completed", flush=True)
    except DeviceError as e:
        print("failed", e.status, flush=True)
    sys.stdin.readline()                   # the engine runs again
    x.array[:] = np.arange(n) % 251
    y = ctx.host_buffer((n,), dtype=np.uint8)
    s.copy_h2d(d, x)
    s.copy_d2h(y, d)
    s.synchronize(timeout=60)
    print("next", int((y.array == np.arange(n) % 251).all()), flush=True)
"""


def _dmesg_since(mark: str) -> list[str]:
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return log[log.index(mark):].splitlines()


def test_fatal_aer_error_recovers_through_root_port_reset(pf_pci: Path) -> None:
    """An uncorrectable FATAL Data Link Protocol error injected on the PF while another
    process has a job in flight: the AER core resets the link with the root port's
    secondary bus reset (dmesg "Root Port link has been reset (0)", not tacc.ko's own
    fallback), tacc.ko's error_detected / slot_reset / resume re-initialise the
    function, the in-flight job fails with -EIO (not a hang), the process's next job
    runs, copies on the PF and on its VF (enabled for the test) are right afterwards,
    and the root port counts the error once."""
    from test_driver_basic import wait_accel_node

    rp = pf_pci.resolve().parent
    numvfs = pf_pci / "sriov_numvfs"
    assert numvfs.read_text().strip() == "0"
    numvfs.write_text("1")
    vf = pf_pci.parent / (pf_pci.name[:-1] + "1")
    try:
        _fatal_recovery(pf_pci, rp, wait_accel_node(vf))
    finally:
        numvfs.write_text("0")


def _copy_checked(dev: str | None, n: int) -> None:
    """A random float32 H2D + D2H round trip on @dev (None: the default device),
    checked against numpy."""
    import numpy as np
    from tacc.runtime import Context

    with Context(dev) as ctx:
        x = ctx.host_buffer((n,), dtype=np.float32)
        y = ctx.host_buffer((n,), dtype=np.float32)
        d = ctx.device_buffer((n,), dtype=np.float32)
        x.array[:] = np.random.default_rng(19).standard_normal(n, dtype=np.float32)
        s = ctx.stream()
        s.copy_h2d(d, x)
        s.copy_d2h(y, d)
        s.synchronize(timeout=60)
        np.testing.assert_array_equal(y.array, x.array)


def _fatal_recovery(pf_pci: Path, rp: Path, vf_accel: Path) -> None:
    f0 = aer_counts(pf_pci, "fatal")
    rf0 = int((rp / "aer_rootport_total_err_fatal").read_text())
    r0 = int((pf_pci / "tacc/function_resets").read_text())
    mark = f"tacc-test-fatal-{time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")
    # one QMP session for the test: the job in flight must meet the error well within
    # tacc.ko's 2 s job timeout
    q = GuestQMP()
    q.qom_set(PF_QOM, "x-fi-hang-engine", 0)
    w = subprocess.Popen([sys.executable, "-c", FATAL_WORKER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline().strip() == "submitted"
        Path("/dev/kmsg").write_text(mark + " injecting\n")
        # DLP is fatal with the AER capability's default severity
        assert q.execute("human-monitor-command", **{
            "command-line": "pcie_aer_inject_error tacc0 DLP"}).startswith("OK id: tacc0")
        Path("/dev/kmsg").write_text(mark + " injected\n")
        failed = w.stdout.readline().split()
        q.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        wait_for(lambda: any("AER: device recovery" in ln or "did not complete" in ln
                             for ln in _dmesg_since(mark)), "the end of the AER recovery")
        w.stdin.write("\n")
        w.stdin.flush()
        out, err = w.communicate(timeout=120)
    finally:
        q.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        q.close()
        if w.poll() is None:
            w.kill()
            w.wait()
    log = _dmesg_since(mark)
    assert failed == ["failed", str(-errno.EIO)], (failed, out, err)
    assert w.returncode == 0 and out.split() == ["next", "1"], (out, err)
    name = pf_pci.name
    assert any("PCI error detected, channel state 2" in ln and name in ln for ln in log), log
    assert any("Root Port link has been reset (0)" in ln for ln in log), log
    assert any("AER: device recovery successful" in ln for ln in log), log
    assert not any("AER recovery did not complete" in ln for ln in log), log
    # The root port counts it.  For a fatal error the AER core does not read an
    # endpoint's Uncorrectable Status (its link may be down: "type=Inaccessible"), and
    # before Linux 6.16 ("PCI/AER: Update statistics early in logging") the device's
    # aer_dev_fatal was only counted from that status: Debian's 6.12 leaves it as it was.
    assert int((rp / "aer_rootport_total_err_fatal").read_text()) == rf0 + 1
    f1 = aer_counts(pf_pci, "fatal")
    early = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2]) >= (6, 16)
    assert f1["TOTAL_ERR_FATAL"] == f0["TOTAL_ERR_FATAL"] + early, (f0, f1)
    assert f1["DLP"] == f0["DLP"], (f0, f1)
    assert int((pf_pci / "tacc/function_resets").read_text()) == r0 + 1
    # the VF went through the same recovery: the bus reset disabled SR-IOV, the PF's
    # config restore (its slot_reset, first on the bus) enabled it again
    assert any("PCI error detected, channel state 2" in ln and name[:-1] + "1" in ln
               for ln in log), log
    assert sum("function reset (-5): recovered" in ln for ln in log) == 2, log
    _copy_checked(str(vf_accel), 1 << 18)
    _copy_checked(f"/dev/accel/{next((pf_pci / 'accel').iterdir()).name}", 1 << 20)



DMA_WORKER = """
import sys, time
import numpy as np
from tacc.runtime import Context
from tacc.runtime.errors import DeviceError
n = 256 << 10
with Context() as ctx:
    x = ctx.host_buffer((n,), dtype=np.uint8)
    y = ctx.host_buffer((n,), dtype=np.uint8)
    d = ctx.device_buffer((n,), dtype=np.uint8)
    s = ctx.stream()
    x.array[:] = 7
    s.copy_h2d(d, x)
    s.synchronize(timeout=60)
    y.array[:] = 0
    s.copy_d2h(y, d)                       # the D2H engine is hung: in flight
    time.sleep(0.05)
    print("submitted", flush=True)
    try:
        s.synchronize(timeout=60)
        y.array[:] = 0xEE                  # the job is over: the buffer is ours again
        print("completed", flush=True)
    except DeviceError as e:
        y.array[:] = 0xEE                  # so it is when its fence failed
        print("failed", e.status, flush=True)
    sys.stdin.readline()                   # the engine ran again, the recovery ended
    print("after", int(np.count_nonzero(y.array != 0xEE)), flush=True)
"""


def _line_ready(f, timeout: float) -> bool:
    import select
    return bool(select.select([f], [], [], timeout)[0])


def test_fatal_aer_error_fails_jobs_only_after_the_link_reset(pf_pci: Path) -> None:
    """A fatal AER error (DLP) while a D2H copy is in flight on a hung engine, tacc.ko's
    error_detected held 1.5 s (debugfs recover_delay_ms) before the AER core resets the
    link; the engine runs again while the link is not yet reset. The device may DMA until
    that reset, so the job's fence must not fail before it: the device's own count of D2H
    bytes (x-gt-d2h-bytes) does not move after the worker saw its fence fail, and the
    buffer the worker overwrote then keeps its bytes."""
    knob = Path("/sys/kernel/debug/accel") / pf_pci.name / "recover_delay_ms"
    mark = f"tacc-test-aer-dma-{time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")
    q = GuestQMP()
    q.qom_set(PF_QOM, "x-fi-hang-engine", 1)
    knob.write_text("1500")
    w = subprocess.Popen([sys.executable, "-c", DMA_WORKER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = None
    try:
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline().strip() == "submitted"
        assert q.execute("human-monitor-command", **{
            "command-line": "pcie_aer_inject_error tacc0 DLP"}).startswith("OK id: tacc0")
        wait_for(lambda: any("PCI error detected, channel state 2" in ln
                             for ln in _dmesg_since(mark)), "error_detected")
        if _line_ready(w.stdout, 0.3):  # failed in error_detected, before the link reset
            result = w.stdout.readline().split()
            g_result = int(q.qom_get(PF_QOM, "x-gt-d2h-bytes"))
        q.qom_set(PF_QOM, "x-fi-hang-engine", -1)  # the device runs the copy now
        if result is None:
            result = w.stdout.readline().split()
            g_result = int(q.qom_get(PF_QOM, "x-gt-d2h-bytes"))
        wait_for(lambda: any("AER: device recovery" in ln or "did not complete" in ln
                             for ln in _dmesg_since(mark)), "the end of the AER recovery")
        time.sleep(0.3)
        g_end = int(q.qom_get(PF_QOM, "x-gt-d2h-bytes"))
        w.stdin.write("\n")
        w.stdin.flush()
        out, err = w.communicate(timeout=120)
    finally:
        knob.write_text("0")
        q.qom_set(PF_QOM, "x-fi-hang-engine", -1)
        q.close()
        if w.poll() is None:
            w.kill()
            w.wait()
    assert result in (["failed", str(-errno.EIO)], ["completed"]), (result, out, err)
    assert g_end == g_result, (f"the device wrote {g_end - g_result} bytes to host memory "
                               f"after the job's fence failed ({result})")
    assert w.returncode == 0 and out.split() == ["after", "0"], (out, err)
    assert any("AER: device recovery successful" in ln for ln in _dmesg_since(mark))


def test_aer_inject_module_correctable_and_nonfatal(pf_pci: Path) -> None:
    """The guest kernel's aer_inject module (tacc.testing.aer_inject, /dev/aer_inject):
    a correctable Bad TLP record for the PF is counted in aer_dev_correctable and by
    the root port; a non-fatal Completion Timeout record goes through the AER core's
    recovery without a function reset and a copy is right afterwards.  The module is
    unloaded at the end (its config accessors replaced the buses'), after which QEMU's
    own injection is counted again through the real registers."""
    from tacc.testing import aer_inject

    assert not aer_inject.is_loaded()
    rp = pf_pci.resolve().parent
    c0, n0 = aer_counts(pf_pci, "correctable"), aer_counts(pf_pci, "nonfatal")
    r0 = int((rp / "aer_rootport_total_err_cor").read_text())
    mark = f"tacc-test-aerinject-{time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")
    with aer_inject.loaded():
        aer_inject.inject(pf_pci.name, cor_status=aer_inject.COR["BAD_TLP"])
        wait_for(lambda: aer_counts(pf_pci, "correctable")["BadTLP"] == c0["BadTLP"] + 1,
                 "aer_dev_correctable BadTLP + 1")
        assert int((rp / "aer_rootport_total_err_cor").read_text()) == r0 + 1
        aer_inject.inject(pf_pci.name, uncor_status=aer_inject.UNCOR["COMP_TIME"])
        wait_for(lambda: any("AER: device recovery" in ln for ln in _dmesg_since(mark)),
                 "the end of the AER recovery")
    assert not aer_inject.is_loaded()
    log = _dmesg_since(mark)
    assert any("Injecting errors 00000040/00000000" in ln for ln in log), log
    assert any("AER: device recovery successful" in ln for ln in log), log
    assert not any("function reset" in ln and pf_pci.name in ln for ln in log), log
    n1 = aer_counts(pf_pci, "nonfatal")
    assert n1["CmpltTO"] == n0["CmpltTO"] + 1, (n0, n1)
    assert n1["TOTAL_ERR_NONFATAL"] == n0["TOTAL_ERR_NONFATAL"] + 1, (n0, n1)
    _copy_checked(None, 1 << 16)
    # the real config accessors are back: QEMU's injection reaches the AER core again
    c1 = aer_counts(pf_pci, "correctable")
    assert hmp("pcie_aer_inject_error -c tacc0 0x40").startswith("OK id: tacc0")
    wait_for(lambda: aer_counts(pf_pci, "correctable")["BadTLP"] == c1["BadTLP"] + 1,
             "aer_dev_correctable BadTLP + 1 after unloading aer_inject")


CAPTURE_WORK = """
import numpy as np
from tacc.runtime import Context
n = 4 << 20
with Context() as ctx:
    x = ctx.host_buffer((n,), dtype=np.uint8)
    d = ctx.device_buffer((n,), dtype=np.uint8)
    s = ctx.stream()
    for _ in range(6):
        s.copy_h2d(d, x)
        s.copy_d2h(x, d)
    s.synchronize()
"""


def _capture(out: Path) -> list:
    """A capture (taccd's session, device trace ring and counters, no BPF) of 6 H2D and
    6 D2H copies of 4 MiB on one stream; its findings."""
    import threading

    from tacc.analyze.engine import analyze
    from tacc.capture import open_capture
    from tacc.daemon.session import CaptureSession, Options
    from tacc.devices import discover

    sess = CaptureSession(out, discover(), Options(counters_hz=10.0, clock_hz=4.0),
                          program=None, tool="test_linkfault", node="lf")
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sess.tick()
            stop.wait(0.05)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        time.sleep(0.2)
        r = subprocess.run([sys.executable, "-c", CAPTURE_WORK], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        time.sleep(0.2)
    finally:
        stop.set()
        th.join(30)
        sess.close(complete=True)
    return analyze(open_capture(out))


@pytest.mark.long  # two captures, ~11 s of guest time: make test-long
def test_link_degraded_rule_on_a_real_capture(degraded: Path, tmp_path: Path) -> None:
    """A capture taken on a link retrained to Gen3 x4 has one link_degraded finding; its
    time lost is what the copies would have saved on the capable Gen4 x16 link (serial
    copies: busy time x (1 - capable/negotiated link time), within 1 % of the summed
    per-copy formula difference); the same workload on the full link has none."""
    from tacc.model.link import D2H, H2D, copy_link_ps

    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-link-gen-now", 3)
        q.qom_set(PF_QOM, "x-link-width-now", 4)
    found = [f for f in _capture(tmp_path / "slow") if f.rule == "link_degraded"]
    assert len(found) == 1, found
    f = found[0]
    assert f.evidence["negotiated"] == {"gen": 3, "width": 4}, f.evidence
    assert f.evidence["capable"] == {"gen": 4, "width": 16}, f.evidence
    assert f.evidence["affected_transfers"] == 12, f.evidence
    scale = int((degraded / "tacc/time_scale").read_text()) / 1000
    n = 4 << 20
    mps = int((degraded / "tacc/max_payload_bytes").read_text())
    want = 6 * scale * sum(copy_link_ps(k, n, 3, 4, mps) - copy_link_ps(k, n, 4, 16, mps)
                           for k in (H2D, D2H)) / 1000
    assert abs(f.time_lost_ns - want) <= 0.01 * want, (f.time_lost_ns, want)
    with GuestQMP() as q:
        q.qom_set(PF_QOM, "x-link-gen-now", 0)
        q.qom_set(PF_QOM, "x-link-width-now", 0)
    assert not [f for f in _capture(tmp_path / "full") if f.rule == "link_degraded"]
