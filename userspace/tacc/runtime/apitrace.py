"""Runtime API tracing: one single-producer shared-memory ring per thread.

``/dev/shm/tacc-api.<pid>`` (the process's first tracing thread, normally the main thread)
and ``/dev/shm/tacc-api.<pid>.<tid>`` (other threads).  docs/runtime-api-ring.md is the
format; this module is both the producer (the runtime) and a reader (tests, taccd).

Off by default: a ring is created, disabled, on a thread's first API call so that a
consumer can switch it on later by writing 1 to the header's ``enable`` word
(:func:`set_enabled`).  ``TACC_API_TRACE=1`` creates rings enabled; ``TACC_API_TRACE=none``
creates no ring at all.  When a ring is disabled an API call costs one byte read of the
header.  A full ring drops the record and counts it in ``dropped``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = 0x49504154  # "TAPI" little endian
VERSION = 1
HEADER_SIZE = 4096
REC_SIZE = 128
ARGS_MAX = 72
NAMES_OFFSET = 512
DEFAULT_RECORDS = 4096
NO_DEV = 0xFFFFFFFF
NO_CTX = 0xFFFFFFFF
FLAG_EXITED = 1 << 0

# Header fields: (offset, struct format)
OFF_MAGIC, OFF_VERSION, OFF_HDR_SIZE, OFF_REC_SIZE, OFF_CAPACITY = 0, 4, 8, 12, 16
OFF_ENABLE, OFF_PID, OFF_TID = 20, 24, 28
OFF_HEAD, OFF_TAIL, OFF_DROPPED, OFF_CREATED = 32, 40, 48, 56
OFF_NAMES_OFF, OFF_NAMES_COUNT, OFF_NAMES_BYTES, OFF_FLAGS, OFF_COMM = 64, 68, 72, 76, 80

HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "<u4"), ("header_size", "<u4"), ("rec_size", "<u4"),
    ("capacity", "<u4"), ("enable", "<u4"), ("pid", "<u4"), ("tid", "<u4"),
    ("head", "<u8"), ("tail", "<u8"), ("dropped", "<u8"), ("created_ns", "<i8"),
    ("names_offset", "<u4"), ("names_count", "<u4"), ("names_bytes", "<u4"), ("flags", "<u4"),
    ("comm", "S16"),
])
assert HEADER_DTYPE.itemsize == 96

RECORD_DTYPE = np.dtype([
    ("t_start", "<i8"), ("t_end", "<i8"), ("tag", "<u8"), ("bytes", "<u8"),
    ("pid", "<u4"), ("tid", "<u4"), ("dev", "<u4"), ("name_id", "<u2"), ("status", "<i2"),
    ("ctx", "<u4"), ("args_len", "<u2"), ("rsvd", "<u2"), ("args", f"S{ARGS_MAX}"),
])
assert RECORD_DTYPE.itemsize == REC_SIZE

# The API names, indexed by name_id. Append only (ids are ABI of the ring format).
NAMES: tuple[str, ...] = (
    "unknown", "context_open", "context_close", "host_buffer", "device_buffer", "wrap",
    "free", "stream_create", "copy_h2d", "copy_d2h", "copy_d2d", "gemm", "eltwise",
    "event_create", "event_record", "stream_wait_event", "event_synchronize",
    "stream_synchronize", "synchronize", "event_query", "stream_query", "nop",
    "host_preprocess", "net_send", "net_recv",
    "softmax", "layer_norm", "rms_norm", "gelu", "silu", "exp", "cast", "gather",
    "graph_capture", "graph_launch", "host_op", "range",
)
NAME_ID: dict[str, int] = {n: i for i, n in enumerate(NAMES)}

_REC = struct.Struct("<qqQQIIIHhIHH72s")
_U64 = struct.Struct("<Q")
assert _REC.size == REC_SIZE

now_ns = time.monotonic_ns  # CLOCK_MONOTONIC


def _c_producer() -> Any:
    """The C producer module (``_apiring.c``, built by scripts/setup.sh), or None: not
    built, or ``TACC_API_PRODUCER=python`` (the Python producer, for comparison)."""
    if os.environ.get("TACC_API_PRODUCER", "c") == "python":
        return None
    try:
        from . import _apiring  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _apiring


_c = _c_producer()
# the ring layout has one truth, this module: the C producer's copy must agree
_LAYOUT = {"HEADER_SIZE": HEADER_SIZE, "REC_SIZE": REC_SIZE, "ARGS_MAX": ARGS_MAX,
           "OFF_ENABLE": OFF_ENABLE, "OFF_HEAD": OFF_HEAD, "OFF_TAIL": OFF_TAIL,
           "OFF_DROPPED": OFF_DROPPED, "NO_DEV": NO_DEV, "NO_CTX": NO_CTX}
if _c is not None and {k: getattr(_c, k, None) for k in _LAYOUT} != _LAYOUT:
    raise ImportError("tacc.runtime._apiring was built for another ring layout: "
                      "run make setup")
#: which producer writes this process's records: "c" or "python"
PRODUCER = "c" if _c is not None else "python"


def ring_dir() -> Path:
    return Path(os.environ.get("TACC_API_DIR", "/dev/shm"))


def _mode() -> str:
    v = os.environ.get("TACC_API_TRACE", "").strip().lower()
    if v in ("1", "on", "yes", "true"):
        return "on"
    if v in ("none", "never", "disabled"):
        return "none"
    return "off"


class _ProducerField:
    """A producer counter of a :class:`Ring`: the C producer's attribute when it runs,
    else the Python producer's ``<name>_`` slot."""

    def __init__(self, minimum: int | None = None) -> None:
        self.minimum = minimum

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, name + "_"

    def __get__(self, r: Ring | None, owner: type | None = None) -> Any:
        if r is None:
            return self
        return int(getattr(r._p, self.name)) if r._p is not None else getattr(r, self.slot)

    def __set__(self, r: Ring, v: int) -> None:
        if self.minimum is not None:
            v = max(v, self.minimum)
        if r._p is not None:
            setattr(r._p, self.name, v)
        else:
            setattr(r, self.slot, v)


