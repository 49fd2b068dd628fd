"""Streams (in-order queues of device work) and events."""

from __future__ import annotations

import ctypes as C
import errno
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import apitrace as tr
from . import uapi as U
from .buffers import Buffer, DeviceBuffer, HostBuffer, UserptrBuffer, device_side, host_side
from .errors import (
    ContextClosedError,
    DeviceTimeoutError,
    DriverError,
    DtypeError,
    ShapeError,
    TaccError,
    UseAfterFreeError,
    WrongDeviceError,
    job_error,
)
from .ops import InferenceOps, Op

if TYPE_CHECKING:
    from .context import Context
    from .graph import Graph

COPY_MAX = (1 << 32) - 4096  # per command (TACC_COPY_MAX_LEN is exclusive)
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
ID = tr.NAME_ID
N_H2D, N_D2H, N_D2D = ID["copy_h2d"], ID["copy_d2h"], ID["copy_d2d"]
N_GEMM, N_ELT, N_NOP = ID["gemm"], ID["eltwise"], ID["nop"]
N_REC, N_WAITEV = ID["event_record"], ID["stream_wait_event"]
N_SSYNC, N_ESYNC, N_SQUERY, N_EQUERY = (ID["stream_synchronize"], ID["event_synchronize"],
                                        ID["stream_query"], ID["event_query"])
ELT_NAMES = {"add": U.ELT_ADD, "mul": U.ELT_MUL, "relu": U.ELT_RELU, "scale": U.ELT_SCALE}


def f32_bits(x: float) -> int:
    return int(_U32.unpack(_F32.pack(x))[0])


def _dim(b: Buffer, what: str) -> tuple[int, int]:
    if len(b.shape) != 2:
        raise ShapeError(f"gemm: {what} must be 2-D, has shape {b.shape}")
    return b.shape[0], b.shape[1]


class Event:
    """A point in a stream. ``timing=True`` also records the device clock there."""

    def __init__(self, ctx: Context, timing: bool = False) -> None:
        self.ctx = ctx
        self.handle = ctx.backend.syncobj_create()
        self.timing = timing
        self.slot = ctx._ts_slot() if timing else -1
        self.recorded = False
        self.destroyed = False
        self.stream: Stream | None = None
        self.seqno = 0

    def _check(self) -> None:
        if self.destroyed:
            raise UseAfterFreeError(f"{self!r} was destroyed")
        if self.ctx.closed:
            raise ContextClosedError(f"{self.ctx!r} is closed")

    def query(self) -> bool:
        """True when the work before the event has completed (never blocks)."""
        self._check()
        t0 = tr.begin()
        done = not self.recorded or self.ctx.backend.syncobj_wait([self.handle], 0)
        if t0:
            tr.end(t0, N_EQUERY, 0, 0, self.ctx.dev_id, self.ctx.hw_context, 0, str(done))
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        """Blocks until the event completed; raises DeviceError if its job failed."""
        self._check()
        t0 = tr.begin()
        st = -1
        try:
            if self.recorded:
                if t0:
                    tr.flush()  # a consumer sees the calls before the wait during it
                dl = time.monotonic_ns() + int(timeout * 1e9) if timeout is not None \
                    else (1 << 63) - 1
                if not self.ctx.backend.syncobj_wait([self.handle], dl):
                    raise DeviceTimeoutError(f"{self!r}: not complete after {timeout} s")
                if self.stream is not None:
                    self.stream._reap(self.seqno)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_ESYNC, 0, 0, self.ctx.dev_id, self.ctx.hw_context, st)

    @property
    def device_ns(self) -> int:
        """Device clock (ns) when the event was reached (timing events, after sync)."""
        if not self.timing:
            raise TaccError(f"{self!r} was created without timing=True")
        if not self.recorded:
            raise TaccError(f"{self!r} was never recorded")
        self.synchronize()
        return int(self.ctx._ts_value(self.slot))

    def elapsed_ns(self, start: Event) -> int:
        """Device time from ``start`` to this event."""
        return self.device_ns - start.device_ns

    def destroy(self) -> None:
        if not self.destroyed and not self.ctx.closed:
            self.ctx.backend.syncobj_destroy(self.handle)
        self.destroyed = True

    def __repr__(self) -> str:
        return f"<Event {self.handle} on {self.ctx.device.pci}>"


