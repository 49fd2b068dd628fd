"""The compiled BPF program and what a tool attaches of it.

``Program`` compiles once (bcc + clang, several seconds under TCG; a later start with the
same text loads the compile cache's entry instead, :mod:`.objcache`) and can be reused:
``attach(mode)`` / ``detach()`` switch the probes, ``configure()`` sets the filters in
the config map, ``drain()`` copies the ring buffer out in bulk, ``stats()`` returns the
in-BPF emit/drop counts.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tacc.libc import NR_BPF, libc

from . import bpfsrc, objcache
from .bpfsrc import (
    CFG_DEV,
    CFG_FLAGS,
    CFG_HAS_COMM,
    CFG_HAS_DEV,
    CFG_PID,
    F_AUTOTRACE,
    F_BYTES,
    F_DMA,
    F_EMIT,
    F_HOST,
    F_LAT,
    F_OWNER_AT_SUBMIT,
    F_TOP,
    HOST_EVENTS,
    TACC_EVENTS,
)
from .events import EV_DTYPE
from .ringbuf import RingReader

# which tacc tracepoints each mode needs
MODE_EVENTS: dict[str, tuple[str, ...]] = {
    "snoop": ("tacc_ioctl_enter", "tacc_submit", "tacc_job_done"),
    "latency": ("tacc_ioctl_enter", "tacc_submit", "tacc_job_start", "tacc_job_done"),
    "top": ("tacc_ioctl_enter", "tacc_submit", "tacc_job_done"),
    "dma": ("tacc_ioctl_enter", "tacc_dma_map", "tacc_dma_unmap"),
    # tacc_job_start carries every fact of tacc_doorbell (hw_job, the new SQ tail) and
    # fires at the same point: one event per job instead of two
    "record": tuple(ev for ev in TACC_EVENTS if ev != "tacc_doorbell"),
    # a capture's per-job facts without the IOCTL records (taccd ``ioctl_events: false``):
    # the submit handler records the context's owner instead (F_OWNER_AT_SUBMIT)
    "jobs": tuple(ev for ev in TACC_EVENTS
                  if ev not in ("tacc_doorbell", "tacc_ioctl_enter", "tacc_ioctl_exit")),
}
MODE_FLAGS = {
    "snoop": F_EMIT | F_BYTES,
    "latency": F_LAT,
    "top": F_TOP | F_BYTES,
    "dma": F_DMA,
    "record": F_EMIT | F_BYTES,
    "jobs": F_EMIT | F_BYTES | F_OWNER_AT_SUBMIT,
}


# struct bpf_prog_info (include/uapi/linux/bpf.h): recursion_misses since Linux 5.12;
# tests/host checks the offset against the system header
PROG_INFO_SIZE = 232
RECURSION_MISSES_OFF = 208
_BPF_OBJ_GET_INFO_BY_FD = 15


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]




def recursion_misses(prog_fd: int) -> int:
    """How often the kernel skipped this program because a BPF program was running."""
    buf = ctypes.create_string_buffer(PROG_INFO_SIZE)
    attr = _InfoAttr(prog_fd, PROG_INFO_SIZE, ctypes.addressof(buf))
    if libc.syscall(NR_BPF, _BPF_OBJ_GET_INFO_BY_FD, ctypes.byref(attr),
                    ctypes.sizeof(attr)) != 0 or attr.info_len < RECURSION_MISSES_OFF + 8:
        return 0
    return int.from_bytes(buf.raw[RECURSION_MISSES_OFF:RECURSION_MISSES_OFF + 8], "little")


class AttachError(Exception):
    """A probe could not be attached (verifier, missing tracepoint); one line."""


@dataclass
class Filters:
    pid: int = 0
    comm: str = ""
    dev: int | None = None


@dataclass
class Stats:
    emitted: int = 0
    dropped: int = 0
    host_emitted: int = 0
    host_dropped: int = 0
    unmatched_done: int = 0
    # runs of attached programs the kernel skipped (bpf_prog_info.recursion_misses): a
    # handler that fired while another BPF program ran on the same CPU.  Counted as lost.
    driver_missed: int = 0
    host_missed: int = 0

    @property
    def missed(self) -> int:
        return self.driver_missed + self.host_missed


def compile_bpf(bpf_cls: Any, src: str, cflags: list[str]) -> tuple[Any, str]:
    """Compile with bcc; returns (BPF object, what clang/LLVM printed).

    bcc's compiler writes its diagnostics straight to file descriptor 2: they are caught
    in a temporary file for the caller (tests assert a clean compile) and then written to
    stderr as before, also when the compile fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            bpf = bpf_cls(text=src, cflags=cflags)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            log = tmp.read().decode(errors="replace")
            if log:
                sys.stderr.write(log)
                sys.stderr.flush()
    return bpf, log


# -w: the distribution headers make clang warn (nocf_check, __seg_gs), not our code.
# -g0: no debug info, so no BTF of the program (bcc's default -g): no tool reads its line
# info, and LLVM's debug-info work was a seventh of each compile (10.4 -> 9.0 s of guest
# time in the test VM, bcc 0.26 with LLVM 14)
CFLAGS = ["-w", "-g0"]


