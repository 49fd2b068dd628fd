"""In-guest: discovery of PF and VFs with pyudev, contexts on VFs, the hotplug watch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tacc.runtime import Context, HotplugWatch, devices
from tacc.runtime.device import HotplugEvent


def _set_numvfs(pf: Path, n: int) -> None:
    (pf / "sriov_numvfs").write_text(f"{n}\n")


def test_hotplug_watch_sees_vfs_come_and_go(pf_pci: Path) -> None:
    if int((pf_pci / "sriov_numvfs").read_text()) != 0:
        pytest.skip("VFs already enabled in this configuration")
    events: list[HotplugEvent] = []
    with HotplugWatch() as w:
        t = threading.Thread(target=lambda: (_set_numvfs(pf_pci, 2), time.sleep(0.5),
                                             _set_numvfs(pf_pci, 0)))
        t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ev = w.poll(1.0)
            if ev is not None:
                events.append(ev)
            removed = [e for e in events if e.subsystem == "accel" and e.action == "remove"]
            if len(removed) >= 2:
                break
        t.join()
    added = [e for e in events if e.subsystem == "accel" and e.action == "add"]
    removed = [e for e in events if e.subsystem == "accel" and e.action == "remove"]
    assert len(added) == 2 and len(removed) == 2, events
    assert {e.pci for e in added} == {e.pci for e in removed}
    assert all(e.device is None or (e.device.is_vf and e.device.pf == pf_pci.name)
               for e in added)


def test_vfs_listed_and_usable(pf_pci: Path) -> None:
    enabled_here = False
    if int((pf_pci / "sriov_numvfs").read_text()) == 0:
        _set_numvfs(pf_pci, 2)
        enabled_here = True
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            vfs = [d for d in devices() if d.is_vf]
            if vfs:
                break
            time.sleep(0.2)
        assert vfs, "no VF accel node appeared"
        pf = devices()[0]
        assert not pf.is_vf
        for vf in vfs:
            assert vf.pf == pf.pci and vf.function >= 1 and vf.devmem_bytes > 0
        a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
        with Context(vfs[0].pci) as ctx:
            assert ctx.device.is_vf
            da = ctx.to_device(a)
            dc = ctx.device_buffer((64, 64))
            s = ctx.stream()
            s.gemm(da, da, dc)
            np.testing.assert_allclose(ctx.to_numpy(dc), a.astype(np.float64) @ a, rtol=1e-5)
    finally:
        if enabled_here:
            _set_numvfs(pf_pci, 0)