class Ring:
    """The producer side of one thread's ring."""

    __slots__ = ("path", "mm", "capacity", "mask", "head_", "tail_", "pid", "tid", "_fd",
                 "_head", "_tail", "_dropped", "published_", "batch_", "_t_first", "_mv", "_p")

    def __init__(self, path: Path, pid: int, tid: int, capacity: int, enabled: bool,
                 batch: int = 1) -> None:
        if capacity & (capacity - 1) or capacity < 2:
            raise ValueError("ring capacity must be a power of two >= 2")
        self.path, self.pid, self.tid = path, pid, tid
        self.capacity, self.mask, self.head_ = capacity, capacity - 1, 0
        size = HEADER_SIZE + capacity * REC_SIZE
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        names = b"\0".join(n.encode() for n in NAMES) + b"\0"
        assert NAMES_OFFSET + len(names) <= HEADER_SIZE
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_bytes().strip()[:15]
        except OSError:
            comm = b""
        struct.pack_into("<IIIIIIIIQQQqIIII16s", self.mm, 0, MAGIC, VERSION, HEADER_SIZE,
                         REC_SIZE, capacity, 1 if enabled else 0, pid, tid, 0, 0, 0, now_ns(),
                         NAMES_OFFSET, len(NAMES), len(names), 0, comm)
        self.mm[NAMES_OFFSET:NAMES_OFFSET + len(names)] = names
        os.rename(tmp, path)  # readers never see a half-written header
        self._fd = -1
        self.tail_ = 0  # last value of the consumer's tail seen by the producer
        self._head = ctypes.c_uint64.from_buffer(self.mm, OFF_HEAD)
        self._tail = ctypes.c_uint64.from_buffer(self.mm, OFF_TAIL)
        self._dropped = ctypes.c_uint64.from_buffer(self.mm, OFF_DROPPED)
        # records are written to their slots as calls end; head is stored (published) once
        # per batch (issue 18: a record cost ~9 µs of guest CPU in the traced thread when
        # every call packed and published its own; ~16 µs per call as a queued tuple)
        self.published_ = 0
        self.batch_ = max(batch, 1)
        self._t_first = 0
        self._mv = memoryview(self.mm)
        # the C producer keeps head, tail, published and batch itself (the *_ slots are
        # the Python producer's); both write the same records (tests/host/test_apiring_c.py)
        self._p = None if _c is None else _c.Producer(self.mm, capacity, pid, tid,
                                                       self.batch_, BATCH_AGE_NS)

    head = _ProducerField()  # records written
    tail = _ProducerField()  # the producer's copy of the consumer's tail
    published = _ProducerField()  # records made visible (head stored)
    batch = _ProducerField(minimum=1)  # records per publish

    @property
    def enabled(self) -> bool:
        return self.mm[OFF_ENABLE] != 0

    def set_enabled(self, on: bool) -> None:
        struct.pack_into("<I", self.mm, OFF_ENABLE, 1 if on else 0)

    @property
    def pending(self) -> int:
        """Records written and not yet published."""
        return self.head - self.published

    def emit(self, name_id: int, t_start: int, t_end: int, tag: int = 0, nbytes: int = 0,
             dev: int = NO_DEV, ctx: int = NO_CTX, status: int = 0, args: str = "") -> None:
        """Writes one record to its slot; it is published (head stored) with the batch it
        belongs to: when ``batch`` records are written, when the first unpublished one is
        ``BATCH_AGE_NS`` old, before a blocking call (:func:`flush`) and at exit.  A record
        that finds the ring full (the consumer is behind) is dropped and counted."""
        if self._p is not None:
            self._p.emit(name_id, t_start, t_end, tag, nbytes, dev, ctx, status, args)
            return
        head = self.head_
        if head - self.tail_ >= self.capacity and not self._room():
            return
        a = args.encode("utf-8", "replace") if args else b""
        _REC.pack_into(self._mv, HEADER_SIZE + ((head & self.mask) << 7), t_start, t_end, tag,
                       nbytes, self.pid, self.tid, dev, name_id, status, ctx,
                       len(a) if len(a) < ARGS_MAX else ARGS_MAX, 0, a)  # "72s" truncates
        self.head_ = head = head + 1
        n = head - self.published_
        if n == 1:
            self._t_first = t_end
        if n >= self.batch_ or t_end - self._t_first >= BATCH_AGE_NS:
            self._head.value = head  # publish after the records (x86 TSO)
            self.published_ = head

    def _room(self) -> bool:
        """Re-reads the consumer's tail (only when the ring looks full); False: the record
        is dropped (counted in the header's ``dropped``)."""
        self.tail_ = self._tail.value
        if self.head_ - self.tail_ < self.capacity:
            return True
        self._dropped.value += 1
        return False

    def publish(self) -> int:
        """Stores head: the records written since the last publish become visible.
        Returns their number."""
        if self._p is not None:
            return int(self._p.publish())
        n = self.head_ - self.published_
        if n:
            self._head.value = self.head_
            self.published_ = self.head_
        return n

    def close(self) -> None:
        """At thread/process exit: unlink when nothing is pending, else leave it to the
        consumer (flag EXITED) so that the last records are not lost."""
        try:
            self.publish()
            head = self.head
            if self._p is not None:
                self._p.close()  # its export of the mapping, before mm.close()
            tail = self._tail.value
            if head == tail:
                self.path.unlink(missing_ok=True)
            else:
                struct.pack_into("<I", self.mm, OFF_FLAGS, FLAG_EXITED)
            del self._head, self._tail, self._dropped
            self._mv.release()
            self.mm.close()
        except (ValueError, OSError):
            pass


