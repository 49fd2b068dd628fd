"""ctypes mirror of the parts of ``kernel/include/uapi/drm/tacc_accel.h`` the tracing tools use.

A host test compiles the header and checks every size and offset against these
structures (tests/host/test_taccd_uapi.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import os

DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40

_IOC_WRITE = 1
_IOC_READ = 2


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (DRM_IOCTL_BASE << 8) | nr


class GetParam(ctypes.Structure):
    _fields_ = [("param", ctypes.c_uint32), ("index", ctypes.c_uint32),
                ("value", ctypes.c_uint64)]


class TraceOpen(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("entries", ctypes.c_uint32),
                ("mmap_offset", ctypes.c_uint64), ("mmap_size", ctypes.c_uint64)]


class TraceHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("rec_size", ctypes.c_uint32),
                ("entries", ctypes.c_uint32), ("rec_version", ctypes.c_uint32),
                ("data_offset", ctypes.c_uint64), ("prod", ctypes.c_uint32),
                ("dropped", ctypes.c_uint32), ("cons", ctypes.c_uint32),
                ("epoch", ctypes.c_uint32)]


class TraceAdvance(ctypes.Structure):
    _fields_ = [("cons", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("prod", ctypes.c_uint32), ("dropped", ctypes.c_uint32)]


class TraceClose(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class Cmd(ctypes.Structure):
    _fields_ = [("opcode", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("tag", ctypes.c_uint64),
                ("a_handle", ctypes.c_uint32), ("a_pad", ctypes.c_uint32),
                ("a_offset", ctypes.c_uint64),
                ("b_handle", ctypes.c_uint32), ("b_pad", ctypes.c_uint32),
                ("b_offset", ctypes.c_uint64),
                ("c_handle", ctypes.c_uint32), ("c_pad", ctypes.c_uint32),
                ("c_offset", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("m", ctypes.c_uint32), ("n", ctypes.c_uint32), ("k", ctypes.c_uint32),
                ("lda", ctypes.c_uint32), ("ldb", ctypes.c_uint32), ("ldc", ctypes.c_uint32),
                ("alpha", ctypes.c_uint32), ("beta", ctypes.c_uint32),
                ("elt_op", ctypes.c_uint32), ("scalar", ctypes.c_uint32),
                ("rsvd", ctypes.c_uint64)]


class Submit(ctypes.Structure):
    _fields_ = [("cmds", ctypes.c_uint64), ("in_syncobjs", ctypes.c_uint64),
                ("num_cmds", ctypes.c_uint32), ("num_in_syncobjs", ctypes.c_uint32),
                ("queue", ctypes.c_uint32), ("out_syncobj", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cmd_size", ctypes.c_uint32),
                ("seqno", ctypes.c_uint64)]


class Wait(ctypes.Structure):
    _fields_ = [("seqno", ctypes.c_uint64), ("timeout_ns", ctypes.c_int64),
                ("flags", ctypes.c_uint32), ("status", ctypes.c_int32)]


PARAM_FUNC = 3
PARAM_NUM_QUEUES = 4
PARAM_CLOCK_HZ = 8
PARAM_CONTEXT_ID = 9
PARAM_MAX_CMDS = 12

OP_NOP = 0
OP_COPY_H2D = 1
OP_COPY_D2H = 2

DRM_TACC_TRACE_HDR_VERSION = 1
DRM_TACC_MMAP_COUNTERS = 0x10000000
DRM_TACC_MMAP_TRACE = 0x20000000

IOCTL_GET_PARAM = _ioc(_IOC_READ | _IOC_WRITE, DRM_COMMAND_BASE + 0x00, ctypes.sizeof(GetParam))
IOCTL_SUBMIT = _ioc(_IOC_READ | _IOC_WRITE, DRM_COMMAND_BASE + 0x05, ctypes.sizeof(Submit))
IOCTL_WAIT = _ioc(_IOC_READ | _IOC_WRITE, DRM_COMMAND_BASE + 0x06, ctypes.sizeof(Wait))
IOCTL_TRACE_OPEN = _ioc(_IOC_READ | _IOC_WRITE, DRM_COMMAND_BASE + 0x07,
                        ctypes.sizeof(TraceOpen))
IOCTL_TRACE_ADVANCE = _ioc(_IOC_READ | _IOC_WRITE, DRM_COMMAND_BASE + 0x08,
                           ctypes.sizeof(TraceAdvance))
IOCTL_TRACE_CLOSE = _ioc(_IOC_WRITE, DRM_COMMAND_BASE + 0x09, ctypes.sizeof(TraceClose))

# _IOC_NR values the tacc_ioctl_* tracepoints report (nr field).
IOCTL_NAMES = {
    0x40: "GET_PARAM", 0x41: "BO_CREATE", 0x42: "BO_INFO", 0x43: "VM_BIND",
    0x44: "VM_UNBIND", 0x45: "SUBMIT", 0x46: "WAIT", 0x47: "TRACE_OPEN",
    0x48: "TRACE_ADVANCE", 0x49: "TRACE_CLOSE",
}
NR_SUBMIT = 0x45


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> None:
    """ioctl(2) with a ctypes argument; raises OSError with the driver's errno."""
    fcntl.ioctl(fd, request, arg, True)


def get_param(fd: int, param: int, index: int = 0) -> int:
    p = GetParam(param=param, index=index)
    ioctl(fd, IOCTL_GET_PARAM, p)
    return int(p.value)


def submit_nops(fd: int, njobs: int, ncmds: int = 1, queue: int = 0, tag_base: int = 0,
                wait: bool = True) -> list[int]:
    """Submit ``njobs`` jobs of ``ncmds`` NOP commands; returns their seqnos (waited for)."""
    cmds = (Cmd * ncmds)()
    seqnos = []
    for j in range(njobs):
        for i in range(ncmds):
            cmds[i].opcode = OP_NOP
            cmds[i].tag = tag_base + j if tag_base else 0
        s = Submit(cmds=ctypes.addressof(cmds), num_cmds=ncmds, queue=queue,
                   cmd_size=ctypes.sizeof(Cmd))
        while True:
            try:
                ioctl(fd, IOCTL_SUBMIT, s)
                break
            except BlockingIOError:
                if seqnos:
                    wait_seqno(fd, seqnos[-1])
        seqnos.append(int(s.seqno))
    if wait and seqnos:
        wait_seqno(fd, seqnos[-1])
    return seqnos


def wait_seqno(fd: int, seqno: int, timeout_ns: int = 10_000_000_000) -> int:
    w = Wait(seqno=seqno, timeout_ns=timeout_ns)
    ioctl(fd, IOCTL_WAIT, w)
    return int(w.status)


def open_node(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)
