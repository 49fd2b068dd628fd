"""ctypes mirror of ``kernel/include/uapi/drm/tacc_accel.h`` (the ioctl ABI).

Hand-written from the header; ``tests/host/test_uapi_layout.py`` compiles a C program
against the header and fails if any size, field offset or ioctl number differs.
"""

from __future__ import annotations

import ctypes as C

# --- ioctl encoding (asm-generic/ioctl.h, x86) ---
_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_WRITE, _IOC_READ = 1, 2

DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40
DRM_TACC_API_VERSION = 4


def _ioc(direction: int, nr: int, size: int) -> int:
    return ((direction << _IOC_DIRSHIFT) | (DRM_IOCTL_BASE << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


def _iowr(nr: int, st: type[C.Structure]) -> int:
    return _ioc(_IOC_READ | _IOC_WRITE, nr, C.sizeof(st))


def _iow(nr: int, st: type[C.Structure]) -> int:
    return _ioc(_IOC_WRITE, nr, C.sizeof(st))


u32, u64, s32, s64 = C.c_uint32, C.c_uint64, C.c_int32, C.c_int64

# params (enum drm_tacc_param)
PARAM_API_VERSION = 0
PARAM_HW_VERSION = 1
PARAM_CAPS = 2
PARAM_FUNC = 3
PARAM_NUM_QUEUES = 4
PARAM_NUM_CONTEXTS = 5
PARAM_NUM_ENGINES = 6
PARAM_DEVMEM_SIZE = 7
PARAM_CLOCK_HZ = 8
PARAM_CONTEXT_ID = 9
PARAM_COUNTERS_MMAP_OFFSET = 10
PARAM_COUNTERS_MMAP_SIZE = 11
PARAM_MAX_CMDS = 12
PARAM_MAX_INFLIGHT = 13
PARAM_VA_START = 14
PARAM_VA_END = 15
PARAM_CTX_FAULTS = 16
PARAM_CTX_FAULT_ADDR = 17
PARAM_DEVCLK = 18
PARAM_QUEUE_SIZE = 19
PARAM_LAST_SEQNO = 20
PARAM_CTX_RESETS = 21
PARAM_TRACE_MMAP_OFFSET = 22
PARAM_DEVMEM_FREE = 23
PARAM_FUNC_KIND = 24  # uAPI 3: enum drm_tacc_func_kind

# enum drm_tacc_func_kind
FUNC_KIND_PF, FUNC_KIND_VF, FUNC_KIND_VIRTIO = 0, 1, 2
FUNC_KIND_NAMES = {FUNC_KIND_PF: "pf", FUNC_KIND_VF: "vf", FUNC_KIND_VIRTIO: "virtio"}

BO_HOST, BO_DEVICE, BO_USERPTR = 0, 1, 2
BO_F_NO_BIND = 1 << 0
BO_F_READONLY = 1 << 1
BIND_F_FIXED = 1 << 0
BIND_F_READONLY = 1 << 1
VM_UNBIND_NOWAIT = 1 << 0

OP_NOP, OP_COPY_H2D, OP_COPY_D2H, OP_COPY_D2D = 0, 1, 2, 3
OP_GEMM, OP_ELTWISE, OP_FENCE, OP_TIMESTAMP, OP_BARRIER = 4, 5, 6, 7, 8
ELT_ADD, ELT_MUL, ELT_RELU, ELT_SCALE = 0, 1, 2, 3
# hw 1.3 (uAPI 4, struct drm_tacc_cmd2 only)
OP_SOFTMAX, OP_NORM, OP_GATHER, OP_LIST = 10, 11, 12, 13
ELT_GELU, ELT_SILU, ELT_EXP, ELT_CAST = 4, 5, 6, 7
CMD2_OPERANDS = 6
MAX_IN_SYNCOBJS = 16
SYNCOBJ_WAIT_FLAGS_WAIT_ALL = 1

# mmap offsets of the counter block and the rings; trace ring header version
MMAP_COUNTERS = 0x10000000
MMAP_TRACE = 0x20000000
TRACE_HDR_VERSION = 1

# device-side counter sampling ring
MMAP_SAMPLE = 0x30000000
# TLP capture ring (uAPI 3, docs/uapi.md "TLP capture")
MMAP_TLPCAP = 0x40000000
TLPCAP_NO_CTRL = 1
TLPCAP_MIN_ENTRIES = 64
TLPCAP_MAX_ENTRIES = 262144
TLPCAP_DEFAULT_ENTRIES = 16384
SAMPLE_MIN_PERIOD_NS = 100_000
SAMPLE_MAX_ENTRIES = 2048
SAMPLE_HDR_VERSION = 1

# device trace ring: entries a TRACE_OPEN may ask for (0 = the default)
TRACE_MIN_ENTRIES = 64
TRACE_MAX_ENTRIES = 32768
TRACE_DEFAULT_ENTRIES = 4096


class drm_tacc_get_param(C.Structure):  # noqa: N801
    _fields_ = [("param", u32), ("index", u32), ("value", u64)]


class drm_tacc_bo_create(C.Structure):  # noqa: N801
    _fields_ = [("size", u64), ("userptr", u64), ("type", u32), ("flags", u32),
                ("handle", u32), ("pad", u32), ("va", u64)]


class drm_tacc_bo_info(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("pad", u32), ("mmap_offset", u64), ("va", u64),
                ("size", u64), ("bound_size", u64), ("type", u32), ("flags", u32)]


class drm_tacc_vm_bind(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("flags", u32), ("va", u64), ("bo_offset", u64),
                ("size", u64), ("page_size", u64)]


class drm_tacc_vm_unbind(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("flags", u32)]


class drm_tacc_operand(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("pad", u32), ("offset", u64)]


class drm_tacc_cmd(C.Structure):  # noqa: N801
    _fields_ = [("opcode", u32), ("flags", u32), ("tag", u64),
                ("a", drm_tacc_operand), ("b", drm_tacc_operand), ("c", drm_tacc_operand),
                ("size", u64), ("value", u64),
                ("m", u32), ("n", u32), ("k", u32), ("lda", u32), ("ldb", u32), ("ldc", u32),
                ("alpha", u32), ("beta", u32), ("elt_op", u32), ("scalar", u32),
                ("rsvd", u64)]


class drm_tacc_cmd2(C.Structure):  # noqa: N801
    """uAPI 4: any opcode; ``args`` is the device descriptor's payload, addresses zero."""

    _fields_ = [("opcode", u32), ("flags", u32), ("tag", u64),
                ("op", drm_tacc_operand * CMD2_OPERANDS), ("args", C.c_uint8 * 104),
                ("rsvd", u64 * 5)]


class drm_tacc_submit(C.Structure):  # noqa: N801
    _fields_ = [("cmds", u64), ("in_syncobjs", u64), ("num_cmds", u32),
                ("num_in_syncobjs", u32), ("queue", u32), ("out_syncobj", u32),
                ("flags", u32), ("cmd_size", u32), ("seqno", u64)]


class drm_tacc_wait(C.Structure):  # noqa: N801
    _fields_ = [("seqno", u64), ("timeout_ns", s64), ("flags", u32), ("status", s32)]


class drm_tacc_trace_open(C.Structure):  # noqa: N801
    _fields_ = [("flags", u32), ("entries", u32), ("mmap_offset", u64), ("mmap_size", u64)]


class drm_tacc_trace_header(C.Structure):  # noqa: N801
    _fields_ = [("version", u32), ("rec_size", u32), ("entries", u32), ("rec_version", u32),
                ("data_offset", u64), ("prod", u32), ("dropped", u32), ("cons", u32),
                ("epoch", u32)]


class drm_tacc_trace_advance(C.Structure):  # noqa: N801
    _fields_ = [("cons", u32), ("flags", u32), ("prod", u32), ("dropped", u32)]


class drm_tacc_trace_close(C.Structure):  # noqa: N801
    _fields_ = [("flags", u32), ("pad", u32)]


class drm_tacc_sample_open(C.Structure):  # noqa: N801
    _fields_ = [("period_ns", u32), ("entries", u32), ("flags", u32), ("pad", u32),
                ("mmap_offset", u64), ("mmap_size", u64)]


class drm_tacc_sample_header(C.Structure):  # noqa: N801
    _fields_ = [("version", u32), ("entry_size", u32), ("entries", u32), ("period_ns", u32),
                ("data_offset", u64), ("prod", u32), ("dropped", u32), ("cons", u32),
                ("epoch", u32), ("dropped_base", u32), ("pad", u32)]


class drm_tacc_sample_advance(C.Structure):  # noqa: N801
    _fields_ = [("cons", u32), ("flags", u32), ("prod", u32), ("dropped", u32)]


class drm_tacc_sample_close(C.Structure):  # noqa: N801
    _fields_ = [("flags", u32), ("pad", u32)]


class drm_tacc_tlpcap_open(C.Structure):  # noqa: N801
    _fields_ = [("flags", u32), ("entries", u32), ("funcs", u32), ("kinds", u32),
                ("addr_lo", u64), ("addr_hi", u64), ("pad", u32), ("pad2", u32),
                ("mmap_offset", u64), ("mmap_size", u64)]


class drm_tacc_gem_close(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("pad", u32)]


class drm_tacc_syncobj_create(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("flags", u32)]


class drm_tacc_syncobj_destroy(C.Structure):  # noqa: N801
    _fields_ = [("handle", u32), ("pad", u32)]


class drm_tacc_syncobj_wait(C.Structure):  # noqa: N801
    _fields_ = [("handles", u64), ("timeout_nsec", s64), ("count_handles", u32),
                ("flags", u32), ("first_signaled", u32), ("pad", u32),
                ("deadline_nsec", u64)]


DRM_IOCTL_TACC_GET_PARAM = _iowr(DRM_COMMAND_BASE + 0x00, drm_tacc_get_param)
DRM_IOCTL_TACC_BO_CREATE = _iowr(DRM_COMMAND_BASE + 0x01, drm_tacc_bo_create)
DRM_IOCTL_TACC_BO_INFO = _iowr(DRM_COMMAND_BASE + 0x02, drm_tacc_bo_info)
DRM_IOCTL_TACC_VM_BIND = _iowr(DRM_COMMAND_BASE + 0x03, drm_tacc_vm_bind)
DRM_IOCTL_TACC_VM_UNBIND = _iow(DRM_COMMAND_BASE + 0x04, drm_tacc_vm_unbind)
DRM_IOCTL_TACC_SUBMIT = _iowr(DRM_COMMAND_BASE + 0x05, drm_tacc_submit)
DRM_IOCTL_TACC_WAIT = _iowr(DRM_COMMAND_BASE + 0x06, drm_tacc_wait)
DRM_IOCTL_TACC_TRACE_OPEN = _iowr(DRM_COMMAND_BASE + 0x07, drm_tacc_trace_open)
DRM_IOCTL_TACC_TRACE_ADVANCE = _iowr(DRM_COMMAND_BASE + 0x08, drm_tacc_trace_advance)
DRM_IOCTL_TACC_TRACE_CLOSE = _iow(DRM_COMMAND_BASE + 0x09, drm_tacc_trace_close)
DRM_IOCTL_TACC_SAMPLE_OPEN = _iowr(DRM_COMMAND_BASE + 0x0A, drm_tacc_sample_open)
DRM_IOCTL_TACC_SAMPLE_ADVANCE = _iowr(DRM_COMMAND_BASE + 0x0B, drm_tacc_sample_advance)
DRM_IOCTL_TACC_SAMPLE_CLOSE = _iow(DRM_COMMAND_BASE + 0x0C, drm_tacc_sample_close)
DRM_IOCTL_TACC_TLPCAP_OPEN = _iowr(DRM_COMMAND_BASE + 0x0D, drm_tacc_tlpcap_open)
DRM_IOCTL_TACC_TLPCAP_ADVANCE = _iowr(DRM_COMMAND_BASE + 0x0E, drm_tacc_trace_advance)
DRM_IOCTL_TACC_TLPCAP_CLOSE = _iow(DRM_COMMAND_BASE + 0x0F, drm_tacc_trace_close)
DRM_IOCTL_TACC_GEM_CLOSE = _iow(0x09, drm_tacc_gem_close)
DRM_IOCTL_TACC_SYNCOBJ_CREATE = _iowr(0xBF, drm_tacc_syncobj_create)
DRM_IOCTL_TACC_SYNCOBJ_DESTROY = _iowr(0xC0, drm_tacc_syncobj_destroy)
DRM_IOCTL_TACC_SYNCOBJ_WAIT = _iowr(0xC3, drm_tacc_syncobj_wait)

# Every structure and ioctl number the layout test compares with the C header.
STRUCTS: tuple[type[C.Structure], ...] = (
    drm_tacc_get_param, drm_tacc_bo_create, drm_tacc_bo_info, drm_tacc_vm_bind,
    drm_tacc_vm_unbind, drm_tacc_operand, drm_tacc_cmd, drm_tacc_cmd2, drm_tacc_submit,
    drm_tacc_wait,
    drm_tacc_trace_open, drm_tacc_trace_header, drm_tacc_trace_advance,
    drm_tacc_trace_close, drm_tacc_sample_open, drm_tacc_sample_header,
    drm_tacc_sample_advance, drm_tacc_sample_close, drm_tacc_tlpcap_open,
    drm_tacc_gem_close, drm_tacc_syncobj_create,
    drm_tacc_syncobj_destroy, drm_tacc_syncobj_wait,
)
IOCTLS: dict[str, int] = {k: v for k, v in globals().items() if k.startswith("DRM_IOCTL_TACC_")}
CONSTANTS: dict[str, int] = {
    "DRM_TACC_API_VERSION": DRM_TACC_API_VERSION,
    "DRM_TACC_BO_HOST": BO_HOST, "DRM_TACC_BO_DEVICE": BO_DEVICE,
    "DRM_TACC_BO_USERPTR": BO_USERPTR, "DRM_TACC_BO_F_NO_BIND": BO_F_NO_BIND,
    "DRM_TACC_BO_F_READONLY": BO_F_READONLY, "DRM_TACC_BIND_F_FIXED": BIND_F_FIXED,
    "DRM_TACC_BIND_F_READONLY": BIND_F_READONLY,
    "DRM_TACC_VM_UNBIND_NOWAIT": VM_UNBIND_NOWAIT,
    "DRM_TACC_OP_NOP": OP_NOP, "DRM_TACC_OP_COPY_H2D": OP_COPY_H2D,
    "DRM_TACC_OP_COPY_D2H": OP_COPY_D2H, "DRM_TACC_OP_COPY_D2D": OP_COPY_D2D,
    "DRM_TACC_OP_GEMM": OP_GEMM, "DRM_TACC_OP_ELTWISE": OP_ELTWISE,
    "DRM_TACC_OP_FENCE": OP_FENCE, "DRM_TACC_OP_TIMESTAMP": OP_TIMESTAMP,
    "DRM_TACC_OP_BARRIER": OP_BARRIER, "DRM_TACC_ELT_ADD": ELT_ADD,
    "DRM_TACC_ELT_MUL": ELT_MUL, "DRM_TACC_ELT_RELU": ELT_RELU,
    "DRM_TACC_ELT_SCALE": ELT_SCALE, "DRM_TACC_MAX_IN_SYNCOBJS": MAX_IN_SYNCOBJS,
    "DRM_TACC_OP_SOFTMAX": OP_SOFTMAX, "DRM_TACC_OP_NORM": OP_NORM,
    "DRM_TACC_OP_GATHER": OP_GATHER, "DRM_TACC_OP_LIST": OP_LIST,
    "DRM_TACC_ELT_GELU": ELT_GELU, "DRM_TACC_ELT_SILU": ELT_SILU, "DRM_TACC_ELT_EXP": ELT_EXP,
    "DRM_TACC_ELT_CAST": ELT_CAST, "DRM_TACC_CMD2_OPERANDS": CMD2_OPERANDS,
    "DRM_TACC_PARAM_DEVMEM_FREE": PARAM_DEVMEM_FREE,
    "DRM_TACC_PARAM_FUNC_KIND": PARAM_FUNC_KIND, "DRM_TACC_FUNC_KIND_PF": FUNC_KIND_PF,
    "DRM_TACC_FUNC_KIND_VF": FUNC_KIND_VF, "DRM_TACC_FUNC_KIND_VIRTIO": FUNC_KIND_VIRTIO,
    "DRM_TACC_PARAM_VA_END": PARAM_VA_END, "DRM_TACC_PARAM_MAX_CMDS": PARAM_MAX_CMDS,
    "DRM_TACC_MMAP_SAMPLE": MMAP_SAMPLE, "DRM_TACC_SAMPLE_MIN_PERIOD_NS": SAMPLE_MIN_PERIOD_NS,
    "DRM_TACC_SAMPLE_MAX_ENTRIES": SAMPLE_MAX_ENTRIES,
    "DRM_TACC_SAMPLE_HDR_VERSION": SAMPLE_HDR_VERSION,
    "DRM_TACC_MMAP_COUNTERS": MMAP_COUNTERS, "DRM_TACC_MMAP_TRACE": MMAP_TRACE,
    "DRM_TACC_TRACE_HDR_VERSION": TRACE_HDR_VERSION,
    "DRM_TACC_TRACE_MIN_ENTRIES": TRACE_MIN_ENTRIES,
    "DRM_TACC_TRACE_MAX_ENTRIES": TRACE_MAX_ENTRIES,
    "DRM_TACC_TRACE_DEFAULT_ENTRIES": TRACE_DEFAULT_ENTRIES,
    "DRM_TACC_MMAP_TLPCAP": MMAP_TLPCAP, "DRM_TACC_TLPCAP_NO_CTRL": TLPCAP_NO_CTRL,
    "DRM_TACC_TLPCAP_MIN_ENTRIES": TLPCAP_MIN_ENTRIES,
    "DRM_TACC_TLPCAP_MAX_ENTRIES": TLPCAP_MAX_ENTRIES,
    "DRM_TACC_TLPCAP_DEFAULT_ENTRIES": TLPCAP_DEFAULT_ENTRIES,
}
