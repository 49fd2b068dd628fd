"""A PCI function's PCIe capability registers, read from its sysfs ``config`` file (root
reads all of it), for in-guest tests."""

from __future__ import annotations

import struct
from pathlib import Path

PCI_CAP_ID_EXP = 0x10
DEVCTL, LNKCTL, DEVCTL2 = 0x08, 0x10, 0x28  # offsets in the PCIe capability


def pcie_word(dev: Path, reg: int) -> int:
    """The 16-bit register at ``reg`` of ``dev``'s PCIe capability."""
    cfg = (dev / "config").read_bytes()
    p = cfg[0x34]
    while p:
        if cfg[p] == PCI_CAP_ID_EXP:
            return int(struct.unpack_from("<H", cfg, p + reg)[0])
        p = cfg[p + 1]
    raise AssertionError(f"{dev.name}: no PCIe capability")
