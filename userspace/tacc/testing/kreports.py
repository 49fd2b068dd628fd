"""Kernel checker reports (KASAN, KFENCE, lockdep, DEBUG_OBJECTS, refcount, WARN, BUG,
kmemleak) cut out of a dmesg or a /sys/kernel/debug/kmemleak dump, and whether each
names tacc.

The debug kernel (scripts/debug-kernel.sh, `make test-debug`) fails a run on any report
whose text names tacc: a ``[tacc]`` module frame, a ``tacc_*+0x..`` symbol, a
``tacc_*.c:N`` location, or -- tacc.ko is the debug kernel's only module -- an unresolved
module-space address (a frame of tacc.ko after it was unloaded).  Reports that do not
name tacc are kept and listed, not failed.  An injected allocation failure's own warning
("page allocation failure", "FAULT_INJECTION: forcing a failure") is expected under fault
injection and is marked so.

Standard library only: scripts/test-vm (the host's python3) loads this file by path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TS = re.compile(r"^\[\s*\d+\.\d+\]\s?")
_RULE = re.compile(r"^={20,}$")
# Lines that open a report (after the timestamp is stripped).
_START = re.compile(
    r"^(-+\[ cut here \]-+|BUG: |WARNING: |INFO: |Oops|general protection fault|"
    r"kernel BUG at|Unable to handle|ODEBUG: |refcount_t: |list_(add|del) corruption|"
    # DMA-API's errors name the driver and the device (err_printk: "DMA-API: %s %s: "); its
    # other lines ("preallocated N debug entries" at boot, "Mapped at:") open nothing
    r"DMA-API: \S+ \S+: |UBSAN: |.*: page allocation failure: |"
    r"FAULT_INJECTION: forcing a failure)"
)
_END = re.compile(r"^(---\[ end trace [0-9a-f]+ \]---|</TASK>|---\[ end Kernel panic)")
NAMES_TACC = re.compile(
    r"\[tacc\]|\btacc_\w+\+0x[0-9a-f]+|\btacc_\w+\.[ch]:\d+|"
    # an unresolved frame in module space (nokaslr): tacc.ko is the only module
    r"^\s*(\? )?(\[<[0-9a-f]+>\] )?0xffffffffc[0-9a-f]{7}\b",
    re.M,
)
EXPECTED_UNDER_INJECTION = re.compile(r"page allocation failure: |FAULT_INJECTION: forcing")
MAX_LINES = 400


@dataclass
class Report:
    kind: str           # the opening line, shortened: "BUG: KASAN: slab-use-after-free", ...
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def names_tacc(self) -> bool:
        return bool(NAMES_TACC.search(self.text))

    @property
    def injected(self) -> bool:
        """The warning an injected allocation failure prints itself (not a bug)."""
        return bool(EXPECTED_UNDER_INJECTION.search(self.kind))


def _kind(lines: list[str]) -> str:
    for ln in lines[:4]:
        if ln.startswith(("------------[ cut here", "=====")):
            continue
        return ln.strip()[:120]
    return lines[0].strip()[:120]


def dmesg_reports(text: str) -> list[Report]:
    """Every checker report in a dmesg (timestamps stripped)."""
    lines = [_TS.sub("", ln.rstrip()) for ln in text.splitlines()]
    out: list[Report] = []
    i, n = 0, len(lines)
    while i < n:
        ln = lines[i]
        framed = _RULE.match(ln) is not None and i + 1 < n and _START.match(lines[i + 1])
        if not (framed or _START.match(ln)):
            i += 1
            continue
        start = i
        # KASAN/KFENCE reports sit between two rules; lockdep's open with one and end with
        # the stack backtrace's </TASK>; WARN()s end with "end trace".
        kasan = framed and re.match(r"BUG: (KASAN|KFENCE)", lines[i + 1]) is not None
        j = i + (2 if framed else 1)
        while j < n and j - start < MAX_LINES:
            cur = lines[j]
            j += 1
            if kasan:
                if _RULE.match(cur):
                    break
            elif _END.match(cur.strip()):
                break
        out.append(Report(_kind(lines[start:j]), lines[start:j]))
        i = j
    return out


def kmemleak_reports(text: str) -> list[Report]:
    """The objects of a /sys/kernel/debug/kmemleak read, one report each."""
    out: list[Report] = []
    for ln in text.splitlines():
        if ln.startswith("unreferenced object"):
            out.append(Report("kmemleak: " + ln.strip(), [ln.rstrip()]))
        elif out:
            out[-1].lines.append(ln.rstrip())
    return out


def tacc_reports(reports: list[Report], allow_injected: bool = False) -> list[Report]:
    """Those that fail a debug-kernel run: they name tacc (and, when fault injection
    ran, are not the injected failure's own warning)."""
    return [r for r in reports if r.names_tacc and not (allow_injected and r.injected)]
