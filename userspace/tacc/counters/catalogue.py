"""The counter catalogue and the tacc PCI functions, read from sysfs at run time.

The driver publishes ``counters/catalogue`` under each function's PCI device
(``name slot unit scope description`` per line, docs/sysfs-abi.md); nothing here
copies the X-lists of ``tacc_hw.h``.  ``SYSFS_ROOT`` can be redirected (tests).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tacc import hw
from tacc.errors import TaccError

TACC_VENDOR = f"0x{hw.TACC_PCI_VENDOR_ID:04x}"  # as sysfs prints it
SYSFS_ROOT = Path(os.environ.get("TACC_SYSFS_ROOT", "/sys"))
SLOT_HDR = hw.TACC_CNT_SLOT_HDR  # version << 32 | number of slots used
SLOT_GEN = hw.TACC_CNT_SLOT_GEN  # odd while the device updates
GLOBAL_PAGE = hw.TACC_CNT_GLOBAL_PAGE


class CounterError(TaccError):
    """A counter source is missing, refused, or returned something undefined."""


@dataclass(frozen=True)
class Counter:
    name: str
    slot: int
    unit: str
    scope: str  # "function" or "global"
    description: str

    @property
    def is_global(self) -> bool:
        return self.scope == "global"

    @property
    def offset(self) -> int:
        """Byte offset in the BAR2 counter block."""
        return (GLOBAL_PAGE if self.is_global else 0) + 8 * self.slot


@dataclass(frozen=True)
class Catalogue:
    version: int
    counters: tuple[Counter, ...]

    def __len__(self) -> int:
        return len(self.counters)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.counters)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.counters]

    def index(self, name: str) -> int:
        for i, c in enumerate(self.counters):
            if c.name == name:
                return i
        raise KeyError(name)

    def get(self, name: str) -> Counter:
        return self.counters[self.index(name)]

    def select(self, names: list[str] | None = None, scope: str | None = None) -> Catalogue:
        out = [c for c in self.counters if scope is None or c.scope == scope]
        if names is not None:
            missing = set(names) - {c.name for c in out}
            if missing:
                raise CounterError(f"unknown counter(s): {', '.join(sorted(missing))}")
            out = [c for c in out if c.name in names]
        return Catalogue(self.version, tuple(out))

    def record_dtype(self) -> np.dtype:
        """One u64 column per counter, in catalogue order (global ones prefixed g_)."""
        return np.dtype([(("g_" if c.is_global else "") + c.name, "<u8") for c in self])

    def page_dtype(self, page_bytes: int = GLOBAL_PAGE) -> np.dtype:
        """numpy structured view of one BAR2 page: hdr, gen and the counters by offset."""
        cs = [c for c in self.counters if (c.offset >= GLOBAL_PAGE) == (page_bytes > GLOBAL_PAGE)]
        names = ["hdr", "gen"] + [c.name for c in cs]
        offsets = [0, 8] + [c.offset % GLOBAL_PAGE for c in cs]
        return np.dtype({"names": names, "formats": ["<u8"] * len(names),
                         "offsets": offsets, "itemsize": GLOBAL_PAGE})


_LINE = re.compile(r"^(\w+)\s+(\d+)\s+(\S+)\s+(function|global)\s*(.*)$")


def parse_catalogue(text: str) -> Catalogue:
    version = 0
    counters: list[Counter] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.search(r"version\s+(\d+)", line)
            if m:
                version = int(m.group(1))
            continue
        m = _LINE.match(line)
        if not m:
            raise CounterError(f"catalogue: cannot parse {raw!r}")
        counters.append(Counter(m.group(1), int(m.group(2)), m.group(3), m.group(4),
                                m.group(5).strip()))
    if not counters:
        raise CounterError("catalogue: no counters")
    return Catalogue(version, tuple(counters))


def _read(p: Path, default: str = "") -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return default


def _gen_of(speed: str) -> int:
    """PCI sysfs speed string ("16.0 GT/s PCIe") -> generation."""
    gts = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
    return gts.get(speed.split(" ")[0], 0)


@dataclass
class Function:
    """One tacc PCI function (PF or VF), as sysfs shows it."""

    pci: str
    path: Path
    vf: int  # 0 = PF, n = VF n
    pf: str
    gen: int = 0
    width: int = 0
    mps: int = 256
    mrrs: int = 512
    clock_hz: int = 1_000_000_000
    sq_entries: int = 256
    time_scale: float = 1.0  # modelled-time factor (sysfs time_scale / 1000)
    _catalogue: Catalogue | None = field(default=None, repr=False)

    @property
    def pmu_name(self) -> str:
        """tacc_<hex>, hex = domain << 16 | bus << 8 | devfn (docs/counters.md)."""
        dom, bus, devfn = self.pci.split(":")
        dev, fn = devfn.split(".")
        hexid = (int(dom, 16) << 16) | (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
        return f"tacc_{hexid:x}"

    @property
    def label(self) -> str:
        return "PF" if self.vf == 0 else f"VF{self.vf}"

    @property
    def accel_node(self) -> Path:
        nodes = sorted((self.path / "accel").glob("accel*"))
        if not nodes:
            raise CounterError(f"{self.pci}: no accel node (is tacc.ko bound?)")
        return Path("/dev/accel") / nodes[0].name

    @property
    def counters_dir(self) -> Path:
        return self.path / "counters"

    def global_dir(self) -> Path:
        return self.path / "global_counters"

    @property
    def catalogue(self) -> Catalogue:
        if self._catalogue is None:
            p = self.counters_dir / "catalogue"
            if not p.exists():
                raise CounterError(f"{self.pci}: {p} missing: driver sysfs counters not present")
            self._catalogue = parse_catalogue(p.read_text())
        return self._catalogue

    @property
    def runtime_status(self) -> str:
        """Runtime PM state: active, suspended, suspending, resuming, unsupported."""
        return _read(self.path / "power" / "runtime_status", "unknown")


def _function(path: Path) -> Function:
    physfn = path / "physfn"
    vf = 0
    pf = path.name
    if physfn.exists():
        pf = physfn.resolve().name
        for link in physfn.glob("virtfn*"):
            if link.resolve().name == path.name:
                vf = int(link.name[len("virtfn"):]) + 1
    info = path / "tacc"
    f = Function(pci=path.name, path=path, vf=vf, pf=pf)
    speed = _read(info / "link_speed") or _read(path / "current_link_speed")
    f.gen = _gen_of(speed)
    f.width = int(_read(info / "link_width") or _read(path / "current_link_width") or 0)
    f.mps = int(_read(info / "max_payload_bytes") or 256)
    f.mrrs = int(_read(info / "max_read_request_bytes") or 512)
    f.clock_hz = int(_read(info / "clock_hz") or 1_000_000_000)
    f.time_scale = int(_read(info / "time_scale") or 1000) / 1000.0
    return f


def functions(root: Path | None = None) -> list[Function]:
    """Every tacc function, PF first, then VFs in order."""
    base = (root or SYSFS_ROOT) / "bus" / "pci" / "devices"
    out = []
    if base.exists():
        for p in sorted(base.iterdir()):
            if _read(p / "vendor") == TACC_VENDOR:
                out.append(_function(p))
    return sorted(out, key=lambda f: (f.pf, f.vf))


def select_functions(devices: list[str] | None, root: Path | None = None) -> list[Function]:
    """Functions named by ``-d`` (PCI addresses, "PF", "VF<n>"), or all of them."""
    all_fns = functions(root)
    if not all_fns:
        raise CounterError("no tacc PCI function found in sysfs")
    if not devices:
        return all_fns
    out = []
    for d in devices:
        hit = [f for f in all_fns if d in (f.pci, f.label) or f.pci.endswith(d)]
        if not hit:
            raise CounterError(f"{d}: no such tacc function "
                               f"(have {', '.join(f.pci for f in all_fns)})")
        out.extend(h for h in hit if h not in out)
    return out
