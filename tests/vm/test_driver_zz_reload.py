"""tacc.ko in the guest: unload/load loops with VFs 0 -> 4 -> 0 in between.

Runs last (file name): it unbinds every tacc device.  2 rounds normally,
20 with TACC_LONG=1.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from test_driver_basic import (
    OP_NOP,
    Cmd,
    Dev,
    dmesg_problems,
    leak_delta,
    leak_snapshot,
    live_objects,
    pf_sysfs,
    record_figures,
)

ROOT = Path(os.environ.get("TACC_ROOT", "/work/main"))
KO = ROOT / "build/modules" / os.uname().release / "tacc.ko"


def _sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, timeout=120)


def _wait_node(pci: Path, timeout: float = 20) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = sorted((pci / "accel").glob("accel*")) if (pci / "accel").exists() else []
        if nodes and Path("/dev/accel", nodes[0].name).exists():
            return Path("/dev/accel", nodes[0].name)
        time.sleep(0.1)
    raise TimeoutError(f"{pci.name}: no accel node")


def _rounds() -> int:
    return 20 if os.environ.get("TACC_LONG") else 2


@pytest.mark.skipif(not KO.exists(), reason=f"{KO} missing")
def test_reload_with_vfs():
    pci = pf_sysfs()
    before = leak_snapshot()
    t0 = time.monotonic()
    lives = []
    for _ in range(_rounds()):
        node = _wait_node(pci)
        with Dev(node) as d:
            assert d.run([Cmd(opcode=OP_NOP, tag=1)]) == 0
        (pci / "sriov_numvfs").write_text("4")
        vfs = sorted(p.resolve() for p in pci.glob("virtfn*"))
        assert len(vfs) == 4
        for vf in vfs:
            with Dev(_wait_node(vf)) as d:
                assert d.run([Cmd(opcode=OP_NOP, tag=2)]) == 0
        (pci / "sriov_numvfs").write_text("0")
        lo = live_objects(pci)
        lives.append(sum(lo.values()))
        assert not any(lo.values()), lo
        _sh("rmmod tacc")
        _sh(f"insmod {KO}")
    _wait_node(pci)
    record_figures("reload-long" if _rounds() > 2 else "reload",
                   {"rounds": _rounds(), "wall_s": round(time.monotonic() - t0, 1),
                    "live_objects_max_after_vf_disable": max(lives),
                    "leak_delta": leak_delta(before, leak_snapshot())})
    assert not dmesg_problems()
