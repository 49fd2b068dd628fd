"""tacc.ko's devcoredumps (kernel/tacc_coredump.c): the dumps in /sys/class/devcoredump
of a PCI function (its ``failing_device`` link) and their text, parsed.

A dump is ``tacc devcoredump 1``, then ``reason:``, ``device:``, ``time_ns:``
(CLOCK_MONOTONIC), ``registers:`` (``NAME: 0x...`` lines), ``queues:``, an optional
``job:`` line with its ``cmd N:`` lines, ``trace:`` with its ``rec`` lines, ``end``.
Writing to a dump's ``data`` frees it (the kernel frees it itself after 5 minutes)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/class/devcoredump")
HEADER = "tacc devcoredump 1"


@dataclass
class Dump:
    reason: str = ""
    device: str = ""
    time_ns: int = 0
    registers: dict[str, int] = field(default_factory=dict)
    queues: list[dict[str, int]] = field(default_factory=list)
    job: dict[str, str] = field(default_factory=dict)
    commands: list[dict[str, int]] = field(default_factory=list)
    trace: list[dict[str, int]] = field(default_factory=list)


def dumps_of(pci: str, root: Path | None = None) -> list[Path]:
    """The devcdN directories whose failing device is PCI function ``pci``."""
    out = []
    for d in sorted((root or ROOT).glob("devcd*")):
        try:
            if Path(os.path.realpath(d / "failing_device")).name == pci:
                out.append(d)
        except OSError:
            continue
    return out


def free(d: Path) -> bool:
    """Free the dump ``d`` (a devcdN directory): any write to its ``data`` does, as the
    kernel's devcoredump ABI (Documentation/ABI/testing/devcoredump) says.  False when it
    is gone already (freed by another reader, or timed out)."""
    try:
        with open(d / "data", "w") as f:
            f.write("1")
    except OSError:
        return False
    return True


def _pairs(text: str) -> dict[str, str]:
    words = text.split()
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}


def parse(text: str) -> Dump:
    lines = text.splitlines()
    if not lines or lines[0] != HEADER:
        raise ValueError(f"not a tacc devcoredump (first line {lines[:1]!r})")
    d = Dump()
    for ln in lines[1:]:
        s = ln.strip()
        if ln.startswith("reason: "):
            d.reason = ln.removeprefix("reason: ")
        elif ln.startswith("device: "):
            d.device = ln.removeprefix("device: ")
        elif ln.startswith("time_ns: "):
            d.time_ns = int(ln.split()[1])
        elif m := re.fullmatch(r"  ([A-Z_]+): (0x[0-9a-f]+)", ln):
            d.registers[m[1]] = int(m[2], 16)
        elif m := re.fullmatch(r"  queue (\d+): (.*)", ln):
            q = {k: int(v, 0) for k, v in _pairs(m[2]).items()}
            d.queues.append({"queue": int(m[1]), **q})
        elif ln.startswith("job: "):
            d.job = _pairs(ln.removeprefix("job: "))
        elif m := re.fullmatch(r"  cmd (\d+): (.*) words (.*)", ln):
            c = {k: int(v, 0) for k, v in _pairs(m[2]).items()}
            d.commands.append({"index": int(m[1]), **c})
        elif s.startswith("rec "):
            d.trace.append({k: int(v, 0) for k, v in _pairs(s.removeprefix("rec ")).items()})
    return d
