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

FORMAT_NAME = "tacc-capture"
FORMAT_VERSION = 1  # major: a reader refuses a capture of a newer major version
# minor: additions (new streams, new fields) that older readers may skip; a reader reads
# every minor of its major.  meta.json "minor" (absent = 0).  1: the "minor" key itself
# (issue 17); captures of minor 0 may lack device_events.  The coordinator reconciles the
# number when several branches add to the format in one round.
FORMAT_MINOR = 11  # docs/capture-format.md "Minor versions": 2 virtio trace records,
# 3 cluster (net_clock), 4 capture overhead (mix/tail), 5 containers (processes),
# 6 link-model counter slots, 7 the TLP stream (tlp), 8 link power-state counters,
# 9 devices[].kind (virtio-tacc functions in captures), 10 L1.1/L1.2 counters,
# 11 devcoredumps (devcoredump/<n>.txt, device event kind 11)
TRACE_REC_VERSION = 2  # TACC_TRACE_VERSION (2: virtio event records, docs/virtio.md)
# event records (trace record version 2): opcode >= TACC_TRACE_EV_BASE is not a command
TRACE_EV_BASE = 0xF0
TRACE_EV_VIRTIO_KICK = 0xF0  # TACC_TRACE_EV_VIRTIO_KICK: a submit buffer taken off the queue
TRACE_EV_VIRTIO_DISPATCH = 0xF1  # TACC_TRACE_EV_VIRTIO_DISPATCH: a job to a hardware queue
STRING_MAX = 120

TRACE_REC_DTYPE = np.dtype(
    [
        ("version", "u1"),
        ("opcode", "u1"),
        ("engine", "u1"),
        ("queue", "u1"),
        ("func", "<u2"),
        ("ctx", "<u2"),
        ("seq", "<u4"),
        ("job", "<u4"),
        ("tag", "<u8"),
        ("t_fetch", "<u8"),
        ("t_start", "<u8"),
        ("t_end", "<u8"),
        ("bytes", "<u4"),
        ("tlps", "<u4"),
        ("index", "<u2"),
        ("status", "<u2"),
        ("tlb_misses", "<u2"),
        ("rsvd", "<u2"),
    ]
)
assert TRACE_REC_DTYPE.itemsize == 64

# Device trace stream: the raw record, then the capture's function id (index in
# meta.json "devices").
DEVICE_TRACE_DTYPE = np.dtype(TRACE_REC_DTYPE.descr + [("fid", "<u2"), ("_pad", "V6")])

# X-lists of tacc_hw.h, in slot order (slot = index in the counter page).
FUNC_COUNTERS: tuple[tuple[str, int], ...] = (
    ("h2d_bytes", 2), ("d2h_bytes", 3), ("h2d_tlps", 4), ("d2h_tlps", 5),
    ("h2d_link_bytes", 6), ("d2h_link_bytes", 7), ("link_stall_ticks", 8),
    ("tlb_hits", 9), ("tlb_misses", 10), ("tlb_walk_reads", 11), ("mmu_faults", 12),
    ("dma_errors", 13), ("irqs", 14), ("trace_records", 15), ("trace_dropped", 16),
    ("jobs_completed", 17), ("cmds_completed", 18), ("flops", 19),
    ("busy_dma_h2d", 20), ("busy_dma_d2h", 21), ("busy_compute0", 22),
    ("busy_compute1", 23), ("busy_compute2", 24), ("busy_compute3", 25),
    ("cmds_dma_h2d", 26), ("cmds_dma_d2h", 27), ("cmds_compute0", 28),
    ("cmds_compute1", 29), ("cmds_compute2", 30), ("cmds_compute3", 31),
    ("queue0_depth_hwm", 32), ("queue1_depth_hwm", 33), ("queue2_depth_hwm", 34),
    ("queue3_depth_hwm", 35), ("devmem_read_bytes", 36), ("devmem_write_bytes", 37),
    # hw 1.2 (link model fidelity, issue 19)
    ("d2h_req_tlps", 38), ("dllp_h2d_bytes", 39), ("dllp_d2h_bytes", 40),
    ("ctrl_h2d_tlps", 41), ("ctrl_d2h_tlps", 42), ("ctrl_h2d_link_bytes", 43),
    ("ctrl_d2h_link_bytes", 44), ("ctrl_dllp_h2d_bytes", 45), ("ctrl_dllp_d2h_bytes", 46),
)
GLOBAL_COUNTERS: tuple[tuple[str, int], ...] = (
    ("link_h2d_busy_ticks", 2), ("link_d2h_busy_ticks", 3), ("link_h2d_bytes", 4),
    ("link_d2h_bytes", 5), ("link_h2d_payload", 6), ("link_d2h_payload", 7),
    ("uptime_ticks", 8),
    # hw 1.2 (link power management, issue 19 item 3; capture minor 8)
    ("link_l0s_entries", 9), ("link_l0s_exits", 10), ("link_l0s_ticks", 11),
    ("link_l1_entries", 12), ("link_l1_exits", 13), ("link_l1_ticks", 14),
    ("link_pm_exit_ticks", 15),
    # hw 1.2 (L1 PM Substates, issue 19 item 3; capture minor 10)
    ("link_l11_entries", 16), ("link_l11_exits", 17), ("link_l11_ticks", 18),
    ("link_l12_entries", 19), ("link_l12_exits", 20), ("link_l12_ticks", 21),
)

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
CLOCK_DTYPE = np.dtype(
    [
        ("mono_before", "<i8"), ("devclk", "<u8"), ("mono_after", "<i8"),
        ("hostclk", "<u8"), ("fid", "<u2"), ("_pad", "V6"),
    ]
)


