"""Record schemas of the capture streams (numpy structured dtypes, little endian).

``TRACE_REC_DTYPE`` is the device's ``struct tacc_trace_rec`` from
``kernel/include/tacc_hw.h`` byte for byte (a test compiles the header and compares
every offset).  The other streams are defined here; each carries a schema version that
the stream file header repeats.  See docs/capture-format.md.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np

from tacc import hw

FORMAT_NAME = "tacc-capture"
FORMAT_VERSION = 1  # major: a reader refuses a capture of a newer major version
# minor: additions (new streams, new fields) that older readers may skip; a reader reads
# every minor of its major.  meta.json "minor" (absent = 0).  1: the "minor" key itself
#; captures of minor 0 may lack device_events.  The coordinator reconciles the
# number when several branches add to the format in one round.
FORMAT_MINOR = 14  # docs/capture-format.md "Minor versions": 2 virtio trace records,
# 3 cluster (net_clock), 4 capture overhead (mix/tail), 5 containers (processes),
# 6 link-model counter slots, 7 the TLP stream (tlp), 8 link power-state counters,
# 9 devices[].kind (virtio-tacc functions in captures), 10 L1.1/L1.2 counters,
# 11 devcoredumps (devcoredump/<n>.txt, device event kind 11), 12 trace record version 3
# (device_trace's flops ... list_index columns, meta devices[] roofline and trace_version),
# 13 block I/O operation (host block records' prev_state: BlockOp), 14 VM pauses
# (clock_sync's vm_paused_ns)
TRACE_REC_VERSION = hw.TACC_TRACE_VERSION  # 2: virtio event records, docs/virtio.md
# event records (trace record version 2): opcode >= TACC_TRACE_EV_BASE is not a command
TRACE_EV_BASE = hw.TACC_TRACE_EV_BASE
TRACE_EV_VIRTIO_KICK = hw.TACC_TRACE_EV_VIRTIO_KICK  # a submit buffer taken off the queue
TRACE_EV_VIRTIO_DISPATCH = hw.TACC_TRACE_EV_VIRTIO_DISPATCH  # a job to a hardware queue
STRING_MAX = 120

TRACE_REC_DTYPE = hw.dtype("tacc_trace_rec")
assert TRACE_REC_DTYPE.itemsize == 64

# Version 3 of the record (TRACE_CTRL.V3, 128 bytes: struct tacc_trace_rec3): the
# version-2 record, then the command's FLOPs, device-memory bytes read and written, its
# list id and the index of its LIST in the job, its operand dtype and sub-op, 32 reserved.
TRACE_REC3_VERSION = hw.TACC_TRACE_VERSION_3
TRACE_REC3_SIZE = hw.TACC_TRACE_REC3_SIZE
TRACE_V3_TAIL = [("flops", "<u8"), ("bytes_read", "<u8"), ("bytes_written", "<u8"),
                 ("list_id", "<u4"), ("list_index", "<u2"), ("dtype", "u1"), ("subop", "u1")]
TRACE_V3_TAIL_DTYPE = np.dtype(TRACE_V3_TAIL)  # bytes 64..96 of a version-3 record
assert TRACE_V3_TAIL_DTYPE.itemsize == 32

# Device trace stream: the raw record (its first 64 bytes), the capture's function id
# (index in meta.json "devices"), then (minor 12) the version-3 fields, zero in a
# version-2 record (``version`` < 3) and in captures of older minors (widened on read).
DEVICE_TRACE_DTYPE = np.dtype(TRACE_REC_DTYPE.descr + [("fid", "<u2"), ("_pad", "V6")]
                              + TRACE_V3_TAIL)
assert DEVICE_TRACE_DTYPE.itemsize == 104
# the stream's record before minor 12 (72 bytes)
DEVICE_TRACE_V2_DTYPE = np.dtype(TRACE_REC_DTYPE.descr + [("fid", "<u2"), ("_pad", "V6")])

# X-lists of tacc_hw.h, in slot order (slot = index in the counter page).
FUNC_COUNTERS: tuple[tuple[str, int], ...] = tuple(hw.FUNC_COUNTERS.items())
GLOBAL_COUNTERS: tuple[tuple[str, int], ...] = tuple(hw.GLOBAL_COUNTERS.items())

# Counter samples: columnar, one u64 column per counter (global ones prefixed g_,
# zero on VFs), values raw and cumulative as the device reports them.
COUNTERS_DTYPE = np.dtype(
    [("devclk", "<u8"), ("seq", "<u8"), ("fid", "<u2"), ("_pad", "V6")]
    + [(name, "<u8") for name, _ in FUNC_COUNTERS]
    + [("g_" + name, "<u8") for name, _ in GLOBAL_COUNTERS]
)


class DriverKind(IntEnum):
    IOCTL = 1
    SUBMIT = 2
    DOORBELL = 3
    IRQ = 4
    JOB_START = 5
    JOB_DONE = 6
    BO_CREATE = 7
    BO_DESTROY = 8
    DMA_MAP = 9
    DMA_UNMAP = 10
    VM_BIND = 11
    VM_UNBIND = 12
    MMU_FAULT = 13
    PM = 14
    RESET = 15
    TRACE_DROP = 16


class DriverFlag(IntEnum):
    USERPTR = 1 << 0  # bo_create / dma_map of user memory
    BOUNCE = 1 << 1  # dma_map went through a bounce buffer (swiotlb)
    PINNED = 1 << 2  # pages long-term pinned
    DEVMEM = 1 << 3  # bo / bind of device memory


class DmaDir(IntEnum):
    BIDIRECTIONAL = 0
    TO_DEVICE = 1
    FROM_DEVICE = 2


# Driver events, from tracepoints. t_ns is CLOCK_MONOTONIC; dur_ns > 0 for events that
# are spans (ioctl, dma map/unmap, vm bind/unbind); dev_start/dev_end are raw device
# ticks (job completion). Unused columns are zero.
DRIVER_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"), ("dur_ns", "<i8"), ("tag", "<u8"), ("addr", "<u8"),
        ("size", "<u8"), ("dev_start", "<u8"), ("dev_end", "<u8"), ("arg", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("job", "<u4"), ("ncmds", "<u4"),
        ("nsegs", "<u4"), ("page_size", "<u4"), ("status", "<i4"), ("flags", "<u4"),
        ("fid", "<u2"), ("ctx", "<u2"), ("kind", "u1"), ("queue", "u1"), ("dir", "u1"),
        ("cpu", "u1"),
    ]
)

NO_FID = 0xFFFF

# Runtime API calls (from the per-thread shared-memory rings). name_id/args_id index
# the strings stream; fid is NO_FID when the call names no device.
API_DTYPE = np.dtype(
    [
        ("t_start", "<i8"), ("t_end", "<i8"), ("tag", "<u8"), ("bytes", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("name_id", "<u4"), ("args_id", "<u4"),
        ("fid", "<u2"), ("status", "<i2"), ("_pad", "V4"),
    ]
)

STRINGS_DTYPE = np.dtype(
    [("id", "<u4"), ("len", "<u2"), ("_pad", "V2"), ("text", f"S{STRING_MAX}")]
)

# Clock-sync pairs: bracketed reads by the driver, per function.
# Clock pairs (sysfs tacc/clock_sync): CLOCK_MONOTONIC before and after the device clock,
# the device's host clock, then (minor 14) the host time the VM has stood still so far
# (TACC_REG_VM_PAUSED_NS, hw 1.7; 0 from older devices and in captures of older minors).
CLOCK_DTYPE = np.dtype(
    [
        ("mono_before", "<i8"), ("devclk", "<u8"), ("mono_after", "<i8"),
        ("hostclk", "<u8"), ("fid", "<u2"), ("_pad", "V6"), ("vm_paused_ns", "<u8"),
    ]
)
assert CLOCK_DTYPE.itemsize == 48
# A VM pause read from clock_sync (Capture.vm_pauses): between CLOCK_MONOTONIC t_lo and t_hi
# the device's VM_PAUSED_NS stepped by paused_ns (host time; the guest's clock stood still)
VM_PAUSE_DTYPE = np.dtype([("t_lo", "<i8"), ("t_hi", "<i8"), ("paused_ns", "<i8")])


class HostKind(IntEnum):
    SCHED_SWITCH = 1  # pid/tid = prev, next_pid, prev_state
    SCHED_WAKEUP = 2  # pid/tid = woken task
    BLOCK_ISSUE = 3  # dev, sector, size, prev_state = BlockOp (minor 13)
    BLOCK_COMPLETE = 4  # dev, sector, size, dur_ns = issue->complete, prev_state = BlockOp
    NET_TX = 5  # dev = ifindex, size
    NET_RX = 6


class BlockOp(IntEnum):
    """A block record's request operation, in ``prev_state`` (minor 13; 0 in older
    captures: not recorded), from the tracepoint's rwbs."""

    OTHER = 0
    READ = 1
    WRITE = 2
    FLUSH = 3
    DISCARD = 4


