"""Generate :mod:`tacc.hw._contract` from the C contract headers.

Run at build time (``scripts/setup.sh``, the package build in ``setup.py``):
``python userspace/tacc/hw/gen.py OUT.py HEADER...``.  Standard library only: it runs
before the package is installed.

What it takes from each header, with no per-constant knowledge:

- every object-like ``#define NAME expr`` whose value evaluates (integers, characters,
  strings; expressions over earlier names, ``sizeof(struct x)`` and the ioctl macros
  ``_IO/_IOR/_IOW/_IOWR``);
- every one-parameter function-like macro whose body evaluates given its argument (a
  Python function of the same name);
- every X-list ``#define NAME(X) X(...) X(...)`` (a tuple of its entries' arguments);
- every ``enum`` (members and values, also as module constants);
- every ``struct`` (natural C layout: fields with offsets, sizes, arrays, nested and
  anonymous structs and unions), as data the package turns into ctypes classes and
  numpy dtypes.
"""

from __future__ import annotations

import pprint
import re
import sys
from pathlib import Path
from typing import Any

SCALARS = {
    "__u8": ("u1", 1), "__u16": ("u2", 2), "__u32": ("u4", 4), "__u64": ("u8", 8),
    "__s8": ("i1", 1), "__s16": ("i2", 2), "__s32": ("i4", 4), "__s64": ("i8", 8),
    "__le16": ("u2", 2), "__le32": ("u4", 4), "__le64": ("u8", 8),
    "char": ("i1", 1), "int": ("i4", 4),
}
_IOC = {"_IO": 0, "_IOW": 1, "_IOR": 2, "_IOWR": 3}


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: " " * 0 + "\n" * m.group(0).count("\n"), text,
                  flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\\\n", " ", text)