class Program:
    """``cache``: "use" loads the program a previous compile of the same text kept
    (objcache: no clang, no LLVM) and compiles and keeps it otherwise; "refresh" always
    compiles (and keeps the result); "off" compiles and keeps nothing.  ``cached`` says
    which happened, ``cache_note`` why an entry was not used; ``compile_log`` is what
    clang and LLVM printed at the compile (kept with the entry)."""

    def __init__(self, tracefs: Path, rb_pages: int = 1024, host: bool = True,
                 cache: str = "use") -> None:
        self.src, self.formats = bpfsrc.build_source(tracefs, rb_pages=rb_pages, host=host)
        # the ring's size is the events map's alone (no instruction depends on it): one
        # cache entry serves every size, the map made at the size asked
        key_src, n = re.subn(r"^#define RB_PAGES \d+$", "#define RB_PAGES <ring>", self.src,
                             count=1, flags=re.M)
        assert n == 1, "the program text lost its RB_PAGES line"
        sizes = {"events": rb_pages * 4096}
        if os.environ.get("TACC_BPF_CACHE") == "off":
            cache = "off"
        self.cached = False
        self.cache_note = ""
        self.compile_log = ""
        self.bpf: Any = None
        if cache == "use":
            try:
                self.bpf = objcache.load(key_src, CFLAGS, tracefs, max_entries=sizes)
                self.cached = self.bpf is not None
                if self.cached:
                    self.compile_log = self.bpf.compile_log
            except (objcache.CacheError, OSError) as e:
                self.cache_note = f"cached program not used: {e}"
        if self.bpf is None:
            from bcc import BPF  # imported late: only /usr/bin/python3 (or the venv) has it

            self.bpf, self.compile_log = compile_bpf(BPF, self.src, CFLAGS)
            if cache != "off":
                try:
                    objcache.save(self.bpf, key_src, CFLAGS, compile_log=self.compile_log)
                except Exception as e:  # noqa: BLE001 - keeping it is a best effort
                    self.cache_note = f"compiled program not kept: {e}"
        self.rb_size = rb_pages * 4096
        self.reader = RingReader.from_map_fd(self.bpf["events"].map_fd, self.rb_size, EV_DTYPE)
        self.attached: list[tuple[str, str]] = []
        self.kprobes: list[tuple[str, str]] = []
        self.mode = ""
        self.warnings: list[str] = [self.cache_note] if self.cache_note else []
        self._stats_base = [0] * bpfsrc.NSTATS
        self._missed_base = (0, 0)

    # ------------------------------------------------------------ attach ---
    def attach(self, mode: str, host: bool = False, autotrace: bool = False) -> None:
        """Attach what ``mode`` needs; on failure nothing stays attached (AttachError)."""
        try:
            self._attach(mode, host, autotrace)
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception (and OSError)
            self.detach()
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            raise AttachError(f"cannot attach {mode} probes: "
                              f"{lines[0] if lines else type(exc).__name__}") from exc

    def _attach(self, mode: str, host: bool, autotrace: bool) -> None:
        self.detach()
        self.mode = mode
        flags = MODE_FLAGS[mode] | (F_HOST if host else 0) | (F_AUTOTRACE if autotrace else 0)
        self._set_cfg(CFG_FLAGS, flags)
        if flags & F_DMA:
            self._kprobe("dma_map_sgtable", "kp_dma_map", ret=False)
            self._kprobe("dma_unmap_sg_attrs", "kr_dma_unmap", ret=True)
        for ev in MODE_EVENTS[mode]:
            self._tp("tacc", ev)
        if host:
            for system, ev in HOST_EVENTS:
                if f"{system}:{ev}" in self.formats:
                    self._tp(system, ev)

    def _tp(self, system: str, ev: str) -> None:
        fn = bpfsrc.handler_name(ev)
        if bpfsrc.is_raw(ev):
            self.bpf.attach_raw_tracepoint(tp=ev, fn_name=fn)
            self.attached.append((ev, fn))
        else:
            tp = f"{system}:{ev}"
            self.bpf.attach_tracepoint(tp=tp, fn_name=fn)
            self.attached.append((tp, fn))

    def _kprobe(self, sym: str, fn: str, ret: bool) -> None:
        try:
            if ret:
                self.bpf.attach_kretprobe(event=sym, fn_name=fn)
            else:
                self.bpf.attach_kprobe(event=sym, fn_name=fn)
            self.kprobes.append((sym, "r" if ret else "p"))
        except Exception:  # noqa: BLE001 - bcc raises plain Exception
            self.warnings.append(f"kprobe {sym} unavailable: its figures are 0")

    def detach(self) -> None:
        self._set_cfg(CFG_FLAGS, 0)
        for tp, _fn in self.attached:
            try:
                if ":" in tp:
                    self.bpf.detach_tracepoint(tp=tp)
                else:
                    self.bpf.detach_raw_tracepoint(tp=tp)
            except Exception:  # noqa: BLE001
                pass
        for sym, kind in self.kprobes:
            try:
                if kind == "r":
                    self.bpf.detach_kretprobe(event=sym)
                else:
                    self.bpf.detach_kprobe(event=sym)
            except Exception:  # noqa: BLE001
                pass
        self.attached, self.kprobes = [], []

    # ------------------------------------------------------------ config ---
    def _set_cfg(self, idx: int, value: int) -> None:
        t = self.bpf["cfg"]
        t[ctypes.c_int(idx)] = ctypes.c_uint64(value)

    def configure(self, f: Filters) -> None:
        self._set_cfg(CFG_PID, f.pid)
        self._set_cfg(CFG_HAS_DEV, 1 if f.dev is not None else 0)
        self._set_cfg(CFG_DEV, f.dev or 0)
        self._set_cfg(CFG_HAS_COMM, 1 if f.comm else 0)
        t = self.bpf["cfg_comm"]
        leaf = t.Leaf()
        raw = f.comm.encode()[:15]
        ctypes.memmove(ctypes.addressof(leaf), raw + b"\0" * (16 - len(raw)), 16)
        t[ctypes.c_int(0)] = leaf

    def trace_pids(self, pids: list[int]) -> None:
        t, any_ = self.bpf["traced_tgid"], self.bpf["traced_any"]
        for p in pids:
            t[t.Key(p)] = t.Leaf(1)
            any_[any_.Key(p & (bpfsrc.TRACED_IDS - 1))] = any_.Leaf(1)  # the prefilter

    def reset(self) -> None:
        """Clear aggregates and statistics (between test runs of one session)."""
        for name in ("lat", "top", "dma", "dmahist", "jobs", "traced_tgid", "traced_tid",
                     "blk", "unmap_t0", "dma_t0", "ioctl_t0"):
            self.bpf[name].clear()
        self._stats_base = self._raw_stats()
        self._missed_base = self._missed()
        self.drain()
        self.reader.records = 0

    # ------------------------------------------------------------- data ---
    def drain(self) -> np.ndarray:
        return self.reader.drain()

    def _raw_stats(self) -> list[int]:
        st = self.bpf["stats"]
        return [int(sum(st[ctypes.c_int(i)])) for i in range(bpfsrc.NSTATS)]

    def _missed(self) -> tuple[int, int]:
        """Recursion misses of the loaded programs: (driver handlers + kprobes, host)."""
        host_fns = {bpfsrc.handler_name(ev) for _s, ev in HOST_EVENTS}
        drv = host = 0
        for name, fn in self.bpf.funcs.items():
            n = recursion_misses(fn.fd)
            if (name.decode() if isinstance(name, bytes) else name) in host_fns:
                host += n
            else:
                drv += n
        return drv, host

    def stats(self) -> Stats:
        v = [a - b for a, b in zip(self._raw_stats(), self._stats_base, strict=True)]
        drv, host = self._missed()
        return Stats(v[bpfsrc.ST_EMIT], v[bpfsrc.ST_DROP], v[bpfsrc.ST_HOST_EMIT],
                     v[bpfsrc.ST_HOST_DROP], v[bpfsrc.ST_NOJOB],
                     drv - self._missed_base[0], host - self._missed_base[1])

    def latency(self) -> dict[tuple[int, int, int], dict[int, int]]:
        """{(dev, queue, which): {log2 slot: count}}; which 0 total, 1 queue wait, 2 device."""
        out: dict[tuple[int, int, int], dict[int, int]] = {}
        for k, v in self.bpf["lat"].items():
            out.setdefault((k.dev, k.queue, k.which), {})[k.slot] = int(v.value)
        return out

    def top(self) -> dict[int, dict[str, Any]]:
        out = {}
        for k, v in self.bpf["top"].items():
            out[int(k.value)] = {
                "comm": bytes(v.comm).split(b"\0")[0].decode(errors="replace"),
                "jobs": v.jobs, "cmds": v.cmds, "bytes": v.bytes, "busy_ticks": v.busy_ticks,
                "submits": v.submits, "errors": v.errors, "lat_ns": v.lat_ns}
        return out

    def dma(self) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, int], dict[int, int]]]:
        per = {}
        for k, v in self.bpf["dma"].items():
            per[int(k.value)] = {
                "comm": bytes(v.comm).split(b"\0")[0].decode(errors="replace"),
                "maps": v.maps, "unmaps": v.unmaps, "map_bytes": v.map_bytes,
                "unmap_bytes": v.unmap_bytes, "map_ns": v.map_ns, "unmap_ns": v.unmap_ns,
                "segments": v.segs}
        hist: dict[tuple[int, int], dict[int, int]] = {}
        for k, v in self.bpf["dmahist"].items():
            hist.setdefault((k.pid, k.dir), {})[k.slot] = int(v.value)
        return per, hist

    def close(self) -> None:
        self.detach()
        self.bpf.cleanup()
