"""The guest kernel's ``aer_inject`` module (CONFIG_PCIEAER_INJECT, Debian: =m).

A write of ``struct aer_error_inj`` (drivers/pci/pcie/aer_inject.c, 32 bytes) to
``/dev/aer_inject`` makes the kernel believe a device logged the given AER status: the
module installs its own config accessors on the device's and its root port's buses
(they answer the AER capability's status registers from the injected record, everything
else from the hardware), sets the root port's Root Error Status and raises the AER
service's interrupt.  The AER core then logs, counts (sysfs ``aer_dev_*``) and recovers
as for a real error.  Unlike QEMU's ``pcie_aer_inject_error`` nothing reaches the device
model: its AER capability stays clean.  The accessors stay installed until the module
is unloaded, so ``loaded()`` unloads it again when it loaded it.

    python -m tacc.testing.aer_inject 0000:01:00.0 --cor BAD_TLP
    python -m tacc.testing.aer_inject 0000:01:00.0 --uncor COMP_TIME --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEV = Path("/dev/aer_inject")
PCI_REGS_H = Path("/usr/include/linux/pci_regs.h")

# struct aer_error_inj { u8 bus, dev, fn; u32 uncor_status, cor_status,
# header_log0..3, domain; } -- natural alignment: one pad byte after fn
AER_ERROR_INJ = struct.Struct("<3BxIIIIIII")

# <linux/pci_regs.h> PCI_ERR_UNC_* / PCI_ERR_COR_* -> the names aer_inject's tool and
# QEMU's HMP pcie_aer_inject_error use (the values come from the header, below)
HEADER_NAMES = {"UNC_DLP": "DLP", "UNC_SURPDN": "SDN", "UNC_POISON_TLP": "POISON_TLP",
                "UNC_FCP": "FCP", "UNC_COMP_TIME": "COMP_TIME",
                "UNC_COMP_ABORT": "COMP_ABORT", "UNC_UNX_COMP": "UNX_COMP",
                "UNC_RX_OVER": "RX_OVER", "UNC_MALF_TLP": "MALF_TLP", "UNC_ECRC": "ECRC",
                "UNC_UNSUP": "UNSUP", "UNC_ACSV": "ACSV", "UNC_INTN": "INTN",
                "COR_RCVR": "RCVR", "COR_BAD_TLP": "BAD_TLP", "COR_BAD_DLLP": "BAD_DLLP",
                "COR_REP_ROLL": "REP_ROLL", "COR_REP_TIMER": "REP_TIMER",
                "COR_ADV_NFAT": "ADV_NONFATAL", "COR_INTERNAL": "INTERNAL",
                "COR_LOG_OVER": "HL_OVERFLOW"}


def header_bits(path: Path = PCI_REGS_H) -> tuple[dict[str, int], dict[str, int]]:
    """(uncorrectable, correctable) error bits of <linux/pci_regs.h> by name; empty
    when the header is not installed (names then fail, numbers still work)."""
    uncor: dict[str, int] = {}
    cor: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return uncor, cor
    for m in re.finditer(r"#define\s+PCI_ERR_(UNC|COR)_(\w+)\s+(0x[0-9a-fA-F]+)", text):
        name = HEADER_NAMES.get(f"{m.group(1)}_{m.group(2)}")
        if name:
            (uncor if m.group(1) == "UNC" else cor)[name] = int(m.group(3), 16)
    return uncor, cor


UNCOR, COR = header_bits()

_BDF = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")


def parse_bdf(name: str) -> tuple[int, int, int, int]:
    """'0000:01:00.0' (or '01:00.0') -> (domain, bus, device, function)."""
    m = _BDF.match(name)
    if not m:
        raise ValueError(f"not a PCI address (DDDD:BB:DD.F): {name!r}")
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), \
        int(m.group(4))


def status_of(names: list[str] | tuple[str, ...], table: dict[str, int]) -> int:
    """A status word from error names or numbers ('BAD_TLP', '0x40')."""
    v = 0
    for n in names:
        if n.upper() in table:
            v |= table[n.upper()]
        else:
            try:
                v |= int(n, 0)
            except ValueError:
                raise ValueError(f"unknown error {n!r} (one of {', '.join(table)}, "
                                 "or a number)") from None
    return v


def pack(pci: str, uncor_status: int = 0, cor_status: int = 0,
         header: tuple[int, int, int, int] = (0, 0, 0, 0)) -> bytes:
    """The struct aer_error_inj record for the device at @pci."""
    domain, bus, dev, fn = parse_bdf(pci)
    return AER_ERROR_INJ.pack(bus, dev, fn, uncor_status, cor_status, *header, domain)


def inject(pci: str, uncor_status: int = 0, cor_status: int = 0,
           header: tuple[int, int, int, int] = (0, 0, 0, 0), dev: Path = DEV) -> None:
    """Injects one record; the module's errno (EINVAL: masked, ENODEV: no such device or
    no AER service on its root port, EPERM: not CAP_SYS_ADMIN) comes back as OSError."""
    if not uncor_status and not cor_status:
        raise ValueError("nothing to inject: give an uncorrectable or a correctable status")
    rec = pack(pci, uncor_status, cor_status, header)
    fd = os.open(dev, os.O_WRONLY)
    try:
        os.write(fd, rec)
    finally:
        os.close(fd)


def is_loaded() -> bool:
    return Path("/sys/module/aer_inject").exists()


@contextmanager
def loaded() -> Iterator[Path]:
    """aer_inject loaded for the block (modprobe), unloaded after it if it was not
    loaded before: its config accessors replace the buses' until it goes."""
    was = is_loaded()
    if not was:
        subprocess.run(["modprobe", "aer_inject"], check=True, capture_output=True)
    try:
        yield DEV
    finally:
        if not was:
            subprocess.run(["modprobe", "-r", "aer_inject"], check=True,
                           capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tacc.testing.aer_inject",
        description="Inject an AER error record with the kernel's aer_inject module "
                    "(loaded first if needed, and left loaded: `modprobe -r aer_inject` "
                    "restores the buses' config accessors).",
        epilog="examples:\n"
               "  python -m tacc.testing.aer_inject 0000:01:00.0 --cor BAD_TLP\n"
               "  python -m tacc.testing.aer_inject 01:00.0 --uncor COMP_TIME --json\n"
               f"uncorrectable: {' '.join(UNCOR)}\ncorrectable: {' '.join(COR)}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("device", help="PCI address, DDDD:BB:DD.F")
    ap.add_argument("--uncor", action="append", default=[], metavar="ERR",
                    help="uncorrectable error name or status number (repeatable)")
    ap.add_argument("--cor", action="append", default=[], metavar="ERR",
                    help="correctable error name or status number (repeatable)")
    ap.add_argument("--json", action="store_true", help="print what was injected as JSON")
    a = ap.parse_args(argv)
    try:
        uncor, cor = status_of(a.uncor, UNCOR), status_of(a.cor, COR)
        parse_bdf(a.device)
        if not is_loaded():
            subprocess.run(["modprobe", "aer_inject"], check=True, capture_output=True)
        inject(a.device, uncor, cor)
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"aer_inject: {e}", file=sys.stderr)
        return 1
    rec = {"device": a.device, "uncor_status": uncor, "cor_status": cor}
    print(json.dumps(rec) if a.json else
          f"injected uncor {uncor:#010x} cor {cor:#010x} into {a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
