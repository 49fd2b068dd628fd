"""ASPM in a real guest (issue 19 item 3, docs/hardware.md "Link power management"):
the guest's ASPM core (policy written at run time, no boot argument) enables L0s and L1
on both ends of the PF's link (qemu/patches/0004 for the root port); an idle-then-burst
workload's first copy after idle starts exactly the L1 exit latency after its fetch was
issued, the link PM counters count it; with ASPM off the same copy pays nothing."""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

POLICY = Path("/sys/module/pcie_aspm/parameters/policy")
L0S_EXIT, L1_EXIT = 256, 2000  # the device's defaults, ns (x time_scale / 1000)
N = 4 << 20
BURST = f"""
import time
import numpy as np
from tacc.runtime import Context
with Context() as ctx:
    x = ctx.host_buffer(({N},), dtype=np.uint8)
    d = ctx.device_buffer(({N},), dtype=np.uint8)
    s = ctx.stream()
    s.copy_h2d(d, x)
    s.synchronize()
    time.sleep(0.05)  # idle: the link goes L0s -> L1
    for _ in range(4):
        s.copy_h2d(d, x)
    s.synchronize()
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


def burst(pf: Path, pf_accel: Path) -> tuple[np.ndarray, dict[str, int]]:
    """The idle-then-burst workload in a child process, the PF's trace ring drained here:
    (the COPY_H2D trace records in fetch order, counter deltas)."""
    import subprocess

    from tacc.daemon.devring import DeviceTraceRing

    ring = DeviceTraceRing(str(pf_accel), 0, 256)
    try:
        c0 = counters(pf)
        r = subprocess.run([sys.executable, "-c", BURST], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        c1 = counters(pf)
        recs = ring.drain().records
    finally:
        ring.close()
    copies = recs[recs["opcode"] == 1]  # TACC_OP_COPY_H2D
    copies = copies[np.argsort(copies["t_fetch"], kind="stable")]
    assert len(copies) == 5, recs
    return copies, {k: c1[k] - c0[k] for k in c0}


def test_first_copy_after_idle_pays_the_l1_exit(aspm: Path, pf_accel: Path) -> None:
    """After 50 ms of idleness the burst's first copy starts exactly the L1 exit latency
    after its fetch was issued (the descriptor fetch woke the link); the link PM counters
    add up (exit ticks = L1 exits x L1 exit + L0s exits x L0s exit).  With ASPM off
    (performance) the same copy starts when it is fetched and the counters stay."""
    scale = int((aspm / "tacc/time_scale").read_text())
    set_policy("powersave")
    time.sleep(0.01)
    copies, d = burst(aspm, pf_accel)
    first = copies[1]  # copies[0] warms the buffers before the idle period
    assert int(first["t_start"]) - int(first["t_fetch"]) == L1_EXIT * scale // 1000, copies
    assert d["link_l1_exits"] >= 1 and d["link_l1_entries"] >= d["link_l1_exits"], d
    assert d["link_pm_exit_ticks"] == (d["link_l1_exits"] * L1_EXIT +
                                       d["link_l0s_exits"] * L0S_EXIT) * scale // 1000, d
    assert d["link_l1_ticks"] >= 40_000_000 * scale // 1000, d  # most of the 50 ms idle
    set_policy("performance")
    copies, d = burst(aspm, pf_accel)
    assert int(copies[1]["t_start"]) == int(copies[1]["t_fetch"]), copies
    assert d["link_l1_exits"] == d["link_l0s_exits"] == d["link_pm_exit_ticks"] == 0, d
