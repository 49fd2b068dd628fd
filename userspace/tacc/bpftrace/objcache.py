"""A compiled BPF program kept on disk, loaded again without bcc's compile.

bcc compiles the program text with clang and LLVM every time a tool starts (7-10 s of
guest time in the TCG test VM, most of a capture's start).  The result depends only on
the text, the flags, the kernel and bcc, so after a compile :func:`save` keeps what the
kernel needs to load it again: each function's instructions (map references turned back
into table names) and each table's type, sizes, flags and key/leaf layout.  :func:`load`
creates fresh maps, patches their fds into the instructions and loads a function with
``BPF_PROG_LOAD`` when it is first attached, as bcc does; nothing is shared with the
process that compiled it (every process has its own maps).

The entry is a JSON file named by a SHA-256 of the text, the flags, the kernel
(``uname`` release and version) and bcc's version, in a directory only root may write
(``/var/cache/tacc/bpf``, ``TACC_BPF_CACHE_DIR``); an entry whose directory or file
another user could write, or that does not parse, is not used (the tool compiles).  The
object :func:`load` returns has the part of bcc's ``BPF`` interface :class:`Program`
uses (tables by name, attach and detach by tracepoint and kprobe, ``funcs``,
``cleanup``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tacc.libc import NR_BPF, NR_PERF_EVENT_OPEN, PERF_ATTR_SIZE, PerfEventAttr, libc

FORMAT = 1
DEFAULT_DIR = Path("/var/cache/tacc/bpf")

_BPF_MAP_CREATE, _BPF_MAP_LOOKUP, _BPF_MAP_UPDATE, _BPF_MAP_DELETE, _BPF_MAP_NEXT = 0, 1, 2, 3, 4
_BPF_PROG_LOAD = 5
_BPF_RAW_TRACEPOINT_OPEN = 17
PROG_KPROBE, PROG_TRACEPOINT, PROG_RAW_TRACEPOINT = 2, 5, 17
MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_RINGBUF = 1, 2, 6, 27
_MAP_TYPES = {MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_RINGBUF}
_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW
_PSEUDO_MAP_FD = 1
_PERF_TYPE_TRACEPOINT = 2
_PERF_FLAG_FD_CLOEXEC = 8
_PERF_IOC_ENABLE, _PERF_IOC_DISABLE, _PERF_IOC_SET_BPF = 0x2400, 0x2401, 0x40042408

# bcc's table descriptions (clang's names of C types) as ctypes
_CTYPES: dict[str, Any] = {
    "_Bool": ctypes.c_bool, "char": ctypes.c_char, "signed char": ctypes.c_byte,
    "unsigned char": ctypes.c_ubyte, "short": ctypes.c_short,
    "unsigned short": ctypes.c_ushort, "int": ctypes.c_int, "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long, "unsigned long": ctypes.c_ulong, "long long": ctypes.c_longlong,
    "unsigned long long": ctypes.c_ulonglong,
}


class CacheError(Exception):
    """An entry that cannot be used (the caller compiles instead)."""


def _bcc_version() -> str:
    for d in ("/usr/lib/python3/dist-packages/bcc", "/usr/lib/python3/site-packages/bcc"):
        try:
            return (Path(d) / "version.py").read_text().strip()
        except OSError:
            continue
    return "unknown"


def cache_dir() -> Path:
    return Path(os.environ.get("TACC_BPF_CACHE_DIR") or DEFAULT_DIR)


def key(src: str, cflags: list[str]) -> str:
    u = os.uname()
    h = hashlib.sha256()
    for part in (str(FORMAT), u.release, u.version, u.machine, _bcc_version(),
                 "\0".join(cflags), src):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def decode_type(desc: Any) -> Any:
    """A bcc table description (JSON) as a ctypes type; CacheError for what this does not
    know (the caller then compiles, and bcc decodes it)."""
    if isinstance(desc, str):
        if desc not in _CTYPES:
            raise CacheError(f"table type {desc!r}")
        return _CTYPES[desc]
    if not (isinstance(desc, list) and len(desc) == 3
            and desc[2] in ("struct", "struct_packed", "union")
            and isinstance(desc[0], str) and isinstance(desc[1], list)):
        raise CacheError(f"table type {str(desc)[:80]}")
    fields: list[tuple[Any, ...]] = []
    for f in desc[1]:
        if not isinstance(f, list) or not f or not isinstance(f[0], str):
            raise CacheError(f"field {str(f)[:80]}")
        if len(f) == 2:
            fields.append((f[0], decode_type(f[1])))
        elif len(f) == 3 and isinstance(f[2], list) and len(f[2]) == 1 \
                and isinstance(f[2][0], int) and f[2][0] > 0:
            fields.append((f[0], decode_type(f[1]) * f[2][0]))
        elif len(f) == 3 and isinstance(f[2], int) and not isinstance(f[2], bool):
            fields.append((f[0], decode_type(f[1]), f[2]))  # a bit field
        else:
            raise CacheError(f"field {str(f)[:80]}")
    base = ctypes.Union if desc[2] == "union" else ctypes.Structure
    ns: dict[str, Any] = {"_fields_": fields}
    if desc[2] == "struct_packed":
        ns["_pack_"] = 1
    return type(str(desc[0]) or "anon", (base,), ns)


# ------------------------------------------------------------------ save ---
def save(bpf: Any, src: str, cflags: list[str], directory: Path | None = None,
         compile_log: str = "") -> Path | None:
    """Keep the program bcc just compiled (``bpf``, a ``bcc.BPF``) under ``src`` (the text
    that names it: see :func:`load`); returns the entry's path, or None when the program
    holds what this loader does not handle."""
    from bcc.libbcc import lib

    vp, u64, cp = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_char_p
    for name, res, args in (("bpf_num_tables", u64, [vp]), ("bpf_table_name", cp, [vp, u64]),
                            ("bpf_table_fd_id", ctypes.c_int, [vp, u64]),
                            ("bpf_table_type_id", ctypes.c_int, [vp, u64]),
                            ("bpf_table_max_entries_id", u64, [vp, u64]),
                            ("bpf_table_flags_id", ctypes.c_int, [vp, u64]),
                            ("bpf_table_key_size_id", ctypes.c_size_t, [vp, u64]),
                            ("bpf_table_leaf_size_id", ctypes.c_size_t, [vp, u64]),
                            ("bpf_table_key_desc_id", cp, [vp, u64]),
                            ("bpf_table_leaf_desc_id", cp, [vp, u64])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    mod = bpf.module
    tables, by_fd = [], {}
    for i in range(lib.bpf_num_tables(mod)):
        t = {"name": lib.bpf_table_name(mod, i).decode(),
             "type": lib.bpf_table_type_id(mod, i),
             "max_entries": int(lib.bpf_table_max_entries_id(mod, i)),
             "flags": lib.bpf_table_flags_id(mod, i),
             "key_size": int(lib.bpf_table_key_size_id(mod, i)),
             "leaf_size": int(lib.bpf_table_leaf_size_id(mod, i)),
             "key_desc": json.loads((lib.bpf_table_key_desc_id(mod, i) or b'""').decode()),
             "leaf_desc": json.loads((lib.bpf_table_leaf_desc_id(mod, i) or b'""').decode())}
        if t["type"] not in _MAP_TYPES:
            return None
        if t["type"] != MAP_RINGBUF:
            try:
                decode_type(t["key_desc"])
                decode_type(t["leaf_desc"])
            except CacheError:
                return None
        by_fd[lib.bpf_table_fd_id(mod, i)] = t["name"]
        tables.append(t)
    funcs = []
    for i in range(lib.bpf_num_functions(mod)):
        name = lib.bpf_function_name(mod, i)
        size = lib.bpf_function_size(mod, name)
        insns = bytearray(ctypes.string_at(lib.bpf_function_start(mod, name), size))
        relocs = []
        for off in range(0, size - 15, 8):
            code, regs, _o, imm = struct.unpack_from("<BBhi", insns, off)
            if code != _LD_IMM64:
                continue
            src_reg = regs >> 4
            if src_reg == _PSEUDO_MAP_FD and imm in by_fd:
                relocs.append([off // 8, by_fd[imm]])
                struct.pack_into("<i", insns, off + 4, 0)
            elif src_reg != 0:
                return None  # another kind of reference: not handled here
        funcs.append({"name": name.decode(), "insns": insns.hex(), "relocs": relocs})
    entry = {"format": FORMAT, "compile_log": compile_log,
             "license": lib.bpf_module_license(mod).decode(),
             "kern_version": int(lib.bpf_module_kern_version(mod)),
             "tables": tables, "funcs": funcs}
    d = directory or cache_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = d / f"{key(src, cflags)}.json"
    tmp = d / f".{path.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------ load ---
def _check_private(p: Path) -> None:
    st = os.stat(p, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CacheError(f"{p}: not private to uid {os.geteuid()} (owner {st.st_uid}, "
                         f"mode {stat.S_IMODE(st.st_mode):o})")


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    r = libc.syscall(NR_BPF, cmd, attr, len(attr))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r)


def _possible_cpus() -> int:
    n = 0
    for part in Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


class Table:
    """One map by fd: bcc's ``Table`` subset that :class:`Program` uses."""

    def __init__(self, spec: dict[str, Any], max_entries: int | None = None) -> None:
        self.name: str = spec["name"]
        self.ttype: int = spec["type"]
        self.key_size, self.leaf_size = spec["key_size"], spec["leaf_size"]
        self.max_entries = int(max_entries or spec["max_entries"])
        if self.ttype != MAP_RINGBUF:
            self.Key = decode_type(spec["key_desc"])
            self.Leaf = decode_type(spec["leaf_desc"])
            if (ctypes.sizeof(self.Key), ctypes.sizeof(self.Leaf)) != (self.key_size,
                                                                        self.leaf_size):
                raise CacheError(f"table {self.name}: layout does not match its sizes")
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<IIIII", attr, 0, self.ttype, self.key_size, self.leaf_size,
                         self.max_entries, spec["flags"])
        nm = self.name.encode()[:15]
        attr[28:28 + len(nm)] = nm
        self.map_fd = _bpf(_BPF_MAP_CREATE, attr)
        self._ncpu = _possible_cpus() if self.ttype == MAP_PERCPU_ARRAY else 1

    def _elem(self, cmd: int, k: Any, v: Any = None, flags: int = 0) -> int:
        attr = ctypes.create_string_buffer(32)
        struct.pack_into("<IxxxxQQQ", attr, 0, self.map_fd, ctypes.addressof(k),
                         ctypes.addressof(v) if v is not None else 0, flags)
        return libc.syscall(NR_BPF, cmd, attr, len(attr))

    def _key(self, k: Any) -> Any:
        return k if isinstance(k, self.Key) else self.Key(k)

    def __setitem__(self, k: Any, v: Any) -> None:
        kk = self._key(k)
        leaf = v if isinstance(v, self.Leaf) else self.Leaf(v)
        buf = ctypes.create_string_buffer(bytes(leaf), self.leaf_size)
        if self._elem(_BPF_MAP_UPDATE, kk, buf) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"map {self.name} update: {os.strerror(e)}")

    def _lookup_raw(self, kk: Any) -> bytes | None:
        stride = (self.leaf_size + 7) & ~7
        buf = ctypes.create_string_buffer(stride * self._ncpu)
        if self._elem(_BPF_MAP_LOOKUP, kk, buf) < 0:
            return None
        return buf.raw

    def __getitem__(self, k: Any) -> Any:
        kk = self._key(k)
        raw = self._lookup_raw(kk)
        if raw is None:
            raise KeyError(k)
        if self.ttype == MAP_PERCPU_ARRAY:  # one leaf per possible CPU, as bcc's
            stride = (self.leaf_size + 7) & ~7
            return [self.Leaf.from_buffer_copy(raw, i * stride).value
                    if hasattr(self.Leaf, "value") else
                    self.Leaf.from_buffer_copy(raw, i * stride) for i in range(self._ncpu)]
        return self.Leaf.from_buffer_copy(raw)

    def keys(self) -> list[Any]:
        out = []
        cur: Any = None
        while True:
            nxt = self.Key()
            attr = ctypes.create_string_buffer(32)
            struct.pack_into("<IxxxxQQ", attr, 0, self.map_fd,
                             ctypes.addressof(cur) if cur is not None else 0,
                             ctypes.addressof(nxt))
            if libc.syscall(NR_BPF, _BPF_MAP_NEXT, attr, len(attr)) < 0:
                return out
            out.append(nxt)
            cur = nxt

    def items(self) -> list[tuple[Any, Any]]:
        out = []
        for k in self.keys():
            raw = self._lookup_raw(k)
            if raw is not None:
                out.append((k, self.Leaf.from_buffer_copy(raw)))
        return out

    def clear(self) -> None:
        if self.ttype == MAP_HASH:
            for k in self.keys():
                self._elem(_BPF_MAP_DELETE, k)
            return
        zero = self.Leaf()
        for i in range(self.max_entries):
            if self.ttype == MAP_PERCPU_ARRAY:
                stride = (self.leaf_size + 7) & ~7
                buf = ctypes.create_string_buffer(stride * self._ncpu)
                self._elem(_BPF_MAP_UPDATE, self.Key(i), buf)
            else:
                self[self.Key(i)] = zero

    def close(self) -> None:
        if self.map_fd >= 0:
            os.close(self.map_fd)
            self.map_fd = -1


