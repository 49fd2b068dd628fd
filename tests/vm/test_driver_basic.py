"""tacc.ko in the guest: uAPI basics, memory types, compute results, observability.

Plain os.open + fcntl.ioctl + ctypes against kernel/include/uapi/drm/tacc_accel.h.
The helpers here are imported by the other test_driver_* files.
"""

from __future__ import annotations

import ctypes as C
import errno
import fcntl
import mmap
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import PAYLOAD

# ------------------------------------------------------------------ uAPI ----
# the header's layouts and numbers, as tacc.hw generates them from it
GetParam, BoCreate, BoInfo, VmBind, VmUnbind, Operand, Cmd, Submit, Wait, TraceOpen, \
    TraceHeader, TraceAdvance, TraceClose, SyncobjWait = (hw.struct("drm_tacc_" + n) for n in (
        "get_param", "bo_create", "bo_info", "vm_bind", "vm_unbind", "operand", "cmd",
        "submit", "wait", "trace_open", "trace_header", "trace_advance", "trace_close",
        "syncobj_wait"))
Pair = hw.struct("drm_tacc_gem_close")  # handle, pad: also syncobj create/destroy's layout
(GET_PARAM, BO_CREATE, BO_INFO, VM_BIND, VM_UNBIND, SUBMIT, WAIT, TRACE_OPEN, TRACE_ADVANCE,
 TRACE_CLOSE, GEM_CLOSE, SYNCOBJ_CREATE, SYNCOBJ_DESTROY, SYNCOBJ_WAIT) = (hw.IOCTLS[n] for n in (
    "GET_PARAM", "BO_CREATE", "BO_INFO", "VM_BIND", "VM_UNBIND", "SUBMIT", "WAIT", "TRACE_OPEN",
    "TRACE_ADVANCE", "TRACE_CLOSE", "GEM_CLOSE", "SYNCOBJ_CREATE", "SYNCOBJ_DESTROY",
    "SYNCOBJ_WAIT"))

HOST, DEVICE, USERPTR = hw.DRM_TACC_BO_HOST, hw.DRM_TACC_BO_DEVICE, hw.DRM_TACC_BO_USERPTR
BO_NO_BIND, BO_READONLY = hw.DRM_TACC_BO_F_NO_BIND, hw.DRM_TACC_BO_F_READONLY
BIND_FIXED, BIND_READONLY = hw.DRM_TACC_BIND_F_FIXED, hw.DRM_TACC_BIND_F_READONLY
OP_NOP, OP_H2D, OP_D2H, OP_D2D, OP_GEMM, OP_ELT, OP_FENCE, OP_TS, OP_BARRIER = (
    getattr(hw, "DRM_TACC_OP_" + n) for n in ("NOP", "COPY_H2D", "COPY_D2H", "COPY_D2D", "GEMM",
                                              "ELTWISE", "FENCE", "TIMESTAMP", "BARRIER"))
ELT_ADD, ELT_MUL, ELT_RELU, ELT_SCALE = (
    hw.DRM_TACC_ELT_ADD, hw.DRM_TACC_ELT_MUL, hw.DRM_TACC_ELT_RELU, hw.DRM_TACC_ELT_SCALE)
P_API, P_HW, P_CAPS, P_FUNC, P_QUEUES, P_CTXS, P_ENGINES, P_DEVMEM, P_CLOCK, P_CTX = (
    getattr(hw, "DRM_TACC_PARAM_" + n) for n in (
        "API_VERSION", "HW_VERSION", "CAPS", "FUNC", "NUM_QUEUES", "NUM_CONTEXTS",
        "NUM_ENGINES", "DEVMEM_SIZE", "CLOCK_HZ", "CONTEXT_ID"))
P_CNT_OFF, P_CNT_SIZE, P_MAX_CMDS, P_MAX_INFLIGHT = (
    hw.DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET, hw.DRM_TACC_PARAM_COUNTERS_MMAP_SIZE,
    hw.DRM_TACC_PARAM_MAX_CMDS, hw.DRM_TACC_PARAM_MAX_INFLIGHT)
