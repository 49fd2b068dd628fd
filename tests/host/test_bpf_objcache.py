"""tacc.bpftrace.objcache's file side: what names an entry, which entries are refused
before anything reaches the kernel, bcc's table descriptions as ctypes.  (Loading into
the kernel and attaching: tests/vm/test_tracing_accounting.py, against the compiled
program of the same session.)"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tacc.bpftrace import objcache
from tacc.bpftrace.objcache import CacheError, decode_type, key, load

SRC = "#define RB_PAGES <ring>\nint f(void *c) { return 0; }\n"


def test_key_names_text_flags_and_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    k = key(SRC, ["-w"])
    assert k == key(SRC, ["-w"])
    assert k != key(SRC + " ", ["-w"]) and k != key(SRC, ["-w", "-g0"])
    real = os.uname()
    other = os.uname_result((real.sysname, real.nodename, real.release + "x", real.version,
                             real.machine))
    monkeypatch.setattr(objcache.os, "uname", lambda: other)
    assert key(SRC, ["-w"]) != k
    monkeypatch.setattr(objcache, "_bcc_version", lambda: "__version__ = '9.9'")
    monkeypatch.setattr(objcache.os, "uname", lambda: real)
    assert key(SRC, ["-w"]) != k


def _entry(d: Path, text: str, mode: int = 0o600) -> Path:
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / f"{key(SRC, [])}.json"
    p.write_text(text)
    p.chmod(mode)
    return p


def test_no_entry_is_none(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    assert load(SRC, [], Path("/nonexistent"), d) is None
    assert load(SRC, [], Path("/nonexistent"), tmp_path / "missing") is None


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_an_entry_others_could_write_is_refused(tmp_path: Path, mode: int) -> None:
    p = _entry(tmp_path / "c", json.dumps({"format": objcache.FORMAT}), mode)
    with pytest.raises(CacheError, match="not private"):
        load(SRC, [], Path("/nonexistent"), p.parent)


def test_a_directory_others_could_write_is_refused(tmp_path: Path) -> None:
    p = _entry(tmp_path / "c", "{}")
    p.parent.chmod(0o777)
    with pytest.raises(CacheError, match="not private"):
        load(SRC, [], Path("/nonexistent"), p.parent)


def test_a_symlinked_entry_is_refused(tmp_path: Path) -> None:
    real = _entry(tmp_path / "a", "{}")
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    (d / real.name).symlink_to(real)
    with pytest.raises(CacheError, match="not private"):
        load(SRC, [], Path("/nonexistent"), d)


@pytest.mark.parametrize("text", ["", "[1]", "{", '{"format": 99}', '{"format": 1}',
                                  '{"format": 1, "license": "GPL", "kern_version": 0, '
                                  '"funcs": [{"name": "f"}], "tables": []}'])
def test_a_damaged_entry_is_refused_before_the_kernel(tmp_path: Path, text: str) -> None:
    p = _entry(tmp_path / "c", text)
    with pytest.raises(CacheError):
        load(SRC, [], Path("/nonexistent"), p.parent)


def test_bcc_descriptions_as_ctypes() -> None:
    # as bcc 0.26 describes tacc's tables (struct_packed: no padding)
    hkey = decode_type(["hkey", [["dev", "unsigned int"], ["queue", "unsigned short"],
                                 ["which", "unsigned char"], ["slot", "unsigned char"]],
                        "struct_packed"])
    assert ctypes.sizeof(hkey) == 8
    k = hkey(dev=7, queue=2, which=1, slot=30)
    assert bytes(k) == (7).to_bytes(4, "little") + (2).to_bytes(2, "little") + bytes([1, 30])
    top = decode_type(["topval", [["jobs", "unsigned long long"], ["comm", "char", [16]]],
                       "struct_packed"])
    assert ctypes.sizeof(top) == 24
    padded = decode_type(["p", [["a", "unsigned char"], ["b", "unsigned long long"]],
                          "struct"])
    assert ctypes.sizeof(padded) == 16
    bits = decode_type(["b", [["x", "unsigned int", 3], ["y", "unsigned int", 5]], "struct"])
    assert ctypes.sizeof(bits) == 4
    assert decode_type("unsigned long long") is ctypes.c_ulonglong


@pytest.mark.parametrize("desc", ["float", "void *", ["x", [], "enum"], ["x", [["a"]], "struct"],
                                  ["x", [["a", "int", [0]]], "struct"], 3, None])
def test_unknown_descriptions_refused(desc: object) -> None:
    with pytest.raises(CacheError):
        decode_type(desc)


_scalar = st.sampled_from(sorted(objcache._CTYPES))
_field = st.tuples(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _scalar,
                   st.one_of(st.none(), st.integers(1, 8)))


@given(st.lists(_field, min_size=1, max_size=8, unique_by=lambda f: f[0]),
       st.sampled_from(["struct", "struct_packed"]))
def test_packed_layouts_match_their_scalars(fields: list, kind: str) -> None:
    """A struct_packed's size is the sum of its fields' (arrays included), whatever they
    are; a plain struct is never smaller."""
    desc = ["s", [[n, t] if c is None else [n, t, [c]] for n, t, c in fields], kind]
    size = ctypes.sizeof(decode_type(desc))
    flat = sum(ctypes.sizeof(objcache._CTYPES[t]) * (c or 1) for _, t, c in fields)
    assert size == flat if kind == "struct_packed" else size >= flat
