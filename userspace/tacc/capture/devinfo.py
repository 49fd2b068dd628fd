"""Device facts from meta.json: the functions and their links (the link's timing is
:mod:`tacc.model.link`'s)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tacc import model
from tacc.model.link import (
    DEFAULT_MRRS,
    DEFAULT_RCB,
    LINK_RATE_GTS,
    link_max_payload_bw,
    link_raw_bw,
)


@dataclass(frozen=True)
class Function:
    fid: int
    pci: str
    pf: str
    vf: int  # 0 = PF, n = VF n
    gen: int
    width: int
    mps: int
    clock_hz: float
    time_scale: float
    devmem: int
    mrrs: int = DEFAULT_MRRS
    rcb: int = DEFAULT_RCB
    # the capable link (LNKCAP): a link trained below it is degraded;
    # captures before minor 8 do not say: taken as the negotiated one
    max_gen: int = 0
    max_width: int = 0
    # "pf", "vf" or "virtio" (meta ``devices[].kind``, minor 9; older: from ``vf``)
    kind: str = ""
    # minor 12: the device's roofline (sysfs peak_*_gflops, devmem_gbps; 0 = not
    # reported: older captures, a device without TACC_CAP_ROOFLINE) and the version of
    # the trace records taccd asked for (3: FLOPs and bytes per command; 2 = older)
    peak_fp32_gflops: float = 0.0
    peak_bf16_gflops: float = 0.0
    devmem_gbps: float = 0.0
    trace_version: int = 2

    def model_params(self) -> model.DeviceParams:
        """tacc.model's parameters with this device's reported peaks (the model's defaults
        where it reports none)."""
        peaks = dict(model.DEFAULT.peak_gflops)
        if self.peak_fp32_gflops > 0:
            peaks["fp32"] = self.peak_fp32_gflops
        if self.peak_bf16_gflops > 0:
            peaks["bf16"] = self.peak_bf16_gflops
        return dataclasses.replace(
            model.DEFAULT, peak_gflops=peaks,
            devmem_gbps=int(self.devmem_gbps) if self.devmem_gbps > 0
            else model.DEFAULT.devmem_gbps)

    @property
    def has_roofline(self) -> bool:
        """The capture reports the device's peaks (else tacc.model's defaults stand in)."""
        return self.peak_fp32_gflops > 0 and self.devmem_gbps > 0

    def ridge(self, dtype: str = "fp32") -> float:
        """FLOP/byte where a command stops being memory-bound: peak of ``dtype`` (a GEMM
        with bf16 operands: the bf16 peak) over the device-memory bandwidth."""
        p = self.model_params()
        return p.peak_gflops[dtype] / p.devmem_gbps

    @property
    def name(self) -> str:
        """The PCI address, with the kind of a function that is not a PF."""
        if self.kind == "virtio":
            return f"{self.pci} (virtio)"
        return self.pci if self.vf == 0 else f"{self.pci} (VF{self.vf})"

    # time_scale: the device's modelled-time factor (QOM ``time-scale`` / 1000): every
    # modelled duration is multiplied by it, so the link moves 1/time_scale of its
    # nominal bandwidth per (virtual) second.  The maxima below are per second of the
    # capture's clock, i.e. already divided by time_scale.
    @property
    def max_payload_bw(self) -> float:
        """The lower (D2H) of the two directions' maxima (see ``max_bw``)."""
        return link_max_payload_bw(self.gen, self.width, self.mps, None, self.mrrs,
                                   self.rcb) / self.time_scale

    def max_bw(self, direction: str) -> float:
        """Modelled maximum payload bandwidth of ``"h2d"`` or ``"d2h"``, bytes/s; 0 when
        the link is not known (a VF described from its hotplug event: no LINK_STATUS)."""
        if self.gen not in LINK_RATE_GTS or not self.width:
            return 0.0
        return link_max_payload_bw(self.gen, self.width, self.mps, direction, self.mrrs,
                                   self.rcb) / self.time_scale

    @property
    def raw_bw(self) -> float:
        """Link bytes per second of one direction (TLP headers included), time-scaled."""
        return link_raw_bw(self.gen, self.width) / self.time_scale


def function_from_desc(fid: int, d: dict[str, Any], meta: dict[str, Any]) -> Function:
    """One function from its description (a ``devices`` entry of meta.json)."""
    link = d.get("link", {})
    return Function(
        fid=fid,
        pci=str(d.get("pci", f"func{fid}")),
        pf=str(d.get("pf", d.get("pci", f"func{fid}"))),
        vf=int(d.get("vf", 0)),
        gen=int(link.get("gen", 4)),
        width=int(link.get("width", 16)),
        mps=int(link.get("mps", 256)),
        clock_hz=float(d.get("clock_hz", 1e9)),
        time_scale=float(d.get("time_scale", meta.get("time_scale", 1.0)) or 1.0),
        devmem=int(d.get("devmem", 0)),
        mrrs=int(link.get("mrrs", DEFAULT_MRRS)),
        rcb=int(link.get("rcb", DEFAULT_RCB)),
        max_gen=int(link.get("max_gen", link.get("gen", 4))),
        max_width=int(link.get("max_width", link.get("width", 16))),
        kind=str(d.get("kind") or ("vf" if int(d.get("vf", 0)) else "pf")),
        peak_fp32_gflops=float(d.get("peak_fp32_gflops", 0) or 0),
        peak_bf16_gflops=float(d.get("peak_bf16_gflops", 0) or 0),
        devmem_gbps=float(d.get("devmem_gbps", 0) or 0),
        trace_version=int(d.get("trace_version", 2) or 2),
    )


def functions_from_meta(meta: dict[str, Any]) -> list[Function]:
    return [function_from_desc(i, d, meta) for i, d in enumerate(meta.get("devices", []))]

