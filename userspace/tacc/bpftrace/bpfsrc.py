"""C source of the one BPF program behind accel-bpftrace and taccd's capture mode.

Every tacc tracepoint and host tracepoint has a handler; the tool attaches only the
ones its mode needs, and filters (pid, comm, device) and modes live in an array map,
so one compiled program serves every subcommand (compile once per process / test
session).  The C is in tacc/bpftrace/bpf/*.c; this module adds the #defines, the
tracepoint record structs generated from tracefs (tpformat.c_struct) and the raw
tracepoint wrappers, and keeps the host handlers whose tracepoint exists.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from . import btf
from .tpformat import Format, c_struct, read_format


def _c(name: str) -> str:
    """A part of the program: the C file tacc/bpftrace/bpf/@name (a package resource)."""
    return (files("tacc.bpftrace") / "bpf" / name).read_text()


# Mode bits of cfg[CFG_FLAGS]
F_EMIT = 1  # driver events to the ring buffer
F_LAT = 2  # latency histograms
F_TOP = 4  # per-process job table
F_DMA = 8  # per-process DMA table
F_HOST = 16  # host events (sched, block, net) of traced processes to the ring buffer
F_AUTOTRACE = 32  # processes calling tacc ioctls become traced
F_BYTES = 64  # no-op: tacc_submit carries the copy bytes (was a kprobe reading the commands)
# ioctl_enter/exit not attached (mode "jobs"): the submit handler records the context's
# owner and traces the process (issue 18: the IOCTL records are no per-job fact, and the
# two ioctl handlers ran 16 times per mlp batch)
F_OWNER_AT_SUBMIT = 128

CFG_FLAGS, CFG_PID, CFG_DEV, CFG_HAS_DEV, CFG_HAS_COMM = 0, 1, 2, 3, 4

# per-CPU stats slots
ST_EMIT, ST_DROP, ST_HOST_EMIT, ST_HOST_DROP, ST_NOJOB = 0, 1, 2, 3, 4
NSTATS = 8
# entries of the scheduler handlers' prefilter array (ids are taken modulo this)
TRACED_IDS = 16384

TACC_EVENTS = ("tacc_ioctl_enter", "tacc_ioctl_exit", "tacc_submit", "tacc_doorbell",
               "tacc_irq", "tacc_job_start", "tacc_job_done", "tacc_bo_create",
               "tacc_bo_destroy", "tacc_dma_map", "tacc_dma_unmap", "tacc_vm_bind",
               "tacc_vm_unbind", "tacc_mmu_fault", "tacc_pm", "tacc_reset", "tacc_trace_drop")
# Driver tracepoints are attached as raw tracepoints: their handlers get the TP_PROTO
# arguments (kernel/tacc_trace.h), in this order, as the record's same-named fields
# (``cmd`` is stored as ``nr``).  Raw tracepoints guard recursion per program, whereas
# classic tracepoints and kprobes share one per-CPU guard: a classic tacc_job_done
# handler firing in the completion IRQ while any other handler ran on that CPU was
# skipped by the kernel, and the job lost its completion event (issue 8).  They are
# also cheaper (no trace record is built).  tests/host checks this table against the
# header.
RAW_ARGS: dict[str, tuple[str, ...]] = {
    "tacc_ioctl_enter": ("dev", "ctx", "nr"),
    "tacc_ioctl_exit": ("dev", "ctx", "nr", "ret"),
    "tacc_submit": ("dev", "ctx", "queue", "seqno", "tag", "ncmds", "bytes", "mix"),
    "tacc_doorbell": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "tail"),
    "tacc_irq": ("dev", "vector", "status"),
    "tacc_job_start": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "tail"),
    "tacc_job_done": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "status", "error",
                      "dev_start", "dev_end"),
    "tacc_bo_create": ("dev", "ctx", "bo", "type", "size", "flags"),
    "tacc_bo_destroy": ("dev", "bo", "type", "size"),
    "tacc_dma_map": ("dev", "bo", "iova", "len", "nents", "dir"),
    "tacc_dma_unmap": ("dev", "bo", "iova", "len", "nents", "dir"),
    "tacc_vm_bind": ("dev", "ctx", "bo", "va", "size", "page_size"),
    "tacc_vm_unbind": ("dev", "ctx", "bo", "va", "size", "page_size"),
    "tacc_mmu_fault": ("dev", "ctx", "queue", "tag", "addr", "type", "write"),
    "tacc_pm": ("dev", "from", "to"),
    "tacc_reset": ("dev", "ctx", "queue", "seqno", "tag", "reason"),
    "tacc_trace_drop": ("dev", "dropped", "total"),
}
HOST_EVENTS = (("sched", "sched_switch"), ("sched", "sched_wakeup"),
               ("block", "block_rq_issue"), ("block", "block_rq_complete"),
               ("net", "net_dev_start_xmit"), ("net", "netif_receive_skb"))

PRELUDE = _c("prelude.c")

DRIVER_HANDLERS = _c("driver.c")

HOST_HANDLERS = _c("host.c")


# The scheduler events are raw tracepoints too: a classic sched_wakeup handler shares the
# per-CPU guard with the kprobes, so a wakeup (often from irq_work) that interrupted one
# of our kprobe handlers was skipped and counted as a HOST drop (CI, session 2).  These
# wrappers rebuild the classic record from the TP_PROTO arguments, as the kernel's
# TP_fast_assign does (include/trace/events/sched.h, 6.12):
#   sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
#                unsigned int prev_state)
#   sched_wakeup(struct task_struct *p)
#
# They read struct task_struct at offsets from the kernel's BTF (btf.py, TASK_OFFSETS):
# including <linux/sched.h> for its layout cost 3 s of a compile's 8.5 s of guest time.
# The task states are include/linux/sched.h's (6.12), as __trace_sched_switch_state
# reports them; tests/host checks them against the guest kernel's headers.
TASK_STATES = {"TASK_INTERRUPTIBLE": 0x1, "TASK_UNINTERRUPTIBLE": 0x2, "TASK_NOLOAD": 0x400,
               "TASK_RTLOCK_WAIT": 0x1000, "TASK_REPORT": 0x7F}
TASK_OFFSETS = {"task_struct": ["pid", "comm", "exit_state", "thread_info"],
                "thread_info": ["cpu"]}
RAW_HOST: dict[str, str] = {ev: _c(f"raw_{ev}.c") for ev in ("sched_switch", "sched_wakeup")}


def handler_name(event: str) -> str:
    """The BPF function attached to ``event``: raw_* for raw tracepoints, else on_*."""
    if event in RAW_ARGS:
        return "raw_" + event.removeprefix("tacc_")
    if event in RAW_HOST:
        return "raw_" + event
    return "on_" + event


def is_raw(event: str) -> bool:
    """Whether ``event`` is attached as a raw tracepoint."""
    return event in RAW_ARGS or event in RAW_HOST


def raw_wrapper(event: str, fmt: Format) -> str:
    """A raw-tracepoint program filling the record struct from the TP_PROTO arguments."""
    missing = [f for f in RAW_ARGS[event] if fmt.field(f) is None]
    if missing:
        raise ValueError(f"tracepoint tacc:{event} has no field {', '.join(missing)}: "
                         "the loaded tacc.ko does not match this tool")
    short = event.removeprefix("tacc_")
    lines = [f"int raw_{short}(struct bpf_raw_tracepoint_args *ctx)", "{",
             f"\tstruct tp_{event} a = {{}};"]
    lines += [f"\ta.{f} = ctx->args[{i}];" for i, f in enumerate(RAW_ARGS[event])]
    lines += [f"\treturn on_{short}(&a);", "}"]
    return "\n".join(lines)


def task_defines(btf_path: Path = btf.VMLINUX) -> list[str]:
    """The task_struct offsets and task states the scheduler handlers use, as #defines."""
    off = btf.offsets(TASK_OFFSETS, btf_path)
    cpu = off["task_struct.thread_info"] + off["thread_info.cpu"]
    out = [f"#define OFF_TASK_PID {off['task_struct.pid']}",
           f"#define OFF_TASK_COMM {off['task_struct.comm']}",
           f"#define OFF_TASK_EXIT_STATE {off['task_struct.exit_state']}",
           f"#define OFF_TASK_CPU {cpu}"]
    return out + [f"#define {k} {v:#x}" for k, v in TASK_STATES.items()]