class Stream(InferenceOps):
    """An in-order sequence of device work on one hardware queue.

    Every method returns at once (the work runs asynchronously); ``synchronize()`` waits.
    Work of one stream runs in order; use events to order work across streams.  A stream
    is used by one thread at a time.
    """

    def __init__(self, ctx: Context, queue: int) -> None:
        self.ctx = ctx
        self.queue = queue
        self._cmds = (U.drm_tacc_cmd * 4)()
        self._waits: list[int] = []
        self._jobs: deque[int] = deque()  # seqnos submitted and not yet reaped
        self._after: deque[tuple[int, Callable[[], None]]] = deque()
        self.last_seqno = 0
        self.jobs_submitted = 0
        self._capture: Graph | None = None
        self._patches: list[tuple[str, Any]] = []  # (cmd field, graph Param) of the next job

    def __repr__(self) -> str:
        return f"<Stream q{self.queue} on {self.ctx.device.pci}>"

    # ---------------------------------------------------------------- core ---
    def _check(self) -> None:
        if self.ctx.closed:
            raise ContextClosedError(f"{self.ctx!r} is closed")

    def _submit(self, n: int, out_syncobj: int = 0, ops: list[Any] | None = None) -> int:
        """Submits self._cmds[:n] (or ``ops``, on the simulator) as one job (retrying while
        the queue is full); inside a capture, records them into the graph instead."""
        if self._capture is not None:
            if out_syncobj or self._waits:
                raise TaccError(f"{self!r}: events cannot be recorded or waited for inside "
                                "a graph capture")
            self._capture._record(ops if ops is not None else
                                  [C.string_at(C.addressof(self._cmds[i]),
                                               C.sizeof(U.drm_tacc_cmd)) for i in range(n)],
                                  self._patches)
            self._patches = []
            return 0
        be = self.ctx.backend
        cmds: Any = self._cmds
        if ops is not None:
            cmds, n = self._encode(ops)
        while True:
            try:
                seq = be.submit(self.queue, cmds, n, self._waits, out_syncobj)
                break
            except DriverError as e:
                if e.errno != errno.EAGAIN or not self._jobs:
                    raise
                self._wait_one(self._jobs[0], -1)
        self._waits = []
        self.last_seqno = seq
        self.jobs_submitted += 1
        self._jobs.append(seq)
        self.ctx._last_stream = self
        if len(self._jobs) > 512:
            self._poll()
        return seq

    def _encode(self, ops: list[Any]) -> tuple[Any, int]:
        """The commands of ``ops`` for the backend: the simulator takes them as they are."""
        if self.ctx.backend.sim:
            return ops, len(ops)
        from .cmdcodec import encode

        return encode(self, ops)

    def _submit_op(self, op: Op) -> None:
        self._submit(1, ops=[op])

    def capture(self) -> Graph:
        """``with stream.capture() as g:`` records the stream's commands into a graph
        (nothing runs) that ``g.launch(params)`` then submits as one job."""
        from .graph import Graph

        self._check()
        if self._capture is not None:
            raise TaccError(f"{self!r} is already capturing")
        return Graph(self)

    def _cmd(self, i: int, opcode: int, tag: int) -> U.drm_tacc_cmd:
        c = self._cmds[i]
        C.memset(C.addressof(c), 0, C.sizeof(c))
        c.opcode = opcode
        c.tag = tag
        return c

    def _wait_one(self, seq: int, timeout_ns: int) -> bool:
        try:
            status = self.ctx.backend.wait(seq, timeout_ns)
        except DeviceTimeoutError:
            if timeout_ns < 0:
                raise
            return False
        if self._jobs and self._jobs[0] == seq:
            self._jobs.popleft()
        if status:
            self._run_after(seq)
            raise job_error(status, f"{self!r} job {seq}")
        return True

    def _poll(self) -> None:
        """Reaps completed jobs at the head (non-blocking)."""
        while self._jobs and self._wait_one(self._jobs[0], 0):
            pass
        self._run_after(self._jobs[0] - 1 if self._jobs else self.last_seqno)

    def _reap(self, upto: int) -> None:
        """Reaps every job up to seqno ``upto`` (they are known to be complete)."""
        while self._jobs and self._jobs[0] <= upto:
            self._wait_one(self._jobs[0], -1)
        self._run_after(upto)

    def _run_after(self, upto: int) -> None:
        while self._after and self._after[0][0] <= upto:
            self._after.popleft()[1]()

    def _stage(self, arr: np.ndarray) -> HostBuffer:
        """A pinned copy of a pageable numpy array, freed when its job completes."""
        hb = self.ctx._alloc_host_raw(arr.shape, arr.dtype)
        hb.array[...] = arr
        return hb

    # ------------------------------------------------------------ copies ---
    def _copy(self, name_id: int, opcode: int, dst: Any, src: Any, nbytes: int | None,
              dst_offset: int, src_offset: int) -> None:
        t0 = tr.begin()
        tag = tr.next_tag()
        st, n = -1, 0
        ctx = self.ctx
        try:
            self._check()
            if self._capture is not None and (isinstance(src, np.ndarray)
                                              or isinstance(dst, np.ndarray)):
                raise TaccError("copy: a graph captures copies between buffers, not from or "
                                "to a numpy array (use a HostBuffer)")
            dyn = [x for x in (dst_offset, src_offset) if not isinstance(x, int)]
            if dyn and (self._capture is None or nbytes is None):
                raise TaccError("copy: a graph Param offset needs a capture and nbytes=")
            staged: HostBuffer | None = None
            back: tuple[np.ndarray, HostBuffer] | None = None
            if opcode == U.OP_COPY_H2D:
                d = device_side(dst, "copy_h2d destination")
                if isinstance(src, np.ndarray):
                    staged = self._stage(np.ascontiguousarray(src))
                    s: Buffer = staged
                else:
                    s = host_side(src, "copy_h2d source")
            elif opcode == U.OP_COPY_D2H:
                s = device_side(src, "copy_d2h source")
                if isinstance(dst, np.ndarray):
                    if not dst.flags.writeable or not dst.flags.c_contiguous:
                        raise ValueError("copy_d2h: destination array must be writeable "
                                         "and C-contiguous")
                    staged = ctx._alloc_host_raw(dst.shape, dst.dtype)
                    back = (dst, staged)
                    d = staged
                else:
                    d = host_side(dst, "copy_d2h destination")
                    if isinstance(d, UserptrBuffer) and d.readonly:
                        raise ValueError(f"copy_d2h: {d!r} was registered read-only")
            else:
                d = device_side(dst, "copy_d2d destination")
                s = device_side(src, "copy_d2d source")
            for b in (d, s):
                if b is not staged:
                    b.check(ctx)
            if nbytes is None:
                if d.dtype != s.dtype:
                    raise DtypeError(f"copy: dtype {s.dtype} -> {d.dtype} differ (pass nbytes= "
                                     "for a raw byte copy)")
                if d.size != s.size:
                    raise ShapeError(f"copy: {s.shape} -> {d.shape}: element counts differ")
                if dst_offset or src_offset or dyn:
                    raise ValueError("copy: offsets need an explicit nbytes")
                n = s.nbytes
            else:
                n = int(nbytes)
                lo_d, hi_d = _span(dst_offset)
                lo_s, hi_s = _span(src_offset)
                if n <= 0 or lo_d < 0 or lo_s < 0:
                    raise ValueError(f"copy: bad nbytes/offsets ({n}, {dst_offset}, "
                                     f"{src_offset})")
                if hi_s + n > s.nbytes or hi_d + n > d.nbytes:
                    raise ShapeError(f"copy: {n} bytes at offsets {src_offset}->{dst_offset} "
                                     f"overrun {s!r} or {d!r}")
            if n == 0:
                st = 0
                return
            off = 0
            while off < n:
                k = min(n - off, COPY_MAX)
                c = self._cmd(0, opcode, tag)
                c.a.handle, c.a.offset = s.handle, s.offset + off
                c.b.handle, c.b.offset = d.handle, d.offset + off
                patches = []
                for fld, o in (("a.offset", src_offset), ("b.offset", dst_offset)):
                    if isinstance(o, int):
                        getattr(c, fld[0]).offset += o
                    else:
                        patches.append((fld, o))
                c.size = k
                self._patches = patches
                seq = self._submit(1)
                off += k
            if staged is not None:
                if back is not None:
                    arr, hb = back
                    self._after.append((seq, lambda a=arr, h=hb: (a.__setitem__(
                        Ellipsis, h.array), h.release())))
                else:
                    self._after.append((seq, staged.release))
            st = 0
        finally:
            if t0:
                a = _args(dst, src, n) if st == 0 else "error"
                if st == 0 and opcode == U.OP_COPY_H2D:
                    a += f" fp={fingerprint(src, src_offset, n)}"
                    if isinstance(dst_offset, int) and dst_offset:
                        a += f" doff={dst_offset}"  # where in dst: a chunk is not a repeat
                tr.end(t0, name_id, tag, n, ctx.dev_id, ctx.hw_context, st, a)

    def copy_h2d(self, dst: DeviceBuffer, src: HostBuffer | UserptrBuffer | np.ndarray,
                 nbytes: int | None = None, *, dst_offset: int = 0, src_offset: int = 0
                 ) -> None:
        """Host -> device. A plain numpy ``src`` is staged through pinned memory."""
        self._copy(N_H2D, U.OP_COPY_H2D, dst, src, nbytes, dst_offset, src_offset)

    def copy_d2h(self, dst: HostBuffer | UserptrBuffer | np.ndarray, src: DeviceBuffer,
                 nbytes: int | None = None, *, dst_offset: int = 0, src_offset: int = 0
                 ) -> None:
        """Device -> host. A plain numpy ``dst`` is filled when the stream is synchronized."""
        self._copy(N_D2H, U.OP_COPY_D2H, dst, src, nbytes, dst_offset, src_offset)

    def copy_d2d(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int | None = None, *,
                 dst_offset: int = 0, src_offset: int = 0) -> None:
        self._copy(N_D2D, U.OP_COPY_D2D, dst, src, nbytes, dst_offset, src_offset)

    # ----------------------------------------------------------- compute ---
    def _gemm_fp32(self, a: DeviceBuffer, b: DeviceBuffer, c: DeviceBuffer, *,
                   alpha: float = 1.0, beta: float = 0.0) -> None:
        """c = alpha * a @ b + beta * c, float32, 2-D row-major device buffers: the GEMM
        command of every hardware version (``gemm`` takes the rest to the inference one)."""
        t0 = tr.begin()
        tag = tr.next_tag()
        st = -1
        ctx = self.ctx
        m = n = k = 0
        try:
            self._check()
            bufs = [device_side(x, f"gemm operand {nm}") for x, nm in ((a, "a"), (b, "b"),
                                                                       (c, "c"))]
            for x in bufs:
                x.check(ctx)
                if x.dtype != np.float32:
                    raise DtypeError(f"gemm: {x!r} is {x.dtype}; the device computes float32")
            m, k = _dim(a, "a")
            k2, n = _dim(b, "b")
            m2, n2 = _dim(c, "c")
            if k != k2 or m != m2 or n != n2:
                raise ShapeError(f"gemm: shapes {a.shape} x {b.shape} -> {c.shape} do not fit")
            if max(m, n, k) > 4096 or m * n * k > 1 << 30:
                raise ShapeError(f"gemm: {m}x{n}x{k} exceeds the device limits "
                                 "(dims <= 4096, m*n*k <= 2^30)")
            cmd = self._cmd(0, U.OP_GEMM, tag)
            cmd.a.handle, cmd.a.offset = a.handle, a.offset
            cmd.b.handle, cmd.b.offset = b.handle, b.offset
            cmd.c.handle, cmd.c.offset = c.handle, c.offset
            cmd.m, cmd.n, cmd.k = m, n, k
            cmd.lda, cmd.ldb, cmd.ldc = k, n, n
            cmd.alpha, cmd.beta = f32_bits(alpha), f32_bits(beta)
            self._submit(1)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_GEMM, tag, 0, ctx.dev_id, ctx.hw_context, st,
                       f"m={m} n={n} k={k} a={a.name if isinstance(a, Buffer) else '?'}")

    def eltwise(self, op: str, a: DeviceBuffer, out: DeviceBuffer, b: DeviceBuffer | None = None,
                *, scalar: float = 0.0) -> None:
        """``out = a op b`` for add/mul, ``relu(a)``, ``a * scalar`` (scale); float32."""
        t0 = tr.begin()
        tag = tr.next_tag()
        st = -1
        ctx = self.ctx
        try:
            self._check()
            if op not in ELT_NAMES:
                raise ValueError(f"eltwise: unknown op {op!r} (add, mul, relu, scale)")
            code = ELT_NAMES[op]
            binary = code in (U.ELT_ADD, U.ELT_MUL)
            if binary and b is None:
                raise ValueError(f"eltwise {op}: needs a second operand b")
            if not binary and b is not None:
                raise ValueError(f"eltwise {op}: takes one operand")
            ops = [(a, "a"), (out, "out")] + ([(b, "b")] if binary else [])
            for x, nm in ops:
                x = device_side(x, f"eltwise {op} operand {nm}")
                x.check(ctx)
                if x.dtype != np.float32:
                    raise DtypeError(f"eltwise {op}: {x!r} is {x.dtype}; float32 needed")
                if x.size != a.size:
                    raise ShapeError(f"eltwise {op}: {nm} has {x.size} elements, a has {a.size}")
            cmd = self._cmd(0, U.OP_ELTWISE, tag)
            cmd.a.handle, cmd.a.offset = a.handle, a.offset
            if binary and b is not None:
                cmd.b.handle, cmd.b.offset = b.handle, b.offset
            cmd.c.handle, cmd.c.offset = out.handle, out.offset
            cmd.size = a.size
            cmd.elt_op = code
            cmd.scalar = f32_bits(scalar)
            self._submit(1)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_ELT, tag, 0, ctx.dev_id, ctx.hw_context, st,
                       f"{op} n={getattr(a, 'size', 0)}")

    def relu(self, a: DeviceBuffer, out: DeviceBuffer) -> None:
        self.eltwise("relu", a, out)

    def scale(self, a: DeviceBuffer, s: float, out: DeviceBuffer) -> None:
        self.eltwise("scale", a, out, scalar=s)

    def nop(self) -> None:
        """An empty job (benchmarks, probing the submit path)."""
        t0 = tr.begin()
        tag = tr.next_tag()
        st = -1
        try:
            self._check()
            self._cmd(0, U.OP_NOP, tag)
            self._submit(1)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_NOP, tag, 0, self.ctx.dev_id, self.ctx.hw_context, st)

    # ------------------------------------------------------------ events ---
    def record(self, event: Event | None = None, *, timing: bool = False) -> Event:
        """Marks the current end of the stream; returns the event (new if None)."""
        t0 = tr.begin()
        tag = tr.next_tag()
        st = -1
        try:
            self._check()
            ev = event if event is not None else Event(self.ctx, timing)
            ev._check()
            if ev.ctx is not self.ctx:
                raise WrongDeviceError(f"{ev!r} belongs to another context")
            if ev.timing:
                c = self._cmd(0, U.OP_TIMESTAMP, tag)
                c.a.handle, c.a.offset = self.ctx._ts_buf.handle, ev.slot * 8
            else:
                self._cmd(0, U.OP_NOP, tag)
            ev.seqno = self._submit(1, ev.handle)
            ev.recorded, ev.stream = True, self
            st = 0
            return ev
        finally:
            if t0:
                tr.end(t0, N_REC, tag, 0, self.ctx.dev_id, self.ctx.hw_context, st)

    def wait_event(self, event: Event) -> None:
        """Work submitted to this stream after this call starts after ``event``."""
        t0 = tr.begin()
        st = -1
        try:
            self._check()
            event._check()
            if event.ctx is not self.ctx:
                raise WrongDeviceError(f"{event!r} belongs to another context")
            if not event.recorded:
                raise TaccError(f"{event!r} was never recorded: nothing to wait for")
            if len(self._waits) >= U.MAX_IN_SYNCOBJS:
                raise TaccError(f"{self!r}: more than {U.MAX_IN_SYNCOBJS} pending waits")
            self._waits.append(event.handle)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_WAITEV, 0, 0, self.ctx.dev_id, self.ctx.hw_context, st)

    def query(self) -> bool:
        self._check()
        t0 = tr.begin()
        done = not self._jobs or self._wait_one(self.last_seqno, 0)
        if done:
            self._reap(self.last_seqno)
        if t0:
            tr.end(t0, N_SQUERY, 0, 0, self.ctx.dev_id, self.ctx.hw_context, 0, str(done))
        return done

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits for all work of this stream; raises DeviceError for any failed job."""
        t0 = tr.begin()
        st = -1
        try:
            self._check()
            if self._jobs:
                if t0:
                    tr.flush()  # a consumer sees the calls before the wait during it
                tns = -1 if timeout is None else int(timeout * 1e9)
                if not self._wait_one(self.last_seqno, tns):
                    raise DeviceTimeoutError(f"{self!r}: not idle after {timeout} s")
                self._reap(self.last_seqno)
            self._run_after(self.last_seqno)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_SSYNC, 0, 0, self.ctx.dev_id, self.ctx.hw_context, st)


def _span(off: Any) -> tuple[int, int]:
    """The lowest and highest value of an offset (an int, or a graph Param's range)."""
    if isinstance(off, int):
        return off, off
    return off.low, off.high


def fingerprint(src: Any, off: int, n: int) -> str:
    """8 hex digits identifying the ``n`` host bytes at ``off`` of a copy's source: the
    CRC-32 of all of them up to 4 KiB, else of 16 spread 64-byte samples and the length
    (the analysis's "the same host bytes uploaded again", docs/analysis.md
    redundant_upload).  '' when the bytes cannot be read."""
    arr = src if isinstance(src, np.ndarray) else getattr(src, "array", None)
    if arr is None or not isinstance(off, int) or n <= 0:
        return ""
    try:
        b = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    except (ValueError, TypeError):
        return ""
    if off + n > b.size:
        return ""
    if n <= 4096:
        return f"{zlib.crc32(b[off:off + n]):08x}"
    at = off + (np.arange(16) * ((n - 64) // 15))
    sample = b[(at[:, None] + np.arange(64)[None, :]).reshape(-1)]
    return f"{zlib.crc32(sample.tobytes(), n & 0xFFFFFFFF):08x}"


def _args(dst: Any, src: Any, n: int) -> str:
    def nm(x: Any) -> str:
        if isinstance(x, Buffer):
            return x.name + (f"+{x.offset}" if x.offset else "")
        if isinstance(x, np.ndarray):
            return f"np@{x.ctypes.data:x}"
        return "?"

    return f"{nm(src)}->{nm(dst)} {n}"
