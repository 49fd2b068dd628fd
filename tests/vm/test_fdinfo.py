"""In the extras boot (a PF, two VFs, the virtio-tacc function): each kind's accel file
shows fdinfo by the rules of the kernel's drm-usage-stats.rst (tacc.fdinfo.parse): the
engines' busy ns, drm-total-memory and drm-resident-memory from drm_show_memory_stats,
no deprecated or non-standard drm- key; the figures follow the client's work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tacc.fdinfo import parse
from tacc.runtime import Context, devices


def _kinds() -> list[str]:
    try:
        have = {d.kind for d in devices()}
    except OSError:
        have = set()
    return [k for k in ("pf", "vf", "virtio") if k in have]


@pytest.mark.parametrize("kind", _kinds())
def test_fdinfo_follows_drm_usage_stats(kind: str) -> None:
    dev = next(d for d in devices() if d.kind == kind)
    with Context(dev) as ctx:
        fd = ctx.backend.fd
        before = parse(Path(f"/proc/self/fdinfo/{fd}").read_text())
        a = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB
        d = ctx.to_device(a)
        back = ctx.to_numpy(d)
        ctx.synchronize()
        np.testing.assert_array_equal(back, a)
        info = parse(Path(f"/proc/self/fdinfo/{fd}").read_text())
        assert info.driver == "tacc"
        if kind != "virtio":
            assert info.pdev == dev.pci
        assert info.engines and set(info.engines) <= {f"queue{i}" for i in range(4)}
        busy = sum(info.engines.values()) - sum(before.engines.values())
        assert busy > 0, info.engines  # the copies kept a queue busy
        mem = info.memory["memory"]
        # the 1 MiB device buffer (and the staging host buffers) are the client's
        assert mem["total"] >= 1 << 20 and mem["resident"] >= 1 << 20, mem
        assert mem["total"] - before.memory["memory"]["total"] >= 1 << 20
        assert int(info.other["tacc-memory-device"].split()[0]) >= 1024
        jobs = sum(int(v) for k, v in info.other.items() if k.startswith("tacc-jobs-queue"))
        assert jobs >= 2
