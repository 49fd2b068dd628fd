"""Container Device Interface (CDI) specs for tacc functions (docs/containers.md).

Two kinds, one device per PCI function, named by its address:

- ``tacc.dev/accel=<BDF>``: the function's accel node, ``path`` = ``hostPath`` (so the
  runtime's sysfs lookup ``/sys/class/accel/accelN`` names the same function inside);
- ``tacc.dev/vfio=<BDF>``: ``/dev/vfio/vfio`` and ``/dev/vfio/<group>`` of the function's
  IOMMU group (present once the function is bound to vfio-pci: ``tacc vfio bind``).

A virtio-tacc function (docs/virtio.md) is an accel device like the others; it has no
vfio device (``tacc.vfio`` drives the tacc register interface of a PF or VF, not a
virtio transport).

A CDI spec holds one kind, so the accel spec goes to ``/etc/cdi/tacc.yaml`` and the vfio
spec beside it (``tacc-vfio.yaml``).  The files are JSON text, which is YAML too (CDI
reads ``.yaml`` and ``.json`` alike).  ``cdiVersion`` is the lowest version whose
features the spec uses, with the rules of the reference implementation
(container-device-interface ``pkg/cdi/version.go``): 0.3.0, 0.4.0 for a mount ``type``,
0.5.0 for a device name that starts with a digit or a ``hostPath``.  PCI addresses start
with a digit, so tacc specs are 0.5.0, the newest that Debian 12's podman 4.3 reads.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tacc.devices import TaccFunction, discover, parse_pci
from tacc.errors import DeviceError, TaccError, UsageError

VENDOR = "tacc.dev"
ACCEL_KIND = f"{VENDOR}/accel"
VFIO_KIND = f"{VENDOR}/vfio"
KINDS = (ACCEL_KIND, VFIO_KIND)
DEFAULT_SPEC = "/etc/cdi/tacc.yaml"
# The newest version this module writes and Debian 12's podman 4.3 (CDI 0.5) reads.
MAX_VERSION = "0.5.0"
_NAME_INNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class CdiError(TaccError):
    """A request the specs cannot satisfy (unknown function, bad name): one line."""


class CdiNameError(CdiError, UsageError):
    """A name or PCI address that is none by its syntax (a usage error)."""


@dataclass(frozen=True)
class Function:
    """What a CDI spec needs of one tacc PCI function."""

    pci: str
    kind: str  # "pf", "vf" or "virtio"
    accel: str | None  # /dev/accel/accelN, None when tacc.ko is not bound
    iommu_group: str | None  # IOMMU group number, None without an IOMMU


def _group(fn: TaccFunction) -> str | None:
    try:
        return os.path.basename(os.readlink(fn.sysfs / "iommu_group"))
    except OSError:
        return None


def functions(sysroot: str = "/") -> list[Function]:
    """Every tacc function in sysfs: PFs, VFs, then virtio-tacc functions
    (tacc.devices.discover)."""
    return [Function(f.pci, f.kind, f.accel, _group(f))
            for f in discover(sysroot)]


def select(fns: list[Function], wanted: Iterable[str]) -> list[Function]:
    """The functions named by PCI address (``0000:01:00.1`` or ``01:00.1``), in order."""
    by_pci = {f.pci: f for f in fns}
    out = []
    for w in wanted:
        try:
            pci, _ = parse_pci(w)
        except DeviceError as exc:
            raise CdiNameError(str(exc)) from None
        if pci not in by_pci:
            present = ", ".join(by_pci) or "none"
            raise CdiError(f"no tacc function at {pci} (present: {present})")
        out.append(by_pci[pci])
    return out


def _node(path: str) -> dict[str, Any]:
    return {"path": path, "hostPath": path, "permissions": "rw"}


def device_edits(kind: str, fn: Function) -> dict[str, Any] | None:
    """The ``containerEdits`` of ``fn`` in ``kind``; None when the function has no node
    of that kind (accel: tacc.ko not bound; vfio: no IOMMU group)."""
    if kind == ACCEL_KIND:
        return {"deviceNodes": [_node(fn.accel)]} if fn.accel else None
    if kind == VFIO_KIND:
        if fn.iommu_group is None or fn.kind == "virtio":  # no user-space virtio driver
            return None
        return {"deviceNodes": [_node("/dev/vfio/vfio"), _node(f"/dev/vfio/{fn.iommu_group}")]}
    raise CdiError(f"unknown CDI kind {kind!r} (known: {', '.join(KINDS)})")


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def required_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion whose features ``spec`` uses (reference rules, see above)."""
    version = "0.3.0"
    edits = [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    edits.append(spec.get("containerEdits") or {})
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        version = "0.4.0"
    if any(not d.get("name", "a")[:1].isalpha() for d in spec.get("devices", [])) or any(
            n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])):
        version = "0.5.0"
    return version