@dataclass
class Function:
    name: bytes
    fd: int


class Loaded:
    """A cached program: bcc's ``BPF`` interface as far as :class:`Program` uses it."""

    def __init__(self, entry: dict[str, Any], tracefs: Path,
                 max_entries: dict[str, int] | None = None) -> None:
        if entry.get("format") != FORMAT:
            raise CacheError(f"entry format {entry.get('format')!r}")
        self.tracefs = tracefs
        self.license = str(entry["license"]).encode()
        self.compile_log = str(entry.get("compile_log", ""))  # what the compile printed
        self.kern_version = int(entry["kern_version"])
        self.tables: dict[str, Table] = {}
        self.funcs: dict[bytes, Function] = {}
        self._insns = {f["name"]: (bytes.fromhex(f["insns"]), f["relocs"])
                       for f in entry["funcs"]}
        self._links: dict[str, list[int]] = {}
        try:
            for spec in entry["tables"]:
                self.tables[spec["name"]] = Table(spec, (max_entries or {}).get(spec["name"]))
        except Exception:
            self.cleanup()
            raise

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def load_func(self, name: str, prog_type: int) -> Function:
        b = name.encode()
        if b in self.funcs:
            return self.funcs[b]
        if name not in self._insns:
            raise CacheError(f"no function {name}")
        raw, relocs = self._insns[name]
        insns = bytearray(raw)
        for idx, table in relocs:
            struct.pack_into("<i", insns, idx * 8 + 4, self.tables[table].map_fd)
        buf = ctypes.create_string_buffer(bytes(insns), len(insns))
        lic = ctypes.create_string_buffer(self.license)
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<IIQQIIQI", attr, 0, prog_type, len(insns) // 8,
                         ctypes.addressof(buf), ctypes.addressof(lic), 0, 0, 0,
                         self.kern_version)
        nm = name.encode()[:15]
        attr[48:48 + len(nm)] = nm
        try:
            fd = _bpf(_BPF_PROG_LOAD, attr)
        except OSError as e:
            raise OSError(e.errno, f"Failed to load BPF program {name}: {e.strerror}") from e
        self.funcs[b] = Function(b, fd)
        return self.funcs[b]

    def _perf_attach(self, attr: PerfEventAttr, fd: int, what: str) -> None:
        attr.size = PERF_ATTR_SIZE
        attr.sample_period = 1
        attr.wakeup_events = 1
        pfd = libc.syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1,
                           _PERF_FLAG_FD_CLOEXEC)
        if pfd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"cannot attach {what}: {os.strerror(e)}")
        if libc.ioctl(pfd, _PERF_IOC_SET_BPF, fd) < 0 or libc.ioctl(pfd, _PERF_IOC_ENABLE,
                                                                   0) < 0:
            e = ctypes.get_errno()
            os.close(pfd)
            raise OSError(e, f"cannot attach {what}: {os.strerror(e)}")
        self._links.setdefault(what, []).append(pfd)

    def attach_tracepoint(self, tp: str, fn_name: str) -> None:
        system, _, ev = tp.partition(":")
        fn = self.load_func(fn_name, PROG_TRACEPOINT)
        tp_id = int((self.tracefs / "events" / system / ev / "id").read_text())
        attr = PerfEventAttr(type=_PERF_TYPE_TRACEPOINT, config=tp_id)
        self._perf_attach(attr, fn.fd, tp)

    def attach_raw_tracepoint(self, tp: str, fn_name: str) -> None:
        fn = self.load_func(fn_name, PROG_RAW_TRACEPOINT)
        name = ctypes.create_string_buffer(tp.encode())
        attr = ctypes.create_string_buffer(16)
        struct.pack_into("<QI", attr, 0, ctypes.addressof(name), fn.fd)
        self._links.setdefault(tp, []).append(_bpf(_BPF_RAW_TRACEPOINT_OPEN, attr))

    def _kprobe(self, event: str, fn_name: str, ret: bool) -> None:
        fn = self.load_func(fn_name, PROG_KPROBE)
        pmu = Path("/sys/bus/event_source/devices/kprobe")
        config = 0
        if ret:
            fmt = (pmu / "format/retprobe").read_text().strip()  # "config:0"
            config = 1 << int(fmt.partition(":")[2])
        sym = ctypes.create_string_buffer(event.encode())
        attr = PerfEventAttr(type=int((pmu / "type").read_text()), config=config,
                         config1=ctypes.addressof(sym))
        self._perf_attach(attr, fn.fd, ("r:" if ret else "p:") + event)

    def attach_kprobe(self, event: str, fn_name: str) -> None:
        self._kprobe(event, fn_name, False)

    def attach_kretprobe(self, event: str, fn_name: str) -> None:
        self._kprobe(event, fn_name, True)

    def _detach(self, what: str) -> None:
        fds = self._links.pop(what, None)
        if fds is None:
            raise Exception(f"{what} is not attached")  # noqa: TRY002 - as bcc raises
        for fd in fds:
            libc.ioctl(fd, _PERF_IOC_DISABLE, 0)
            os.close(fd)

    def detach_tracepoint(self, tp: str) -> None:
        self._detach(tp)

    def detach_raw_tracepoint(self, tp: str) -> None:
        self._detach(tp)

    def detach_kprobe(self, event: str) -> None:
        self._detach("p:" + event)

    def detach_kretprobe(self, event: str) -> None:
        self._detach("r:" + event)

    def cleanup(self) -> None:
        for what in list(self._links):
            self._detach(what)
        for f in self.funcs.values():
            os.close(f.fd)
        self.funcs = {}
        for t in self.tables.values():
            t.close()
        self.tables = {}


def load(src: str, cflags: list[str], tracefs: Path, directory: Path | None = None,
         max_entries: dict[str, int] | None = None) -> Loaded | None:
    """The cached program for this text, or None when there is no entry.  ``src`` names
    the entry: the program's text, where a table size that the instructions do not depend
    on (a ring buffer's) may stand as a placeholder, given here in ``max_entries`` by
    table name.  CacheError for an entry that must not or cannot be used (not private,
    damaged), OSError for a map the kernel refused."""
    d = directory or cache_dir()
    path = d / f"{key(src, cflags)}.json"
    try:
        _check_private(d)
        _check_private(path)
    except FileNotFoundError:
        return None
    try:
        entry = json.loads(path.read_text())
        if not isinstance(entry, dict):
            raise CacheError("not an object")
        return Loaded(entry, tracefs, max_entries)
    except (ValueError, KeyError, TypeError) as e:
        raise CacheError(f"{path}: {type(e).__name__}: {e}") from e
