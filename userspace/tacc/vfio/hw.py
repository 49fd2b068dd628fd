"""tacc_hw.h for the user-space driver: the #defines and enums (``HW``, parsed by
:mod:`tacc.testing.taccdev`) plus its one-argument function-like macros
(``macro("TACC_QUEUE_BASE", 1)``), evaluated from the header text, never retyped."""

from __future__ import annotations

import re
from functools import cache

from tacc.testing.taccdev import HW, HW_H

__all__ = ["HW", "macro", "macros"]


@cache
def macros() -> dict[str, tuple[str, str]]:
    """name -> (parameter, body) of every ``#define TACC_X(p) body`` in tacc_hw.h."""
    text = re.sub(r"/\*.*?\*/", "", HW_H.read_text(), flags=re.S)
    out = {}
    for m in re.finditer(r"^\s*#define\s+(TACC_\w+)\((\w+)\)\s+(.+?)\s*$", text, flags=re.M):
        if not m.group(3).endswith("\\"):
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def macro(name: str, arg: int) -> int:
    """The value of the header's macro @name applied to @arg."""
    param, body = macros()[name]
    e = re.sub(rf"\b{param}\b", str(int(arg)), body)
    e = re.sub(r"(0x[0-9a-fA-F]+|\d+)(ull|ULL|u|U|ul|UL)\b", r"\1", e)
    for k in sorted(HW.defs, key=len, reverse=True):
        if k in e:
            e = re.sub(rf"\b{k}\b", str(HW.defs[k]), e)
    if re.search(r"[A-Za-z_]", e.replace("0x", "")):
        raise ValueError(f"{name}({arg}): cannot evaluate {e!r}")
    return int(eval(e, {"__builtins__": {}}))  # noqa: S307 - digits and operators only