STALE_S = 300.0
DEFAULT_BATCH = 32  # records published together (TACC_API_BATCH; 1 = each call its own)
BATCH_AGE_NS = 10_000_000  # a queued record is published at the next call 10 ms later


def batch_size() -> int:
    try:
        n = int(os.environ.get("TACC_API_BATCH", DEFAULT_BATCH))
    except ValueError:
        return DEFAULT_BATCH
    return max(n, 1)


def _remove_stale(d: Path) -> None:
    """Rings of processes that died more than STALE_S ago with records nobody drained."""
    now = time.time()
    try:
        paths = list(d.glob("tacc-api.*"))
    except OSError:
        return
    for p in paths:
        try:
            pid = int(p.name.split(".")[1])
            if Path(f"/proc/{pid}").exists() or now - p.stat().st_mtime < STALE_S:
                continue
            p.unlink()
        except (ValueError, IndexError, OSError):
            continue


class _PublishAtThreadExit:
    """Kept in the thread's ``threading.local``: when the thread ends, its locals are
    freed and this publishes the ring's queued records, so a thread whose last traced
    call is followed by its end (a sender thread of a pipeline) loses nothing while the
    process goes on.  (A ring already closed, at process exit, is left alone.)"""

    __slots__ = ("ring",)

    def __init__(self, ring: Ring) -> None:
        self.ring = ring

    def __del__(self) -> None:
        r = self.ring
        if r.pending:
            try:
                r.publish()
            except (ValueError, AttributeError):  # closed (mmap or its views released)
                pass