def check_name(name: str) -> None:
    """CDI's device-name rule (``ValidateDeviceName``): letters, digits, ``_ - . :``,
    starting and ending with a letter or digit."""
    if not _NAME_INNER.match(name) or not name[-1].isalnum():
        raise CdiError(f"{name!r} is not a valid CDI device name")


def build_spec(kind: str, fns: list[Function]) -> dict[str, Any]:
    """One CDI spec of ``kind`` with a device per function that has a node of the kind."""
    devices = []
    for fn in fns:
        edits = device_edits(kind, fn)
        if edits is None:
            continue
        check_name(fn.pci)
        devices.append({"name": fn.pci, "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": devices}
    spec["cdiVersion"] = required_version(spec)
    assert _ver(spec["cdiVersion"]) <= _ver(MAX_VERSION)
    return spec


def spec_paths(output: str | os.PathLike[str] = DEFAULT_SPEC) -> dict[str, Path]:
    """kind -> file: the accel spec at ``output``, the vfio spec beside it (``-vfio``)."""
    p = Path(output)
    return {ACCEL_KIND: p, VFIO_KIND: p.with_name(f"{p.stem}-vfio{p.suffix}")}


def render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2) + "\n"


def generate(output: str | os.PathLike[str] = DEFAULT_SPEC, sysroot: str = "/",
             only: Iterable[str] = ()) -> dict[str, Path]:
    """Write both specs (atomically; unchanged files are not rewritten).  A kind with no
    device (no IOMMU: no vfio devices) still gets its file, with an empty device list, so
    a function that went away is gone from the spec too."""
    fns = functions(sysroot)
    wanted = list(only)
    if wanted:
        fns = select(fns, wanted)
    paths = spec_paths(output)
    for kind, path in paths.items():
        text = render(build_spec(kind, fns))
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise CdiError(f"{path}: not a spec written by tacc cdi generate ({exc})") from None
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        raise CdiError(f"{path}: not a tacc CDI spec (kind {spec.get('kind')!r})")
    return spec


def qualified_names(output: str | os.PathLike[str] = DEFAULT_SPEC) -> list[tuple[str, dict]]:
    """(``kind=name``, containerEdits) of every device in the specs at ``output``."""
    out = []
    for _kind, path in spec_paths(output).items():
        if not path.exists():
            continue
        spec = load(path)
        out += [(f"{spec['kind']}={d['name']}", d["containerEdits"]) for d in spec["devices"]]
    return out


def resolve(name: str, output: str | os.PathLike[str] = DEFAULT_SPEC) -> dict[str, Any]:
    """The containerEdits of a fully qualified name (``tacc.dev/accel=0000:01:00.1``)."""
    kind, sep, dev = name.partition("=")
    if not sep or kind not in KINDS:
        raise CdiNameError(f"{name!r} is not a tacc CDI name (expected "
                       f"{ACCEL_KIND}=<PCI> or {VFIO_KIND}=<PCI>)")
    try:
        pci, _ = parse_pci(dev)
    except DeviceError as exc:
        raise CdiNameError(f"{name}: {exc}") from None
    known = dict(qualified_names(output))
    full = f"{kind}={pci}"
    if full not in known:
        have = ", ".join(k.split("=", 1)[1] for k in known if k.startswith(kind + "=")) or "none"
        raise CdiError(f"unresolvable CDI device {full}: no such function in "
                       f"{spec_paths(output)[kind]} (present: {have})")
    return known[full]