HOST_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"), ("dur_ns", "<i8"), ("size", "<u8"), ("sector", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("next_pid", "<u4"), ("dev", "<u4"),
        ("prev_state", "<i4"), ("cpu", "<u2"), ("kind", "u1"), ("_pad", "V1"),
        ("comm", "S16"), ("next_comm", "S16"),
    ]
)


class DropSource(IntEnum):
    DEVICE_TRACE = 1
    DRIVER = 2
    API = 3
    COUNTERS = 4
    HOST = 5
    CLOCK = 6
    DEVICE_EVENTS = 7  # past max_bytes, or the netlink socket overflowed (ENOBUFS)
    TLP = 8  # the TLP capture ring was full (the device's TLPCAP_DROPPED), or max_bytes


DROPS_DTYPE = np.dtype(
    [("t_ns", "<i8"), ("count", "<u8"), ("pid", "<u4"), ("fid", "<u2"), ("source", "u1"),
     ("_pad", "V1")]
)

class DeviceEventKind(IntEnum):
    """``device_events.kind``: 1-8 are the driver's netlink events (``enum tacc_genl_event``
    in tacc_accel.h, same numbers), 9-10 the functions taccd saw appear or disappear."""

    MMU_FAULT = 1  # ctx, queue, tag, addr = faulting VA, arg = FAULT_INFO, status = type
    HANG = 2  # a job timed out: ctx, queue, tag, seqno
    RESET = 3  # queue reset (ctx, queue, tag, seqno) or function reset (queue 0xFFFF,
    #            arg = reason)
    FATAL = 4  # arg = IRQ status
    PM = 5  # runtime PM transition: arg = new PCI state (0 D0 resumed, 3 D3hot suspended)
    VF_ENABLE = 6  # on the PF: arg = number of VFs
    VF_DISABLE = 7  # on the PF
    DMA_ERROR = 8  # arg = IRQ status
    HOTPLUG_ADD = 9  # a function appeared during the capture (new fid)
    HOTPLUG_REMOVE = 10  # a function of the capture disappeared
    DEVCOREDUMP = 11  # tacc.ko's devcoredump (minor 11): arg = n of devcoredump/<n>.txt;
    #                   a job timeout's ctx, queue, tag, seqno, pid
    OTHER = 255  # a netlink event this tacc does not know: arg = its event number


