"""The extras boot's virtio-tacc-pci (VIRTIO=1, docs/virtio.md) as the guest sees it.

The guest's virtio-pci binds the PCI function and registers virtio device 57, which
tacc.ko's frontend drives (tests/vm/test_virtio_frontend.py).  Checks what the spec
promises a guest: the modern-only PCI identity, the device ID, and the shared-memory BAR.
"""

from pathlib import Path

import pytest

PCI = Path("/sys/bus/pci/devices")


def _virtio_tacc() -> Path:
    for d in sorted(PCI.iterdir()):
        if (d / "vendor").read_text().strip() == "0x1af4" and \
                (d / "device").read_text().strip() == "0x1079":
            return d
    pytest.skip("no virtio-tacc-pci in this boot (VIRTIO=1 adds it; extras has it)")


def test_virtio_tacc_identity():
    d = _virtio_tacc()
    assert (d / "class").read_text().strip() == "0x120000"
    assert (d / "driver").resolve().name == "virtio-pci"
    [vdev] = [p for p in d.iterdir() if p.name.startswith("virtio")]
    assert (vdev / "device").read_text().strip() == "0x0039"  # 57
    # BAR 4: the shared-memory regions (fences 4 KiB at 0, counters 8 KiB at 8 KiB)
    bars = (d / "resource").read_text().splitlines()
    start, end, _ = (int(x, 16) for x in bars[4].split())
    assert end - start + 1 == 0x4000