class Contract:
    def __init__(self) -> None:
        self.consts: dict[str, Any] = {}
        self.macros: dict[str, tuple[str, str]] = {}  # name -> (param, body)
        self.xlists: dict[str, list[tuple[Any, ...]]] = {}
        self.enums: dict[str, dict[str, int]] = {}
        self.structs: dict[str, dict[str, Any]] = {}

    # ---------------------------------------------------------------- values
    def _py(self, e: str) -> str:
        """The C expression @e as a Python one (suffixes, casts, sizeof resolved)."""
        e = e.strip()
        e = re.sub(r"sizeof\s*\(\s*struct\s+(\w+)\s*\)",
                   lambda m: str(self.structs[m.group(1)]["size"]), e)
        # the ioctl macros' type argument: its size
        e = re.sub(r"\bstruct\s+(\w+)", lambda m: str(self.structs[m.group(1)]["size"]), e)
        e = re.sub(r"\(\s*(?:__[us](?:8|16|32|64)|unsigned(?: long)*|long|int)\s*\)", "", e)
        e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU]?)\b", r"\1", e)
        e = re.sub(r"'(.)'", lambda m: str(ord(m.group(1))), e)
        if re.search(r"[^\s\w()+\-*<>|&~^,\"]|/|\?", e):
            raise ValueError(e)
        return e

    def _expr(self, e: str, env: dict[str, Any] | None = None) -> Any:
        e = self._py(e)
        names = dict(self.consts)
        names.update(env or {})
        for k, code in _IOC.items():
            names[k] = (lambda d: lambda t, nr, size=0: (d << 30) | (size << 16)
                        | (t << 8) | nr)(code)
        for k in self.macros:
            names.setdefault(k, self._func(k))
        return eval(e, {"__builtins__": {}}, names)  # noqa: S307 - the project's headers

    def _func(self, name: str) -> Any:
        param, body = self.macros[name]
        return lambda v: self._expr(body, {param: v})

    def _scalar(self, tok: str) -> Any:
        tok = tok.strip()
        if tok.startswith('"'):
            return tok.strip('"')
        try:
            return self._expr(tok)
        except Exception:
            return tok  # an identifier (a unit, a name)

    # ---------------------------------------------------------------- parse
    def parse(self, text: str) -> None:
        text = _strip(text)
        body_lines: list[str] = []
        active: list[bool] = []  # the #if stack: a user-space build (no __KERNEL__, C)
        for line in text.splitlines():
            s = line.strip()
            m = re.match(r"#\s*(ifdef|ifndef|if|else|endif)\b\s*(.*)$", s)
            if m:
                kind, cond = m.groups()
                if kind == "endif":
                    active.pop()
                elif kind == "else":
                    active[-1] = not active[-1]
                else:
                    d = re.fullmatch(r"(?:defined\s*\(\s*(\w+)\s*\)|(\w+))", cond.strip())
                    name = d and (d.group(1) or d.group(2))
                    known = bool(name) and name in self.consts
                    active.append(known if kind in ("ifdef", "if") and name else
                                  not known if kind == "ifndef" else True)
                continue
            if not all(active):
                continue
            if s.startswith("#") and body_lines:
                code = " ".join(body_lines)
                if code.count("{") == code.count("}"):  # declarations before this line
                    self._decls(code)
                    body_lines = []
            m = re.match(r"#\s*define\s+(\w+)\(\s*(\w+)\s*\)\s*(.*)$", s)
            if m:
                name, param, body = m.groups()
                calls = _calls(body, param)
                if calls is not None:
                    self.xlists[name] = [tuple(self._scalar(a) for a in _split_args(c))
                                         for c in calls]
                elif body:
                    self.macros[name] = (param, body)
                continue
            m = re.match(r"#\s*define\s+(\w+)\s+(.+)$", s)
            if m:
                try:
                    v = (m.group(2).strip().strip('"') if m.group(2).strip().startswith('"')
                         else self._expr(m.group(2)))
                except Exception:
                    continue
                self.consts[m.group(1)] = v
                continue
            if s.startswith("#"):
                continue
            body_lines.append(line)
        self._decls(" ".join(body_lines))

    def _decls(self, code: str) -> None:
        pos = 0
        pat = re.compile(r"\b(enum|struct)\s+(\w+)\s*\{")
        while True:
            m = pat.search(code, pos)
            if not m:
                return
            end = _match_brace(code, m.end() - 1)
            inner = code[m.end():end]
            if m.group(1) == "enum":
                self._enum(m.group(2), inner)
            else:
                fields, size, align = self._struct(inner)
                self.structs[m.group(2)] = {"size": size, "align": align, "fields": fields}
            pos = end + 1

    def _enum(self, name: str, inner: str) -> None:
        members: dict[str, int] = {}
        nxt = 0
        for item in _split_args(inner):
            if not item:
                continue
            m = re.fullmatch(r"(\w+)\s*(?:=\s*(.+))?", item)
            if not m:
                continue  # a macro expansion (an X-list's enum): the X-list has the data
            try:
                v = self._expr(m.group(2)) if m.group(2) else nxt
            except Exception:
                continue
            members[m.group(1)] = v
            self.consts[m.group(1)] = v
            nxt = v + 1
        self.enums[name] = members

    def _struct(self, inner: str, union: bool = False
                ) -> tuple[list[dict[str, Any]], int, int]:
        """Fields of a struct (or union) body: name, offset, type, count, size; nested
        aggregates as ``fields`` (anonymous ones with name None)."""
        fields: list[dict[str, Any]] = []
        off = size = 0
        align = 1
        for decl in _members(inner):
            m = re.match(r"(struct|union)\s*(\w*)\s*\{", decl)
            if m:
                end = _match_brace(decl, m.end() - 1)
                sub, ssize, salign = self._struct(decl[m.end():end], m.group(1) == "union")
                names = [n.strip() for n in decl[end + 1:].split(",") if n.strip()] or [None]
                for n in names:
                    off = _align(off, salign) if not union else 0
                    fields.append({"name": n, "offset": off, "kind": m.group(1),
                                   "fields": sub, "size": ssize, "count": 1})
                    size = max(size, off + ssize) if union else off + ssize
                    off = off + ssize if not union else 0
                    align = max(align, salign)
                continue
            m = re.match(r"struct\s+(\w+)\s+(.+)$", decl)
            if m:
                st = self.structs[m.group(1)]
                tsize, talign, typ = st["size"], st["align"], "struct " + m.group(1)
                rest = m.group(2)
            else:
                m = re.match(r"(\w+)\s+(.+)$", decl)
                if not m or m.group(1) not in SCALARS:
                    raise ValueError(f"cannot lay out {decl!r}")
                typ, (_, tsize) = m.group(1), SCALARS[m.group(1)]
                talign, rest = tsize, m.group(2)
            for n in rest.split(","):
                mm = re.fullmatch(r"\s*(\w+)\s*(?:\[\s*(.+?)\s*\])?\s*", n)
                if not mm:
                    raise ValueError(f"cannot lay out {decl!r}")
                count = self._expr(mm.group(2)) if mm.group(2) else 1
                if not union:
                    off = _align(off, talign)
                fields.append({"name": mm.group(1), "offset": off if not union else 0,
                               "type": typ, "count": count, "size": tsize * count})
                if union:
                    size = max(size, tsize * count)
                else:
                    off += tsize * count
                    size = off
                align = max(align, talign)
        return fields, _align(size, align), align


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


