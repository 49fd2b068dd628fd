"""Device facts from meta.json: functions, link model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from tacc import hw, model

LINK_RATE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
# docs/hardware.md section 9 (kernel/include/tacc_hw.h TACC_LINK_*): the ONE Python
# implementation of the device's PCIe link timing.  tacc.testing.taccdev.LinkModel,
# tacc.counters (share of the link max), tacc analyze and tacc timeline all use it;
# The constants are tacc.hw's (generated from tacc_hw.h).
LINK_ENC_NUM, LINK_ENC_DEN = hw.TACC_LINK_ENC_NUM, hw.TACC_LINK_ENC_DEN  # 128b/130b (Gen3+)
LINK_SKP_INTERVAL = hw.TACC_LINK_SKP_INTERVAL  # data blocks per SKP ordered set
LINK_MWR_OVERHEAD = hw.TACC_LINK_MWR_OVERHEAD  # per memory-write TLP (D2H payload)
LINK_CPL_OVERHEAD = hw.TACC_LINK_CPL_OVERHEAD  # per completion-with-data TLP (H2D payload)
LINK_MRD_BYTES = hw.TACC_LINK_MRD_BYTES  # per memory-read request TLP (upstream, H2D)
LINK_DLLP_BYTES = hw.TACC_LINK_DLLP_BYTES  # ACK or UpdateFC DLLP
LINK_ACK_TLPS = hw.TACC_LINK_ACK_TLPS  # TLPs acknowledged per ACK DLLP
LINK_FC_TLPS = hw.TACC_LINK_FC_TLPS  # TLPs whose credits one UpdateFC returns
LINK_RD_BOUNDARY = hw.TACC_LINK_RD_BOUNDARY  # a read request never crosses it
LINK_FC_UNIT = hw.TACC_LINK_FC_UNIT  # bytes per flow-control data credit
LINK_MSI_BYTES = hw.TACC_LINK_MSI_BYTES  # an MSI-X message: one 4-byte memory write
TLP_OVERHEAD_BYTES = LINK_MWR_OVERHEAD  # the larger of the two (default when no direction)
TLP_OVERHEAD_BY_DIR = {"h2d": LINK_CPL_OVERHEAD, "d2h": LINK_MWR_OVERHEAD}
# the QEMU device's defaults of the parameters the link model reads (tacc.model)
DEFAULT_MRRS, DEFAULT_RCB, DEFAULT_TAGS = model.DEFAULT.mrrs, model.DEFAULT.rcb, model.DEFAULT.tags
DEFAULT_POSTED_CREDITS = model.DEFAULT.posted_credits
DEFAULT_POSTED_HDR_CREDITS = model.DEFAULT.posted_hdr_credits
DEFAULT_READ_NS = model.DEFAULT.read_latency_ns
DEFAULT_WRITE_NS = model.DEFAULT.write_latency_ns
H2D, D2H = "h2d", "d2h"


def _enc(gen: int) -> float:
    return LINK_ENC_NUM / LINK_ENC_DEN if int(gen) >= 3 else 8.0 / 10.0


def t_link_ps(nbytes: int, gen: int, width: int) -> int:
    """Modelled time of ``nbytes`` link bytes on one direction, picoseconds (exact ceil),
    SKP ordered sets included (one block per ``LINK_SKP_INTERVAL``):
    ``ceil(bytes * 8 * 130 * 1000 * 371 / (lanes * rate_GT * 128 * 370))``."""
    rate = LINK_RATE_GTS[int(gen)]
    if int(gen) >= 3:
        den = int(width) * int(rate) * LINK_ENC_NUM * LINK_SKP_INTERVAL
        num = 8 * LINK_ENC_DEN * 1000 * (LINK_SKP_INTERVAL + 1)
        return -(-int(nbytes) * num // den)
    return int(np.ceil(nbytes * 8 * 1000 / (width * rate * 0.8)))


def _cuts(off: int, n: int, period: int) -> int:
    """#{x in (0, n): (off + x) % period == 0}."""
    return (int(off) % period + int(n) - 1) // period if n > 0 else 0


