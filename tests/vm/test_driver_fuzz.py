"""tacc.ko in the guest: hypothesis fuzz of every ioctl.

Each call returns 0 or one of the errnos docs/uapi.md documents for it; dmesg
stays free of BUG/WARN/Oops; live-object counts return to zero afterwards.
~500 calls in the normal run; 5,000 with TACC_LONG=1 (marker `long`).  Two processes
on one file (a submitter fuzzing, a disturber unbinding, closing and resetting under it)
and fork-heavy openers (children inheriting the file, submitting, closing and exiting
with their jobs in flight) on the PF here, on the virtio-tacc node in
test_virtio_fuzz.py (extras boot).
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
    pf_sysfs,
    record_figures,
    wait_live_zero,
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
# a virtio-tacc node (docs/uapi.md "virtio-tacc nodes"): what it does not provide is
# -EOPNOTSUPP; a control request the backend refuses is one of its errnos; the per-user
# limits (-EDQUOT) are the PF's
_BACKEND = {E.EINVAL, E.ENOSPC, E.ENOENT, E.EACCES, E.EBUSY, E.EOPNOTSUPP, E.EIO}
VIRTIO_ALLOWED = {
    **ALLOWED,
    "param": ALLOWED["param"] | {E.EOPNOTSUPP},
    "bo_create": ALLOWED["bo_create"] | _BACKEND | {E.EDQUOT},
    "vm_bind": ALLOWED["vm_bind"] | _BACKEND,
    "vm_unbind": ALLOWED["vm_unbind"] | _BACKEND,
    "trace_open": ALLOWED["trace_open"] | {E.EOPNOTSUPP},
    "trace_advance": ALLOWED["trace_advance"] | {E.EOPNOTSUPP},
    "trace_close": ALLOWED["trace_close"] | {E.EOPNOTSUPP},
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
    lo = wait_live_zero()
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


# ------------------------------------------------------ two processes, one file ---
def _disturb(dev: Dev, node, pci, seed: int, stop_fd: int, resets_every: int,
             paced: C.Array, base: dict[str, set[int]] = ALLOWED) -> dict:
    """The second process, on the same open file (the same context) as the submitter:
    unbinds, closes and binds handles, creates BOs, opens other files and closes them
    with jobs in flight, and every `resets_every` calls resets the function (FLR).
    It keeps within 8 calls of the submitter (paced[0] counts the submitter's)."""
    import random
    import select

    rnd = random.Random(seed)
    calls, resets, bad = 0, 0, []
    seen: dict[str, set[int]] = {}
    allowed = {**base, "reset": set(),
               "other_file": base["submit"] | base["bo_create"] | {E.ENOMEM}}
    while not select.select([stop_fd], [], [], 0)[0]:
        if calls > paced[0] + 8:
            time.sleep(0.001)
            continue
        calls += 1
        r = rnd.random()
        h = rnd.choice([rnd.randint(0, 12), rnd.randint(0, 40)])
        try:
            if resets_every and calls % resets_every == 0:
                kind = "reset"
                (pci / "reset").write_text("1")
                resets += 1
            elif r < 0.30:
                kind = "vm_unbind"
                dev.ioctl(VM_UNBIND, VmUnbind(handle=h, flags=rnd.choice([0, 0, 1])))
            elif r < 0.50:
                kind = "gem_close"
                dev.ioctl(GEM_CLOSE, Pair(handle=h))
            elif r < 0.65:
                kind = "bo_create"
                dev.ioctl(BO_CREATE, BoCreate(size=rnd.choice([4096, 8192, 65536]),
                                              type=rnd.choice([0, 1]), flags=0))
            elif r < 0.80:
                kind = "vm_bind"
                dev.ioctl(VM_BIND, VmBind(handle=h, flags=rnd.choice([0, 0, 1]),
                                          va=rnd.choice([0, 0, 2**32, 2**32 + 65536]),
                                          size=rnd.choice([0, 4096])))
            elif r < 0.88:
                kind = "trace_close"
                dev.ioctl(TRACE_CLOSE, TraceClose())
            elif r < 0.95:
                kind = "wait"
                dev.ioctl(WAIT, Wait(seqno=rnd.randint(0, 40), timeout_ns=rnd.choice([0, 10**6])))
            else:
                kind = "other_file"  # a context closed with its job in flight
                with Dev(node) as o:
                    b = o.bo(8192)
                    o.submit([Cmd(opcode=6, a=Operand(handle=b.handle), value=1)] * 4,
                             queue=rnd.randint(0, 3))
            seen.setdefault(kind, set()).add(0)
        except OSError as e:
            seen.setdefault(kind, set()).add(e.errno)
            if e.errno not in allowed[kind]:
                bad.append(f"{kind}: {os.strerror(e.errno)}")
    return {"calls": calls, "resets": resets, "bad": bad[:20],
            "outcomes": {k: sorted(v) for k, v in seen.items()}}


# Jobs that can run: the disturber's unbinds and resets must meet work in flight.
valid_calls = st.one_of(
    st.tuples(st.just("valid_bo_create"), st.sampled_from([0, 0, 1]),
              st.sampled_from([4096, 8192, 65536])),
    st.tuples(st.just("valid_submit"), st.integers(1, 24), st.integers(1, 24),
              st.integers(0, 3), st.integers(0, 3)),
)


def do_valid_call(dev: Dev, call) -> None:
    if call[0] == "valid_bo_create":
        dev.ioctl(BO_CREATE, BoCreate(size=call[2], type=call[1]))
        return
    _, h, h2, kind, queue = call
    cmds = [Cmd(opcode=0),                                              # NOP
            Cmd(opcode=6, a=Operand(handle=h), value=7),                # FENCE into h
            Cmd(opcode=1, a=Operand(handle=h), b=Operand(handle=h2), size=4096),  # H2D
            Cmd(opcode=3, a=Operand(handle=h), b=Operand(handle=h2), size=4096)]  # D2D
    arr = (Cmd * 1)(cmds[kind])
    dev.ioctl(SUBMIT, Submit(cmds=C.addressof(arr), num_cmds=1, queue=queue, cmd_size=128))


def run_two_process_fuzz(node, n_examples: int, resets_every: int, name: str,
                         allowed: dict[str, set[int]] = ALLOWED) -> None:
    """One file, two processes: the parent fuzzes every ioctl (mostly SUBMIT) through
    hypothesis while a forked child unbinds, closes, binds and resets under it.  Every
    call returns 0 or a documented errno, nothing oopses or leaks, the device still
    runs jobs afterwards."""
    import json
    import mmap

    before = leak_snapshot()
    t0 = time.monotonic()
    pci = pf_sysfs()
    dev = Dev(node)
    shared = mmap.mmap(-1, 8)  # MAP_SHARED: the submitter's call count, for pacing
    paced = (C.c_uint64 * 1).from_buffer(shared)
    stop_r, stop_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(stop_w)
            os.close(res_r)
            out = _disturb(dev, node, pci, 20261201, stop_r, resets_every, paced, allowed)
            os.write(res_w, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(stop_r)
    os.close(res_w)
    seen: dict[str, set[int]] = {}
    ncalls = [0]

    @settings(max_examples=n_examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(calls, valid_calls, valid_calls), min_size=1, max_size=10))
    def fuzz(seq):
        for call in seq:
            ncalls[0] += 1
            paced[0] = ncalls[0]
            try:
                do_valid_call(dev, call) if call[0].startswith("valid_") else do_call(dev, call)
                seen.setdefault(call[0], set()).add(0)
            except OSError as e:
                ok = allowed[call[0].removeprefix("valid_")]
                assert e.errno in ok, (call, os.strerror(e.errno))
                seen.setdefault(call[0], set()).add(e.errno)

    try:
        fuzz()
    finally:
        os.write(stop_w, b"x")
        os.close(stop_w)
        chunks = []
        while chunk := os.read(res_r, 65536):
            chunks.append(chunk)
        os.close(res_r)
        _, status = os.waitpid(pid, 0)
        dev.close()
    child = json.loads(b"".join(chunks) or b"{}")
    lo = wait_live_zero()
    wall = time.monotonic() - t0
    total = ncalls[0] + child.get("calls", 0)
    record_figures(name, {"calls": total, "submitter_calls": ncalls[0],
                          "disturber_calls": child.get("calls"), "resets": child.get("resets"),
                          "examples": n_examples, "wall_s": round(wall, 1),
                          "live_after": lo, "leak_delta": leak_delta(before, leak_snapshot()),
                          "outcomes": {k: sorted(v) for k, v in seen.items()},
                          "disturber_outcomes": child.get("outcomes")})
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert not child["bad"], child["bad"]
    assert not any(lo.values()), lo
    assert not dmesg_problems()
    assert len(seen) >= 8 and len(child["outcomes"]) >= 6, (seen, child["outcomes"])
    with Dev(node) as d:  # the device still runs jobs
        assert d.run([Cmd(opcode=0)]) == 0


def test_fuzz_two_processes(pf_accel):
    run_two_process_fuzz(pf_accel, 25, 100, "fuzz-2proc")   # ~300 calls, 1 reset


@pytest.mark.long
@pytest.mark.debugkernel
def test_fuzz_two_processes_long(pf_accel):
    run_two_process_fuzz(pf_accel, 450, 250, "fuzz-2proc-long")  # >= 5,000 calls


# ----------------------------------------------------------- fork-heavy openers ---
def _forked_opener(dev: Dev, node, seed: int, res_w: int) -> None:
    """A child that inherited ``dev``: on the inherited file and a file of its own it
    creates BOs and submits jobs it never waits for, unbinds or closes some handles,
    then exits (its copy of the file and its own file released with jobs in flight).
    Writes its unexpected errnos (JSON) to ``res_w``."""
    import json
    import random

    rnd = random.Random(seed)
    bad: list[str] = []

    def step(kind: str, allowed: set[int], fn) -> None:
        try:
            fn()
        except OSError as e:
            if e.errno not in allowed:
                bad.append(f"{kind}: {os.strerror(e.errno)}")

    def work(d: Dev, handles: list[int]) -> None:
        def bo() -> None:
            handles.append(d.bo(rnd.choice([4096, 65536]), type=rnd.choice([0, 1])).handle)
        for _ in range(2):
            step("bo_create", ALLOWED["bo_create"] | {E.EDQUOT}, bo)
        for _ in range(rnd.randint(2, 6)):
            h = rnd.choice(handles) if handles else 1
            cmds = [Cmd(opcode=6, a=Operand(handle=h), value=rnd.randint(1, 99))] * 8
            step("submit", ALLOWED["submit"] | {E.ENOMEM},
                 lambda c=cmds: d.submit(c, queue=rnd.randint(0, 3)))
        if handles and rnd.random() < 0.5:
            h = rnd.choice(handles)
            step("vm_unbind", ALLOWED["vm_unbind"] | {E.EIO},
                 lambda: d.ioctl(VM_UNBIND, VmUnbind(handle=h, flags=1)))
        if handles and rnd.random() < 0.5:
            h = rnd.choice(handles)
            step("gem_close", ALLOWED["gem_close"] | {E.ENOENT}, lambda: d.gem_close(h))

    try:
        work(dev, [])
        own = Dev(node)  # not closed: the exit releases it with its jobs in flight
        work(own, [])
        if rnd.random() < 0.5:
            dev.close()  # the inherited copy closed before the exit, or by it
    except OSError as e:
        bad.append(f"open: {os.strerror(e.errno)}")
    except Exception as e:  # noqa: BLE001 - reported by the parent
        bad.append(f"{type(e).__name__}: {e}")
    os.write(res_w, (json.dumps(bad) + "\n").encode())


def run_fork_openers(node, rounds: int, children: int, name: str) -> None:
    """Fork-heavy openers: each round the parent opens the node, submits jobs, forks
    ``children`` children that inherit the file (``_forked_opener``), closes its own copy
    while they run, and reaps them (each within 60 s: no hang).  Every
    call returns 0 or a documented errno, nothing oopses, no object is left and a fresh
    opener is served afterwards."""
    import json

    before = leak_snapshot()
    t0 = time.monotonic()
    bad: list[str] = []
    forks = 0
    for r in range(rounds):
        dev = Dev(node)
        h = dev.bo(65536).handle
        for q in range(4):
            dev.submit([Cmd(opcode=6, a=Operand(handle=h), value=q + 1)] * 8, queue=q)
        res_r, res_w = os.pipe()
        pids = []
        for c in range(children):
            pid = os.fork()
            if pid == 0:  # never returns into pytest
                code = 1
                try:
                    os.close(res_r)
                    _forked_opener(dev, node, r * 100 + c, res_w)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
            forks += 1
        os.close(res_w)
        dev.close()  # the parent's copy goes while the children still hold theirs
        deadline = time.monotonic() + 60
        for pid in pids:
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                assert time.monotonic() < deadline, f"round {r}: child {pid} hung"
                time.sleep(0.01)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (r, status)
        chunks = []
        while chunk := os.read(res_r, 65536):
            chunks.append(chunk)
        os.close(res_r)
        for ln in b"".join(chunks).decode().splitlines():
            bad.extend(json.loads(ln))
    lo = wait_live_zero()
    record_figures(name, {"rounds": rounds, "forks": forks,
                          "wall_s": round(time.monotonic() - t0, 1), "live_after": lo,
                          "leak_delta": leak_delta(before, leak_snapshot())})
    assert not bad, bad[:20]
    assert not any(lo.values()), lo
    assert not dmesg_problems()
    with Dev(node) as d:  # a fresh opener is served
        assert d.run([Cmd(opcode=0)]) == 0


def test_fork_heavy_openers(pf_accel):
    run_fork_openers(pf_accel, 3, 4, "fork-openers")


@pytest.mark.long
@pytest.mark.debugkernel
@pytest.mark.timeout(3600)
def test_fork_heavy_openers_long(pf_accel):
    run_fork_openers(pf_accel, 60, 8, "fork-openers-long")
