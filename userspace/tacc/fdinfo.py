"""fdinfo of a DRM/accel file (/proc/PID/fdinfo/FD) read by the rules of the kernel's
Documentation/gpu/drm-usage-stats.rst (6.12): each line ``<key>:<whitespace><value>``;
``drm-`` keys are the standard ones only (a driver's own keys carry its prefix, here
``tacc-``); ``drm-engine-<name>: <uint> ns``; memory ``drm-{total,shared,resident,
purgeable,active}-<region>: <uint> [KiB|MiB]``; no deprecated ``drm-memory-<region>``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LINE = re.compile(r"(?P<key>[a-z0-9_-]+):\s+(?P<value>\S.*)")
UINT = r"(0|[1-9][0-9]*)"
MEMORY_KINDS = ("total", "shared", "resident", "purgeable", "active")
SIZE_UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20}


class FdinfoError(ValueError):
    pass


@dataclass
class Fdinfo:
    driver: str = ""
    client_id: int = -1
    pdev: str = ""
    engines: dict[str, int] = field(default_factory=dict)  # name -> ns
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # region -> kind -> B
    other: dict[str, str] = field(default_factory=dict)  # the driver's own keys


def parse(text: str, driver_prefix: str = "tacc-") -> Fdinfo:
    """The DRM keys of ``text``; FdinfoError names the first line breaking the rules."""
    out = Fdinfo()
    for ln in text.splitlines():
        m = LINE.fullmatch(ln)
        if not m:
            raise FdinfoError(f"not '<key>:<whitespace><value>': {ln!r}")
        key, value = m["key"], m["value"].strip()
        if not key.startswith("drm-"):
            if key.startswith(driver_prefix):
                out.other[key] = value
            continue  # pos, flags, mnt_id, ino: the file's own fdinfo
        if key == "drm-driver":
            out.driver = value
        elif key == "drm-client-id":
            if not re.fullmatch(UINT, value):
                raise FdinfoError(f"{key}: not a uint: {value!r}")
            out.client_id = int(value)
        elif key == "drm-pdev":
            if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", value):
                raise FdinfoError(f"{key}: not a PCI address: {value!r}")
            out.pdev = value
        elif key.startswith("drm-engine-") and not key.startswith("drm-engine-capacity-"):
            v = re.fullmatch(UINT + " ns", value)
            if not v:
                raise FdinfoError(f"{key}: not '<uint> ns': {value!r}")
            out.engines[key.removeprefix("drm-engine-")] = int(v[1])
        elif key.startswith("drm-memory-"):
            raise FdinfoError(f"{key}: deprecated (drm-total-/drm-resident-<region>)")
        elif (k := key.split("-")[1]) in MEMORY_KINDS and key.count("-") >= 2:
            v = re.fullmatch(UINT + r"(?: (KiB|MiB))?", value)
            if not v:
                raise FdinfoError(f"{key}: not '<uint> [KiB|MiB]': {value!r}")
            region = key.split("-", 2)[2]
            out.memory.setdefault(region, {})[k] = int(v[1]) * SIZE_UNITS[v[2] or ""]
        elif key.startswith(("drm-engine-capacity-", "drm-cycles-", "drm-maxfreq-",
                             "drm-total-cycles-")):
            continue  # standard keys tacc does not print
        else:
            raise FdinfoError(f"{key}: not a key of drm-usage-stats.rst")
    if not out.driver:
        raise FdinfoError("no drm-driver (mandatory)")
    return out
