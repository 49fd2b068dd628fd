"""Device facts from meta.json: functions, link model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LINK_RATE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
# docs/hardware.md section 9 (kernel/include/tacc_hw.h TACC_LINK_*): the ONE Python
# implementation of the device's PCIe link timing.  tacc.testing.taccdev.LinkModel,
# tacc.counters (share of the link max), tacc analyze and tacc timeline all use it;
# tests/host/test_capture_layout.py checks the constants against tacc_hw.h.
LINK_ENC_NUM, LINK_ENC_DEN = 128, 130  # 128b/130b (Gen3+)
LINK_MWR_OVERHEAD = 24  # per memory-write TLP (D2H payload): STP+seq 4, 4DW header, LCRC 4
LINK_CPL_OVERHEAD = 20  # per completion-with-data TLP (H2D payload): 3DW header
LINK_MRD_BYTES = 24  # per memory-read request TLP (upstream, H2D)
TLP_OVERHEAD_BYTES = LINK_MWR_OVERHEAD  # the larger of the two (default when no direction)
TLP_OVERHEAD_BY_DIR = {"h2d": LINK_CPL_OVERHEAD, "d2h": LINK_MWR_OVERHEAD}


def _enc(gen: int) -> float:
    return LINK_ENC_NUM / LINK_ENC_DEN if int(gen) >= 3 else 8.0 / 10.0


def t_link_ps(nbytes: int, gen: int, width: int) -> int:
    """Modelled time of ``nbytes`` link bytes on one direction, picoseconds (exact ceil):
    ``ceil(bytes * 8 * 130 * 1000 / (lanes * rate_GT * 128))``."""
    rate = LINK_RATE_GTS[int(gen)]
    if int(gen) >= 3:
        den = int(width) * int(rate) * LINK_ENC_NUM
        return -(-int(nbytes) * 8 * LINK_ENC_DEN * 1000 // den)
    return int(np.ceil(nbytes * 8 * 1000 / (width * rate * 0.8)))


def payload_tlps(n, mps: int, host_off: int = 0, dev_off: int = 0):
    """Payload TLPs of a transfer of ``n`` bytes (docs/hardware.md section 9, "PCIe link").

    The DMA engine cuts ``[0, n)`` at every ``x`` in ``(0, n)`` where the device-side
    address ``dev_off + x`` or the host-side address ``host_off + x`` is a multiple of
    ``mps``; each piece is one TLP.  Only the offsets modulo ``mps`` matter.  Aligned
    (both offsets 0 modulo ``mps``) this is ``ceil(n / mps)``.  ``n`` may be an int or
    a numpy integer array (0 bytes = 0 TLPs).
    """
    mps = int(mps)
    h, d = int(host_off) % mps, int(dev_off) % mps
    if isinstance(n, np.ndarray):
        m = np.maximum(n.astype(np.int64), 1)
        t = 1 + (d + m - 1) // mps + (0 if h == d else (h + m - 1) // mps)
        return np.where(n > 0, t, 0)
    n = int(n)
    if n <= 0:
        return 0
    # cuts(off) = #{x in (0, n): (off + x) % mps == 0} = (off + n - 1) // mps for off < mps;
    # the two sets of cuts coincide when h == d and are disjoint otherwise
    return 1 + (d + n - 1) // mps + (0 if h == d else (h + n - 1) // mps)


def h2d_link_bytes(
    n: int, mps: int, mrrs: int, host_off: int = 0, dev_off: int = 0
) -> tuple[int, int, int]:
    """(down, up, tlps) link bytes of a host read of ``n`` payload bytes (COPY_H2D) from
    host-side offset ``host_off`` to device-side offset ``dev_off``: completions
    (``payload_tlps``) downstream, read requests (``ceil(n / mrrs)``) upstream."""
    cpl = payload_tlps(n, mps, host_off, dev_off)
    return int(n) + cpl * LINK_CPL_OVERHEAD, -(-int(n) // int(mrrs)) * LINK_MRD_BYTES, cpl


def d2h_link_bytes(n: int, mps: int, host_off: int = 0, dev_off: int = 0) -> tuple[int, int]:
    """(up, tlps) link bytes of a host write of ``n`` payload bytes (COPY_D2H) from
    device-side offset ``dev_off`` to host-side offset ``host_off``."""
    tlps = payload_tlps(n, mps, host_off, dev_off)
    return int(n) + tlps * LINK_MWR_OVERHEAD, tlps


def link_raw_bw(gen: int, width: int) -> float:
    """Link bytes per second of one direction after line encoding (TLP headers included)."""
    return width * LINK_RATE_GTS.get(int(gen), 16.0) * 1e9 * _enc(gen) / 8.0


def link_max_payload_bw(gen: int, width: int, mps: int, direction: str | None = None) -> float:
    """Modelled maximum payload bandwidth of one link direction, bytes per second.

    lanes * rate(GT/s) * 128/130 / 8 * MPS / (MPS + overhead), overhead = 20 bytes per
    completion (``direction="h2d"``) or 24 per memory write (``"d2h"``, and the default):
    the limit of ``t_link_ps`` of ``h2d_link_bytes`` / ``d2h_link_bytes`` for large
    transfers (the read requests of H2D use the other direction).
    """
    over = TLP_OVERHEAD_BY_DIR[direction] if direction else TLP_OVERHEAD_BYTES
    return link_raw_bw(gen, width) * mps / (mps + over)


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

    # time_scale: the device's modelled-time factor (QOM ``time-scale`` / 1000): every
    # modelled duration is multiplied by it, so the link moves 1/time_scale of its
    # nominal bandwidth per (virtual) second.  The maxima below are per second of the
    # capture's clock, i.e. already divided by time_scale.
    @property
    def max_payload_bw(self) -> float:
        """The lower (D2H) of the two directions' maxima (see ``max_bw``)."""
        return link_max_payload_bw(self.gen, self.width, self.mps) / self.time_scale

    def max_bw(self, direction: str) -> float:
        """Modelled maximum payload bandwidth of ``"h2d"`` or ``"d2h"``, bytes/s."""
        return link_max_payload_bw(self.gen, self.width, self.mps, direction) / self.time_scale

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
    )


def functions_from_meta(meta: dict[str, Any]) -> list[Function]:
    return [function_from_desc(i, d, meta) for i, d in enumerate(meta.get("devices", []))]

