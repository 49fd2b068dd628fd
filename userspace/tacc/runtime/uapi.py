"""The uAPI (``kernel/include/uapi/drm/tacc_accel.h``) under the runtime's short names:
every value and layout is :mod:`tacc.hw`'s (generated from the header at build time);
tests/host/test_hw_contract.py compiles the header and compares."""

from __future__ import annotations

import ctypes as C
import fcntl
import os

from tacc import hw

DRM_IOCTL_BASE = hw.DRM_IOCTL_BASE
DRM_COMMAND_BASE = hw.DRM_COMMAND_BASE
DRM_TACC_API_VERSION = hw.DRM_TACC_API_VERSION
PARAM_API_VERSION = hw.DRM_TACC_PARAM_API_VERSION
PARAM_HW_VERSION = hw.DRM_TACC_PARAM_HW_VERSION
PARAM_CAPS = hw.DRM_TACC_PARAM_CAPS
PARAM_FUNC = hw.DRM_TACC_PARAM_FUNC
PARAM_NUM_QUEUES = hw.DRM_TACC_PARAM_NUM_QUEUES
PARAM_NUM_CONTEXTS = hw.DRM_TACC_PARAM_NUM_CONTEXTS
PARAM_NUM_ENGINES = hw.DRM_TACC_PARAM_NUM_ENGINES
PARAM_DEVMEM_SIZE = hw.DRM_TACC_PARAM_DEVMEM_SIZE
PARAM_CLOCK_HZ = hw.DRM_TACC_PARAM_CLOCK_HZ
PARAM_CONTEXT_ID = hw.DRM_TACC_PARAM_CONTEXT_ID
PARAM_COUNTERS_MMAP_OFFSET = hw.DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET
PARAM_COUNTERS_MMAP_SIZE = hw.DRM_TACC_PARAM_COUNTERS_MMAP_SIZE
PARAM_MAX_CMDS = hw.DRM_TACC_PARAM_MAX_CMDS
PARAM_MAX_INFLIGHT = hw.DRM_TACC_PARAM_MAX_INFLIGHT
PARAM_VA_START = hw.DRM_TACC_PARAM_VA_START
PARAM_VA_END = hw.DRM_TACC_PARAM_VA_END
PARAM_CTX_FAULTS = hw.DRM_TACC_PARAM_CTX_FAULTS
PARAM_CTX_FAULT_ADDR = hw.DRM_TACC_PARAM_CTX_FAULT_ADDR
PARAM_DEVCLK = hw.DRM_TACC_PARAM_DEVCLK
PARAM_QUEUE_SIZE = hw.DRM_TACC_PARAM_QUEUE_SIZE
PARAM_LAST_SEQNO = hw.DRM_TACC_PARAM_LAST_SEQNO
PARAM_CTX_RESETS = hw.DRM_TACC_PARAM_CTX_RESETS
PARAM_TRACE_MMAP_OFFSET = hw.DRM_TACC_PARAM_TRACE_MMAP_OFFSET
PARAM_DEVMEM_FREE = hw.DRM_TACC_PARAM_DEVMEM_FREE
PARAM_FUNC_KIND = hw.DRM_TACC_PARAM_FUNC_KIND
FUNC_KIND_PF = hw.DRM_TACC_FUNC_KIND_PF
FUNC_KIND_VF = hw.DRM_TACC_FUNC_KIND_VF
FUNC_KIND_VIRTIO = hw.DRM_TACC_FUNC_KIND_VIRTIO
BO_HOST = hw.DRM_TACC_BO_HOST
BO_DEVICE = hw.DRM_TACC_BO_DEVICE
BO_USERPTR = hw.DRM_TACC_BO_USERPTR
BO_F_NO_BIND = hw.DRM_TACC_BO_F_NO_BIND
BO_F_READONLY = hw.DRM_TACC_BO_F_READONLY
BIND_F_FIXED = hw.DRM_TACC_BIND_F_FIXED
BIND_F_READONLY = hw.DRM_TACC_BIND_F_READONLY
VM_UNBIND_NOWAIT = hw.DRM_TACC_VM_UNBIND_NOWAIT
OP_NOP = hw.DRM_TACC_OP_NOP
OP_COPY_H2D = hw.DRM_TACC_OP_COPY_H2D
OP_COPY_D2H = hw.DRM_TACC_OP_COPY_D2H
OP_COPY_D2D = hw.DRM_TACC_OP_COPY_D2D
OP_GEMM = hw.DRM_TACC_OP_GEMM
OP_ELTWISE = hw.DRM_TACC_OP_ELTWISE
OP_FENCE = hw.DRM_TACC_OP_FENCE
OP_TIMESTAMP = hw.DRM_TACC_OP_TIMESTAMP
OP_BARRIER = hw.DRM_TACC_OP_BARRIER
ELT_ADD = hw.DRM_TACC_ELT_ADD
ELT_MUL = hw.DRM_TACC_ELT_MUL
ELT_RELU = hw.DRM_TACC_ELT_RELU
ELT_SCALE = hw.DRM_TACC_ELT_SCALE
# hw 1.3 (uAPI 4, struct drm_tacc_cmd2 only)
OP_SOFTMAX = hw.DRM_TACC_OP_SOFTMAX
OP_NORM = hw.DRM_TACC_OP_NORM
OP_GATHER = hw.DRM_TACC_OP_GATHER
OP_LIST = hw.DRM_TACC_OP_LIST
ELT_GELU = hw.DRM_TACC_ELT_GELU
ELT_SILU = hw.DRM_TACC_ELT_SILU
ELT_EXP = hw.DRM_TACC_ELT_EXP
ELT_CAST = hw.DRM_TACC_ELT_CAST
CMD2_OPERANDS = hw.DRM_TACC_CMD2_OPERANDS
MAX_IN_SYNCOBJS = hw.DRM_TACC_MAX_IN_SYNCOBJS
MMAP_COUNTERS = hw.DRM_TACC_MMAP_COUNTERS
MMAP_TRACE = hw.DRM_TACC_MMAP_TRACE
TRACE_HDR_VERSION = hw.DRM_TACC_TRACE_HDR_VERSION
MMAP_SAMPLE = hw.DRM_TACC_MMAP_SAMPLE
MMAP_TLPCAP = hw.DRM_TACC_MMAP_TLPCAP
TLPCAP_NO_CTRL = hw.DRM_TACC_TLPCAP_NO_CTRL
TLPCAP_MIN_ENTRIES = hw.DRM_TACC_TLPCAP_MIN_ENTRIES
TLPCAP_MAX_ENTRIES = hw.DRM_TACC_TLPCAP_MAX_ENTRIES
TLPCAP_DEFAULT_ENTRIES = hw.DRM_TACC_TLPCAP_DEFAULT_ENTRIES
SAMPLE_MIN_PERIOD_NS = hw.DRM_TACC_SAMPLE_MIN_PERIOD_NS
SAMPLE_MAX_ENTRIES = hw.DRM_TACC_SAMPLE_MAX_ENTRIES
SAMPLE_HDR_VERSION = hw.DRM_TACC_SAMPLE_HDR_VERSION
TRACE_MIN_ENTRIES = hw.DRM_TACC_TRACE_MIN_ENTRIES
TRACE_MAX_ENTRIES = hw.DRM_TACC_TRACE_MAX_ENTRIES
TRACE_DEFAULT_ENTRIES = hw.DRM_TACC_TRACE_DEFAULT_ENTRIES
DRM_IOCTL_TACC_GET_PARAM = hw.DRM_IOCTL_TACC_GET_PARAM
DRM_IOCTL_TACC_BO_CREATE = hw.DRM_IOCTL_TACC_BO_CREATE
DRM_IOCTL_TACC_BO_INFO = hw.DRM_IOCTL_TACC_BO_INFO
DRM_IOCTL_TACC_VM_BIND = hw.DRM_IOCTL_TACC_VM_BIND
DRM_IOCTL_TACC_VM_UNBIND = hw.DRM_IOCTL_TACC_VM_UNBIND
DRM_IOCTL_TACC_SUBMIT = hw.DRM_IOCTL_TACC_SUBMIT
DRM_IOCTL_TACC_WAIT = hw.DRM_IOCTL_TACC_WAIT
DRM_IOCTL_TACC_TRACE_OPEN = hw.DRM_IOCTL_TACC_TRACE_OPEN
DRM_IOCTL_TACC_TRACE_ADVANCE = hw.DRM_IOCTL_TACC_TRACE_ADVANCE
DRM_IOCTL_TACC_TRACE_CLOSE = hw.DRM_IOCTL_TACC_TRACE_CLOSE
DRM_IOCTL_TACC_SAMPLE_OPEN = hw.DRM_IOCTL_TACC_SAMPLE_OPEN
DRM_IOCTL_TACC_SAMPLE_ADVANCE = hw.DRM_IOCTL_TACC_SAMPLE_ADVANCE
DRM_IOCTL_TACC_SAMPLE_CLOSE = hw.DRM_IOCTL_TACC_SAMPLE_CLOSE
DRM_IOCTL_TACC_TLPCAP_OPEN = hw.DRM_IOCTL_TACC_TLPCAP_OPEN
DRM_IOCTL_TACC_TLPCAP_ADVANCE = hw.DRM_IOCTL_TACC_TLPCAP_ADVANCE
DRM_IOCTL_TACC_TLPCAP_CLOSE = hw.DRM_IOCTL_TACC_TLPCAP_CLOSE
DRM_IOCTL_TACC_GEM_CLOSE = hw.DRM_IOCTL_TACC_GEM_CLOSE
DRM_IOCTL_TACC_SYNCOBJ_CREATE = hw.DRM_IOCTL_TACC_SYNCOBJ_CREATE
DRM_IOCTL_TACC_SYNCOBJ_DESTROY = hw.DRM_IOCTL_TACC_SYNCOBJ_DESTROY
DRM_IOCTL_TACC_SYNCOBJ_WAIT = hw.DRM_IOCTL_TACC_SYNCOBJ_WAIT