def payload_tlps(n, mps: int, host_off: int = 0, dev_off: int = 0):
    """Memory-write TLPs of a host write (COPY_D2H) of ``n`` bytes (docs/hardware.md
    section 9, "PCIe link").

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
    # the two sets of cuts coincide when h == d and are disjoint otherwise
    return 1 + _cuts(d, n, mps) + (0 if h == d else _cuts(h, n, mps))


def read_requests(n: int, mrrs: int, host_off: int = 0) -> int:
    """Read requests of a host read of ``n`` bytes from host offset ``host_off``: MRRS
    bytes each from the start of the transfer, never across a 4 KiB boundary of the host
    address (4 KiB cuts fall on MRRS cuts exactly when ``host_off`` is MRRS-aligned)."""
    n, h = int(n), int(host_off) % LINK_RD_BOUNDARY
    if n <= 0:
        return 0
    return 1 + (n - 1) // mrrs + (_cuts(h, n, LINK_RD_BOUNDARY) if h % mrrs else 0)


def completions(n: int, mrrs: int, rcb: int, host_off: int = 0) -> int:
    """Completions of those requests: the root port cuts each request's data at its Read
    Completion Boundary (``rcb``-aligned host addresses), so ``[0, n)`` is cut at every
    RCB boundary of the host address and at every request boundary."""
    n, h = int(n), int(host_off) % rcb
    if n <= 0:
        return 0
    return 1 + _cuts(h, n, rcb) + ((n - 1) // mrrs if h else 0)


@dataclass(frozen=True)
class LinkCount:
    """Link traffic of (a prefix of) a transfer; index 0 = down (H2D), 1 = up (D2H)."""

    tlps: tuple[int, int]
    dllp: tuple[int, int]
    bytes: tuple[int, int]

    def __sub__(self, o: LinkCount) -> LinkCount:
        def sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return a[0] - b[0], a[1] - b[1]
        return LinkCount(sub(self.tlps, o.tlps), sub(self.dllp, o.dllp),
                         sub(self.bytes, o.bytes))


def link_prefix(kind: str, n: int, mps: int, mrrs: int = DEFAULT_MRRS,
                rcb: int = DEFAULT_RCB, host_off: int = 0, dev_off: int = 0) -> LinkCount:
    """The link traffic of the first ``n`` payload bytes of a host read (``"h2d"``:
    completions down, read requests up) or host write (``"d2h"``: memory writes up), with
    the DLLPs that acknowledge them and return their credits (tacc-model.c
    ``tacc_link_prefix``)."""
    def acks(t: int) -> int:
        return -(-t // LINK_ACK_TLPS)

    def fcs(t: int) -> int:
        return -(-t // LINK_FC_TLPS)
    n = int(n)
    if kind == H2D:
        req = read_requests(n, mrrs, host_off)
        cpl = completions(n, mrrs, rcb, host_off)
        tl, dl = (cpl, req), (acks(req) + fcs(req), acks(cpl))
        by = [n + cpl * LINK_CPL_OVERHEAD, req * LINK_MRD_BYTES]
    else:
        w = payload_tlps(n, mps, host_off, dev_off)
        tl, dl = (0, w), (acks(w) + fcs(w), 0)
        by = [0, n + w * LINK_MWR_OVERHEAD]
    return LinkCount(tl, dl, (by[0] + dl[0] * LINK_DLLP_BYTES, by[1] + dl[1] * LINK_DLLP_BYTES))


def copy_tlps(n, h2d: bool, mps: int, mrrs: int = DEFAULT_MRRS, rcb: int = DEFAULT_RCB,
              host_off: int = 0, dev_off: int = 0):
    """The payload TLPs a copy's trace record reports (``tlps``): the completions of a
    host read (H2D), the memory writes of a host write (D2H).  ``n`` may be a numpy
    array (aligned buffers only)."""
    if isinstance(n, np.ndarray):
        if h2d:
            if host_off % rcb:
                raise ValueError("arrays: aligned host buffers only")
            return np.where(n > 0, -(-n.astype(np.int64) // rcb), 0)
        return payload_tlps(n, mps, host_off, dev_off)
    if h2d:
        return completions(n, mrrs, rcb, host_off)
    return payload_tlps(n, mps, host_off, dev_off)


def h2d_link_bytes(
    n: int, mps: int, mrrs: int, host_off: int = 0, dev_off: int = 0, rcb: int = DEFAULT_RCB
) -> tuple[int, int, int]:
    """(down, up, completions) link bytes of a host read of ``n`` payload bytes (COPY_H2D)
    from host-side offset ``host_off``: completions and the root port's DLLPs downstream,
    read requests and the device's ACKs upstream.  ``mps`` and ``dev_off`` do not matter
    (the root port cuts completions at its RCB); kept for a uniform signature."""
    c = link_prefix(H2D, n, mps, mrrs, rcb, host_off, dev_off)
    return c.bytes[0], c.bytes[1], c.tlps[0]


def d2h_link_bytes(n: int, mps: int, host_off: int = 0, dev_off: int = 0) -> tuple[int, int]:
    """(up, tlps) link bytes of a host write of ``n`` payload bytes (COPY_D2H) from
    device-side offset ``dev_off`` to host-side offset ``host_off`` (the root port's ACK and
    UpdateFC DLLPs downstream: ``link_prefix("d2h", ...).bytes[0]``)."""
    c = link_prefix(D2H, n, mps, host_off=host_off, dev_off=dev_off)
    return c.bytes[1], c.tlps[1]


def link_raw_bw(gen: int, width: int) -> float:
    """Link bytes per second of one direction after line encoding and SKP ordered sets
    (TLP headers and DLLPs included)."""
    return (width * LINK_RATE_GTS.get(int(gen), 16.0) * 1e9 * _enc(gen) / 8.0
            * LINK_SKP_INTERVAL / (LINK_SKP_INTERVAL + 1))


STEP = 64 * 1024  # the device's link step (tacc.h TACC_CHUNK_BYTES)


def fc_loop_ps(gen: int, width: int, mps: int, wr_ns: int = DEFAULT_WRITE_NS) -> int:
    """The credit loop of a posted write, picoseconds (unscaled; tacc-model.c
    ``tacc_link_fc_loop_ps``): the root port frees a TLP's credits ``wr_ns`` after it took
    it, returns them with one UpdateFC per ``LINK_FC_TLPS`` TLPs (a batch's link time) and
    the UpdateFC crosses the link: ``T_wr + 4 t_link(MPS + 24) + t_link(8)``."""
    return (int(wr_ns) * 1000 + LINK_FC_TLPS * t_link_ps(int(mps) + LINK_MWR_OVERHEAD, gen,
                                                          width)
            + t_link_ps(LINK_DLLP_BYTES, gen, width))


class PostedPool:
    """A pool of ``pool`` posted credits returned ``pool`` per ``loop`` ps, as a rate
    (tacc-model.c ``tacc_posted_take``): taking ``n`` credits at ``t`` advances the
    pool's theoretical return time by ``n * loop / pool`` from ``max(itself, t)``; what was
    taken may be on the link no later than one loop before it.  Exact (integers)."""

    def __init__(self, loop: int, pool: int) -> None:
        self.loop, self.pool = int(loop), int(pool)
        self.tat = 0  # theoretical return time x pool

    def take(self, t: int, n: int) -> int:
        """The earliest end of what takes ``n`` credits at ``t`` (0: no bound)."""
        self.tat = max(self.tat, int(t) * self.pool) + int(n) * self.loop
        return max(0, -(-self.tat // self.pool) - self.loop)


class PostedCredits:
    """The root port's posted header (one per TLP) and data (16 bytes each) credits of
    one link (tacc-model.c ``tacc_link_posted``), full at time 0."""

    def __init__(self, gen: int, width: int, mps: int, wr_ns: int = DEFAULT_WRITE_NS,
                 posted_hdr_credits: int = DEFAULT_POSTED_HDR_CREDITS,
                 posted_credits: int = DEFAULT_POSTED_CREDITS) -> None:
        loop = fc_loop_ps(gen, width, mps, wr_ns)
        self.hdr = PostedPool(loop, posted_hdr_credits)
        self.data = PostedPool(loop, posted_credits)

    def take(self, t: int, tlps: int, payload: int) -> int:
        """The earliest end of a step of ``tlps`` writes and ``payload`` bytes sent at
        ``t``."""
        return max(self.hdr.take(t, tlps), self.data.take(t, -(-int(payload) // LINK_FC_UNIT)))


def fc_ps(kind: str, payload: int, reqs: int, tags: int = DEFAULT_TAGS,
          rd_ns: int = DEFAULT_READ_NS, wr_ns: int = DEFAULT_WRITE_NS,
          posted_credits: int = DEFAULT_POSTED_CREDITS, gen: int = 4, width: int = 16,
          mps: int = 256, posted_hdr_credits: int = DEFAULT_POSTED_HDR_CREDITS) -> int:
    """The shortest time flow control allows ``payload`` bytes in steady state,
    picoseconds (unscaled): ``reqs * T_rd / tags`` for a host read (tacc_link_fc_ps); for a
    host write of ``reqs`` write TLPs, the posted credits' rate: ``max(reqs / PH, payload
    / 16 / PD) * L`` (``fc_loop_ps``; a burst after idle gets a full pool first, see
    ``PostedCredits``)."""
    if kind == H2D:
        return -(-int(reqs) * rd_ns * 1000 // tags)
    loop = fc_loop_ps(gen, width, mps, wr_ns)
    data = -(-int(payload) // LINK_FC_UNIT)
    return max(-(-int(reqs) * loop // posted_hdr_credits),
               -(-data * loop // posted_credits))


def step_ps(kind: str, pos: int, c: int, gen: int, width: int, mps: int,
            mrrs: int = DEFAULT_MRRS, rcb: int = DEFAULT_RCB, tags: int = DEFAULT_TAGS,
            rd_ns: int = DEFAULT_READ_NS, wr_ns: int = DEFAULT_WRITE_NS,
            posted_credits: int = DEFAULT_POSTED_CREDITS, host_off: int = 0,
            dev_off: int = 0, posted_hdr_credits: int = DEFAULT_POSTED_HDR_CREDITS,
            credits: PostedCredits | None = None, t: int = 0) -> int:
    """Uncontended duration of the link step carrying payload ``[pos, pos + c)`` of a
    transfer sent at ``t`` (tacc-sched.c ``tacc_unit_link_step`` with the link otherwise
    idle): the TLPs and DLLPs that start in it (prefix differences), the larger of both
    directions' ``t_link``, the tags' bound and (a host write) what the posted
    ``credits`` allow (a full pool when None), picoseconds (unscaled)."""
    st = (link_prefix(kind, pos + c, mps, mrrs, rcb, host_off, dev_off)
          - link_prefix(kind, pos, mps, mrrs, rcb, host_off, dev_off))
    d = max(t_link_ps(st.bytes[0], gen, width), t_link_ps(st.bytes[1], gen, width))
    if kind == H2D:
        return max(d, fc_ps(kind, c, st.tlps[1], tags, rd_ns))
    if credits is None:
        credits = PostedCredits(gen, width, mps, wr_ns, posted_hdr_credits, posted_credits)
    return max(d, credits.take(t, st.tlps[1], c) - t)


def copy_link_ps(kind: str, n: int, gen: int, width: int, mps: int,
                 mrrs: int = DEFAULT_MRRS, rcb: int = DEFAULT_RCB, tags: int = DEFAULT_TAGS,
                 rd_ns: int = DEFAULT_READ_NS, wr_ns: int = DEFAULT_WRITE_NS,
                 posted_credits: int = DEFAULT_POSTED_CREDITS, host_off: int = 0,
                 dev_off: int = 0,
                 posted_hdr_credits: int = DEFAULT_POSTED_HDR_CREDITS) -> int:
    """The link steps of an uncontended copy of ``n`` bytes (``STEP`` bytes each, the
    last one shorter) after idle (a full posted-credit pool), picoseconds (unscaled):
    what a copy's duration holds beyond its command latency, page walks and completion
    latency (docs/hardware.md section 9)."""
    credits = PostedCredits(gen, width, mps, wr_ns, posted_hdr_credits, posted_credits)
    t = 0
    for a in range(0, int(n), STEP):
        t += step_ps(kind, a, min(int(n) - a, STEP), gen, width, mps, mrrs, rcb, tags,
                     rd_ns, wr_ns, posted_credits, host_off, dev_off, posted_hdr_credits,
                     credits, t)
    return t


def link_max_payload_bw(gen: int, width: int, mps: int, direction: str | None = None,
                        mrrs: int = DEFAULT_MRRS, rcb: int = DEFAULT_RCB,
                        tags: int = DEFAULT_TAGS, rd_ns: int = DEFAULT_READ_NS,
                        wr_ns: int = DEFAULT_WRITE_NS,
                        posted_credits: int = DEFAULT_POSTED_CREDITS,
                        posted_hdr_credits: int = DEFAULT_POSTED_HDR_CREDITS) -> float:
    """Modelled maximum payload bandwidth of one link direction, bytes per second: the
    payload of one aligned 64 KiB link step in the middle of a long transfer over the
    step's time (``max`` of both directions' ``t_link`` and flow control in steady
    state), i.e. what a long copy approaches.  ``direction`` None: the lower of the two."""
    if direction is None:
        return min(link_max_payload_bw(gen, width, mps, d, mrrs, rcb, tags, rd_ns, wr_ns,
                                       posted_credits, posted_hdr_credits) for d in (H2D, D2H))
    c = (link_prefix(direction, 2 * STEP, mps, mrrs, rcb)
         - link_prefix(direction, STEP, mps, mrrs, rcb))
    t = max(t_link_ps(c.bytes[0], gen, width), t_link_ps(c.bytes[1], gen, width),
            fc_ps(direction, STEP, c.tlps[1], tags, rd_ns, wr_ns, posted_credits, gen, width,
                  mps, posted_hdr_credits))
    return STEP / (t * 1e-12)


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

