"""A Python stand-in for the driver and device (host tests, ``TACC_RUNTIME_SIM=1``).

It implements the :class:`~tacc.runtime.backend.Backend` methods with the driver's rules
(handles, operand kinds, bound ranges, alignment) and executes every job at submit with
numpy.  Jobs complete immediately; ``device time`` (:attr:`SimBackend.devclk`) advances by
each command's uncontended time in :mod:`tacc.model` (copies: the link model; compute:
the roofline over :mod:`tacc.runtime.opcost`'s FLOPs and bytes).

The inference commands and graph launches reach it as the runtime's
:class:`~tacc.runtime.ops.Op` objects (not encoded descriptors); it checks their operands
as the device does (an operand outside its binding fails the job with -EFAULT, an index
outside the gather table with -EINVAL) and computes them with :mod:`tacc.runtime.kernels`.
"""

from __future__ import annotations

import ctypes as C
import errno
import mmap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tacc import model

from . import uapi as U
from .errors import TaccError, ioctl_error
from .ops import run_op


class _Fault(Exception):
    """A command failed on the (simulated) device: the job's completion status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

PAGE = 4096
HUGE = 2 << 20
VA_START = 1 << 32
VA_END = 1 << 39


@dataclass
class _Bo:
    type: int
    size: int
    flags: int
    mem: np.ndarray  # uint8 view of the backing memory
    mm: mmap.mmap | None = None
    va: int = 0
    bound: int = 0
    bo_offset: int = 0
    page_size: int = 0


@dataclass
class SimBackend:
    sim: bool = True
    devmem_size: int = 256 << 20
    num_queues: int = 4
    max_cmds: int = 64
    devclk: int = 0
    bos: dict[int, _Bo] = field(default_factory=dict)
    syncobjs: dict[int, int] = field(default_factory=dict)  # handle -> seqno (0 = none)
    status: dict[int, int] = field(default_factory=dict)
    next_handle: int = 1
    seqno: int = 0
    va_next: int = VA_START
    devmem_used: int = 0
    jobs: list[tuple[int, int, int, int]] = field(default_factory=list)  # seqno, q, start, end
    tags: list[int] = field(default_factory=list)
    # (kind, tag, flops, device bytes, list id) of every command run: the trace records
    op_records: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    _list_id: int = 0
    closed: bool = False

    # ------------------------------------------------------------ params ---
    def get_param(self, param: int, index: int = 0) -> int:
        vals = {U.PARAM_API_VERSION: U.DRM_TACC_API_VERSION, U.PARAM_HW_VERSION: 1 << 16 | 1,
                U.PARAM_CAPS: 0xE,
                U.PARAM_FUNC: 0, U.PARAM_FUNC_KIND: U.FUNC_KIND_PF,
                U.PARAM_NUM_QUEUES: self.num_queues,
                U.PARAM_NUM_CONTEXTS: 16, U.PARAM_NUM_ENGINES: 6,
                U.PARAM_DEVMEM_SIZE: self.devmem_size, U.PARAM_CLOCK_HZ: 10**9,
                U.PARAM_CONTEXT_ID: 1, U.PARAM_MAX_CMDS: self.max_cmds,
                U.PARAM_MAX_INFLIGHT: 128, U.PARAM_VA_START: VA_START, U.PARAM_VA_END: VA_END,
                U.PARAM_DEVCLK: self.devclk, U.PARAM_LAST_SEQNO: self.seqno,
                U.PARAM_DEVMEM_FREE: self.devmem_size - self.devmem_used}
        if param not in vals:
            raise ioctl_error(f"GET_PARAM({param})", errno.EINVAL)
        return vals[param]

    # --------------------------------------------------------------- BOs ---
    def _new_handle(self) -> int:
        h = self.next_handle
        self.next_handle += 1
        return h

    def bo_create(self, size: int, type_: int, flags: int = 0, userptr: int = 0
                  ) -> tuple[int, int]:
        if size <= 0 or type_ > U.BO_USERPTR or (type_ != U.BO_USERPTR and userptr):
            raise ioctl_error("BO_CREATE", errno.EINVAL)
        size = (size + PAGE - 1) // PAGE * PAGE
        mm = None
        if type_ == U.BO_HOST:
            mm = mmap.mmap(-1, size)
            mem = np.frombuffer(mm, np.uint8)
        elif type_ == U.BO_DEVICE:
            if self.devmem_used + size > self.devmem_size:
                raise ioctl_error("BO_CREATE", errno.ENOSPC)
            self.devmem_used += size
            mem = np.zeros(size, np.uint8)
        else:
            if userptr % PAGE or size % PAGE:
                raise ioctl_error("BO_CREATE", errno.EINVAL)
            mem = np.ctypeslib.as_array((C.c_uint8 * size).from_address(userptr))
        h = self._new_handle()
        bo = _Bo(type_, size, flags, mem, mm)
        self.bos[h] = bo
        va = 0
        if not flags & U.BO_F_NO_BIND:
            va, _ = self.vm_bind(h, 0, 0, size, 0)
        return h, va

    def _bo(self, handle: int, name: str) -> _Bo:
        bo = self.bos.get(handle)
        if bo is None:
            raise ioctl_error(name, errno.ENOENT)
        return bo

    def bo_info(self, handle: int) -> U.drm_tacc_bo_info:
        bo = self._bo(handle, "BO_INFO")
        return U.drm_tacc_bo_info(handle=handle, mmap_offset=0x1000 * handle
                                  if bo.type == U.BO_HOST else 0, va=bo.va, size=bo.size,
                                  bound_size=bo.bound, type=bo.type, flags=bo.flags)

    def vm_bind(self, handle: int, va: int, bo_offset: int, size: int, flags: int
                ) -> tuple[int, int]:
        bo = self._bo(handle, "VM_BIND")
        if bo.bound:
            raise ioctl_error("VM_BIND", errno.EBUSY)
        size = size or bo.size - bo_offset
        if bo_offset % PAGE or size % PAGE or bo_offset + size > bo.size:
            raise ioctl_error("VM_BIND", errno.EINVAL)
        if not flags & U.BIND_F_FIXED:
            align = HUGE if size >= HUGE else PAGE
            va = (self.va_next + align - 1) // align * align
            self.va_next = va + size
        elif va % PAGE:
            raise ioctl_error("VM_BIND", errno.EINVAL)
        huge = bo.type == U.BO_DEVICE and va % HUGE == 0 and size >= HUGE
        bo.va, bo.bound, bo.bo_offset = va, size, bo_offset
        bo.page_size = HUGE if huge else PAGE
        return va, bo.page_size

    def vm_unbind(self, handle: int) -> None:
        bo = self._bo(handle, "VM_UNBIND")
        bo.va = bo.bound = 0

    def gem_close(self, handle: int) -> None:
        bo = self.bos.pop(handle, None)
        if bo is None:
            raise ioctl_error("GEM_CLOSE", errno.EINVAL)
        if bo.type == U.BO_DEVICE:
            self.devmem_used -= bo.size

    def mmap_bo(self, handle: int, size: int) -> mmap.mmap:
        bo = self._bo(handle, "BO_INFO")
        if bo.mm is None:
            raise ioctl_error("BO_INFO", errno.EINVAL, "buffer is not CPU-mappable")
        return bo.mm

    # -------------------------------------------------------------- jobs ---
    def _operand(self, op: U.drm_tacc_operand, nbytes: int, want: str, align: int = 1
                 ) -> np.ndarray:
        if not op.handle or nbytes <= 0 or op.offset % align:
            raise ioctl_error("SUBMIT", errno.EINVAL)
        bo = self._bo(op.handle, "SUBMIT")
        if (want == "dev" and bo.type != U.BO_DEVICE) or (want == "host" and
                                                           bo.type == U.BO_DEVICE):
            raise ioctl_error("SUBMIT", errno.EINVAL)
        if not bo.bound or op.offset < bo.bo_offset or op.offset + nbytes > bo.bo_offset + \
                bo.bound:
            raise ioctl_error("SUBMIT", errno.EINVAL)
        return bo.mem[op.offset:op.offset + nbytes]

    def _f32(self, op: U.drm_tacc_operand, rows: int, cols: int, ld: int) -> np.ndarray:
        raw = self._operand(op, ((rows - 1) * ld + cols) * 4, "dev", 4)
        flat = raw.view(np.float32)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 4, 4))

    def _exec(self, c: U.drm_tacc_cmd) -> int:
        """Runs one command; returns its modelled duration in ns."""
        op = c.opcode
        if op in (U.OP_NOP, U.OP_BARRIER):
            return model.DEFAULT.cmd_latency_ns
        if op in (U.OP_COPY_H2D, U.OP_COPY_D2H, U.OP_COPY_D2D):
            src = self._operand(c.a, c.size, "dev" if op != U.OP_COPY_H2D else "host")
            dst = self._operand(c.b, c.size, "dev" if op != U.OP_COPY_D2H else "host")
            dst[:] = src
            if op == U.OP_COPY_D2D:  # device memory only: read and write
                return model.compute_ns(0, 2 * c.size)
            return model.copy_ns("h2d" if op == U.OP_COPY_H2D else "d2h", c.size)
        if op == U.OP_GEMM:
            a = self._f32(c.a, c.m, c.k, c.lda)
            b = self._f32(c.b, c.k, c.n, c.ldb)
            out = self._f32(c.c, c.m, c.n, c.ldc)
            alpha = float(np.uint32(c.alpha).view(np.float32))
            beta = float(np.uint32(c.beta).view(np.float32))
            r = alpha * (a.astype(np.float64) @ b.astype(np.float64))
            if beta != 0.0:
                r += beta * out
            out[...] = r.astype(np.float32)
            return model.gemm_ns(c.m, c.n, c.k, beta=beta != 0.0)
        if op == U.OP_ELTWISE:
            n = c.size
            a = self._operand(c.a, n * 4, "dev", 4).view(np.float32)
            out = self._operand(c.c, n * 4, "dev", 4).view(np.float32)
            if c.elt_op in (U.ELT_ADD, U.ELT_MUL):
                b = self._operand(c.b, n * 4, "dev", 4).view(np.float32)
                out[:] = a + b if c.elt_op == U.ELT_ADD else a * b
            elif c.elt_op == U.ELT_RELU:
                out[:] = np.maximum(a, 0)
            elif c.elt_op == U.ELT_SCALE:
                out[:] = a * np.uint32(c.scalar).view(np.float32)
            else:
                raise ioctl_error("SUBMIT", errno.EINVAL)
            return model.eltwise_ns(n, 2 if c.elt_op in (U.ELT_ADD, U.ELT_MUL) else 1)
        if op in (U.OP_FENCE, U.OP_TIMESTAMP):
            dst = self._operand(c.a, 8, "any", 8).view(np.uint64)
            dst[0] = c.value if op == U.OP_FENCE else self.devclk
            return model.copy_ns("d2h", 8)  # an 8-byte host write
        raise ioctl_error("SUBMIT", errno.EINVAL)

    # ------------------------------------------------- inference commands ---
    def _view(self, buf: Any) -> np.ndarray:
        """The memory of a device operand as its shape/dtype (bounds as the device checks)."""
        if not isinstance(buf.offset, int):
            raise _Fault(-errno.EINVAL)
        bo = self.bos.get(buf.handle)
        if bo is None or bo.type != U.BO_DEVICE:
            raise _Fault(-errno.EFAULT)
        if not bo.bound or buf.offset < bo.bo_offset or \
                buf.offset + buf.nbytes > bo.bo_offset + bo.bound:
            raise _Fault(-errno.EFAULT)
        if buf.offset % buf.dtype.itemsize:
            raise _Fault(-errno.EINVAL)
        raw = bo.mem[buf.offset:buf.offset + buf.nbytes]
        return raw.view(buf.dtype).reshape(buf.shape)

    def _run_op(self, op: Any, block: np.ndarray | None) -> int:
        """Executes an inference Op; returns its modelled time (the roofline)."""
        def store(b: Any, a: np.ndarray) -> None:
            self._view(b)[...] = a

        try:
            run_op(op, lambda b: self._view(b).copy(), store, block)
        except IndexError:
            raise _Fault(-errno.EINVAL) from None
        self.op_records.append((op.kind, op.tag, op.flops, op.nbytes,
                                block is not None and self._list_id or 0))
        return model.compute_ns(op.flops, op.nbytes, "bf16" if op.bf16 else "fp32")

    def _run_list(self, launch: Any) -> int:
        """A graph launch: every listed command, in order, with the parameter block."""
        from .graph import Param

        t = 0
        self._list_id = launch.graph.id
        for e in launch.graph.entries:
            self.tags.append(e.op.tag if e.op is not None else
                             int(U.drm_tacc_cmd.from_buffer_copy(e.cmd).tag))
            if e.op is not None:
                t += self._run_op(e.op, launch.block)
                continue
            c = U.drm_tacc_cmd.from_buffer_copy(e.cmd)
            for fld, prm in e.patches:
                assert isinstance(prm, Param)
                part, attr = fld.split(".")
                o = getattr(c, part)
                setattr(o, attr, getattr(o, attr) + prm.value_in(launch.block))
            try:
                t += self._exec(c)
            except TaccError:
                raise _Fault(-errno.EINVAL) from None
            self.op_records.append((f"op{c.opcode}", int(c.tag), 0, int(c.size),
                                    self._list_id))
        self._list_id = 0
        return t

    def _submit_ops(self, queue: int, ops: list[Any], in_syncobjs: list[int],
                    out_syncobj: int) -> int:
        from .graph import Launch

        start, status = self.devclk, 0
        try:
            for op in ops:
                if isinstance(op, Launch):
                    self.devclk += self._run_list(op)
                else:
                    self.tags.append(op.tag)
                    self.devclk += self._run_op(op, None)
        except _Fault as f:
            status = f.status
            self._list_id = 0
        self.seqno += 1
        self.status[self.seqno] = status
        self.jobs.append((self.seqno, queue, start, self.devclk))
        if out_syncobj:
            self.syncobjs[out_syncobj] = self.seqno
        return self.seqno

    def submit(self, queue: int, cmds: Any, ncmds: int, in_syncobjs: list[int],
               out_syncobj: int) -> int:
        if not 0 <= queue < self.num_queues or not 1 <= ncmds <= self.max_cmds:
            raise ioctl_error("SUBMIT", errno.EINVAL)
        if isinstance(cmds, list):
            for h in [*in_syncobjs, *([out_syncobj] if out_syncobj else [])]:
                if h not in self.syncobjs:
                    raise ioctl_error("SUBMIT", errno.ENOENT)
            return self._submit_ops(queue, cmds, in_syncobjs, out_syncobj)
        for h in in_syncobjs:
            if h not in self.syncobjs:
                raise ioctl_error("SUBMIT", errno.ENOENT)
        if out_syncobj and out_syncobj not in self.syncobjs:
            raise ioctl_error("SUBMIT", errno.ENOENT)
        start = self.devclk
        for i in range(ncmds):
            self.tags.append(int(cmds[i].tag))
            self.devclk += self._exec(cmds[i])
        self.seqno += 1
        self.status[self.seqno] = 0
        self.jobs.append((self.seqno, queue, start, self.devclk))
        if out_syncobj:
            self.syncobjs[out_syncobj] = self.seqno
        return self.seqno

    def wait(self, seqno: int, timeout_ns: int) -> int:
        if not 0 < seqno <= self.seqno:
            raise ioctl_error("WAIT", errno.EINVAL)
        return self.status.get(seqno, 0)

    def syncobj_create(self, signaled: bool = False) -> int:
        h = self._new_handle()
        self.syncobjs[h] = -1 if signaled else 0
        return h

    def syncobj_destroy(self, handle: int) -> None:
        if self.syncobjs.pop(handle, None) is None:
            raise ioctl_error("SYNCOBJ_DESTROY", errno.EINVAL)

    def syncobj_wait(self, handles: list[int], timeout_abs_ns: int, wait_all: bool = True
                     ) -> bool:
        for h in handles:
            if h not in self.syncobjs:
                raise ioctl_error("SYNCOBJ_WAIT", errno.ENOENT)
            if self.syncobjs[h] == 0:
                raise ioctl_error("SYNCOBJ_WAIT", errno.EINVAL)
        return True

    def close(self) -> None:
        self.closed = True
        self.bos.clear()