class HostKind(IntEnum):
    SCHED_SWITCH = 1  # pid/tid = prev, next_pid, prev_state
    SCHED_WAKEUP = 2  # pid/tid = woken task
    BLOCK_ISSUE = 3  # dev, sector, size
    BLOCK_COMPLETE = 4  # dev, sector, size, dur_ns = issue->complete
    NET_TX = 5  # dev = ifindex, size
    NET_RX = 6


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

# issue 17, clock alignment across nodes: one record per four-timestamp exchange between
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
TLP_REC_DTYPE = np.dtype([
    ("t_ps", "<u8"), ("addr", "<u8"), ("cmd_tag", "<u8"), ("seq", "<u4"),
    ("payload", "<u2"), ("link_bytes", "<u2"), ("req_id", "<u2"), ("cpl_id", "<u2"),
    ("tag", "<u2"), ("len_dw", "<u2"), ("byte_count", "<u2"),
    ("fmt_type", "u1"), ("kind", "u1"), ("flags", "u1"), ("be", "u1"),
    ("lower_addr", "u1"), ("func", "u1"), ("version", "u1"), ("queue", "u1"),
    ("ctx", "<u2"), ("job", "<u4"), ("rsvd", "<u8"),
])
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
    # issue 17 (cluster captures): older captures have no file for it (read as empty)
    "net_clock": (1, NET_CLOCK_DTYPE),
    # containers: added after the others, read as empty from captures without it
    "processes": (1, PROCESSES_DTYPE),
    # minor 7: the TLP stream, opt-in; read as empty from captures without it
    "tlp": (1, TLP_DTYPE),
}


class Opcode(IntEnum):
    NOP = 0
    COPY_H2D = 1
    COPY_D2H = 2
    COPY_D2D = 3
    GEMM = 4
    ELTWISE = 5
    FENCE = 6
    TIMESTAMP = 7
    BARRIER = 8
    FILL = 9  # hw 1.1: the driver's device-memory scrub (tag 0)


class Engine(IntEnum):
    DMA_H2D = 0
    DMA_D2H = 1
    COMPUTE0 = 2
    COMPUTE1 = 3
    COMPUTE2 = 4
    COMPUTE3 = 5


NUM_ENGINES = 6
NUM_QUEUES = 4


def dtype_to_json(dt: np.dtype) -> list[list[Any]]:
    """A JSON-able description of a structured dtype (numpy's descr): ``[name, format]``,
    or ``[name, format, shape]`` for a sub-array field."""
    return [[d[0], str(d[1]), *([list(d[2])] if len(d) > 2 else [])] for d in dt.descr]


def dtype_from_json(descr: list[list[Any]]) -> np.dtype:
    return np.dtype([(d[0] or "", d[1], *([tuple(d[2])] if len(d) > 2 else []))
                     for d in descr])
