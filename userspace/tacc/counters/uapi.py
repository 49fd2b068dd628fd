"""The few tacc ioctls the counter tools use, as ctypes structures.

Layouts mirror ``kernel/include/uapi/drm/tacc_accel.h``; tests/host/test_counters_uapi.py
compiles the header and checks every size and offset against these.
"""

from __future__ import annotations

import ctypes as C
import fcntl

DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40

PARAM_FUNC = 3
PARAM_COUNTERS_MMAP_OFFSET = 10
PARAM_COUNTERS_MMAP_SIZE = 11
PARAM_DEVCLK = 18
PARAM_QUEUE_SIZE = 19

OP_COPY_H2D = 1
OP_COPY_D2H = 2
OP_TIMESTAMP = 7
BO_HOST = 0
BO_DEVICE = 1


class GetParam(C.Structure):
    _fields_ = [("param", C.c_uint32), ("index", C.c_uint32), ("value", C.c_uint64)]


class BoCreate(C.Structure):
    _fields_ = [("size", C.c_uint64), ("userptr", C.c_uint64), ("type", C.c_uint32),
                ("flags", C.c_uint32), ("handle", C.c_uint32), ("pad", C.c_uint32),
                ("va", C.c_uint64)]


class BoInfo(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("pad", C.c_uint32), ("mmap_offset", C.c_uint64),
                ("va", C.c_uint64), ("size", C.c_uint64), ("bound_size", C.c_uint64),
                ("type", C.c_uint32), ("flags", C.c_uint32)]


class Operand(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("pad", C.c_uint32), ("offset", C.c_uint64)]


class Cmd(C.Structure):
    _fields_ = [("opcode", C.c_uint32), ("flags", C.c_uint32), ("tag", C.c_uint64),
                ("a", Operand), ("b", Operand), ("c", Operand), ("size", C.c_uint64),
                ("value", C.c_uint64)] + [(n, C.c_uint32) for n in (
                    "m", "n", "k", "lda", "ldb", "ldc", "alpha", "beta", "elt_op", "scalar")] + [
                ("rsvd", C.c_uint64)]


class Submit(C.Structure):
    _fields_ = [("cmds", C.c_uint64), ("in_syncobjs", C.c_uint64), ("num_cmds", C.c_uint32),
                ("num_in_syncobjs", C.c_uint32), ("queue", C.c_uint32),
                ("out_syncobj", C.c_uint32), ("flags", C.c_uint32), ("cmd_size", C.c_uint32),
                ("seqno", C.c_uint64)]


class Wait(C.Structure):
    _fields_ = [("seqno", C.c_uint64), ("timeout_ns", C.c_int64), ("flags", C.c_uint32),
                ("status", C.c_int32)]


class GemClose(C.Structure):
    _fields_ = [("handle", C.c_uint32), ("pad", C.c_uint32)]


def _iowr(nr: int, size: int, write_only: bool = False) -> int:
    direction = 1 if write_only else 3  # _IOC_WRITE, _IOC_READ | _IOC_WRITE
    return (direction << 30) | (size << 16) | (DRM_IOCTL_BASE << 8) | nr


IOCTL_GET_PARAM = _iowr(DRM_COMMAND_BASE + 0x00, C.sizeof(GetParam))
IOCTL_BO_CREATE = _iowr(DRM_COMMAND_BASE + 0x01, C.sizeof(BoCreate))
IOCTL_BO_INFO = _iowr(DRM_COMMAND_BASE + 0x02, C.sizeof(BoInfo))
IOCTL_SUBMIT = _iowr(DRM_COMMAND_BASE + 0x05, C.sizeof(Submit))
IOCTL_WAIT = _iowr(DRM_COMMAND_BASE + 0x06, C.sizeof(Wait))
IOCTL_GEM_CLOSE = _iowr(0x09, C.sizeof(GemClose), write_only=True)

COUNTERS_MMAP_OFFSET = 0x10000000  # DRM_TACC_MMAP_COUNTERS


def ioctl(fd: int, req: int, arg: C.Structure) -> C.Structure:
    fcntl.ioctl(fd, req, arg, True)
    return arg


def get_param(fd: int, param: int, index: int = 0) -> int:
    return int(ioctl(fd, IOCTL_GET_PARAM, GetParam(param, index, 0)).value)  # type: ignore[attr-defined]