NO_CTX = 0xFFFFFFFF
NO_QUEUE = 0xFFFF

# Asynchronous device events (driver netlink group "events", taccd's hot-plug monitor),
# one record each, written as they arrive.  t_ns is CLOCK_MONOTONIC (the driver's
# timestamp of the event); ctx is NO_CTX and queue NO_QUEUE when the event names none;
# name_id indexes the strings stream (free-text detail, 0 = none).
DEVICE_EVENTS_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"), ("tag", "<u8"), ("addr", "<u8"), ("arg", "<u8"), ("seqno", "<u8"),
        ("ctx", "<u4"), ("pid", "<u4"), ("status", "<i4"), ("name_id", "<u4"),
        ("fid", "<u2"), ("queue", "<u2"), ("kind", "u1"), ("_pad", "V3"),
    ]
)
assert DEVICE_EVENTS_DTYPE.itemsize == 64

# Fields holding raw device ticks (converted to CLOCK_MONOTONIC ns through the record's
# function's clock pairs: Capture.device_clock(fid)); 0 = not set.  A stream adding tick
# fields lists them here (tacc export adds a <field>_ns column for each).
DEVICE_TICK_FIELDS: dict[str, tuple[str, ...]] = {
    "device_trace": ("t_fetch", "t_start", "t_end"),
    "driver": ("dev_start", "dev_end"),
    "counters": ("devclk",),
}

# clock alignment across nodes: one record per four-timestamp exchange between
# this node's taccd (the requester) and a peer's (docs/cluster.md).  t1 request sent, t4
# reply received (this node's CLOCK_MONOTONIC ns); t2 request received, t3 reply sent (the
# peer's).  offset (peer - this) = ((t2 - t1) + (t3 - t4)) / 2, within +- delay / 2 where
# delay = (t4 - t1) - (t3 - t2): half the round trip.
NET_CLOCK_DTYPE = np.dtype(
    [
        ("t1", "<i8"), ("t2", "<i8"), ("t3", "<i8"), ("t4", "<i8"), ("seq", "<u4"),
        ("peer_ip", "<u4"), ("peer_node", "S24"),
    ]
)
assert NET_CLOCK_DTYPE.itemsize == 64