P_CTX_FAULTS, P_CTX_FAULT_ADDR, P_DEVCLK, P_CTX_RESETS = (
    hw.DRM_TACC_PARAM_CTX_FAULTS, hw.DRM_TACC_PARAM_CTX_FAULT_ADDR, hw.DRM_TACC_PARAM_DEVCLK,
    hw.DRM_TACC_PARAM_CTX_RESETS)
MMAP_COUNTERS, MMAP_TRACE = hw.DRM_TACC_MMAP_COUNTERS, hw.DRM_TACC_MMAP_TRACE
u32 = C.c_uint32


def f32bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


class Dev:
    """One open file of the accel node = one device context."""

    def __init__(self, node: str | Path = "/dev/accel/accel0") -> None:
        self.fd = os.open(str(node), os.O_RDWR | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dev:
        return self

    def __exit__(self, *a) -> None:
        self.close()

    def ioctl(self, req: int, arg):
        fcntl.ioctl(self.fd, req, arg, True)
        return arg

    def param(self, p: int, index: int = 0) -> int:
        return self.ioctl(GET_PARAM, GetParam(param=p, index=index)).value

    def bo(self, size: int, type: int = HOST, flags: int = 0, userptr: int = 0) -> BoCreate:
        return self.ioctl(BO_CREATE, BoCreate(size=size, type=type, flags=flags, userptr=userptr))

    def info(self, handle: int) -> BoInfo:
        return self.ioctl(BO_INFO, BoInfo(handle=handle))

    def map(self, handle: int, size: int) -> mmap.mmap:
        off = self.info(handle).mmap_offset
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                         offset=off)

    def gem_close(self, handle: int) -> None:
        self.ioctl(GEM_CLOSE, Pair(handle=handle))

    def submit(self, cmds: list[Cmd], queue: int = 0, ins: list[int] = (), out: int = 0) -> int:
        arr = (Cmd * len(cmds))(*cmds)
        ins_arr = (u32 * max(1, len(ins)))(*ins)
        s = Submit(cmds=C.addressof(arr), num_cmds=len(cmds), queue=queue, out_syncobj=out,
                   in_syncobjs=C.addressof(ins_arr) if ins else 0, num_in_syncobjs=len(ins),
                   cmd_size=C.sizeof(Cmd))
        return self.ioctl(SUBMIT, s).seqno

    def wait(self, seqno: int, timeout_s: float = 60.0) -> int:
        return self.ioctl(WAIT, Wait(seqno=seqno, timeout_ns=int(timeout_s * 1e9))).status

    def run(self, cmds: list[Cmd], queue: int = 0, timeout_s: float = 60.0) -> int:
        return self.wait(self.submit(cmds, queue), timeout_s)

    def syncobj(self) -> int:
        return self.ioctl(SYNCOBJ_CREATE, Pair()).handle


def op(handle: int = 0, offset: int = 0) -> Operand:
    return Operand(handle=handle, offset=offset)


def copy(opc: int, src: int, dst: int, size: int, soff: int = 0, doff: int = 0,
         tag: int = 0) -> Cmd:
    return Cmd(opcode=opc, a=op(src, soff), b=op(dst, doff), size=size, tag=tag)


def nop(tag: int = 0) -> Cmd:
    return Cmd(opcode=OP_NOP, tag=tag)


def fence(h: int, off: int, value: int, tag: int = 0) -> Cmd:
    return Cmd(opcode=OP_FENCE, a=op(h, off), value=value, tag=tag)


def gemm(a: int, b: int, c: int, m: int, n: int, k: int, alpha=1.0, beta=0.0, tag=0) -> Cmd:
    return Cmd(opcode=OP_GEMM, a=op(a), b=op(b), c=op(c), m=m, n=n, k=k, lda=k, ldb=n, ldc=n,
               alpha=f32bits(alpha), beta=f32bits(beta), tag=tag)


Cmd2 = hw.struct("drm_tacc_cmd2")


def cmd2(opcode: int, payload: bytes, ops: list[tuple[int, int]], tag: int = 0):
    c = Cmd2()
    c.opcode, c.tag = opcode, tag
    for i, (h, off) in enumerate(ops):
        c.op[i].handle, c.op[i].offset = h, off
    C.memmove(C.addressof(c) + Cmd2.args.offset, payload, len(payload))
    return c


