"""ASPM in a real guest (docs/hardware.md "Link power management"):
the guest's ASPM core (policy written at run time, no boot argument) enables L0s and L1
on both ends of the PF's link (qemu/patches/0004 for the root port); an idle-then-burst
workload's first copy after idle starts exactly the L1 exit latency after its fetch was
issued, the link PM counters count it; with ASPM off the same copy pays nothing.
powersupersave also enables the L1 PM Substates (qemu/patches/0006: the root port's
capability and LTR, q35's _OSC granting LTR control): the link idles in L1.2 and the
first copy pays the L1.2 exit latency the OS programmed (docs/hardware.md "L1 PM
Substates")."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tacc.testing.pcicfg import DEVCTL2, LNKCTL, pcie_word

POLICY = Path("/sys/module/pcie_aspm/parameters/policy")
L0S_EXIT, L1_EXIT = 256, 2000  # the device's defaults, ns (x time_scale / 1000)
L11_EXIT = 4000  # aspm-l11-exit-ns
# Linux's aspm_calc_l12_info from the root port's (40 us, 44 us) and the PF's (10, 10)
# Common_Mode_Restore_Time and T_POWER_ON: the larger of each, threshold 2 + 4 + 40 + 44
# us = 88 x 1024 ns; L1.2 exit = L1.1 exit + T_POWER_ON + Common_Mode_Restore_Time
CMRT_US, T_POWER_ON_US, THRESHOLD = 40, 44, (88, 2)
L12_EXIT = L11_EXIT + (T_POWER_ON_US + CMRT_US) * 1000
POLICIES = ("powersave", "powersupersave", "performance")
N = 4 << 20
BURST = f"""
import sys, time
import numpy as np
from tacc.runtime import Context
with Context() as ctx:
    x = ctx.host_buffer(({N},), dtype=np.uint8)
    d = ctx.device_buffer(({N},), dtype=np.uint8)
    s = ctx.stream()
    s.copy_h2d(d, x)
    s.synchronize()
    for _ in range(3):  # one burst per policy the parent sets
        print("idle", flush=True)
        sys.stdin.readline()
        time.sleep(0.05)  # idle: the link goes L0s -> L1
        for _ in range(4):
            s.copy_h2d(d, x)
        s.synchronize()
        print("burst", flush=True)
        sys.stdin.readline()