def _match_brace(s: str, i: int) -> int:
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced braces")


def _calls(body: str, name: str) -> list[str] | None:
    """The argument texts of @body when it is nothing but calls ``name(...)``."""
    out, i = [], 0
    while True:
        m = re.compile(rf"\s*{name}\s*\(").match(body, i)
        if not m:
            return out if out and not body[i:].strip() else None
        depth, q, j = 1, False, m.end()
        while j < len(body) and depth:
            ch = body[j]
            if ch == '"':
                q = not q
            elif not q and ch == "(":
                depth += 1
            elif not q and ch == ")":
                depth -= 1
            j += 1
        if depth:
            return None
        out.append(body[m.end():j - 1])
        i = j


def _split_args(s: str) -> list[str]:
    out, depth, cur, q = [], 0, "", False
    for ch in s:
        if ch == '"':
            q = not q
        if not q and ch in "({":
            depth += 1
        elif not q and ch in ")}":
            depth -= 1
        if ch == "," and depth == 0 and not q:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _members(inner: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append(" ".join(cur.split()))
            cur = ""
        else:
            cur += ch
    return [m for m in out if m]


def generate(headers: list[Path]) -> str:
    c = Contract()
    for h in headers:
        c.parse(h.read_text())
    funcs = []
    for name in sorted(c.macros):
        try:
            c._func(name)(1)
        except Exception:
            continue
        funcs.append(name)
    lines = [
        '"""Generated by tacc/hw/gen.py from ' + ", ".join(h.name for h in headers)
        + ': do not edit."""',
        "# ruff: noqa",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
    ]
    for k, v in c.consts.items():
        lines.append(f"{k} = {v!r}")
    lines.append("")
    for name in funcs:
        param, body = c.macros[name]
        lines.append(f"def {name}({param}: int) -> int:\n"
                     f"    return int({c._py(body)})\n")
    lines.append("CONSTANTS: dict[str, Any] = " + pprint.pformat(c.consts, sort_dicts=False))
    lines.append("ENUMS: dict[str, dict[str, int]] = "
                 + pprint.pformat(c.enums, sort_dicts=False))
    lines.append("XLISTS: dict[str, list[tuple[Any, ...]]] = "
                 + pprint.pformat(c.xlists, sort_dicts=False, width=100))
    lines.append("STRUCTS: dict[str, dict[str, Any]] = "
                 + pprint.pformat(c.structs, sort_dicts=False, width=100))
    lines.append(f"MACROS: tuple[str, ...] = {tuple(funcs)!r}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out, *headers = argv
    text = generate([Path(h) for h in headers])
    p = Path(out)
    if not p.exists() or p.read_text() != text:
        p.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
