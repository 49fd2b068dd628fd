"""In-guest test session (scripts/test-vm boots the VM once and runs this).

Shared fixtures for every tests/vm file: the PF's accel node, its PCI device
directory in sysfs, and the VM configuration name (strict, pt, lazy, off).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TACC_VENDOR = "0x7acc"


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("TACC_IN_VM"):
        pytest.exit("tests/vm runs inside the test VM: use `make test-vm`", returncode=4)


# Files that reload the module or remove the device run after everything else,
# in this order (pytest would otherwise order files by name).
LAST_FILES = ("test_driver_zz_reload.py", "test_driver_zzz_surprise.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def key(item: pytest.Item) -> int:
        name = item.path.name
        return LAST_FILES.index(name) + 1 if name in LAST_FILES else 0

    items.sort(key=key)  # stable: the rest keeps pytest's order
    if os.uname().release.endswith("-tacc-debug"):
        # the debug kernel runs the code for its checkers; its timing is not the product's
        # (the rules judged a 4x slower host "host bound", not link-saturated)
        lax = pytest.mark.xfail(strict=False, reason="timing, on the debug kernel")
        for item in items:
            if item.get_closest_marker("timing"):
                item.add_marker(lax)


def tacc_pci_devices() -> list[Path]:
    """PCI functions of the tacc device (PF first, then VFs), from sysfs."""
    devs = [p for p in Path("/sys/bus/pci/devices").iterdir()
            if (p / "vendor").read_text().strip() == TACC_VENDOR]
    return sorted(devs, key=lambda p: ((p / "physfn").exists(), p.name))


@pytest.fixture(scope="session")
def vm_config() -> str:
    return os.environ.get("TACC_VM_CONFIG", "strict")


@pytest.fixture(scope="session")
def pf_pci() -> Path:
    devs = [d for d in tacc_pci_devices() if not (d / "physfn").exists()]
    assert devs, "no tacc PF on the PCI bus"
    return devs[0]


@pytest.fixture(scope="session")
def pf_accel(pf_pci: Path) -> Path:
    nodes = sorted((pf_pci / "accel").glob("accel*")) if (pf_pci / "accel").exists() else []
    assert nodes, f"{pf_pci.name}: tacc.ko did not create an accel node"
    return Path("/dev/accel") / nodes[0].name


@pytest.fixture(scope="session")
def program() -> Iterator[Any]:
    """The one BPF program (accel-bpftrace / taccd capture engine) of the session: a bcc
    compile costs ~7 s of guest time, so tracing and end-to-end tests share it (each
    test re-attaches and resets it), and the tools the tests start load it from the
    compile cache (tacc.bpftrace.objcache) when an earlier compile of the boot kept it."""
    from tacc.bpftrace import preflight
    from tacc.bpftrace.program import Program

    root = preflight.all_checks(bcc=True)
    prog = Program(root, rb_pages=4096, host=True)
    yield prog
    prog.close()


# scripts/test-vm's IOMMU-mode passes: after a strict boot's own session, pytest runs the
# IOMMU_MODE_TESTS again with the PF's group switched to the default domain of another
# mode, instead of booting once per mode (a boot costs ~40 s of wall under TCG).  The
# whole-boot modes (iommu.strict=0, iommu=pt on the command line) boot for real in
# `make test-long` (scripts/test-vm LONG_CONFIGS).
DOMAIN_TYPES = ("DMA", "DMA-FQ", "identity")


@pytest.fixture(scope="session", autouse=True)
def iommu_domain() -> Iterator[str | None]:
    """``TACC_VM_DOMAIN``: the PF's IOMMU group type for this session (a test-vm pass);
    back to ``DMA`` (the strict boot's) at the end."""
    domain = os.environ.get("TACC_VM_DOMAIN")
    if not domain:
        yield None
        return
    assert domain in DOMAIN_TYPES, f"TACC_VM_DOMAIN={domain}: accepted: {DOMAIN_TYPES}"
    pf = next(d for d in tacc_pci_devices() if not (d / "physfn").exists())
    assert int((pf / "sriov_numvfs").read_text()) == 0, "domain passes need VFs off"
    before = (pf / "iommu_group" / "type").read_text().strip()
    from test_driver_basic import rebind

    rebind(pf, domain)
    yield domain
    rebind(pf, before)
