"""tacc PCI functions as seen in sysfs: discovery, metadata, clock-sync samples.

Every path is relative to ``sysroot`` (default ``/``) so host tests can point the
functions at a fake sysfs tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tacc import hw
from tacc.capture.schema import CLOCK_DTYPE, FUNC_COUNTERS, GLOBAL_COUNTERS
from tacc.errors import DeviceError

TACC_VENDOR = f"0x{hw.TACC_PCI_VENDOR_ID:04x}"  # as sysfs prints it
# virtio-tacc-pci (docs/virtio.md): 1af4:(0x1040 + 57), tacc.ko's tacc-virtio driver
VIRTIO_VENDOR, VIRTIO_TACC_DEVICE = "0x1af4", "0x1079"
VIRTIO_FUNC = 5  # TACC_FN_VIRTIO: its function index on the tacc device (trace records)
PCI_ADDR_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def parse_pci(addr: str) -> tuple[str, int]:
    """Normalise a PCI address; returns (``DDDD:BB:DD.F``, driver dev id).

    The dev id is what the tacc tracepoints carry: domain << 16 | bus << 8 | devfn.
    """
    m = PCI_ADDR_RE.match(addr.strip())
    if not m:
        raise DeviceError(f"'{addr}' is not a PCI address (expected DDDD:BB:DD.F)")
    dom = int(m.group(1) or "0", 16)
    bus, dev, fn = int(m.group(2), 16), int(m.group(3), 16), int(m.group(4))
    if dev > 31:
        raise DeviceError(f"'{addr}' is not a PCI address (device number > 0x1f)")
    devid = (dom << 16) | (bus << 8) | (dev << 3) | fn
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn}", devid


def devid_to_pci(devid: int) -> str:
    return (f"{devid >> 16:04x}:{(devid >> 8) & 0xff:02x}:{(devid >> 3) & 0x1f:02x}."
            f"{devid & 7}")


@dataclass
class TaccFunction:
    pci: str
    devid: int
    sysfs: Path
    is_vf: bool
    vf: int
    pf: str
    accel: str | None  # /dev/accel/accelN, None if the driver is not bound
    info: dict[str, str] = field(default_factory=dict)
    # "pf", "vf" or "virtio" (DRM_TACC_PARAM_FUNC_KIND's names; "" = from is_vf)
    kind: str = ""
    # the tacc/ sysfs directory whose clock_sync pairs this function's device ticks: its
    # own, or for a virtio-tacc function its PF's (None = its own)
    clock_sysfs: Path | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            self.kind = "vf" if self.is_vf else "pf"

    def meta(self) -> dict[str, Any]:
        """The function's entry of meta.json "devices" (docs/capture-format.md)."""
        i = self.info

        def num(key: str, default: float = 0) -> float:
            try:
                return float(i.get(key, default))
            except ValueError:
                return default

        def gen_of(key: str) -> int:
            return {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}.get(
                i.get(key, "").split(" ")[0], 0)

        gen = gen_of("link_speed")
        return {
            "pci": self.pci, "pf": self.pf, "vf": self.vf, "kind": self.kind,
            "accel": self.accel,
            # max_*: the capable link (minor 8; a lower gen/width is a degraded link)
            "link": {"gen": gen, "width": int(num("link_width")),
                     "max_gen": gen_of("max_link_speed") or gen,
                     "max_width": int(num("max_link_width")) or int(num("link_width")),
                     "mps": int(num("max_payload_bytes", 256)),
                     "mrrs": int(num("max_read_request_bytes", 512))},
            "devmem": int(num("devmem_bytes")), "clock_hz": num("clock_hz", 1e9),
            "time_scale": num("time_scale", 1000) / 1000.0,  # sysfs: x 1000
            "tlb_entries": int(num("tlb_entries")),
            "hw_version": i.get("hw_version", ""), "engines": int(num("engines")),
            "queues": int(num("queues")),
            # the roofline (minor 12): sysfs peaks of TACC_CAP_ROOFLINE, 0 = not reported
            "peak_fp32_gflops": int(num("peak_fp32_gflops")),
            "peak_bf16_gflops": int(num("peak_bf16_gflops")),
            "devmem_gbps": int(num("devmem_gbps")),
        }


INFO_KEYS = ("function", "is_vf", "hw_version", "caps", "link_speed", "link_width",
             "max_link_speed", "max_link_width",
             "max_payload_bytes", "max_read_request_bytes", "devmem_bytes", "engines",
             "queues", "contexts", "clock_hz", "time_scale", "tlb_entries", "num_vfs",
             "peak_fp32_gflops", "peak_bf16_gflops", "devmem_gbps")


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _accel_of(d: Path, pattern: str) -> str | None:
    nodes = sorted(d.glob(pattern))
    return f"/dev/accel/{nodes[0].name}" if nodes else None


def _virtio_function(d: Path, pfs: list[TaccFunction]) -> TaccFunction:
    """A virtio-tacc PCI function (docs/virtio.md): its accel node is under the virtio
    device (``virtioN/accel/accelM``); it has no ``tacc/`` sysfs directory.  To the tacc
    device it is function 5 of the PF whose engines it drives, so it is described like
    a VF of that PF (``vf`` 5, the PF's link, clock and time scale: its trace records
    carry that device's ticks, paired through the PF's ``clock_sync``).  The guest cannot
    see which PF backs it (a QOM link): with several PFs, the first is taken."""
    pci, devid = parse_pci(d.name)
    pf = pfs[0] if pfs else None
    info = {k: v for k, v in (pf.info if pf else {}).items()
            if k in ("link_speed", "link_width", "max_link_speed", "max_link_width",
                     "max_payload_bytes", "max_read_request_bytes", "clock_hz",
                     "time_scale", "peak_fp32_gflops", "peak_bf16_gflops",
                     "devmem_gbps")}
    info["function"] = str(VIRTIO_FUNC)
    return TaccFunction(pci, devid, d, False, VIRTIO_FUNC, pf.pci if pf else pci,
                        _accel_of(d, "virtio*/accel/accel*"), info, kind="virtio",
                        clock_sysfs=pf.sysfs if pf else None)