def submit2(dev: Dev, cmds: list, queue: int = 0) -> int:
    arr = (Cmd2 * len(cmds))(*cmds)
    s = Submit(cmds=C.addressof(arr), num_cmds=len(cmds), queue=queue,
               cmd_size=C.sizeof(Cmd2))
    return dev.ioctl(SUBMIT, s).seqno


def run_list(dev: Dev, handle: int, mem: mmap.mmap, list_off: int, listed: list[bytes], *,
             params=()) -> int:
    """The raw descriptors (device VAs) written at offset list_off of the mapped host BO
    ``handle``, run by one LIST: its status."""
    mem[list_off:list_off + len(b"".join(listed))] = b"".join(listed)
    p = list(params) + [0] * (hw.TACC_LIST_PARAMS - len(params))
    pay = PAYLOAD["list"].pack(0, 0, len(listed), 0, 7, 0, *p, 0)
    return dev.wait(submit2(dev, [cmd2(hw.TACC_OP_LIST, pay, [(handle, list_off)])]))


def pf_sysfs() -> Path:
    for p in sorted(Path("/sys/bus/pci/devices").iterdir()):
        vendor = f"0x{hw.TACC_PCI_VENDOR_ID:04x}"
        if (p / "vendor").read_text().strip() == vendor and not (p / "physfn").exists():
            return p
    raise FileNotFoundError("no tacc PF")


def live_objects(pci: Path | None = None) -> dict[str, int]:
    txt = ((pci or pf_sysfs()) / "tacc/live_objects").read_text()
    return {k: int(v) for k, v in (ln.split() for ln in txt.splitlines())}


def wait_live_zero(timeout: float = 30) -> dict[str, int]:
    """live_objects() once it reads all zero (the last fences and BOs of closed files
    are freed asynchronously), or as it is after @timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        lo = live_objects()
        if not any(lo.values()) or time.monotonic() >= deadline:
            return lo
        time.sleep(0.2)


def wait_accel_node(pci: Path, timeout: float = 20) -> Path:
    """The /dev/accel node of a function, once its driver made it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = sorted((pci / "accel").glob("accel*")) if (pci / "accel").exists() else []
        if nodes and Path("/dev/accel", nodes[0].name).exists():
            return Path("/dev/accel", nodes[0].name)
        time.sleep(0.1)
    raise TimeoutError(f"{pci.name}: no accel node")


def rebind(pci: Path, domain: str | None = None) -> Path:
    """Unbind tacc from ``pci`` if bound (its files may stay open), optionally write its
    IOMMU group's default domain type (``DMA``, ``DMA-FQ``, ``identity``: the group's
    devices must have no driver then, Documentation/ABI/testing/sysfs-kernel-iommu_groups),
    probe it again.  Returns its accel node once guest-init's watcher has made it 0660
    group tacc (within a second, as udev's rule would)."""
    import grp

    if (pci / "driver").exists():
        (pci / "driver" / "unbind").write_text(pci.name)
    if domain:
        (pci / "iommu_group" / "type").write_text(domain)
    Path("/sys/bus/pci/drivers_probe").write_text(pci.name)
    node = wait_accel_node(pci, timeout=60)
    want = (0o660, grp.getgrnam("tacc").gr_gid)
    deadline = time.monotonic() + 30
    while (node.stat().st_mode & 0o777, node.stat().st_gid) != want:
        assert time.monotonic() < deadline, f"{node}: not 0660 group tacc after rebinding"
        time.sleep(0.1)
    if domain:
        got = (pci / "iommu_group" / "type").read_text().strip()
        assert got == domain, f"{pci.name}: group type {got}, wrote {domain}"
    return node


def dmesg_problems() -> list[str]:
    out = os.popen("dmesg").read().splitlines()
    bad = ("BUG:", "WARNING:", "Oops", "general protection", "Call Trace", "UBSAN", "refcount_t")
    return [ln for ln in out if any(b in ln for b in bad)]


