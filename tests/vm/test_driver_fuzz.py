"""tacc.ko in the guest: hypothesis fuzz of every ioctl.

Each call returns 0 or one of the errnos docs/uapi.md documents for it; dmesg
stays free of BUG/WARN/Oops; live-object counts return to zero afterwards.
~500 calls in the normal run; 5,000 with TACC_LONG=1 (marker `long`).
"""

from __future__ import annotations

import ctypes as C
import errno
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_driver_basic import (
    BO_CREATE,
    BO_INFO,
    GEM_CLOSE,
    GET_PARAM,
    SUBMIT,
    TRACE_ADVANCE,
    TRACE_CLOSE,
    TRACE_OPEN,
    VM_BIND,
    VM_UNBIND,
    WAIT,
    BoCreate,
    BoInfo,
    Cmd,
    Dev,
    GetParam,
    Operand,
    Pair,
    Submit,
    TraceAdvance,
    TraceClose,
    TraceOpen,
    VmBind,
    VmUnbind,
    Wait,
    dmesg_problems,
    leak_delta,
    leak_snapshot,
    live_objects,
    record_figures,
)

E = errno
ALLOWED = {
    "param": {E.EINVAL},
    "bo_create": {E.EINVAL, E.EFAULT, E.ENOSPC, E.ENOMEM, E.EMFILE},
    "bo_info": {E.EINVAL, E.ENOENT},
    "vm_bind": {E.EINVAL, E.ENOENT, E.EBUSY, E.ENOSPC, E.ENOMEM},
    "vm_unbind": {E.EINVAL, E.ENOENT, E.EBUSY},  # EBUSY: UNBIND_NOWAIT (flag 1), a job runs
    "submit": {E.EINVAL, E.ENOENT, E.EFAULT, E.EAGAIN},
    "wait": {E.EINVAL, E.ETIME},
    "trace_open": {E.EINVAL, E.EBUSY, E.EALREADY},
    "trace_advance": {E.EINVAL, E.EPERM},
    "trace_close": {E.EINVAL, E.EPERM},
    "gem_close": {E.EINVAL},
}

u32s = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 7, 8, 64, 4095, 4096, 2**31, 2**32 - 1]),
                 st.integers(0, 2**32 - 1))
u64s = st.one_of(st.sampled_from([0, 1, 8, 4096, 8192, 65536, 2**21, 2**32, 2**39,
                                  2**63, 2**64 - 1, 2**64 - 4096]),
                 st.integers(0, 2**64 - 1))
handles = st.one_of(st.integers(0, 12), u32s)


@st.composite
def operand(draw):
    return Operand(handle=draw(handles), pad=draw(st.sampled_from([0, 0, 0, 1])),
                   offset=draw(st.one_of(st.integers(0, 70000), u64s)))


@st.composite
def command(draw):
    c = Cmd(opcode=draw(st.one_of(st.integers(0, 9), u32s)),
            flags=draw(st.sampled_from([0, 0, 0, 1])), tag=draw(u64s),
            a=draw(operand()), b=draw(operand()), c=draw(operand()),
            size=draw(st.one_of(st.integers(0, 70000), u64s)),
            value=draw(st.sampled_from([0, 0, 5])))
    for f in ("m", "n", "k", "lda", "ldb", "ldc"):
        setattr(c, f, draw(st.one_of(st.integers(0, 80), u32s)))
    c.elt_op = draw(st.integers(0, 5))
    return c


calls = st.one_of(
    st.tuples(st.just("param"), u32s, st.integers(0, 5)),
    st.tuples(st.just("bo_create"), st.one_of(st.integers(0, 70000), u64s), st.integers(0, 3),
              st.integers(0, 4), st.sampled_from([0, 0, 4096, 1])),
    st.tuples(st.just("bo_info"), handles),
    st.tuples(st.just("vm_bind"), handles, st.integers(0, 4), u64s,
              st.sampled_from([0, 4096, 8192, 1]), st.sampled_from([0, 4096, 65536, 3])),
    st.tuples(st.just("vm_unbind"), handles, st.sampled_from([0, 0, 1, 2])),
    st.tuples(st.just("submit"), st.lists(command(), min_size=0, max_size=3),
              st.integers(0, 5), st.sampled_from([128, 128, 64]), st.sampled_from([0, 0, 1])),
    st.tuples(st.just("wait"), st.integers(0, 40), st.sampled_from([0, 1000, 10**8])),
    st.tuples(st.just("trace_open"), st.sampled_from([0, 0, 1])),
    st.tuples(st.just("trace_advance"), u32s),
    st.tuples(st.just("trace_close"), st.sampled_from([0, 0, 1])),
    st.tuples(st.just("gem_close"), handles),
)