# Containers (format 1, minor addition "containers"; docs/capture-format.md): one record
# per traced process, resolved once at its first event (tacc.daemon.procinfo).  pid is
# the host pid (the driver stream's), ns_pid the pid in its own pid namespace; cgroup_id
# is the cgroup v2 directory's inode (bpf_get_current_cgroup_id's value, 0 = unknown);
# cgroup_name_id / container_name_id index the strings stream (0 = none).
PROCESSES_DTYPE = np.dtype(
    [
        ("t_ns", "<i8"), ("cgroup_id", "<u8"), ("pidns", "<u8"), ("pid", "<u4"),
        ("ns_pid", "<u4"), ("cgroup_name_id", "<u4"), ("container_name_id", "<u4"),
        ("comm", "S16"),
    ]
)
assert PROCESSES_DTYPE.itemsize == 56

# The TLP stream (format 1, minor 7, "TLP stream" in docs/capture-format.md): the PF's
# TLP capture ring (docs/hardware.md section 11), opt-in (taccd option ``tlp``, CAP_PERFMON).
# TLP_REC_DTYPE is ``struct tacc_tlp_rec`` byte for byte (tests/host/test_pcie.py checks it
# against tacc_hw.h); t_ps is the device's modelled time in ps (t_ps // 1000 = device ticks
# of the PF's clock), func the function on the PF's link (0 = PF, n = VF n).  The stream
# adds the capture's fid of that function (NO_FID when it is not in the capture).
TLP_REC_DTYPE = hw.dtype("tacc_tlp_rec")
assert TLP_REC_DTYPE.itemsize == 64
TLP_DTYPE = np.dtype(TLP_REC_DTYPE.descr + [("fid", "<u2"), ("_pad", "V6")])
assert TLP_DTYPE.itemsize == 72

# name -> (schema version, dtype)
STREAMS: dict[str, tuple[int, np.dtype]] = {
    "device_trace": (1, DEVICE_TRACE_DTYPE),
    "driver": (1, DRIVER_DTYPE),
    "api": (1, API_DTYPE),
    "strings": (1, STRINGS_DTYPE),
    "counters": (1, COUNTERS_DTYPE),
    "clock_sync": (1, CLOCK_DTYPE),
    "host": (1, HOST_DTYPE),
    "drops": (1, DROPS_DTYPE),
    # added after the others: older captures have no file for it (read as empty)
    "device_events": (1, DEVICE_EVENTS_DTYPE),
    # older captures have no file for it (read as empty)
    "net_clock": (1, NET_CLOCK_DTYPE),
    # containers: added after the others, read as empty from captures without it
    "processes": (1, PROCESSES_DTYPE),
    # minor 7: the TLP stream, opt-in; read as empty from captures without it
    "tlp": (1, TLP_DTYPE),
}


# enum tacc_opcode (FILL, hw 1.1: the driver's device-memory scrub, tag 0)
Opcode = IntEnum("Opcode", {k.removeprefix("TACC_OP_"): v
                            for k, v in hw.ENUMS["tacc_opcode"].items() if k != "TACC_OP_MAX"})
# enum tacc_engine: the DMA engines, then the compute engines numbered on
Engine = IntEnum("Engine", {"DMA_H2D": hw.TACC_ENGINE_DMA_H2D, "DMA_D2H": hw.TACC_ENGINE_DMA_D2H}
                 | {f"COMPUTE{i}": hw.TACC_ENGINE_COMPUTE0 + i
                    for i in range(hw.TACC_NUM_COMPUTE_ENGINES)})

NUM_ENGINES = hw.TACC_NUM_ENGINES
NUM_QUEUES = hw.TACC_NUM_QUEUES


def dtype_to_json(dt: np.dtype) -> list[list[Any]]:
    """A JSON-able description of a structured dtype (numpy's descr): ``[name, format]``,
    or ``[name, format, shape]`` for a sub-array field."""
    return [[d[0], str(d[1]), *([list(d[2])] if len(d) > 2 else [])] for d in dt.descr]


def dtype_from_json(descr: list[list[Any]]) -> np.dtype:
    return np.dtype([(d[0] or "", d[1], *([tuple(d[2])] if len(d) > 2 else []))
                     for d in descr])
