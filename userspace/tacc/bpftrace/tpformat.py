"""Tracepoint formats from tracefs: parsing, ``list`` output, C structs for BPF programs.

The BPF program's view of each tracepoint record is generated from the live format
file, so it always matches the loaded driver (kernel/tacc_trace.h).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
_FIELD_RE = re.compile(
    r"field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);\s*signed:(?P<sgn>\d+);"
)


@dataclass(frozen=True)
class Field:
    ctype: str
    name: str
    offset: int
    size: int
    signed: bool
    array: int = 0  # element count for "char comm[16]"

    @property
    def common(self) -> bool:
        return self.name.startswith("common_")


@dataclass(frozen=True)
class Format:
    system: str
    name: str
    id: int
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None


def parse_format(text: str, system: str = "") -> Format:
    name, tid = "", 0
    fields: list[Field] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:"):
            name = s.split(":", 1)[1].strip()
        elif s.startswith("ID:"):
            tid = int(s.split(":", 1)[1])
        m = _FIELD_RE.search(s)
        if not m:
            continue
        decl = m.group("decl").strip()
        arr = 0
        am = re.match(r"^(.*?)\s*\b(\w+)\s*\[(\d*)\]$", decl)
        if am:
            ctype, fname = am.group(1).strip(), am.group(2)
            arr = int(am.group(3) or 0)
        else:
            parts = decl.rsplit(None, 1)
            ctype, fname = (parts[0], parts[1]) if len(parts) == 2 else ("int", parts[0])
            while fname.startswith("*"):
                ctype += " *"
                fname = fname[1:]
        fields.append(Field(ctype, fname, int(m.group("off")), int(m.group("size")),
                            m.group("sgn") == "1", arr))
    return Format(system, name, tid, tuple(fields))


def tracefs_root() -> Path | None:
    for c in TRACEFS_CANDIDATES:
        if Path(c, "events").is_dir():
            return Path(c)
    return None


def read_format(root: Path, system: str, event: str) -> Format | None:
    p = root / "events" / system / event / "format"
    try:
        return parse_format(p.read_text(), system)
    except OSError:
        return None


def list_system(root: Path, system: str) -> list[Format]:
    d = root / "events" / system
    out = []
    for ev in sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []:
        fmt = read_format(root, system, ev)
        if fmt is not None:
            out.append(fmt)
    return out


_INT = {(1, False): "u8", (1, True): "s8", (2, False): "u16", (2, True): "s16",
        (4, False): "u32", (4, True): "s32", (8, False): "u64", (8, True): "s64"}


def c_struct(fmt: Format, struct_name: str) -> str:
    """A packed C struct with the record's fields at their exact offsets."""
    lines = [f"struct {struct_name} {{"]
    pos = 0
    pad = 0
    for f in sorted(fmt.fields, key=lambda f: f.offset):
        if f.offset < pos:
            continue
        if f.offset > pos:
            lines.append(f"\tu8 __pad{pad}[{f.offset - pos}];")
            pad += 1
        if f.array or "__data_loc" in f.ctype:
            if "__data_loc" in f.ctype:
                lines.append(f"\tu32 {f.name};")
            else:
                lines.append(f"\tu8 {f.name}[{f.size}];")
        else:
            t = _INT.get((f.size, f.signed and "*" not in f.ctype))
            lines.append(f"\t{t} {f.name};" if t else f"\tu8 {f.name}[{f.size}];")
        pos = f.offset + f.size
    lines.append("} __attribute__((packed));")
    return "\n".join(lines)
