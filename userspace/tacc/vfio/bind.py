"""Move a tacc PCI function between tacc.ko and vfio-pci (``tacc vfio bind|unbind``).

Plain functions for other code (the CDI generator imports them):

- :func:`bind` (BDF to vfio-pci), :func:`unbind` (back to tacc.ko),
- :func:`group_of` (the function's IOMMU group number), :func:`functions` (every tacc
  function with its driver, group, accel node and openers).

Binding goes through ``driver_override`` and ``/sys/bus/pci/drivers_probe``, the
kernel's documented way (Documentation/driver-api/vfio.rst).  A sysfs unbind cannot be
refused by the driver, so this code refuses what it must not do: a function whose accel
node (or VFIO group) some process holds open, and the PF while its VFs are enabled (the
VFs hang off the PF driver: unbinding it disables them).  Every refusal is a
:class:`VfioError` with one line of text.  The open check and the unbind are not atomic:
a process that opens the node in between keeps its file, and tacc.ko's remove path
handles that (the node goes away, the file sees -ENODEV).
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tacc import hw
from tacc.errors import VfioError

SYSFS_PCI = Path("/sys/bus/pci")
SYSFS_MODULE = Path("/sys/module")  # a loaded module, or a built-in one with parameters
TACC_VENDOR = f"0x{hw.TACC_PCI_VENDOR_ID:04x}"  # as sysfs prints it
TACC_DRIVER = "tacc"
VFIO_DRIVER = "vfio-pci"
VARIANT_DRIVER = "tacc_vfio_pci"  # vfio-pci-core plus migration (kernel/tacc_vfio_pci.c)
VFIO_DRIVERS = (VFIO_DRIVER, VARIANT_DRIVER)
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Function:
    """One tacc PCI function as sysfs sees it."""

    bdf: str
    kind: str  # "PF" or "VF"
    driver: str | None
    group: int | None
    accel: str | None  # /dev/accel/accelN while tacc.ko drives it
    vfio: str | None  # /dev/vfio/N while vfio-pci drives it
    num_vfs: int = 0
    openers: list[str] = field(default_factory=list)  # "pid comm" holding accel/vfio node

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _dev(bdf: str) -> Path:
    p = SYSFS_PCI / "devices" / bdf
    if not (p / "vendor").exists():
        raise VfioError(f"{bdf}: no such PCI function")
    if (p / "vendor").read_text().strip() != TACC_VENDOR:
        raise VfioError(f"{bdf}: not a tacc function")
    return p


def normalize(bdf: str) -> str:
    """'01:00.1' -> '0000:01:00.1' (domain 0 assumed when missing)."""
    bdf = bdf.strip().lower()
    return bdf if bdf.count(":") == 2 else f"0000:{bdf}"


def driver_of(bdf: str) -> str | None:
    link = SYSFS_PCI / "devices" / bdf / "driver"
    return link.resolve().name if link.exists() else None


def group_of(bdf: str) -> int:
    """The IOMMU group number of @bdf (VfioError when it has none: IOMMU off)."""
    link = _dev(normalize(bdf)) / "iommu_group"
    if not link.exists():
        raise VfioError(f"{bdf}: no IOMMU group (is the IOMMU off?); vfio-pci needs one")
    return int(link.resolve().name)


def accel_node(bdf: str) -> str | None:
    d = SYSFS_PCI / "devices" / bdf / "accel"
    nodes = sorted(d.glob("accel*")) if d.exists() else []
    return f"/dev/accel/{nodes[0].name}" if nodes else None


def _rdev(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_rdev


def openers(path: str | None) -> list[str]:
    """'pid comm' of every process with an open file on the character device @path
    (found through /proc/*/fd; needs root to see other users' processes)."""
    rdev = _rdev(path) if path else None
    if rdev is None:
        return []
    out: list[str] = []
    for proc in Path("/proc").iterdir():  # the caller too: its own open file counts
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours to see
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:
                continue
            if st.st_rdev == rdev and (st.st_mode & 0o170000) == 0o020000:
                try:
                    comm = (proc / "comm").read_text().strip()
                except OSError:
                    comm = "?"
                out.append(f"{proc.name} {comm}")
                break
    return out


def _vfio_node(bdf: str) -> str | None:
    try:
        g = group_of(bdf)
    except VfioError:
        return None
    return f"/dev/vfio/{g}"


def describe(bdf: str) -> Function:
    bdf = normalize(bdf)
    p = _dev(bdf)
    drv = driver_of(bdf)
    grp = int((p / "iommu_group").resolve().name) if (p / "iommu_group").exists() else None
    numvfs = int((p / "sriov_numvfs").read_text()) if (p / "sriov_numvfs").exists() else 0
    acc = accel_node(bdf) if drv == TACC_DRIVER else None
    vf = f"/dev/vfio/{grp}" if drv in VFIO_DRIVERS and grp is not None else None
    return Function(bdf, "VF" if (p / "physfn").exists() else "PF", drv, grp, acc, vf, numvfs,
                    openers(acc) + openers(vf))


def functions() -> list[Function]:
    """Every tacc function, PF(s) first, then VFs, by BDF."""
    devs = [p for p in (SYSFS_PCI / "devices").iterdir()
            if (p / "vendor").exists() and (p / "vendor").read_text().strip() == TACC_VENDOR]
    devs.sort(key=lambda p: ((p / "physfn").exists(), p.name))
    return [describe(p.name) for p in devs]


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise VfioError(f"{path}: {e.strerror}") from None


def ensure_vfio_pci() -> None:
    """Load vfio-pci (and with it vfio_iommu_type1 on first container use)."""
    if (SYSFS_PCI / "drivers" / VFIO_DRIVER).exists():
        return
    r = subprocess.run(["modprobe", "-a", "vfio-pci", "vfio_iommu_type1"],
                       capture_output=True, text=True, check=False)
    if r.returncode or not (SYSFS_PCI / "drivers" / VFIO_DRIVER).exists():
        msg = (r.stderr.strip().splitlines() or ["driver did not register"])[-1]
        raise VfioError(f"modprobe vfio-pci failed: {msg}")


def ensure_variant() -> None:
    """Load tacc_vfio_pci.ko (after vfio-pci-core and the type1 IOMMU) from the build
    (build/modules/<release>/), as scripts/guest-init.sh loads tacc.ko."""
    if (SYSFS_PCI / "drivers" / VARIANT_DRIVER).exists():
        return
    ko = ROOT / "build" / "modules" / os.uname().release / f"{VARIANT_DRIVER}.ko"
    if not ko.exists():
        raise VfioError(f"{ko}: not built (make module; the kernel needs vfio-pci-core)")
    # its dependencies may be built into the kernel (the debug kernel: no module to
    # modprobe): insmod first, modprobe them only when it lacks their symbols
    insmod = ["insmod", str(ko)]
    r = subprocess.run(insmod, capture_output=True, text=True, check=False)
    if r.returncode:
        need = [m for m in ("vfio-pci-core", "vfio_iommu_type1")
                if not (SYSFS_MODULE / m.replace("-", "_")).exists()]
        for cmd in ([["modprobe", "-a", *need]] if need else []) + [insmod]:
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode:
                msg = (r.stderr.strip().splitlines() or ["failed"])[-1]
                raise VfioError(f"{' '.join(cmd)}: {msg}")
    if not (SYSFS_PCI / "drivers" / VARIANT_DRIVER).exists():
        raise VfioError(f"insmod {ko}: the driver did not register")


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _rebind(bdf: str, override: str) -> None:
    p = SYSFS_PCI / "devices" / bdf
    _write(p / "driver_override", override + "\n")
    if (p / "driver").exists():
        _write(p / "driver" / "unbind", bdf)
    _write(SYSFS_PCI / "drivers_probe", bdf)


def _handoff(bdf: str, f: Function) -> None:
    """tacc.ko's tacc/handoff (docs/sysfs-abi.md): from here to the unbind no open of
    the accel node succeeds, and it is refused if one is open now (the /proc scan
    above names openers, this makes the check atomic)."""
    p = _dev(bdf) / "tacc" / "handoff"
    if not p.exists():
        return  # a tacc.ko without it: the /proc check is all there is
    try:
        p.write_text("1\n")
    except OSError as e:
        if e.errno == errno.EBUSY:
            who = openers(f.accel)
            pids = f" (pid {', pid '.join(who)})" if who else ""
            raise VfioError(f"{bdf}: {f.accel} is open{pids}") from None
        raise VfioError(f"{p}: {e.strerror}") from None


def _end_handoff(bdf: str) -> None:
    p = _dev(bdf) / "tacc" / "handoff"
    if p.exists():
        try:
            p.write_text("0\n")
        except OSError:
            pass  # the binding went meanwhile: nothing to end


def bind(bdf: str, timeout: float = 10.0, driver: str = VFIO_DRIVER) -> Function:
    """Give @bdf to vfio-pci (or @driver: VARIANT_DRIVER, tacc_vfio_pci, for migration);
    returns its new description (vfio = /dev/vfio/<group>).

    Refuses: a non-tacc or missing function, the PF while VFs are enabled, a function
    without an IOMMU group, a function whose accel node is open."""
    bdf = normalize(bdf)
    f = describe(bdf)
    if f.kind == "PF" and f.num_vfs:
        raise VfioError(f"{bdf}: PF has {f.num_vfs} VFs enabled (write 0 to sriov_numvfs "
                        "first)")
    if driver not in VFIO_DRIVERS:
        raise VfioError(f"{driver}: not a VFIO driver of tacc ({', '.join(VFIO_DRIVERS)})")
    group_of(bdf)
    if f.driver == driver:
        return f
    if f.openers:
        raise VfioError(f"{bdf}: {f.accel or f.vfio} is open (pid {', pid '.join(f.openers)})")
    if driver == VARIANT_DRIVER:
        ensure_variant()
    else:
        ensure_vfio_pci()
    _handoff(bdf, f)
    try:
        _rebind(bdf, driver)
    except VfioError:
        _write(SYSFS_PCI / "devices" / bdf / "driver_override", "\n")
        _end_handoff(bdf)
        raise
    node = f"/dev/vfio/{group_of(bdf)}"
    if not _wait(lambda: driver_of(bdf) == driver and os.path.exists(node), timeout):
        raise VfioError(f"{bdf}: {driver} did not take the function (driver "
                        f"{driver_of(bdf) or 'none'})")
    return describe(bdf)


def unbind(bdf: str, timeout: float = 20.0) -> Function:
    """Give @bdf back to tacc.ko (clears driver_override, reprobes); waits for its
    accel node.  Refuses while a process holds its VFIO group open."""
    bdf = normalize(bdf)
    f = describe(bdf)
    if f.driver == TACC_DRIVER:
        return f
    if f.driver in VFIO_DRIVERS and f.openers:
        raise VfioError(f"{bdf}: {f.vfio} is open (pid {', pid '.join(f.openers)})")
    _rebind(bdf, "")
    if not (SYSFS_PCI / "drivers" / TACC_DRIVER).exists():
        raise VfioError(f"{bdf}: tacc.ko is not loaded; the function has no driver")
    if not _wait(lambda: driver_of(bdf) == TACC_DRIVER and accel_node(bdf) is not None
                 and os.path.exists(accel_node(bdf) or ""), timeout):
        raise VfioError(f"{bdf}: tacc.ko did not take the function back (driver "
                        f"{driver_of(bdf) or 'none'})")
    return describe(bdf)