def discover(sysroot: str = "/") -> list[TaccFunction]:
    """Every tacc function: PFs, then VFs, then virtio-tacc functions, each in PCI
    address order."""
    base = Path(sysroot, "sys/bus/pci/devices")
    out: list[TaccFunction] = []
    if not base.is_dir():
        return out
    virtio: list[Path] = []
    for d in sorted(base.iterdir()):
        vendor = _read(d / "vendor")
        if vendor == VIRTIO_VENDOR and _read(d / "device") == VIRTIO_TACC_DEVICE:
            virtio.append(d)
            continue
        if vendor != TACC_VENDOR:
            continue
        pci, devid = parse_pci(d.name)
        physfn = d / "physfn"
        is_vf = physfn.exists()
        pf = os.path.basename(os.readlink(physfn)) if is_vf else pci
        vf = 0
        if is_vf:
            pfdir = base / pf
            for link in pfdir.glob("virtfn*"):
                if os.path.basename(os.readlink(link)) == d.name:
                    vf = int(link.name[len("virtfn"):]) + 1
        accel = _accel_of(d, "accel/accel*")
        info = {k: _read(d / "tacc" / k) for k in INFO_KEYS if (d / "tacc" / k).exists()}
        out.append(TaccFunction(pci, devid, d, is_vf, vf, pf, accel, info))
    out.sort(key=lambda f: (f.is_vf, f.pci))
    pfs = [f for f in out if f.kind == "pf"]
    out += [_virtio_function(d, pfs) for d in virtio]
    return out


def find(functions: list[TaccFunction], addr: str) -> TaccFunction:
    pci, _ = parse_pci(addr)
    for f in functions:
        if f.pci == pci:
            return f
    raise DeviceError(f"no tacc device at {pci}")


CLOCK_SYNC_COLUMNS = ("mono_before", "devclk", "mono_after", "hostclk", "vm_paused_ns")


def parse_clock_sync(text: str, fid: int) -> np.ndarray:
    """``before devclk after [hostclk [vm_paused_ns]]`` lines of sysfs tacc/clock_sync ->
    CLOCK_DTYPE records (columns a kernel does not print read 0; a line of fewer than three
    or of non-numbers is not a pair)."""
    rows = []
    for ln in text.splitlines():
        r = ln.split()
        if len(r) >= 3 and not ln.startswith("#") and all(c.isdigit() for c in r):
            rows.append(r[:len(CLOCK_SYNC_COLUMNS)])
    out = np.zeros(len(rows), CLOCK_DTYPE)
    for i, r in enumerate(rows):
        for name, v in zip(CLOCK_SYNC_COLUMNS, r, strict=False):
            out[i][name] = int(v)
    out["fid"] = fid
    return out


def read_clock_sync(fn: TaccFunction, fid: int) -> np.ndarray:
    """Clock pairs of ``fn``'s device ticks (a virtio-tacc function's: its PF's)."""
    try:
        return parse_clock_sync(((fn.clock_sysfs or fn.sysfs) / "tacc" / "clock_sync")
                                .read_text(), fid)
    except OSError:
        return np.zeros(0, CLOCK_DTYPE)


def read_counters_sysfs(fn: TaccFunction) -> dict[str, int]:
    """Function (and, on the PF as root, global ``g_``) counters from sysfs.

    Reading sysfs never wakes a suspended device (the driver serves its snapshot).
    """
    out: dict[str, int] = {}
    for group, names, prefix in (("counters", FUNC_COUNTERS, ""),
                                 ("global_counters", GLOBAL_COUNTERS, "g_")):
        d = fn.sysfs / group
        if not d.is_dir():
            continue
        for name, _slot in names:
            v = _read(d / name)
            if v.isdigit():
                out[prefix + name] = int(v)
    return out


def kernel_release() -> str:
    return os.uname().release


def machine_info(sysroot: str = "/") -> dict[str, str]:
    """What the guest can tell about the machine (QEMU machine type via DMI)."""
    dmi = Path(sysroot, "sys/class/dmi/id")
    return {k: _read(dmi / k) for k in ("sys_vendor", "product_name", "product_version",
                                         "bios_version") if (dmi / k).exists()}


def icount_info(timeout: float = 2.0) -> dict[str, object] | None:
    """QEMU's -icount state, when the guest has a QMP channel to its own QEMU.

    The test VM (scripts/run-vm) gives the guest a virtio-serial QMP port
    (tacc.guest_qmp).  QMP has no query for the -icount options: HMP ``info jit``
    prints its "Host - Guest clock" drift line only with icount on, and ``query-replay``
    reports the executed-instruction counter; the shift itself is not visible (null).
    Without the port (a real machine, other VMs) the answer is None.
    """
    try:
        from tacc.guest_qmp import GuestQMP, find_port

        port = find_port()
    except (ImportError, OSError):
        return None
    try:
        with GuestQMP(port, timeout=timeout) as q:
            jit = str(q.execute("human-monitor-command", **{"command-line": "info jit"}))
            enabled = "Host - Guest clock" in jit
            rep = q.execute("query-replay") if enabled else {}
    except Exception:  # noqa: BLE001 - QMP errors, timeouts: the figure is unknown
        return None
    return {"enabled": enabled, "shift": None, "sleep": None,
            "instructions": (rep or {}).get("icount") if enabled else None,
            "source": "guest QMP: info jit, query-replay"}
