"""ASPM in a real guest (issue 19 item 3, docs/hardware.md "Link power management"):
the guest's ASPM core (policy written at run time, no boot argument) enables L0s and L1
on both ends of the PF's link (qemu/patches/0004 for the root port); an idle-then-burst
workload's first copy after idle starts exactly the L1 exit latency after its fetch was
issued, the link PM counters count it; with ASPM off the same copy pays nothing."""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

POLICY = Path("/sys/module/pcie_aspm/parameters/policy")
L0S_EXIT, L1_EXIT = 256, 2000  # the device's defaults, ns (x time_scale / 1000)
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
    for _ in range(2):  # one burst per policy the parent sets
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
            "link_pm_exit_ticks")


def lnkctl(dev: Path) -> int:
    """Link Control of a PCI function, from its config space (root reads all of it)."""
    cfg = (dev / "config").read_bytes()
    p = cfg[0x34]
    while p:
        if cfg[p] == 0x10:
            return struct.unpack_from("<H", cfg, p + 0x10)[0]
        p = cfg[p + 1]
    raise AssertionError(f"{dev.name}: no PCIe capability")


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
    import subprocess

    from tacc.daemon.devring import DeviceTraceRing

    scale = int((aspm / "tacc/time_scale").read_text())
    ring = DeviceTraceRing(str(pf_accel), 0, 256)
    w = subprocess.Popen([sys.executable, "-c", BURST], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rounds = []
    try:
        assert w.stdin is not None and w.stdout is not None
        for pol in ("powersave", "performance"):
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
    (lead, d), (lead_off, d_off) = rounds
    assert lead == L1_EXIT * scale // 1000, rounds
    assert d["link_l1_exits"] >= 1 and d["link_l1_entries"] >= d["link_l1_exits"], d
    assert d["link_pm_exit_ticks"] == (d["link_l1_exits"] * L1_EXIT +
                                       d["link_l0s_exits"] * L0S_EXIT) * scale // 1000, d
    assert d["link_l1_ticks"] >= 40_000_000 * scale // 1000, d  # most of the 50 ms idle
    assert lead_off == 0, rounds
    assert d_off["link_l1_exits"] == d_off["link_l0s_exits"] == 0, d_off
    assert d_off["link_pm_exit_ticks"] == 0, d_off