class _Tracer:
    """Process-wide state: the rings of this process's threads and the tag sequence."""

    def __init__(self) -> None:
        self.tls = threading.local()
        self.rings: list[Ring] = []
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.seq = _node_seq_base()
        self.mode = _mode()
        self.adopting = 0  # threads inside adopt_tag() (next_tag reads no tls when 0)
        self.batch = batch_size()
        try:
            self.capacity = int(os.environ.get("TACC_API_RING_RECORDS", DEFAULT_RECORDS))
        except ValueError:
            self.capacity = DEFAULT_RECORDS

    def ring(self) -> Ring | None:
        try:
            return self.tls.ring  # type: ignore[no-any-return]
        except AttributeError:
            return self._open()

    def _open(self) -> Ring | None:
        r: Ring | None = None
        if self.mode != "none":
            tid = threading.get_native_id()
            with self.lock:
                first = not self.rings
                if first:
                    _remove_stale(ring_dir())
                name = f"tacc-api.{self.pid}" if first else f"tacc-api.{self.pid}.{tid}"
                try:
                    r = Ring(ring_dir() / name, self.pid, tid, self.capacity, self.mode == "on",
                             self.batch)
                    self.rings.append(r)
                except OSError:
                    r = None
        tls = self.tls
        tls.ring = r
        if _c is not None:
            _c.set_current(None if r is None else r._p)
        if r is not None:
            tls.at_exit = _PublishAtThreadExit(r)
        if not hasattr(tls, "adopted"):
            tls.adopted = 0  # set once: next_tag reads it without a getattr miss
        return r

    def next_tag(self) -> int:
        if self.adopting:  # some thread is inside adopt_tag(): this one may be
            try:
                adopted = self.tls.adopted
            except AttributeError:  # a thread that has made no traced call yet
                adopted = 0
            if adopted:
                return int(adopted)
        self.seq = s = (self.seq + 1) & 0xFFFFFFFF
        return (self.pid << 32) | s

    def close_all(self) -> None:
        with self.lock:
            for r in self.rings:
                r.close()
            self.rings.clear()


def _node_seq_base() -> int:
    """In a cluster (TACC_NODE=i, scripts/run-vm NODES=N) node i's tag sequence starts at
    i << 28: identical guests give their processes the same pids, and a tag carried to a
    peer (``adopt_tag``) must not equal one of the peer's own (docs/cluster.md)."""
    node = os.environ.get("TACC_NODE", "")
    return (int(node) & 0xF) << 28 if node.isdigit() else 0


_tracer = _Tracer()


def _after_fork() -> None:
    global _tracer
    _tracer = _Tracer()
    if _c is not None:
        _c.forget_thread()  # the parent thread's ring is not this process's


def _open_for_c() -> Any:
    """The C producer's opener: this thread's Producer (its ring opened on the first
    traced call, as the Python begin() does), or None."""
    r = _tracer.ring()
    return None if r is None else r._p


os.register_at_fork(after_in_child=_after_fork)
atexit.register(lambda: _tracer.close_all())


def next_tag() -> int:
    """A new user tag: pid << 32 | per-process sequence (docs: design decisions)."""
    return _tracer.next_tag()


@contextlib.contextmanager
def adopt_tag(tag: int) -> Iterator[int]:
    """Every call of this thread inside the block takes ``tag`` instead of a new one: a
    peer's tag received in a message header (tacc.workloads.pipeline), so the receive and
    the device work it causes share the sender's correlation id.  ``tag`` 0: a new tag."""
    t = _tracer
    prev = getattr(t.tls, "adopted", 0)
    tag = tag or t.next_tag()
    t.tls.adopted = tag
    with t.lock:
        t.adopting += 1
    try:
        yield tag
    finally:
        t.tls.adopted = prev
        with t.lock:
            t.adopting -= 1