def leak_snapshot() -> dict[str, int]:
    """What a leak would move: pinned pages (FOLL_PIN), slab bytes, per-cache objects."""
    vm = dict(ln.split() for ln in Path("/proc/vmstat").read_text().splitlines())
    mi = {ln.split(":")[0]: int(ln.split()[1]) for ln in
          Path("/proc/meminfo").read_text().splitlines()}
    snap = {"nr_foll_pin_acquired": int(vm.get("nr_foll_pin_acquired", 0)),
            "nr_foll_pin_released": int(vm.get("nr_foll_pin_released", 0)),
            "slab_kib": mi.get("Slab", 0), "sunreclaim_kib": mi.get("SUnreclaim", 0)}
    try:
        for ln in Path("/proc/slabinfo").read_text().splitlines()[2:]:
            f = ln.split()
            snap[f"slab:{f[0]}"] = int(f[1])
    except OSError:
        pass
    return snap


def leak_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Deltas of the summary figures, plus slab caches that grew by 32+ objects."""
    out = {k: after[k] - before[k] for k in before if not k.startswith("slab:")}
    out["pins_outstanding"] = (out["nr_foll_pin_acquired"] - out["nr_foll_pin_released"])
    grew = {k: after.get(k, 0) - v for k, v in before.items()
            if k.startswith("slab:") and after.get(k, 0) - v >= 32}
    out.update(sorted(grew.items(), key=lambda kv: -kv[1])[:8])
    return out


def record_figures(name: str, figures: dict) -> None:
    """Print long-run figures and keep them in $TACC_VM_OUT/<name>.json."""
    import json
    print(f"\nFIGURES {name}: {json.dumps(figures)}")
    out = os.environ.get("TACC_VM_OUT")
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")


class UserBuf:
    """Page-aligned anonymous memory viewed as a numpy array (for userptr)."""

    def __init__(self, nbytes: int) -> None:
        self.size = (nbytes + 4095) & ~4095
        self.mm = mmap.mmap(-1, self.size)
        self.addr = C.addressof(C.c_char.from_buffer(self.mm))

    def array(self, dtype=np.float32, count: int = -1) -> np.ndarray:
        return np.frombuffer(self.mm, dtype=dtype, count=count)


# ----------------------------------------------------------------- fixtures ---
@pytest.fixture
def dev(pf_accel):
    d = Dev(pf_accel)
    yield d
    d.close()


# -------------------------------------------------------------------- tests ---
def test_layouts():
    assert C.sizeof(Cmd) == 128
    assert C.sizeof(Submit) == 48
    assert C.sizeof(BoCreate) == 40
    assert C.sizeof(BoInfo) == 48
    assert C.sizeof(VmBind) == 40
    assert C.sizeof(TraceHeader) == 40


def test_params(dev):
    from tacc.runtime.uapi import DRM_TACC_API_VERSION

    # the mirror of tacc_accel.h (3: TLP capture, masked queues refused)
    assert dev.param(P_API) == DRM_TACC_API_VERSION >= 3
    assert dev.param(P_HW) >> 16 == 1
    assert dev.param(P_QUEUES) == 4
    assert dev.param(P_CTXS) == 16
    assert dev.param(P_ENGINES) == 6
    assert dev.param(P_DEVMEM) > 0
    assert dev.param(P_CLOCK) == 1_000_000_000
    assert 0 <= dev.param(P_CTX) < 16
    t0 = dev.param(P_DEVCLK)
    assert dev.param(P_DEVCLK) > t0
    with pytest.raises(OSError) as e:
        dev.param(999)
    assert e.value.errno == errno.EINVAL


def test_nop_fence_timestamp(dev):
    b = dev.bo(4096)
    m = dev.map(b.handle, 4096)
    m[:] = b"\0" * 4096
    st = dev.run([nop(tag=1), fence(b.handle, 8, 0x1122334455667788, tag=2),
                  Cmd(opcode=OP_TS, a=op(b.handle, 16), tag=3)])
    assert st == 0
    v, ts = struct.unpack_from("<QQ", m, 8)
    assert v == 0x1122334455667788
    assert ts > 0
    m.close()


@pytest.mark.parametrize("kind", ["host", "userptr"])
def test_copy_roundtrip(dev, kind):
    n = 256 * 1024
    data = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    d = dev.bo(n, DEVICE)
    if kind == "host":
        src, dst = dev.bo(n), dev.bo(n)
        ms, md = dev.map(src.handle, n), dev.map(dst.handle, n)
        np.frombuffer(ms, np.uint8)[:] = data
        out = lambda: np.frombuffer(md, np.uint8).copy()  # noqa: E731
    else:
        us, ud = UserBuf(n), UserBuf(n)
        us.array(np.uint8)[:] = data
        src = dev.bo(n, USERPTR, userptr=us.addr)
        dst = dev.bo(n, USERPTR, userptr=ud.addr)
        out = lambda: ud.array(np.uint8).copy()  # noqa: E731
    st = dev.run([copy(OP_H2D, src.handle, d.handle, n, tag=0x10),
                  copy(OP_D2D, d.handle, d.handle, n // 2, 0, n // 2, tag=0x11),
                  copy(OP_D2H, d.handle, dst.handle, n, tag=0x12)])
    assert st == 0
    got = out()
    assert np.array_equal(got[: n // 2], data[: n // 2])
    assert np.array_equal(got[n // 2:], data[: n // 2])


def test_userptr_registered_twice(dev):
    """One user buffer behind two USERPTR BOs (read-write: both DMA-mapped both ways): the
    device writes through one and reads through the other.  Overlapping streaming maps:
    on the debug kernel, DMA-API debug reported 'cacheline tracking EEXIST' from
    tacc_bo_create_ioctl until the map skipped the CPU sync and synced explicitly."""
    n = 8192
    ub = UserBuf(n)
    a = dev.bo(n, USERPTR, userptr=ub.addr)
    b = dev.bo(n, USERPTR, userptr=ub.addr)
    data = np.arange(n, dtype=np.uint32).astype(np.uint8)
    src, d = dev.bo(n), dev.bo(n, DEVICE)
    np.frombuffer(dev.map(src.handle, n), np.uint8)[:] = data
    assert dev.run([copy(OP_H2D, src.handle, d.handle, n),
                    copy(OP_D2H, d.handle, a.handle, n)]) == 0
    assert np.array_equal(ub.array(np.uint8), data)
    d2 = dev.bo(n, DEVICE)
    assert dev.run([copy(OP_H2D, b.handle, d2.handle, n),
                    copy(OP_D2D, d2.handle, d.handle, n)]) == 0
    back = dev.bo(n)
    assert dev.run([copy(OP_D2H, d.handle, back.handle, n)]) == 0
    assert np.array_equal(np.frombuffer(dev.map(back.handle, n), np.uint8), data)


@pytest.mark.parametrize("kind", ["host", "userptr"])
def test_gemm_numpy(dev, kind):
    rng = np.random.default_rng(7)
    m, n, k = 32, 24, 40
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    bos = {}
    for name, arr in (("a", a), ("b", b), ("c", c0)):
        if kind == "host":
            h = dev.bo(arr.nbytes)
            mm = dev.map(h.handle, (arr.nbytes + 4095) & ~4095)
            np.frombuffer(mm, np.float32, count=arr.size)[:] = arr.ravel()
            bos[name] = (h, mm)
        else:
            ub = UserBuf(arr.nbytes)
            ub.array(count=arr.size)[:] = arr.ravel()
            bos[name] = (dev.bo(ub.size, USERPTR, userptr=ub.addr), ub)
    dv = {name: dev.bo(arr.nbytes, DEVICE) for name, arr in (("a", a), ("b", b), ("c", c0))}
    cmds = [copy(OP_H2D, bos[x][0].handle, dv[x].handle, arr.nbytes)
            for x, arr in (("a", a), ("b", b), ("c", c0))]
    cmds.append(gemm(dv["a"].handle, dv["b"].handle, dv["c"].handle, m, n, k, 0.5, 2.0,
                     tag=0x77))
    cmds.append(copy(OP_D2H, dv["c"].handle, bos["c"][0].handle, c0.nbytes))
    assert dev.run(cmds) == 0
    if kind == "host":
        got = np.frombuffer(bos["c"][1], np.float32, count=m * n).reshape(m, n)
    else:
        got = bos["c"][1].array(count=m * n).reshape(m, n)
    np.testing.assert_allclose(got, 0.5 * (a @ b) + 2.0 * c0, rtol=1e-4, atol=1e-4)


def test_eltwise(dev):
    n = 1000
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    h = dev.bo(3 * 4096)
    mm = dev.map(h.handle, 3 * 4096)
    np.frombuffer(mm, np.float32, count=n)[:] = x
    np.frombuffer(mm, np.float32, count=n, offset=4096)[:] = y
    d = dev.bo(3 * 4096, DEVICE)
    cmds = [copy(OP_H2D, h.handle, d.handle, 2 * 4096),
            Cmd(opcode=OP_ELT, a=op(d.handle, 0), b=op(d.handle, 4096), c=op(d.handle, 8192),
                size=n, elt_op=ELT_ADD),
            Cmd(opcode=OP_ELT, a=op(d.handle, 8192), c=op(d.handle, 8192), size=n,
                elt_op=ELT_RELU),
            copy(OP_D2H, d.handle, h.handle, 4096, 8192, 8192)]
    assert dev.run(cmds) == 0
    got = np.frombuffer(mm, np.float32, count=n, offset=8192)
    np.testing.assert_allclose(got, np.maximum(x + y, 0), rtol=1e-6)


def test_huge_pages_devmem(dev, pf_accel):
    b = dev.bo(4 << 20, DEVICE, flags=BO_NO_BIND)
    r = dev.ioctl(VM_BIND, VmBind(handle=b.handle))
    assert r.page_size == 2 << 20
    assert r.va % (2 << 20) == 0
    assert dev.info(b.handle).va == r.va
    dev.ioctl(VM_UNBIND, VmUnbind(handle=b.handle))
    assert dev.info(b.handle).va == 0
    with pytest.raises(OSError) as e:
        dev.ioctl(VM_UNBIND, VmUnbind(handle=b.handle))
    assert e.value.errno == errno.EINVAL
    # fixed VA, partial binding
    r = dev.ioctl(VM_BIND, VmBind(handle=b.handle, flags=BIND_FIXED, va=0x40000000,
                                  bo_offset=4096, size=8192))
    assert r.va == 0x40000000 and r.page_size == 4096
    assert dev.info(b.handle).bound_size == 8192


def test_syncobj_chain(dev):
    b = dev.bo(4096)
    mm = dev.map(b.handle, 4096)
    s1 = dev.syncobj()
    dev.submit([fence(b.handle, 0, 1)], queue=1, out=s1)
    seq = dev.submit([fence(b.handle, 8, 2)], queue=2, ins=[s1])
    assert dev.wait(seq) == 0
    handles = (u32 * 1)(s1)
    dev.ioctl(SYNCOBJ_WAIT, SyncobjWait(handles=C.addressof(handles), count_handles=1,
                                        timeout_nsec=time.clock_gettime_ns(1) + 10**10))
    assert struct.unpack_from("<QQ", mm, 0) == (1, 2)
    dev.ioctl(SYNCOBJ_DESTROY, Pair(handle=s1))


def expect_errno(code, fn, *args):
    with pytest.raises(OSError) as e:
        fn(*args)
    assert e.value.errno == code, f"{fn}{args}: {e.value}"


def test_errors(dev):
    h = dev.bo(4096)
    d = dev.bo(8192, DEVICE)
    expect_errno(errno.EINVAL, dev.bo, 0)
    expect_errno(errno.EINVAL, dev.bo, 4096, 7)
    expect_errno(errno.EINVAL, dev.bo, 4096, HOST, 0x80)
    expect_errno(errno.EINVAL, dev.bo, 4096, HOST, 0, 0x1000)
    expect_errno(errno.EINVAL, dev.bo, 4096, USERPTR, 0, 0x1001)
    expect_errno(errno.EFAULT, dev.bo, 4096, USERPTR, 0, 0x1000)
    expect_errno(errno.ENOENT, dev.info, 12345)
    expect_errno(errno.EINVAL, dev.submit, [])
    expect_errno(errno.EINVAL, dev.submit, [nop()], 9)
    expect_errno(errno.EINVAL, dev.submit, [Cmd(opcode=99)])
    expect_errno(errno.EINVAL, dev.submit, [Cmd(opcode=OP_NOP, flags=1)])
    expect_errno(errno.EINVAL, dev.submit, [nop()] * 65)
    expect_errno(errno.ENOENT, dev.submit, [copy(OP_H2D, 999, d.handle, 16)])
    # wrong memory kinds, out of range, overflowing offsets
    expect_errno(errno.EINVAL, dev.submit, [copy(OP_H2D, d.handle, h.handle, 16)])
    expect_errno(errno.EINVAL, dev.submit, [copy(OP_H2D, h.handle, d.handle, 4097)])
    expect_errno(errno.EINVAL, dev.submit, [copy(OP_H2D, h.handle, d.handle, 16, 2**64 - 8)])
    expect_errno(errno.EINVAL, dev.submit, [copy(OP_D2H, d.handle, h.handle, 0)])
    expect_errno(errno.EINVAL, dev.submit, [gemm(h.handle, h.handle, h.handle, 2, 2, 2)])
    expect_errno(errno.EINVAL, dev.submit, [gemm(d.handle, d.handle, d.handle, 64, 64, 64)])
    expect_errno(errno.EINVAL, dev.submit, [fence(h.handle, 4, 1)])
    expect_errno(errno.ENOENT, dev.submit, [nop()], 0, [], 777)
    expect_errno(errno.ENOENT, dev.submit, [nop()], 0, [777])
    expect_errno(errno.EINVAL, dev.wait, 10**9)
    s = Submit(cmds=8, num_cmds=1, cmd_size=128)
    expect_errno(errno.EFAULT, dev.ioctl, SUBMIT, s)
    s = Submit(cmds=0, num_cmds=1, cmd_size=64)
    expect_errno(errno.EINVAL, dev.ioctl, SUBMIT, s)
    expect_errno(errno.EBUSY, dev.ioctl, VM_BIND, VmBind(handle=h.handle))
    expect_errno(errno.EINVAL, dev.ioctl, VM_BIND, VmBind(handle=h.handle, flags=0x10))
    expect_errno(errno.EPERM, dev.ioctl, TRACE_ADVANCE, TraceAdvance())


def test_fdinfo_sysfs_counters(dev, pf_accel):
    d = dev.bo(1 << 20, DEVICE)
    h = dev.bo(1 << 20)
    assert dev.run([copy(OP_H2D, h.handle, d.handle, 1 << 20)]) == 0
    info = Path(f"/proc/self/fdinfo/{dev.fd}").read_text()
    assert "drm-driver:\ttacc" in info
    assert "drm-engine-queue0:" in info
    assert "tacc-memory-device:\t1024 KiB" in info and "drm-total-memory:\t" in info
    pci = pf_sysfs()
    t = pci / "tacc"
    assert (t / "link_width").read_text().strip().isdigit()
    assert "GT/s" in (t / "link_speed").read_text()
    assert int((t / "devmem_bytes").read_text()) == dev.param(P_DEVMEM)
    paused = set()
    for ln in (t / "clock_sync").read_text().splitlines():
        # before, DEVCLK, after, HOSTCLK, VM_PAUSED_NS (hw 1.7)
        before, devclk, after, hostclk, vm_paused = map(int, ln.split())
        assert before <= after and devclk > 0 and hostclk > 0
        paused.add(vm_paused)
    assert len(paused) == 1  # the VM ran through the read: the pause count stood
    cat = (pci / "counters/catalogue").read_text().splitlines()
    names = [ln.split()[0] for ln in cat if not ln.startswith("#") and " function " in ln]
    assert "h2d_bytes" in names and len(names) >= 30
    for nm in names:
        assert (pci / "counters" / nm).read_text().strip().isdigit()
    assert int((pci / "counters/h2d_bytes").read_text()) >= 1 << 20


def test_counter_mmap(dev):
    off = dev.param(P_CNT_OFF)
    mm = mmap.mmap(dev.fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)
    hdr = struct.unpack_from("<Q", mm, 0)[0]
    assert hdr >> 32 == 1 and (hdr & 0xffffffff) >= 30
    mm.close()
    with pytest.raises(OSError):
        mmap.mmap(dev.fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=off)


def test_trace_ring(dev, pf_accel):
    t = dev.ioctl(TRACE_OPEN, TraceOpen())
    try:
        with Dev(pf_accel) as other:
            expect_errno(errno.EBUSY, other.ioctl, TRACE_OPEN, TraceOpen())
        mm = mmap.mmap(dev.fd, t.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ,
                       offset=t.mmap_offset)
        hdr = TraceHeader.from_buffer_copy(mm[: C.sizeof(TraceHeader)])
        assert hdr.version == 1 and hdr.rec_size == 64 and hdr.entries == t.entries == 4096
        start = hdr.prod
        assert dev.run([nop(tag=0xabc0), nop(tag=0xabc1), nop(tag=0xabc2)]) == 0
        hdr = TraceHeader.from_buffer_copy(mm[: C.sizeof(TraceHeader)])
        assert hdr.prod - start >= 3
        tags = []
        for i in range(start, hdr.prod):
            rec = mm[hdr.data_offset + (i % hdr.entries) * 64:][:64]
            tags.append(struct.unpack_from("<Q", rec, 16)[0])
        assert [0xabc0, 0xabc1, 0xabc2] == [x for x in tags if x >> 4 == 0xabc]
        adv = dev.ioctl(TRACE_ADVANCE, TraceAdvance(cons=hdr.prod))
        assert adv.prod == hdr.prod
        expect_errno(errno.EINVAL, dev.ioctl, TRACE_ADVANCE, TraceAdvance(cons=hdr.prod + 100))
        mm.close()
    finally:
        dev.ioctl(TRACE_CLOSE, TraceClose())


def test_trace_ring_sized_at_open_and_drops_belong_to_their_consumer(pf_accel):
    """TRACE_OPEN sizes the ring (power of two, 64..32768, 0 = 4096).  The device's drop
    count is cumulative (since the function's last reset); TRACE_OPEN seeds the header
    with it, so a consumer counts exactly the drops of its own run and the next consumer
    starts at 0 new drops, not at the last one's total."""
    from tacc.daemon.devring import DeviceTraceRing, TraceRingError
    from tacc.runtime import uapi

    for bad in (32, 100, 65536):
        with pytest.raises(TraceRingError, match="Invalid argument"):
            DeviceTraceRing(str(pf_accel), 0, bad)
    ring = DeviceTraceRing(str(pf_accel), 0, 64)
    fd = uapi.open_node(str(pf_accel))
    try:
        hdr = ring.view.header()
        assert ring.view.entries == int(hdr.entries) == 64
        assert len(ring.mm) == 4096 + 64 * 64
        base = int(hdr.dropped)
        assert int(hdr.prod) == 0
        uapi.submit_nops(fd, 3, ncmds=64)  # 192 records into 64 slots, none drained
        hdr = ring.view.header()
        assert int(hdr.prod) == 64
        assert (int(hdr.dropped) - base) & 0xFFFFFFFF == 128
        r = ring.drain()
        assert len(r.records) == 64 and r.dropped == 128
        total = int(hdr.dropped)
    finally:
        ring.close()
    ring = DeviceTraceRing(str(pf_accel), 0, 128)
    try:
        hdr = ring.view.header()
        assert int(hdr.entries) == 128 and len(ring.mm) == 4096 + 128 * 64
        assert int(hdr.prod) == 0 and int(hdr.dropped) == total  # seeded, not a stale 0
        uapi.submit_nops(fd, 1, ncmds=2)
        r = ring.drain()
        assert len(r.records) == 2 and r.dropped == 0 and ring.view.total_dropped == 0
    finally:
        ring.close()
        os.close(fd)


def test_live_objects_back_to_zero(pf_accel):
    with Dev(pf_accel) as d:
        d.bo(8192)
        d.bo(8192, DEVICE)
        ub = UserBuf(8192)
        d.bo(8192, USERPTR, userptr=ub.addr)
        d.submit([nop()])
        lo = live_objects()
        assert lo["bos"] >= 3 and lo["contexts"] >= 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lo = live_objects()
        if all(v == 0 for k, v in lo.items() if k != "pt_pages"):
            break
        time.sleep(0.1)
    assert all(v == 0 for v in lo.values()), lo
    assert not dmesg_problems()