# <drm/drm.h> DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL (drm_tacc_syncobj_wait mirrors the core's)
SYNCOBJ_WAIT_FLAGS_WAIT_ALL = 1

# enum drm_tacc_func_kind
FUNC_KIND_NAMES = {FUNC_KIND_PF: "pf", FUNC_KIND_VF: "vf", FUNC_KIND_VIRTIO: "virtio"}

drm_tacc_get_param: type[C.Structure] = hw.struct("drm_tacc_get_param")
drm_tacc_bo_create: type[C.Structure] = hw.struct("drm_tacc_bo_create")
drm_tacc_bo_info: type[C.Structure] = hw.struct("drm_tacc_bo_info")
drm_tacc_vm_bind: type[C.Structure] = hw.struct("drm_tacc_vm_bind")
drm_tacc_vm_unbind: type[C.Structure] = hw.struct("drm_tacc_vm_unbind")
drm_tacc_operand: type[C.Structure] = hw.struct("drm_tacc_operand")
drm_tacc_cmd: type[C.Structure] = hw.struct("drm_tacc_cmd")
drm_tacc_cmd2: type[C.Structure] = hw.struct("drm_tacc_cmd2")
drm_tacc_submit: type[C.Structure] = hw.struct("drm_tacc_submit")
drm_tacc_wait: type[C.Structure] = hw.struct("drm_tacc_wait")
drm_tacc_trace_open: type[C.Structure] = hw.struct("drm_tacc_trace_open")
drm_tacc_trace_header: type[C.Structure] = hw.struct("drm_tacc_trace_header")
drm_tacc_trace_advance: type[C.Structure] = hw.struct("drm_tacc_trace_advance")
drm_tacc_trace_close: type[C.Structure] = hw.struct("drm_tacc_trace_close")
drm_tacc_sample_open: type[C.Structure] = hw.struct("drm_tacc_sample_open")
drm_tacc_sample_header: type[C.Structure] = hw.struct("drm_tacc_sample_header")
drm_tacc_sample_advance: type[C.Structure] = hw.struct("drm_tacc_sample_advance")
drm_tacc_sample_close: type[C.Structure] = hw.struct("drm_tacc_sample_close")
drm_tacc_tlpcap_open: type[C.Structure] = hw.struct("drm_tacc_tlpcap_open")
drm_tacc_gem_close: type[C.Structure] = hw.struct("drm_tacc_gem_close")
drm_tacc_syncobj_create: type[C.Structure] = hw.struct("drm_tacc_syncobj_create")
drm_tacc_syncobj_destroy: type[C.Structure] = hw.struct("drm_tacc_syncobj_destroy")
drm_tacc_syncobj_wait: type[C.Structure] = hw.struct("drm_tacc_syncobj_wait")