def flush() -> None:
    """Publishes this thread's queued records: the runtime calls it before it blocks
    (a synchronize), so a consumer sees every call made before the wait."""
    try:
        r = _tracer.tls.ring
    except AttributeError:
        return
    if r is not None and r.pending:
        r.publish()


def current_ring() -> Ring | None:
    return _tracer.ring()


def begin() -> int:
    """0 when tracing is off for this thread, else the call's start time (ns)."""
    try:
        r = _tracer.tls.ring
    except AttributeError:
        r = _tracer._open()
    if r is None or not r.mm[OFF_ENABLE]:
        return 0
    return now_ns()


def end(t0: int, name_id: int, tag: int = 0, nbytes: int = 0, dev: int = NO_DEV,
        ctx: int = NO_CTX, status: int = 0, args: str = "") -> None:
    """Records a call that began with a non-zero :func:`begin` (same thread), ending now.

    The Python producer's (``_apiring.end`` replaces it when the C producer is built)."""
    try:
        r = _tracer.tls.ring
    except AttributeError:
        return
    if r is not None:
        r.emit(name_id, t0, now_ns(), tag, nbytes, dev, ctx, status, args)


if _c is not None:  # the C producer's begin/end/flush replace the Python ones below
    _c.set_opener(_open_for_c)
    begin = _c.begin  # type: ignore[assignment]  # noqa: F811
    end = _c.end  # type: ignore[assignment]  # noqa: F811
    flush = _c.flush  # type: ignore[assignment]  # noqa: F811


def set_process_enabled(on: bool) -> None:
    """Switch tracing on/off for every ring of this process (and future ones)."""
    _tracer.mode = "on" if on else "off"
    with _tracer.lock:
        for r in _tracer.rings:
            r.set_enabled(on)


# ------------------------------------------------------------------ readers ---
@dataclass
class RingInfo:
    path: Path
    pid: int
    tid: int
    enabled: bool
    head: int
    tail: int
    dropped: int
    capacity: int
    exited: bool
    comm: str


def list_rings(directory: Path | None = None, pid: int | None = None) -> list[Path]:
    d = directory or ring_dir()
    pat = f"tacc-api.{pid}" if pid is not None else "tacc-api.*"
    out = sorted(p for p in d.glob(pat) if not p.name.endswith(".tmp"))
    if pid is not None:
        out += sorted(p for p in d.glob(f"tacc-api.{pid}.*") if not p.name.endswith(".tmp"))
    return out


class RingReader:
    """Consumer side: maps a ring read/write (to advance ``tail`` and flip ``enable``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ValueError(f"{self.path}: not a tacc API ring (too short)")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        hdr = np.frombuffer(self.mm, HEADER_DTYPE, 1).copy()[0]
        if int(hdr["magic"]) != MAGIC:
            self.mm.close()
            raise ValueError(f"{self.path}: not a tacc API ring (bad magic)")
        if int(hdr["version"]) != VERSION:
            self.mm.close()
            raise ValueError(f"{self.path}: API ring format version {int(hdr['version'])}, "
                             f"this reader knows {VERSION}")
        self.capacity = int(hdr["capacity"])
        self.header_size = int(hdr["header_size"])
        self.rec_size = int(hdr["rec_size"])
        no, nb = int(hdr["names_offset"]), int(hdr["names_bytes"])
        self.names = [s.decode() for s in bytes(self.mm[no:no + nb]).split(b"\0")][
            : int(hdr["names_count"])]
        self.records = np.frombuffer(self.mm, RECORD_DTYPE, self.capacity, self.header_size)

    def info(self) -> RingInfo:
        h = np.frombuffer(self.mm, HEADER_DTYPE, 1).copy()[0]
        return RingInfo(self.path, int(h["pid"]), int(h["tid"]), bool(h["enable"]),
                        int(h["head"]), int(h["tail"]), int(h["dropped"]), self.capacity,
                        bool(int(h["flags"]) & FLAG_EXITED), h["comm"].decode(errors="replace"))

    def set_enabled(self, on: bool) -> None:
        struct.pack_into("<I", self.mm, OFF_ENABLE, 1 if on else 0)

    @property
    def dropped(self) -> int:
        return int(_U64.unpack_from(self.mm, OFF_DROPPED)[0])

    def pending(self) -> int:
        """Records published and not yet drained."""
        return int(_U64.unpack_from(self.mm, OFF_HEAD)[0] - _U64.unpack_from(self.mm,
                                                                             OFF_TAIL)[0])

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Copies out every record published since the last drain and frees their slots."""
        head = _U64.unpack_from(self.mm, OFF_HEAD)[0]
        tail = _U64.unpack_from(self.mm, OFF_TAIL)[0]
        n = head - tail
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return np.empty(0, RECORD_DTYPE)
        start = tail % self.capacity  # the records, as at most two slices (one wrap)
        first = min(n, self.capacity - start)
        out = np.empty(n, RECORD_DTYPE)
        out[:first] = self.records[start:start + first]
        out[first:] = self.records[:n - first]
        _U64.pack_into(self.mm, OFF_TAIL, tail + n)
        return out

    def close(self) -> None:
        self.records = np.empty(0, RECORD_DTYPE)
        try:
            self.mm.close()
        except BufferError:
            pass


