"""tacc.model's parameter table equals the QEMU device's property defaults (read from the
built QEMU), and its command timing is the roofline docs/hardware.md describes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from tacc import model
from tacc.model import link as linkmodel
from tacc.testing.taccdev import LinkModel

ROOT = Path(__file__).resolve().parents[2]
QEMU = ROOT / "build/qemu/qemu-system-x86_64"
GENERIC = {"acpi-index", "addr", "busnr", "failover_pair_id", "multifunction", "rombar",
           "romfile", "romsize", "time-scale"}


def qemu_defaults() -> dict[str, str]:
    out = subprocess.run([str(QEMU), "-device", "tacc,help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    props = {}
    for line in out.splitlines():
        m = re.match(r"\s+([\w-]+)=<\w+>\s*(?:-.*?\(default: (.*)\))?\s*$", line)
        if m:
            props[m.group(1)] = m.group(2)
    return props


@pytest.mark.skipif(not QEMU.exists(), reason="QEMU not built (make setup)")
def test_parameters_equal_qemu_defaults() -> None:
    q = qemu_defaults()
    ours = {k for k, v in q.items() if not k.startswith("x-") and k not in GENERIC}
    assert ours == set(model.QEMU_DEFAULTS), ours ^ set(model.QEMU_DEFAULTS)
    for k, v in model.QEMU_DEFAULTS.items():
        want = ("on" if v else "off") if isinstance(v, bool) else str(v)
        assert q[k] == want, (k, q[k], v)


def test_users_take_the_model_parameters() -> None:
    p = model.DEFAULT
    lm = LinkModel()
    assert (lm.gen, lm.width, lm.mps, lm.mrrs, lm.rcb, lm.tags) == (
        p.link_gen, p.link_width, p.mps, p.mrrs, p.rcb, p.tags)
    assert (lm.cmd_ns, lm.rd_ns, lm.wr_ns, lm.walk_ns) == (
        p.cmd_latency_ns, p.read_latency_ns, p.write_latency_ns, p.walk_latency_ns)
    assert (linkmodel.DEFAULT_MRRS, linkmodel.DEFAULT_POSTED_HDR_CREDITS,
            linkmodel.DEFAULT_READ_NS) == (p.mrrs, p.posted_hdr_credits, p.read_latency_ns)


def test_roofline() -> None:
    p = model.DEFAULT
    # compute bound: 512^3 GEMM, 2*512^3 FLOP at 7575 GFLOP/s (fp32), 30250 (bf16), +100
    assert model.gemm_ns(512, 512, 512) == 100 + int(2 * 512**3 / 7575)
    assert model.gemm_ns(512, 512, 512, "bf16", 2) == 100 + int(2 * 512**3 / 30250)
    # memory bound: 1 FLOP over 3 MB of device memory at 300 GB/s = 10000 ns
    assert model.compute_ns(1, 3_000_000) == p.cmd_latency_ns + 10_000
    with pytest.raises(KeyError):
        model.compute_ns(1, 0, "int4")