def build_source(root: Path, rb_pages: int = 1024, max_scan_cmds: int = 32,
                 host: bool = True, btf_path: Path = btf.VMLINUX
                 ) -> tuple[str, dict[str, Format]]:
    """The program text for the loaded driver; returns (source, formats found)."""
    from tacc.capture.schema import DriverKind

    from .events import HOST_BASE

    formats: dict[str, Format] = {}
    structs = []
    for ev in TACC_EVENTS:
        fmt = read_format(root, "tacc", ev)
        if fmt is None:
            raise FileNotFoundError(f"tracepoint tacc:{ev} not found")
        formats[f"tacc:{ev}"] = fmt
        structs.append(c_struct(fmt, f"tp_{ev}"))
    src_host = ""
    if host:
        present: set[str] = set()
        for system, ev in HOST_EVENTS:
            fmt = read_format(root, system, ev)
            if fmt is None:
                continue
            formats[f"{system}:{ev}"] = fmt
            structs.append(c_struct(fmt, f"tp_{ev}"))
            present.add(ev)
        # keep the helper and the handlers whose tracepoint exists
        body = HOST_HANDLERS

        def start(ev: str) -> int:  # the line defining on_<ev>
            return body.rfind("\n", 0, body.find(f"int on_{ev}(")) + 1

        names = [ev for _, ev in HOST_EVENTS]
        chunks = [body[:start(names[0])]]
        for i, n in enumerate(names):
            s = start(n)
            e = start(names[i + 1]) if i + 1 < len(names) else len(body)
            if n in present:
                chunks.append(body[s:e])
                chunks.append(RAW_HOST.get(n, ""))
        src_host = "".join(chunks)
        if present & {"sched_switch", "sched_wakeup"}:
            src_host = "\n".join(task_defines(btf_path)) + "\n" + src_host
    defines = [f"#define RB_PAGES {rb_pages}", f"#define NSTATS {NSTATS}",
               f"#define TRACED_IDS {TRACED_IDS}",
               f"#define MAX_SCAN_CMDS {max_scan_cmds}", f"#define HOST_BASE {HOST_BASE}"]
    for name, val in (("F_EMIT", F_EMIT), ("F_LAT", F_LAT), ("F_TOP", F_TOP), ("F_DMA", F_DMA),
                      ("F_HOST", F_HOST), ("F_AUTOTRACE", F_AUTOTRACE), ("F_BYTES", F_BYTES),
                      ("F_OWNER_AT_SUBMIT", F_OWNER_AT_SUBMIT),
                      ("CFG_FLAGS", CFG_FLAGS), ("CFG_PID", CFG_PID), ("CFG_DEV", CFG_DEV),
                      ("CFG_HAS_DEV", CFG_HAS_DEV), ("CFG_HAS_COMM", CFG_HAS_COMM),
                      ("ST_EMIT", ST_EMIT), ("ST_DROP", ST_DROP), ("ST_HOST_EMIT", ST_HOST_EMIT),
                      ("ST_HOST_DROP", ST_HOST_DROP), ("ST_NOJOB", ST_NOJOB)):
        defines.append(f"#define {name} {val}")
    for k in DriverKind:
        defines.append(f"#define KIND_{k.name} {int(k)}")
    wrappers = "\n\n".join(raw_wrapper(ev, formats[f"tacc:{ev}"]) for ev in TACC_EVENTS)
    src = "\n".join(defines) + "\n" + PRELUDE + "\n" + "\n\n".join(structs) + "\n" + \
        DRIVER_HANDLERS + "\n" + wrappers + "\n" + src_host
    return src, formats
