"""Device discovery with pyudev: the PF and its VFs by PCI address, link, memory, hotplug.

The test VM runs no udevd, so enumeration reads sysfs through pyudev and the hotplug
watch listens to the kernel's own uevents (``Monitor.from_netlink(source='kernel')``).
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyudev

from .errors import DeviceNotFoundError

TACC_VENDOR = 0x7ACC
# virtio-tacc-pci (docs/virtio.md): 1af4:(0x1040 + 57), driven by tacc.ko's virtio driver
VIRTIO_VENDOR, VIRTIO_TACC_DEVICE = 0x1AF4, 0x1079
VIRTIO_FUNC = 5  # TACC_FN_VIRTIO
SIM_PCI = "0000:00:00.0"


def pci_id(pci: str) -> int:
    """``0000:01:00.1`` -> domain << 16 | bus << 8 | devfn (the perf PMU / ring id)."""
    dom, bus, rest = pci.split(":")
    dev, fn = rest.split(".")
    return (int(dom, 16) << 16) | (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn, 16)


@dataclass(frozen=True)
class DeviceInfo:
    """One PCI function (PF or VF) of a tacc device."""

    pci: str  # PCI address, e.g. 0000:01:00.0
    devnode: str  # /dev/accel/accelN
    minor: int
    is_vf: bool
    function: int  # 0 = PF, n = VF n
    pf: str  # PCI address of the PF (itself for a PF)
    link_speed: str = ""
    link_width: int = 0
    max_link_speed: str = ""
    max_link_width: int = 0
    max_payload_bytes: int = 0
    devmem_bytes: int = 0
    queues: int = 0
    tlb_entries: int = 0
    num_vfs: int = 0
    sim: bool = False
    virtio: bool = False  # the paravirtual function (kind "virtio")
    attrs: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def pci_id(self) -> int:
        return pci_id(self.pci)

    @property
    def kind(self) -> str:
        """``pf``, ``vf`` or ``virtio`` (DRM_TACC_PARAM_FUNC_KIND's names)."""
        return "virtio" if self.virtio else "vf" if self.is_vf else "pf"

    def __str__(self) -> str:
        kind = "virtio" if self.virtio else f"VF{self.function}" if self.is_vf else "PF"
        link = f"{self.link_speed} x{self.link_width}" if self.link_width else "link ?"
        return (f"{self.pci} {kind} {self.devnode} {link} "
                f"devmem {self.devmem_bytes >> 20} MiB")


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _int(s: str) -> int:
    try:
        return int(s, 0)
    except ValueError:
        return 0


def _info_from_accel(dev: pyudev.Device) -> DeviceInfo | None:
    parent = dev.find_parent("pci")
    if parent is None:
        return None
    pdir = Path(parent.sys_path)
    vendor = _int(_read(pdir / "vendor"))
    if vendor == VIRTIO_VENDOR and _int(_read(pdir / "device")) == VIRTIO_TACC_DEVICE:
        return DeviceInfo(pci=parent.sys_name,
                          devnode=dev.device_node or f"/dev/accel/{dev.sys_name}",
                          minor=_int(dev.sys_name.removeprefix("accel")), is_vf=False,
                          function=VIRTIO_FUNC, pf=parent.sys_name, virtio=True)
    if vendor != TACC_VENDOR:
        return None
    t = pdir / "tacc"
    attrs = {p.name: _read(p) for p in t.iterdir() if p.is_file()} if t.is_dir() else {}
    physfn = pdir / "physfn"
    is_vf = physfn.exists()
    pf = os.path.basename(os.path.realpath(physfn)) if is_vf else parent.sys_name
    return DeviceInfo(
        pci=parent.sys_name,
        devnode=dev.device_node or f"/dev/accel/{dev.sys_name}",
        minor=_int(dev.sys_name.removeprefix("accel")),
        is_vf=is_vf,
        function=_int(attrs.get("function", "0")) if attrs else int(parent.sys_name[-1]),
        pf=pf,
        link_speed=attrs.get("link_speed", ""),
        link_width=_int(attrs.get("link_width", "0")),
        max_link_speed=attrs.get("max_link_speed", ""),
        max_link_width=_int(attrs.get("max_link_width", "0")),
        max_payload_bytes=_int(attrs.get("max_payload_bytes", "0")),
        devmem_bytes=_int(attrs.get("devmem_bytes", "0")),
        queues=_int(attrs.get("queues", "0")),
        tlb_entries=_int(attrs.get("tlb_entries", "0")),
        num_vfs=_int(attrs.get("num_vfs", "0")),
        attrs=attrs,
    )


def sim_device() -> DeviceInfo:
    return DeviceInfo(pci=SIM_PCI, devnode="sim", minor=0, is_vf=False, function=0,
                      pf=SIM_PCI, link_speed="16.0 GT/s PCIe", link_width=16,
                      devmem_bytes=256 << 20, queues=4, sim=True)


def sim_enabled() -> bool:
    return os.environ.get("TACC_RUNTIME_SIM", "") not in ("", "0")


def devices(sim: bool | None = None) -> list[DeviceInfo]:
    """Every tacc function with an accel node: PFs first, then VFs, then virtio-tacc
    functions, by PCI address.

    Only functions whose node is in ``/dev``: a container given one VF (CDI,
    docs/containers.md) sees every function in sysfs but has the node of its own only."""
    if sim if sim is not None else sim_enabled():
        return [sim_device()]
    ctx = pyudev.Context()
    out = [i for d in ctx.list_devices(subsystem="accel")
           if (i := _info_from_accel(d)) is not None and os.path.exists(i.devnode)]
    return sorted(out, key=lambda i: (i.virtio, i.is_vf, i.pf, i.pci))


def find(spec: str | int | DeviceInfo | None = None, sim: bool | None = None) -> DeviceInfo:
    """A device by PCI address (``0000:01:00.0`` or ``01:00.0``), accel node, list index,
    or the first PF when ``spec`` is None."""
    if isinstance(spec, DeviceInfo):
        return spec
    devs = devices(sim)
    if not devs:
        raise DeviceNotFoundError("no tacc device found (is tacc.ko loaded? "
                                  "set TACC_RUNTIME_SIM=1 for the simulator)")
    if spec is None:
        return devs[0]
    if isinstance(spec, int):
        if not 0 <= spec < len(devs):
            raise DeviceNotFoundError(f"device index {spec}: only {len(devs)} tacc functions")
        return devs[spec]
    for d in devs:
        if spec in (d.pci, d.devnode, d.pci.removeprefix("0000:"), f"accel{d.minor}"):
            return d
    names = ", ".join(d.pci for d in devs)
    raise DeviceNotFoundError(f"no tacc function {spec!r} (present: {names})")


@dataclass(frozen=True)
class HotplugEvent:
    action: str  # add, remove, change, bind, unbind
    subsystem: str  # accel or pci
    pci: str
    devnode: str
    device: DeviceInfo | None  # present for 'add' when the node is readable


class HotplugWatch:
    """Kernel uevents for tacc accel nodes and PCI functions (no udevd needed)."""

    def __init__(self) -> None:
        self.context = pyudev.Context()
        self.monitor = pyudev.Monitor.from_netlink(self.context, source="kernel")
        self.monitor.start()

    def fileno(self) -> int:
        return int(self.monitor.fileno())

    def _event(self, dev: pyudev.Device) -> HotplugEvent | None:
        sub = dev.subsystem
        action = dev.action or ""
        if sub == "accel":
            pdev = dev.find_parent("pci") if action != "remove" else None
            pci = pdev.sys_name if pdev is not None else \
                Path(dev.device_path).parent.parent.name
            info = _info_from_accel(dev) if action == "add" else None
            if pdev is not None and info is None and action == "add":
                return None  # another vendor's accel node
            return HotplugEvent(action, sub, pci, f"/dev/accel/{dev.sys_name}", info)
        if sub == "pci":
            vendor = dev.properties.get("PCI_ID", "").split(":")[0]
            if vendor.lower() != f"{TACC_VENDOR:04x}":
                return None
            return HotplugEvent(action, sub, dev.sys_name, "", None)
        return None

    def poll(self, timeout: float | None = None) -> HotplugEvent | None:
        """The next tacc event within ``timeout`` seconds (None: wait forever)."""
        deadline = None if timeout is None else _now() + timeout
        while True:
            left = None if deadline is None else max(deadline - _now(), 0.0)
            r, _, _ = select.select([self.fileno()], [], [], left)
            if not r:
                return None
            dev = self.monitor.poll(timeout=0)
            if dev is None:
                continue
            ev = self._event(dev)
            if ev is not None:
                return ev

    def __iter__(self) -> Iterator[HotplugEvent]:
        while True:
            ev = self.poll()
            if ev is not None:
                yield ev

    def close(self) -> None:
        self.monitor.stop() if hasattr(self.monitor, "stop") else None

    def __enter__(self) -> HotplugWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch(callback: Callable[[HotplugEvent], None], timeout: float | None = None) -> None:
    """Calls ``callback`` for each tacc hotplug event until ``timeout`` seconds pass."""
    deadline = None if timeout is None else _now() + timeout
    with HotplugWatch() as w:
        while deadline is None or _now() < deadline:
            ev = w.poll(None if deadline is None else max(deadline - _now(), 0.0))
            if ev is not None:
                callback(ev)


def _now() -> float:
    import time

    return time.monotonic()
