"""The device contract: ``kernel/include/tacc_hw.h`` and
``kernel/include/uapi/drm/tacc_accel.h`` as Python, generated at build time.

:mod:`tacc.hw._contract` is written by :mod:`tacc.hw.gen` (``scripts/setup.sh`` and the
package build run it): every constant, enum, X-list, one-argument macro and struct
layout of the two headers, under the headers' own names (``hw.TACC_REG_ID``,
``hw.TACC_QUEUE_BASE(q)``, ``hw.DRM_IOCTL_TACC_SUBMIT``).  This module adds the views
the rest of the package reads: the counter lists, the ioctl names, ctypes structures
and numpy dtypes of the record layouts.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

try:
    from tacc.hw._contract import *  # noqa: F403
    from tacc.hw._contract import CONSTANTS, ENUMS, MACROS, STRUCTS, XLISTS
except ModuleNotFoundError as exc:  # a source tree nobody built
    raise ImportError("tacc.hw._contract is not generated: run scripts/setup.sh "
                      "(or pip install the package)") from exc

__all__ = ["CONSTANTS", "ENUMS", "FUNC_COUNTERS", "GLOBAL_COUNTERS", "IOCTLS", "MACROS",
           "STRUCTS", "XLISTS", "counter_catalogue", "dtype", "ioctl_names", "struct"]


def _xlist(name: str) -> dict[str, int]:
    return {e[0]: int(e[1]) for e in XLISTS[name]}


# counter name -> BAR2 slot, of the function page and of the global page
FUNC_COUNTERS: dict[str, int] = _xlist("TACC_FUNC_COUNTERS")
GLOBAL_COUNTERS: dict[str, int] = _xlist("TACC_GLOBAL_COUNTERS")

# every DRM_IOCTL_TACC_* request number, by its name without the prefix
IOCTLS: dict[str, int] = {k.removeprefix("DRM_IOCTL_TACC_"): v for k, v in CONSTANTS.items()
                          if k.startswith("DRM_IOCTL_TACC_")}


def ioctl_names() -> dict[int, str]:
    """_IOC_NR of each tacc ioctl -> its name (``SUBMIT``): what the driver's
    tracepoints report in ``nr``."""
    return {v & 0xFF: k for k, v in IOCTLS.items()}


def counter_catalogue(with_global: bool = True) -> str:
    """The driver's ``counters/catalogue`` text (docs/counters.md): version line, then
    ``name slot unit scope description`` per counter."""
    lines = ["# version 1: name slot unit scope description"]
    lists = [("TACC_FUNC_COUNTERS", "function")]
    if with_global:
        lists.append(("TACC_GLOBAL_COUNTERS", "global"))
    for xl, scope in lists:
        lines += [f"{n} {slot} {unit} {scope} {desc}" for n, slot, unit, desc in XLISTS[xl]]
    return "\n".join(lines) + "\n"


_CT = {"u1": ctypes.c_uint8, "u2": ctypes.c_uint16, "u4": ctypes.c_uint32,
       "u8": ctypes.c_uint64, "i1": ctypes.c_int8, "i2": ctypes.c_int16,
       "i4": ctypes.c_int32, "i8": ctypes.c_int64}
_SCALAR = {"__u8": "u1", "__u16": "u2", "__u32": "u4", "__u64": "u8", "__s8": "i1",
           "__s16": "i2", "__s32": "i4", "__s64": "i8", "__le16": "u2", "__le32": "u4",
           "__le64": "u8", "char": "i1", "int": "i4"}


def _ctype(f: dict[str, Any], name: str) -> Any:
    if "fields" in f:
        base = ctypes.Union if f["kind"] == "union" else ctypes.Structure
        t: Any = _aggregate(f"{name}_{f['name'] or 'anon'}", f["fields"], f["size"], base)
    elif f["type"].startswith("struct "):
        t = struct(f["type"][7:])
    else:
        t = _CT[_SCALAR[f["type"]]]
    return t * f["count"] if f.get("count", 1) > 1 else t


def _aggregate(name: str, fields: list[dict[str, Any]], size: int, base: type) -> type:
    anon = [f"_anon{i}" for i, f in enumerate(fields) if f["name"] is None]
    names = [f["name"] or f"_anon{i}" for i, f in enumerate(fields)]
    ns: dict[str, Any] = {"_fields_": [(n, _ctype(f, name)) for n, f in zip(names, fields,
                                                                          strict=True)]}
    if anon:
        ns["_anonymous_"] = anon
    cls = type(name, (base,), ns)
    assert ctypes.sizeof(cls) == size, (name, ctypes.sizeof(cls), size)
    return cls


@cache
def struct(name: str) -> type[ctypes.Structure]:
    """The ctypes class of the header's ``struct name`` (``struct("drm_tacc_cmd")``)."""
    s = STRUCTS[name]
    return _aggregate(name, s["fields"], s["size"], ctypes.Structure)  # type: ignore[return-value]


@cache
def dtype(name: str) -> Any:
    """The numpy dtype of a flat record layout (``dtype("tacc_trace_rec")``): every
    scalar and array field at its C offset, itemsize the C size."""
    import numpy as np

    s = STRUCTS[name]
    names, formats, offsets = [], [], []
    for f in s["fields"]:
        if "fields" in f or f["type"].startswith("struct "):
            raise ValueError(f"struct {name} is not flat")
        names.append(f["name"])
        fmt = "<" + _SCALAR[f["type"]]
        formats.append((fmt, f["count"]) if f["count"] > 1 else fmt)
        offsets.append(f["offset"])
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": s["size"]})