# every structure and ioctl number of the header
STRUCTS: tuple[type[C.Structure], ...] = tuple(
    hw.struct(n) for n in hw.STRUCTS if n.startswith("drm_tacc_"))
IOCTLS: dict[str, int] = {k: v for k, v in hw.CONSTANTS.items()
                          if k.startswith("DRM_IOCTL_TACC_")}


# --- the few calls the tracing and counter tools make without a runtime Context
def ioctl(fd: int, request: int, arg: C.Structure) -> C.Structure:
    """ioctl(2) with a ctypes argument (returned, updated); raises OSError with the
    driver's errno."""
    fcntl.ioctl(fd, request, arg, True)
    return arg


def get_param(fd: int, param: int, index: int = 0) -> int:
    p = drm_tacc_get_param(param=param, index=index)
    ioctl(fd, DRM_IOCTL_TACC_GET_PARAM, p)
    return int(p.value)


def submit_nops(fd: int, njobs: int, ncmds: int = 1, queue: int = 0, tag_base: int = 0,
                wait: bool = True) -> list[int]:
    """Submit ``njobs`` jobs of ``ncmds`` NOP commands; returns their seqnos (waited for)."""
    cmds = (drm_tacc_cmd * ncmds)()
    seqnos = []
    for j in range(njobs):
        for i in range(ncmds):
            cmds[i].opcode = OP_NOP
            cmds[i].tag = tag_base + j if tag_base else 0
        s = drm_tacc_submit(cmds=C.addressof(cmds), num_cmds=ncmds, queue=queue,
                            cmd_size=C.sizeof(drm_tacc_cmd))
        while True:
            try:
                ioctl(fd, DRM_IOCTL_TACC_SUBMIT, s)
                break
            except BlockingIOError:
                if seqnos:
                    wait_seqno(fd, seqnos[-1])
        seqnos.append(int(s.seqno))
    if wait and seqnos:
        wait_seqno(fd, seqnos[-1])
    return seqnos


def wait_seqno(fd: int, seqno: int, timeout_ns: int = 10_000_000_000) -> int:
    w = drm_tacc_wait(seqno=seqno, timeout_ns=timeout_ns)
    ioctl(fd, DRM_IOCTL_TACC_WAIT, w)
    return int(w.status)


def open_node(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)
