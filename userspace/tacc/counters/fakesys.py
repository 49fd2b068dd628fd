"""A fake sysfs tree of tacc functions, for host tests and demos without a device.

The catalogue is the driver's ``counters/catalogue`` text of :mod:`tacc.hw` (the X-lists
of ``kernel/include/tacc_hw.h``), so host tests follow the header.
"""

from __future__ import annotations

from pathlib import Path

from tacc import hw


def make_function(root: Path, pci: str = "0000:01:00.0", vf: int = 0, gen: int = 4,
                  width: int = 16, values: dict[str, int] | None = None) -> Path:
    """Create /sys/bus/pci/devices/<pci> with counters, tacc/ info and a PMU dir."""
    d = root / "bus" / "pci" / "devices" / pci
    (d / "counters").mkdir(parents=True)
    (d / "tacc").mkdir()
    (d / "power").mkdir()
    (d / "vendor").write_text("0x7acc\n")
    (d / "power" / "runtime_status").write_text("active\n")
    speed = {3: "8.0", 4: "16.0", 5: "32.0"}[gen]
    for k, v in {"link_speed": f"{speed} GT/s PCIe", "link_width": width,
                 "max_payload_bytes": 256, "max_read_request_bytes": 512,
                 "clock_hz": 1_000_000_000}.items():
        (d / "tacc" / k).write_text(f"{v}\n")
    (d / "tacc" / "clock_sync").write_text("100 1000 110\n200 1100 205\n")
    cat = hw.counter_catalogue(with_global=vf == 0)
    (d / "counters" / "catalogue").write_text(cat)
    if vf == 0:
        (d / "global_counters").mkdir()
    set_values(d, values or {})
    return d


def set_values(dev: Path, values: dict[str, int]) -> None:
    for line in (dev / "counters" / "catalogue").read_text().splitlines()[1:]:
        name, _, _, scope = line.split()[:4]
        sub = "global_counters" if scope == "global" else "counters"
        (dev / sub / name).write_text(f"{values.get(name, 0)}\n")