"""
COUNTERS = ("link_l0s_exits", "link_l1_entries", "link_l1_exits", "link_l1_ticks",
            "link_pm_exit_ticks", "link_l11_exits", "link_l12_entries", "link_l12_exits",
            "link_l12_ticks")


def lnkctl(dev: Path) -> int:
    """Link Control of a PCI function."""
    return pcie_word(dev, LNKCTL)


def ext_cap(dev: Path, cap_id: int) -> tuple[bytes, int]:
    """(config space, offset of extended capability cap_id, 0 if none)."""
    cfg = (dev / "config").read_bytes()
    p = 0x100
    while p and len(cfg) >= p + 4:
        h = struct.unpack_from("<I", cfg, p)[0]
        if h & 0xFFFF == cap_id:
            return cfg, p
        p = h >> 20
    return cfg, 0


def policy() -> str:
    return POLICY.read_text().split("[")[1].split("]")[0]


def set_policy(p: str) -> None:
    POLICY.write_text(p)
    assert policy() == p


def counters(pf: Path) -> dict[str, int]:
    return {c: int((pf / "global_counters" / c).read_text()) for c in COUNTERS}


@pytest.fixture
def aspm(pf_pci: Path) -> Iterator[Path]:
    """powersave for the test, the boot's policy and PM control back afterwards; the PF
    kept in D0 (a runtime suspend would put the function in D3hot between the copies)."""
    if not POLICY.exists():
        pytest.fail("the guest kernel has no pcie_aspm (CONFIG_PCIEASPM)")
    old, ctl = policy(), (pf_pci / "power/control").read_text().strip()
    (pf_pci / "power/control").write_text("on")
    try:
        yield pf_pci
    finally:
        set_policy(old)
        (pf_pci / "power/control").write_text(ctl)


def test_guest_aspm_core_enables_l0s_l1_on_both_ends(aspm: Path) -> None:
    """pcie_aspm policy powersave: the ASPM core writes ASPM Control on the root port and
    on the PF, and both keep it (before 0004: "LnkCtl: ASPM Disabled", the bits read
    back 0); performance clears them again."""
    rp = aspm.resolve().parent
    set_policy("powersave")
    assert lnkctl(rp) & 3 == 3 and lnkctl(aspm) & 3 == 3, (hex(lnkctl(rp)), hex(lnkctl(aspm)))
    link = aspm / "link"
    assert (link / "l1_aspm").read_text().strip() == "1"
    assert (link / "l0s_aspm").read_text().strip() == "1"
    set_policy("performance")
    assert lnkctl(rp) & 3 == 0 and lnkctl(aspm) & 3 == 0
    assert (link / "l1_aspm").read_text().strip() == "0"


def first_copy_lead(copies: np.ndarray) -> int:
    """t_start - t_fetch of the first copy (in fetch order)."""
    c = copies[np.argsort(copies["t_fetch"], kind="stable")][0]
    return int(c["t_start"]) - int(c["t_fetch"])


def test_first_copy_after_idle_pays_the_l1_exit(aspm: Path, pf_accel: Path) -> None:
    """One process, two idle-then-burst rounds (4 copies of 4 MiB after 50 ms idle).
    powersave: the burst's first copy starts exactly the L1 exit latency after its fetch
    was issued (the descriptor fetch woke the link) and the link PM counters add up
    (exit ticks = L1 exits x L1 exit + L0s exits x L0s exit); performance (ASPM off):
    the first copy starts when it is fetched and the counters stay."""
    from tacc.daemon.devring import DeviceTraceRing

    scale = int((aspm / "tacc/time_scale").read_text())
    ring = DeviceTraceRing(str(pf_accel), 0, 256)
    w = subprocess.Popen([sys.executable, "-c", BURST], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rounds = []
    try:
        assert w.stdin is not None and w.stdout is not None
        for pol in POLICIES:
            assert w.stdout.readline().strip() == "idle"
            set_policy(pol)
            ring.drain()
            c0 = counters(aspm)
            w.stdin.write("\n")
            w.stdin.flush()
            assert w.stdout.readline().strip() == "burst"
            c1 = counters(aspm)
            recs = ring.drain().records
            copies = recs[recs["opcode"] == 1]  # TACC_OP_COPY_H2D
            assert len(copies) == 4, recs
            rounds.append((first_copy_lead(copies), {k: c1[k] - c0[k] for k in c0}))
            w.stdin.write("\n")
            w.stdin.flush()
        _, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        ring.close()
    (lead, d), (lead_ss, d_ss), (lead_off, d_off) = rounds
    assert lead == L1_EXIT * scale // 1000, rounds
    assert d["link_l12_entries"] == d["link_l11_exits"] == 0, d  # powersave: no L1.x
    assert d["link_l1_exits"] >= 1 and d["link_l1_entries"] >= d["link_l1_exits"], d
    assert d["link_pm_exit_ticks"] == (d["link_l1_exits"] * L1_EXIT +
                                       d["link_l0s_exits"] * L0S_EXIT) * scale // 1000, d
    assert d["link_l1_ticks"] >= 40_000_000 * scale // 1000, d  # most of the 50 ms idle
    # powersupersave: every L1 is L1.2 (LTR 1 ms >= threshold); the burst's first copy
    # pays the L1.2 exit the OS programmed
    assert lead_ss == L12_EXIT * scale // 1000, rounds
    assert d_ss["link_l12_exits"] >= 1, d_ss
    assert d_ss["link_l12_exits"] == d_ss["link_l1_exits"], d_ss
    assert d_ss["link_pm_exit_ticks"] == (d_ss["link_l12_exits"] * L12_EXIT +
                                          d_ss["link_l0s_exits"] * L0S_EXIT) * scale // 1000
    assert d_ss["link_l12_ticks"] >= 40_000_000 * scale // 1000, d_ss
    assert lead_off == 0, rounds
    assert d_off["link_l1_exits"] == d_off["link_l0s_exits"] == 0, d_off
    assert d_off["link_pm_exit_ticks"] == 0, d_off


def test_guest_aspm_core_enables_l1_substates_on_both_ends(aspm: Path) -> None:
    """powersupersave: the guest's ASPM core finds the L1 PM Substates capability on
    both ends, LTR enabled on the path (pci_configure_ltr: _OSC grants LTR), programs
    T_POWER_ON, Common_Mode_Restore_Time and LTR_L1.2_THRESHOLD (aspm_calc_l12_info) and
    enables ASPM and PCI-PM L1.1/L1.2 on both ends: lspci says so and the link/ sysfs
    attributes read 1; powersave clears the substates again (before 0006: no L1SubCap in
    lspci, no l1_2_aspm attribute)."""
    rp = aspm.resolve().parent
    set_policy("powersupersave")
    for dev in (rp, aspm):
        cfg, ss = ext_cap(dev, 0x1E)
        assert ss, f"{dev.name}: no L1 PM Substates capability"
        ctl1, ctl2 = struct.unpack_from("<II", cfg, ss + 8)
        assert ctl1 & 0xF == 0xF, (dev.name, hex(ctl1))
        assert ((ctl1 >> 16) & 0x3FF, ctl1 >> 29) == THRESHOLD, (dev.name, hex(ctl1))
        assert ctl2 == (T_POWER_ON_US // 2) << 3, (dev.name, hex(ctl2))  # scale 0: 2 us
        assert pcie_word(dev, DEVCTL2) & 0x400, f"{dev.name}: LTR not enabled"
        out = subprocess.run(["lspci", "-vvv", "-s", dev.name], capture_output=True,
                             text=True, check=True).stdout
        assert "L1SubCtl1: PCI-PM_L1.2+ PCI-PM_L1.1+ ASPM_L1.2+ ASPM_L1.1+" in out, out
        assert "LTR1.2_Threshold=90112ns" in out and "T_PwrOn=44us" in out, out
    cfg, ss = ext_cap(rp, 0x1E)
    assert (struct.unpack_from("<I", cfg, ss + 8)[0] >> 8) & 0xFF == CMRT_US
    link = aspm / "link"
    for attr in ("l1_aspm", "l1_1_aspm", "l1_2_aspm", "l1_1_pcipm", "l1_2_pcipm"):
        assert (link / attr).read_text().strip() == "1", attr
    set_policy("powersave")
    assert (link / "l1_aspm").read_text().strip() == "1"
    for attr in ("l1_1_aspm", "l1_2_aspm", "l1_1_pcipm", "l1_2_pcipm"):
        assert (link / attr).read_text().strip() == "0", attr
    for dev in (rp, aspm):
        cfg, ss = ext_cap(dev, 0x1E)
        assert struct.unpack_from("<I", cfg, ss + 8)[0] & 0xF == 0, dev.name


IDLE_BURST = f"""
import time
import numpy as np
from tacc.runtime import Context
with Context() as ctx:
    x = ctx.host_buffer(({N},), dtype=np.uint8)
    d = ctx.device_buffer(({N},), dtype=np.uint8)
    s = ctx.stream()
    for _ in range(2):
        time.sleep(0.2)  # idle: the link goes L0s -> L1 (samples see the residency)
        for _ in range(4):
            s.copy_h2d(d, x)
        s.synchronize()
    time.sleep(0.05)  # a sample after the last burst