def do_call(dev: Dev, call) -> None:
    kind = call[0]
    if kind == "param":
        dev.ioctl(GET_PARAM, GetParam(param=call[1] % 30 if call[1] < 2**31 else call[1],
                                      index=call[2]))
    elif kind == "bo_create":
        size, typ, flags, uptr = call[1:]
        size = min(size, 1 << 20) if typ != 3 else size
        dev.ioctl(BO_CREATE, BoCreate(size=size, type=typ, flags=flags, userptr=uptr))
    elif kind == "bo_info":
        dev.ioctl(BO_INFO, BoInfo(handle=call[1]))
    elif kind == "vm_bind":
        dev.ioctl(VM_BIND, VmBind(handle=call[1], flags=call[2], va=call[3], bo_offset=call[4],
                                  size=call[5]))
    elif kind == "vm_unbind":
        dev.ioctl(VM_UNBIND, VmUnbind(handle=call[1], flags=call[2]))
    elif kind == "submit":
        cmds, queue, csize, flags = call[1:]
        arr = (Cmd * max(1, len(cmds)))(*cmds)
        dev.ioctl(SUBMIT, Submit(cmds=C.addressof(arr), num_cmds=len(cmds), queue=queue,
                                 cmd_size=csize, flags=flags))
    elif kind == "wait":
        dev.ioctl(WAIT, Wait(seqno=call[1], timeout_ns=call[2]))
    elif kind == "trace_open":
        dev.ioctl(TRACE_OPEN, TraceOpen(flags=call[1]))
    elif kind == "trace_advance":
        dev.ioctl(TRACE_ADVANCE, TraceAdvance(cons=call[1]))
    elif kind == "trace_close":
        dev.ioctl(TRACE_CLOSE, TraceClose(flags=call[1]))
    elif kind == "gem_close":
        dev.ioctl(GEM_CLOSE, Pair(handle=call[1]))


def run_fuzz(pf_accel, n_examples: int, name: str = "fuzz") -> None:
    before = leak_snapshot()
    t0 = time.monotonic()
    dev = Dev(pf_accel)
    seen: dict[str, set[int]] = {}
    ncalls = [0]

    @settings(max_examples=n_examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(calls, min_size=1, max_size=10))
    def fuzz(seq):
        for call in seq:
            ncalls[0] += 1
            try:
                do_call(dev, call)
                seen.setdefault(call[0], set()).add(0)
            except OSError as e:
                assert e.errno in ALLOWED[call[0]], (call, os.strerror(e.errno))
                seen.setdefault(call[0], set()).add(e.errno)

    try:
        fuzz()
    finally:
        dev.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lo = live_objects()
        if not any(lo.values()):
            break
        time.sleep(0.2)
    wall = time.monotonic() - t0
    record_figures(name, {"calls": ncalls[0], "examples": n_examples, "wall_s": round(wall, 1),
                          "calls_per_s": round(ncalls[0] / wall, 1), "live_after": lo,
                          "leak_delta": leak_delta(before, leak_snapshot()),
                          "outcomes": {k: sorted(v) for k, v in seen.items()}})
    assert not any(lo.values()), lo
    assert not dmesg_problems()
    assert len(seen) >= 8, seen
    assert ncalls[0] >= n_examples


def test_fuzz_ioctls(pf_accel):
    run_fuzz(pf_accel, 60)          # ~60 x 1..10 calls: ~500 calls


@pytest.mark.long
def test_fuzz_ioctls_long(pf_accel):
    run_fuzz(pf_accel, 1000, "fuzz-long")  # ~5,500 calls
