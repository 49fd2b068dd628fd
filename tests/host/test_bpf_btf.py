"""tacc.bpftrace.btf: struct member offsets from a BTF blob, and the task states the
scheduler handlers use instead of including <linux/sched.h>."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.bpftrace import bpfsrc, btf

ROOT = Path(__file__).resolve().parents[2]


class Blob:
    """A BTF blob written the way the kernel lays it out (Documentation/bpf/btf.rst)."""

    def __init__(self) -> None:
        self.types = b""
        self.strings = b"\0"
        self.ntypes = 0

    def s(self, name: str) -> int:
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(self, name: str, kind: int, vlen: int, size: int, extra: bytes = b"",
            kflag: bool = False) -> int:
        info = (int(kflag) << 31) | (kind << 24) | vlen
        self.types += struct.pack("<III", self.s(name) if name else 0, info, size) + extra
        self.ntypes += 1
        return self.ntypes

    def int_(self, name: str) -> int:
        return self.add(name, 1, 0, 4, struct.pack("<I", 32))

    def struct_(self, name: str, members: list[tuple[str, int, int]], kflag: bool = False) -> int:
        extra = b"".join(struct.pack("<III", self.s(n), t, off) for n, t, off in members)
        return self.add(name, 4, len(members), 64, extra, kflag)

    def bytes(self) -> bytes:
        hdr = struct.pack("<HBBIIIII", btf.BTF_MAGIC, 1, 0, 24, 0, len(self.types),
                          len(self.types), len(self.strings))
        return hdr + self.types + self.strings


def _task_blob(pad_types: int = 0) -> Blob:
    b = Blob()
    i = b.int_("int")
    for k in range(pad_types):  # other kinds before it, each with its trailing data
        b.add(f"e{k}", 6, 2, 4, struct.pack("<Ii", b.s("A"), 1) + struct.pack("<Ii", b.s("B"), 2))
        b.add("", 13, 1, i, struct.pack("<II", 0, i))
        b.add(f"arr{k}", 3, 0, 0, struct.pack("<III", i, i, 4))
    ti = b.struct_("thread_info", [("flags", i, 0), ("cpu", i, 160)])
    b.struct_("task_struct", [("thread_info", ti, 0), ("exit_state", i, 1160 * 8),
                              ("pid", i, 1264 * 8), ("comm", i, 1752 * 8)])
    return b


@settings(max_examples=10, deadline=None)
@given(pad=st.integers(0, 20))
def test_offsets_found_past_other_kinds(tmp_path_factory: pytest.TempPathFactory,
                                        pad: int) -> None:
    path = tmp_path_factory.mktemp("btf") / "vmlinux"
    path.write_bytes(_task_blob(pad).bytes())
    off = btf.offsets(bpfsrc.TASK_OFFSETS, path)
    assert off == {"task_struct.pid": 1264, "task_struct.comm": 1752,
                   "task_struct.exit_state": 1160, "task_struct.thread_info": 0,
                   "thread_info.cpu": 20}
    defines = bpfsrc.task_defines(path)
    assert "#define OFF_TASK_CPU 20" in defines and "#define OFF_TASK_PID 1264" in defines


def test_bitfield_struct_offsets_masked(tmp_path: Path) -> None:
    b = Blob()
    i = b.int_("int")
    b.struct_("s", [("a", i, (3 << 24) | 64), ("b", i, (0 << 24) | 12)], kflag=True)
    (tmp_path / "v").write_bytes(b.bytes())
    assert btf.offsets({"s": ["a"]}, tmp_path / "v") == {"s.a": 8}
    with pytest.raises(btf.BTFError, match="bitfield"):
        btf.offsets({"s": ["b"]}, tmp_path / "v")


@pytest.mark.parametrize("damage", ["magic", "short", "truncated", "member", "struct",
                                    "missing"])
def test_bad_blob_is_one_error(tmp_path: Path, damage: str) -> None:
    raw = bytearray(_task_blob(2).bytes())
    fields = dict(bpfsrc.TASK_OFFSETS)
    path = tmp_path / "vmlinux"
    if damage == "magic":
        raw[0] ^= 0xFF
    elif damage == "short":
        raw = raw[:10]
    elif damage == "truncated":
        struct.pack_into("<I", raw, 12, len(raw))  # type_len past the end
    elif damage == "member":
        fields = {"task_struct": ["no_such_member"]}
    elif damage == "struct":
        fields = {"mm_struct": ["pgd"]}
    if damage != "missing":
        path.write_bytes(bytes(raw))
    with pytest.raises(btf.BTFError) as e:
        btf.offsets(fields, path)
    assert "\n" not in str(e.value)


def _header_defines(text: str) -> dict[str, int]:
    """#define NAME value|(A | B ...) of include/linux/sched.h, evaluated."""
    text = text.replace("\\\n", " ")
    vals: dict[str, int] = {}
    for name, expr in re.findall(r"^#define\s+(\w+)\s+(.+)$", text, re.M):
        expr = expr.split("/*")[0].strip()
        if not re.fullmatch(r"[\w\s|()+<x]+", expr):
            continue
        try:
            vals[name] = int(eval(expr, {}, dict(vals)))  # noqa: S307 - the kernel's header
        except (NameError, SyntaxError, TypeError):
            continue
    return vals


def test_task_states_match_the_guest_kernel_headers() -> None:
    """The constants the handlers take instead of <linux/sched.h> are the 6.12 kernel's
    (the headers setup.sh installs for bcc)."""
    kver = (ROOT / "scripts/kernel.pin").read_text().split()[0]
    common = sorted(Path("/usr/src").glob(f"linux-headers-{kver.split('+')[0]}*-common"))
    assert common, f"no linux-headers for {kver} under /usr/src (scripts/setup.sh installs it)"
    vals = _header_defines((common[0] / "include/linux/sched.h").read_text())
    for name, v in bpfsrc.TASK_STATES.items():
        assert vals[name] == v, name
