"""The tacc uAPI as the tracing tools use it: the ctypes layouts and numbers of
:mod:`tacc.runtime.uapi` (the one Python definition of the uAPI, checked against
``kernel/include/uapi/drm/tacc_accel.h`` by tests/host/test_uapi_layout.py) under the
names these tools use, and the few helpers they need (NOP jobs, waits).
"""

from __future__ import annotations

import ctypes
import fcntl
import os

from tacc.runtime import uapi as _u

GetParam = _u.drm_tacc_get_param
TraceOpen = _u.drm_tacc_trace_open
TraceHeader = _u.drm_tacc_trace_header
TraceAdvance = _u.drm_tacc_trace_advance
TraceClose = _u.drm_tacc_trace_close
Cmd = _u.drm_tacc_cmd
Submit = _u.drm_tacc_submit
Wait = _u.drm_tacc_wait

PARAM_FUNC = _u.PARAM_FUNC
PARAM_NUM_QUEUES = _u.PARAM_NUM_QUEUES
PARAM_CLOCK_HZ = _u.PARAM_CLOCK_HZ
PARAM_CONTEXT_ID = _u.PARAM_CONTEXT_ID
PARAM_MAX_CMDS = _u.PARAM_MAX_CMDS

OP_NOP = _u.OP_NOP
OP_COPY_H2D = _u.OP_COPY_H2D
OP_COPY_D2H = _u.OP_COPY_D2H

DRM_TACC_TRACE_HDR_VERSION = _u.TRACE_HDR_VERSION
DRM_TACC_MMAP_COUNTERS = _u.MMAP_COUNTERS
DRM_TACC_MMAP_TRACE = _u.MMAP_TRACE

IOCTL_GET_PARAM = _u.DRM_IOCTL_TACC_GET_PARAM
IOCTL_SUBMIT = _u.DRM_IOCTL_TACC_SUBMIT
IOCTL_WAIT = _u.DRM_IOCTL_TACC_WAIT
IOCTL_TRACE_OPEN = _u.DRM_IOCTL_TACC_TRACE_OPEN
IOCTL_TRACE_ADVANCE = _u.DRM_IOCTL_TACC_TRACE_ADVANCE
IOCTL_TRACE_CLOSE = _u.DRM_IOCTL_TACC_TRACE_CLOSE

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
