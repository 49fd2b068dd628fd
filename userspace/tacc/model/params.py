"""The device model's parameters: one table equal to ``-device tacc``'s property defaults
(tests/host/test_model.py reads them from the built QEMU)."""

from __future__ import annotations

from dataclasses import dataclass, field

# ``-device tacc`` property -> default (qemu/hw/tacc/tacc-pci.c): the model's parameters.
# Debug (x-) and generic PCI properties are not the model's.
QEMU_DEFAULTS: dict[str, int | bool] = {
    "devmem-size": 256 << 20,
    "link-gen": 4,
    "link-width": 16,
    "mps": 256,
    "mrrs": 512,
    "rcb": 64,
    "tags": 32,
    "posted-credits": 1024,
    # the root port's posted header credits: Intel's IIO advertises 64 for an x16 port
    # (Xeon C5500/C3500 datasheet, vol. 1, table 76, "Posted Request Header Credits")
    "posted-hdr-credits": 64,
    "link-ctrl-cost": True,
    "aspm-l0s-entry-ns": 1000,
    "aspm-l0s-exit-ns": 256,
    "aspm-l1-entry-ns": 10000,
    "aspm-l1-exit-ns": 2000,
    "l1ss": True,
    "l1ss-cm-restore-us": 10,
    "l1ss-t-power-on-us": 10,
    "aspm-l11-exit-ns": 4000,
    "ltr-latency-ns": 1_000_000,
    "tlb-entries": 128,
    "cmd-latency-ns": 100,
    "read-latency-ns": 600,
    "write-latency-ns": 200,
    "walk-latency-ns": 500,
    "compute-gflops": 7575,  # fp32, one compute engine
    "bf16-gflops": 30250,  # GEMMs with bf16 A and B
    "devmem-gbps": 300,
    "sriov-max-vfs": 4,
}


def _p(name: str) -> int:
    return int(QEMU_DEFAULTS[name])


@dataclass(frozen=True)
class DeviceParams:
    """The parameters the model computes with (defaults: the QEMU device's)."""

    link_gen: int = _p("link-gen")
    link_width: int = _p("link-width")
    mps: int = _p("mps")
    mrrs: int = _p("mrrs")
    rcb: int = _p("rcb")
    tags: int = _p("tags")
    posted_credits: int = _p("posted-credits")
    posted_hdr_credits: int = _p("posted-hdr-credits")
    cmd_latency_ns: int = _p("cmd-latency-ns")
    read_latency_ns: int = _p("read-latency-ns")
    write_latency_ns: int = _p("write-latency-ns")
    walk_latency_ns: int = _p("walk-latency-ns")
    tlb_entries: int = _p("tlb-entries")
    devmem_gbps: int = _p("devmem-gbps")
    # peak arithmetic rate per data type, GFLOP/s (compute-gflops, bf16-gflops)
    peak_gflops: dict[str, float] = field(
        default_factory=lambda: {"fp32": float(_p("compute-gflops")),
                                 "bf16": float(_p("bf16-gflops"))})


DEFAULT = DeviceParams()
PEAK_GFLOPS = DEFAULT.peak_gflops
