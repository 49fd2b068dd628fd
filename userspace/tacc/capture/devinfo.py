"""Device facts from meta.json: functions, link model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LINK_RATE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
TLP_OVERHEAD_BYTES = 24  # header + framing per TLP (the model's constant)
# Per payload TLP, by direction (tacc_hw.h TACC_LINK_CPL_OVERHEAD / _MWR_OVERHEAD):
# H2D payload arrives in completions (3 DW header), D2H leaves in memory writes (4 DW).
TLP_OVERHEAD_BY_DIR = {"h2d": 20, "d2h": 24}


def link_max_payload_bw(gen: int, width: int, mps: int, direction: str | None = None) -> float:
    """Modelled maximum payload bandwidth of one link direction, bytes per second.

    lanes * rate(GT/s) * 128/130 / 8 * MPS / (MPS + overhead), overhead = 20 bytes per
    completion (``direction="h2d"``) or 24 per memory write (``"d2h"``, and the default).
    The one place to align with docs/hardware.md's bandwidth formula (also used by
    tacc.counters for "share of the link's modelled max").
    """
    rate = LINK_RATE_GTS.get(int(gen), 16.0) * 1e9
    enc = 128.0 / 130.0 if int(gen) >= 3 else 8.0 / 10.0
    over = TLP_OVERHEAD_BY_DIR[direction] if direction else TLP_OVERHEAD_BYTES
    return width * rate * enc / 8.0 * mps / (mps + over)


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

    @property
    def name(self) -> str:
        return self.pci if self.vf == 0 else f"{self.pci} (VF{self.vf})"

    @property
    def max_payload_bw(self) -> float:
        return link_max_payload_bw(self.gen, self.width, self.mps)


def functions_from_meta(meta: dict[str, Any]) -> list[Function]:
    out = []
    for i, d in enumerate(meta.get("devices", [])):
        link = d.get("link", {})
        out.append(
            Function(
                fid=i,
                pci=str(d.get("pci", f"func{i}")),
                pf=str(d.get("pf", d.get("pci", f"func{i}"))),
                vf=int(d.get("vf", 0)),
                gen=int(link.get("gen", 4)),
                width=int(link.get("width", 16)),
                mps=int(link.get("mps", 256)),
                clock_hz=float(d.get("clock_hz", 1e9)),
                time_scale=float(d.get("time_scale", meta.get("time_scale", 1.0))),
                devmem=int(d.get("devmem", 0)),
            )
        )
    return out


def link_raw_bw(gen: int, width: int) -> float:
    """Link bytes per second of one direction after line encoding (TLP headers included)."""
    rate = LINK_RATE_GTS.get(int(gen), 16.0) * 1e9
    enc = 128.0 / 130.0 if int(gen) >= 3 else 8.0 / 10.0
    return width * rate * enc / 8.0