def set_enabled(target: int | Path | str, on: bool = True) -> int:
    """From another process: enable/disable every ring of a pid (or one ring file).
    Returns the number of rings switched."""
    paths = list_rings(pid=target) if isinstance(target, int) else [Path(target)]
    for p in paths:
        r = RingReader(p)
        r.set_enabled(on)
        r.close()
    return len(paths)


def iter_records(paths: list[Path]) -> Iterator[tuple[Path, np.ndarray, list[str]]]:
    for p in paths:
        r = RingReader(p)
        try:
            yield p, r.drain(), r.names
        finally:
            r.close()


# Decoded records for consumers that want strings (taccd's adapter: open_reader()).
DECODED_DTYPE = np.dtype([
    ("t_start", "<i8"), ("t_end", "<i8"), ("tag", "<u8"), ("bytes", "<u8"),
    ("pid", "<u4"), ("tid", "<u4"), ("status", "<i2"), ("ctx", "<u4"), ("name", "S32"),
    ("args", f"S{ARGS_MAX}"), ("device", "S12"),
])


def pci_name(dev: int) -> str:
    """The inverse of the ``dev`` field encoding: ``0000:01:00.1``; '' for NO_DEV."""
    if dev == NO_DEV:
        return ""
    return f"{dev >> 16:04x}:{(dev >> 8) & 0xFF:02x}:{(dev >> 3) & 0x1F:02x}.{dev & 7}"


class DecodedReader:
    """A :class:`RingReader` whose ``drain()`` returns :data:`DECODED_DTYPE` records:
    the API name and the device's PCI address as strings."""

    def __init__(self, path: Path | str) -> None:
        self.ring = RingReader(path)
        self.path = self.ring.path
        self._names = np.array([n.encode()[:32] for n in self.ring.names] + [b"?"], "S32")

    @property
    def dropped(self) -> int:
        return self.ring.dropped

    @property
    def pid(self) -> int:
        return self.ring.info().pid

    def set_enabled(self, on: bool) -> None:
        self.ring.set_enabled(on)

    def drain(self, max_records: int | None = None) -> np.ndarray:
        r = self.ring.drain(max_records)
        out = np.zeros(len(r), DECODED_DTYPE)
        if not len(r):
            return out
        for f in ("t_start", "t_end", "tag", "bytes", "pid", "tid", "status", "ctx", "args"):
            out[f] = r[f]
        ids = np.minimum(r["name_id"].astype(np.int64), len(self._names) - 1)
        out["name"] = self._names[ids]
        u, inv = np.unique(r["dev"], return_inverse=True)
        out["device"] = np.array([pci_name(int(d)).encode() for d in u], "S12")[inv]
        return out

    def close(self) -> None:
        self.ring.close()


def open_reader(path: Path | str) -> DecodedReader:
    """Opens one ring for draining (the interface taccd's API-ring adapter uses)."""
    return DecodedReader(path)


def ring_pid(path: Path | str) -> int:
    """The pid of a ring file name: ``tacc-api.<pid>`` or ``tacc-api.<pid>.<tid>``."""
    return int(Path(path).name.split(".")[1])