"""


def test_idle_then_burst_capture_shows_l1_exits_on_the_timeline(aspm: Path,
                                                                tmp_path: Path) -> None:
    """with ASPM L1 on, a taccd capture of the idle-then-burst
    workload converts to a timeline whose "link in L1 %" track shows the idle link in L1
    and whose "link L1 exits" track counts the burst's exits, as many as the device's
    counters (the samples' global link PM slots, capture minor 8)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.capture import open_capture
    from tacc.daemon.protocol import request
    from tacc.testing.taccd import start_taccd
    from tacc.timeline.convert import convert

    set_policy("powersave")
    sock, out = tmp_path / "taccd.sock", tmp_path / "cap"
    p = start_taccd(sock, tmp_path, "--no-bpf", "--no-always-on", "--no-cdi")
    try:
        rep = request({"cmd": "start", "output": str(out),
                       "options": {"device": aspm.name, "host_events": False, "api": False,
                                   "counters_hz": 100}}, str(sock), timeout=120.0)
        assert rep["ok"], rep
        c0 = counters(aspm)
        exec(IDLE_BURST, {})
        c1 = counters(aspm)
        time.sleep(0.05)
        rep = request({"cmd": "stop"}, str(sock), timeout=120.0)
        assert rep["ok"], rep
    finally:
        p.terminate()
        p.wait(30)
    exits = c1["link_l1_exits"] - c0["link_l1_exits"]
    assert exits >= 2, (c0, c1)  # one per burst at least (the fetch wakes the link)
    cap = open_capture(out)
    assert cap.complete, cap.problems
    pft = tmp_path / "t.pftrace"
    convert([out], pft)
    tr = pb.Trace()
    tr.ParseFromString(pft.read_bytes())
    names = {q.track_descriptor.uuid: q.track_descriptor.name for q in tr.packet
             if q.HasField("track_descriptor")}
    vals: dict[str, list[float]] = {}
    for q in tr.packet:
        if q.HasField("track_event") and q.track_event.type == pb.TrackEvent.TYPE_COUNTER:
            v = q.track_event.double_counter_value or float(q.track_event.counter_value)
            vals.setdefault(names.get(q.track_event.track_uuid, ""), []).append(v)
    assert "link L1 exits" in vals and "link in L1 %" in vals, sorted(vals)
    assert max(vals["link in L1 %"]) > 50, vals["link in L1 %"]  # 200 ms idle in L1
    # every exit of the capture's window is on the track (the window holds the bursts)
    assert exits <= sum(vals["link L1 exits"]) <= exits + 2, (exits, vals["link L1 exits"])
