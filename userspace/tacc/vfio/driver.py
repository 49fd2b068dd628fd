"""tacc.vfio: a user-space driver for a tacc function bound to vfio-pci.

No kernel driver of ours runs: this module opens the type1 container and the
function's IOMMU group, takes the device fd, mmaps BAR0, maps its own buffers into the
IOMMU (``VFIO_IOMMU_MAP_DMA``), builds the device page tables, programs queue 0 and
takes completions through an MSI-X vector wired to an eventfd (``VFIO_DEVICE_SET_IRQS``).
Register offsets, bits and descriptor layouts come from ``kernel/include/tacc_hw.h``
(parsed by :mod:`tacc.testing.taccdev`, checked against the compiled header by
tests/host/test_vfio_layout.py).  docs/vfio.md describes the API and its limits.

Example (as root, or as the owner of ``/dev/vfio/<group>`` with enough RLIMIT_MEMLOCK)::

    with TaccVfio("0000:01:00.2") as t:
        a = t.alloc(4096); a.array[:] = 7
        t.copy_h2d(a, 0, 4096)            # host buffer -> device memory offset 0
        b = t.alloc(4096); t.copy_d2h(0, b, 4096)
"""

from __future__ import annotations

import ctypes as C
import errno
import mmap
import os
import select
import struct
import time
from dataclasses import dataclass

import numpy as np

from tacc import hw
from tacc.errors import DeviceError, VfioError
from tacc.hw.records import CQE, Cqe, d_copy, d_gemm, desc
from tacc.libc import libc
from tacc.vfio import uapi as V
from tacc.vfio.bind import group_of, normalize

PAGE = 4096
HUGE = 2 << 20
IOVA_BASE = 1 << 32  # above the x86 MSI window; intel-iommu's 39-bit space
DEVMEM_VA = 0x40_0000_0000  # the window is mapped here in context 0 (a driver choice)
QUEUE = 0
SQ_ENTRIES = 256
CQ_ENTRIES = 256
PT_POOL_PAGES = 64
PCI_COMMAND = 0x04
PCI_COMMAND_MEMORY = 0x2
PCI_COMMAND_MASTER = 0x4
MAP_HUGETLB = 0x40000
QBASE = hw.TACC_QUEUE_BASE(QUEUE)
QVEC = hw.TACC_MSIX_QUEUE(QUEUE)
PTBR0 = hw.TACC_REG_CTX_PTBR(0)

libc.mmap.restype = C.c_void_p
libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
libc.munmap.argtypes = [C.c_void_p, C.c_size_t]
libc.ioctl.argtypes = [C.c_int, C.c_ulong, C.c_void_p]


def _ioctl(fd: int, req: int, arg: object, what: str) -> int:
    if isinstance(arg, int):
        ptr: C.c_void_p | int = arg
    else:
        ptr = C.cast(C.pointer(arg), C.c_void_p)  # type: ignore[arg-type]
    r = libc.ioctl(fd, req, ptr)
    if r < 0:
        e = C.get_errno()
        raise VfioError(e, f"{what}: {os.strerror(e)}")
    return int(r)


def _mmap(length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    addr = libc.mmap(None, length, prot, flags, fd, offset)
    if addr in (None, C.c_void_p(-1).value):
        e = C.get_errno()
        raise VfioError(e, f"mmap of {length} bytes: {os.strerror(e)}")
    return int(addr)


@dataclass
class Buffer:
    """Host memory mapped for the device: CPU address, IOVA, and the device VA it has in
    context 0 (host buffers are mapped at VA = IOVA)."""

    addr: int
    size: int
    iova: int
    huge: bool

    @property
    def va(self) -> int:
        return self.iova

    @property
    def array(self) -> np.ndarray:
        return np.ctypeslib.as_array((C.c_uint8 * self.size).from_address(self.addr))

    def view(self, dtype: str | np.dtype, count: int = -1) -> np.ndarray:
        return np.frombuffer((C.c_uint8 * self.size).from_address(self.addr), dtype=dtype,
                             count=count)


class Container:
    """/dev/vfio/vfio with one group attached and the type1v2 IOMMU set."""

    def __init__(self) -> None:
        self.fd = os.open("/dev/vfio/vfio", os.O_RDWR | os.O_CLOEXEC)
        try:
            v = _ioctl(self.fd, V.VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")
            if v != V.VFIO_API_VERSION:
                raise VfioError(errno.EPROTO, f"VFIO API version {v}, expected "
                                f"{V.VFIO_API_VERSION}")
            if not _ioctl(self.fd, V.VFIO_CHECK_EXTENSION, V.VFIO_TYPE1v2_IOMMU,
                          "VFIO_CHECK_EXTENSION"):
                raise VfioError(errno.ENODEV, "the container has no type1v2 IOMMU "
                                "(modprobe vfio_iommu_type1)")
        except BaseException:
            os.close(self.fd)
            raise

    def set_iommu(self) -> None:
        _ioctl(self.fd, V.VFIO_SET_IOMMU, V.VFIO_TYPE1v2_IOMMU, "VFIO_SET_IOMMU(type1v2)")

    def map_dma(self, addr: int, iova: int, size: int) -> None:
        m = V.vfio_iommu_type1_dma_map(C.sizeof(V.vfio_iommu_type1_dma_map),
                                       V.VFIO_DMA_MAP_FLAG_READ | V.VFIO_DMA_MAP_FLAG_WRITE,
                                       addr, iova, size)
        _ioctl(self.fd, V.VFIO_IOMMU_MAP_DMA, m, f"VFIO_IOMMU_MAP_DMA iova 0x{iova:x}+0x{size:x}")

    def unmap_dma(self, iova: int, size: int) -> None:
        u = V.vfio_iommu_type1_dma_unmap(C.sizeof(V.vfio_iommu_type1_dma_unmap), 0, iova, size)
        _ioctl(self.fd, V.VFIO_IOMMU_UNMAP_DMA, u, f"VFIO_IOMMU_UNMAP_DMA iova 0x{iova:x}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Group:
    """/dev/vfio/<group>: opened once (a second open fails with EBUSY)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.path = f"/dev/vfio/{number}"
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.EBUSY:
                raise VfioError(errno.EBUSY, f"{self.path}: VFIO group {number} is already "
                                "open (one user per group)") from None
            raise VfioError(e.errno, f"{self.path}: {e.strerror}") from None
        st = V.vfio_group_status(C.sizeof(V.vfio_group_status), 0)
        _ioctl(self.fd, V.VFIO_GROUP_GET_STATUS, st, "VFIO_GROUP_GET_STATUS")
        if not st.flags & V.VFIO_GROUP_FLAGS_VIABLE:
            os.close(self.fd)
            raise VfioError(errno.EBUSY, f"{self.path}: group not viable (a device of it is "
                            "not bound to vfio-pci)")

    def set_container(self, c: Container) -> None:
        fd = C.c_int(c.fd)
        _ioctl(self.fd, V.VFIO_GROUP_SET_CONTAINER, fd, "VFIO_GROUP_SET_CONTAINER")

    def device(self, bdf: str) -> int:
        name = C.create_string_buffer(bdf.encode())
        return _ioctl(self.fd, V.VFIO_GROUP_GET_DEVICE_FD, C.addressof(name),
                      f"VFIO_GROUP_GET_DEVICE_FD {bdf}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Device:
    """The device fd: regions (BAR0 mmap, config space), MSI-X eventfds, reset."""

    def __init__(self, fd: int, bdf: str) -> None:
        self.fd, self.bdf = fd, bdf
        info = V.vfio_device_info(C.sizeof(V.vfio_device_info))
        _ioctl(fd, V.VFIO_DEVICE_GET_INFO, info, "VFIO_DEVICE_GET_INFO")
        if not info.flags & V.VFIO_DEVICE_FLAGS_PCI:
            raise VfioError(errno.ENODEV, f"{bdf}: not a vfio-pci device")
        self.flags, self.num_regions, self.num_irqs = info.flags, info.num_regions, info.num_irqs
        self.cfg = self.region(V.VFIO_PCI_CONFIG_REGION_INDEX)
        self.bar0 = self.region(V.VFIO_PCI_BAR0_REGION_INDEX + hw.TACC_BAR_REGS)
        if not self.bar0.flags & V.VFIO_REGION_INFO_FLAG_MMAP:
            raise VfioError(errno.ENOTSUP, f"{bdf}: BAR0 cannot be mmapped")
        self.bar0_addr = _mmap(self.bar0.size, mmap.PROT_READ | mmap.PROT_WRITE,
                               mmap.MAP_SHARED, fd, self.bar0.offset)
        self.eventfds: list[int] = []

    def region(self, index: int) -> V.vfio_region_info:
        r = V.vfio_region_info(C.sizeof(V.vfio_region_info), 0, index)
        _ioctl(self.fd, V.VFIO_DEVICE_GET_REGION_INFO, r, f"VFIO_DEVICE_GET_REGION_INFO {index}")
        return r

    # config space, through the region (vfio-pci virtualizes parts of it)
    def cfg_read16(self, off: int) -> int:
        return int(struct.unpack("<H", os.pread(self.fd, 2, self.cfg.offset + off))[0])

    def cfg_write16(self, off: int, v: int) -> None:
        os.pwrite(self.fd, struct.pack("<H", v), self.cfg.offset + off)

    # BAR0 registers: one aligned access of the register's width
    def r32(self, off: int) -> int:
        return int(C.c_uint32.from_address(self.bar0_addr + off).value)

    def w32(self, off: int, v: int) -> None:
        C.c_uint32.from_address(self.bar0_addr + off).value = v & 0xFFFFFFFF

    def r64(self, off: int) -> int:
        return int(C.c_uint64.from_address(self.bar0_addr + off).value)

    def w64(self, off: int, v: int) -> None:
        C.c_uint64.from_address(self.bar0_addr + off).value = v

    def msix_eventfds(self, count: int) -> list[int]:
        """Wire MSI-X vectors 0 .. count-1 to new eventfds."""
        irq = V.vfio_irq_info(C.sizeof(V.vfio_irq_info), 0, V.VFIO_PCI_MSIX_IRQ_INDEX)
        _ioctl(self.fd, V.VFIO_DEVICE_GET_IRQ_INFO, irq, "VFIO_DEVICE_GET_IRQ_INFO(MSI-X)")
        if irq.count < count or not irq.flags & V.VFIO_IRQ_INFO_EVENTFD:
            raise VfioError(errno.ENOTSUP, f"{self.bdf}: {irq.count} MSI-X vectors, need {count}")
        fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(count)]

        class _Set(C.Structure):
            _fields_ = [("hdr", V.vfio_irq_set), ("data", C.c_int32 * count)]

        s = _Set()
        s.hdr = V.vfio_irq_set(C.sizeof(_Set), V.VFIO_IRQ_SET_DATA_EVENTFD |
                               V.VFIO_IRQ_SET_ACTION_TRIGGER, V.VFIO_PCI_MSIX_IRQ_INDEX, 0, count)
        s.data[:] = fds
        _ioctl(self.fd, V.VFIO_DEVICE_SET_IRQS, s, "VFIO_DEVICE_SET_IRQS(MSI-X)")
        self.eventfds = fds
        return fds

    def irqs_off(self) -> None:
        s = V.vfio_irq_set(C.sizeof(V.vfio_irq_set), V.VFIO_IRQ_SET_DATA_NONE |
                           V.VFIO_IRQ_SET_ACTION_TRIGGER, V.VFIO_PCI_MSIX_IRQ_INDEX, 0, 0)
        _ioctl(self.fd, V.VFIO_DEVICE_SET_IRQS, s, "VFIO_DEVICE_SET_IRQS(off)")
        for fd in self.eventfds:
            os.close(fd)
        self.eventfds = []

    def reset(self) -> None:
        if not self.flags & V.VFIO_DEVICE_FLAGS_RESET:
            raise VfioError(errno.ENOTSUP, f"{self.bdf}: vfio-pci offers no reset")
        _ioctl(self.fd, V.VFIO_DEVICE_RESET, 0, "VFIO_DEVICE_RESET")

    def close(self) -> None:
        if self.eventfds:
            try:
                self.irqs_off()
            except VfioError:
                pass
        if self.bar0_addr:
            libc.munmap(self.bar0_addr, self.bar0.size)
            self.bar0_addr = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class TaccVfio:
    """A tacc function driven from user space: one context (0), one queue (0)."""

    def __init__(self, bdf: str, *, irq: bool = True, pt_pages: int = PT_POOL_PAGES) -> None:
        self.bdf = normalize(bdf)
        self.container = Container()
        self.group: Group | None = None
        self.dev: Device | None = None
        self.bufs: list[Buffer] = []
        self.next_iova = IOVA_BASE
        self.job = 0
        self.done: dict[int, Cqe] = {}  # completions read by wait() for other jobs
        self.tlb_seq = 0
        self.irq = irq
        try:
            self.group = Group(group_of(self.bdf))
            self.group.set_container(self.container)
            self.container.set_iommu()
            self.dev = Device(self.group.device(self.bdf), self.bdf)
            self.pt_pool = self.alloc(pt_pages * PAGE)
            self.sq = self.alloc(SQ_ENTRIES * hw.TACC_DESC_SIZE)
            self.cq = self.alloc(CQ_ENTRIES * hw.TACC_CQE_SIZE)
            if irq:
                self.dev.msix_eventfds(hw.TACC_MSIX_VECTORS)
            self.init_hw()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------- memory ---
    def alloc(self, size: int, *, huge: bool = False) -> Buffer:
        """Anonymous (or 2 MiB hugetlb) memory, zeroed, pinned and mapped at a new IOVA."""
        step = HUGE if huge else PAGE
        size = (size + step - 1) // step * step
        flags = mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | (MAP_HUGETLB if huge else 0)
        addr = _mmap(size, mmap.PROT_READ | mmap.PROT_WRITE, flags)
        iova = (self.next_iova + step - 1) // step * step
        try:
            self.container.map_dma(addr, iova, size)
        except BaseException:
            libc.munmap(addr, size)
            raise
        self.next_iova = iova + size
        b = Buffer(addr, size, iova, huge)
        self.bufs.append(b)
        if hasattr(self, "root"):
            self.map_host(b)
        return b

    def free(self, b: Buffer) -> None:
        """Unmap from the device page tables (TLB invalidated), then from the IOMMU."""
        self.unmap_va(b.va, b.size, huge=b.huge)
        self.container.unmap_dma(b.iova, b.size)
        libc.munmap(b.addr, b.size)
        self.bufs.remove(b)

    # -------------------------------------------------------- page tables ---
    def _pt_alloc(self) -> int:
        if self.pt_next >= self.pt_pool.size:
            raise DeviceError("page-table pool exhausted")
        iova = self.pt_pool.iova + self.pt_next
        self.pt_next += PAGE
        return iova

    def _pte(self, table_iova: int, idx: int) -> C.c_uint64:
        return C.c_uint64.from_address(self.pt_pool.addr + (table_iova - self.pt_pool.iova)
                                       + 8 * idx)

    def _next_table(self, table: int, idx: int) -> int:
        e = self._pte(table, idx)
        if e.value & hw.TACC_PTE_VALID:
            return int(e.value & hw.TACC_PTE_ADDR_MASK)
        t = self._pt_alloc()
        e.value = t | hw.TACC_PTE_VALID
        return t

    def map_va(self, va: int, addr: int, size: int, *, devmem: bool = False,
               huge: bool = False, write: bool = True) -> None:
        """PTEs for [va, va+size) -> addr (an IOVA, or a window offset with devmem)."""
        flags = hw.TACC_PTE_VALID | (hw.TACC_PTE_WRITE if write else 0) | (
            hw.TACC_PTE_DEVMEM if devmem else 0)
        step = HUGE if huge else PAGE
        for off in range(0, size, step):
            v, a = va + off, addr + off
            l1 = self._next_table(self.root, (v >> 30) & 511)
            if huge:
                self._pte(l1, (v >> 21) & 511).value = a | flags | hw.TACC_PTE_HUGE
            else:
                l2 = self._next_table(l1, (v >> 21) & 511)
                self._pte(l2, (v >> 12) & 511).value = a | flags

    def unmap_va(self, va: int, size: int, *, huge: bool = False) -> None:
        step = HUGE if huge else PAGE
        for v in range(va, va + size, step):
            l0 = self._pte(self.root, (v >> 30) & 511).value
            if not l0 & hw.TACC_PTE_VALID:
                continue
            l1 = int(l0 & hw.TACC_PTE_ADDR_MASK)
            e1 = self._pte(l1, (v >> 21) & 511)
            if huge:
                e1.value = 0
            elif e1.value & hw.TACC_PTE_VALID:
                self._pte(int(e1.value & hw.TACC_PTE_ADDR_MASK), (v >> 12) & 511).value = 0
        self.tlb_invalidate()

    def map_host(self, b: Buffer) -> None:
        self.map_va(b.va, b.iova, b.size, huge=b.huge)

    def tlb_invalidate(self, ctx: int = 0) -> None:
        """docs/hardware.md section 5: TLB_INV_SEQ, TLB_INV, poll TLB_INV_DONE."""
        assert self.dev is not None
        self.tlb_seq = (self.tlb_seq + 1) & 0xFFFFFFFF or 1
        self.dev.w32(hw.TACC_REG_TLB_INV_SEQ, self.tlb_seq)
        self.dev.w32(hw.TACC_REG_TLB_INV, ctx)
        deadline = time.monotonic() + 0.1
        while self.dev.r32(hw.TACC_REG_TLB_INV_DONE) != self.tlb_seq:
            if time.monotonic() > deadline:
                raise DeviceError(f"TLB invalidation {self.tlb_seq} did not complete")

    # ------------------------------------------------------------- device ---
    def init_hw(self) -> None:
        """Function reset, enable, context 0's page tables, queue 0 (after every reset)."""
        d = self.dev
        assert d is not None
        cmd = d.cfg_read16(PCI_COMMAND)
        d.cfg_write16(PCI_COMMAND, cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)
        if d.r32(hw.TACC_REG_ID) != hw.TACC_ID_MAGIC:
            raise DeviceError(f"{self.bdf}: BAR0 ID reads 0x{d.r32(hw.TACC_REG_ID):08x}")
        self.caps = d.r32(hw.TACC_REG_CAPS)
        if not self.caps & hw.TACC_CAP_TLB_INV_DONE:
            raise DeviceError(f"{self.bdf}: no TLB_INV_DONE (hw < 1.1)")
        d.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
        self._poll(lambda: not d.r32(hw.TACC_REG_CTRL) & hw.TACC_CTRL_RESET, "function reset")
        d.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_ENABLE)
        self._poll(lambda: d.r32(hw.TACC_REG_STATUS) & hw.TACC_STATUS_READY, "READY")
        d.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
        d.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT | hw.TACC_IRQ_DMA_ERROR |
              hw.TACC_IRQ_FATAL | hw.TACC_IRQ_QUEUE_ERROR)
        d.w32(hw.TACC_REG_FAULT_CLEAR, 1)
        self.func = d.r32(hw.TACC_REG_FUNC)
        self.devmem_size = d.r64(hw.TACC_REG_DEVMEM_SIZE)
        self.tlb_seq = 0
        # page tables: a fresh root, host buffers at VA = IOVA, the window at DEVMEM_VA
        C.memset(self.pt_pool.addr, 0, self.pt_pool.size)
        self.pt_next = 0
        self.root = self._pt_alloc()
        for b in self.bufs:
            if b is not self.pt_pool:
                self.map_host(b)
        if self.devmem_size >= HUGE:
            self.map_va(DEVMEM_VA, 0, self.devmem_size // HUGE * HUGE, devmem=True, huge=True)
        d.w64(PTBR0, self.root | hw.TACC_PTBR_VALID)
        self.tlb_invalidate(hw.TACC_TLB_INV_ALL)
        self._queue_setup()

    def _poll(self, pred, what: str, timeout: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise DeviceError(f"{self.bdf}: timeout waiting for {what}")
            time.sleep(0.0001)

    def _q(self, reg: int) -> int:
        return QBASE + reg

    def _queue_setup(self) -> None:
        d = self.dev
        assert d is not None
        d.w32(self._q(hw.TACC_Q_CTRL), 0)
        d.w64(self._q(hw.TACC_Q_SQ_BASE), self.sq.iova)
        d.w32(self._q(hw.TACC_Q_SQ_SIZE), SQ_ENTRIES)
        d.w64(self._q(hw.TACC_Q_CQ_BASE), self.cq.iova)
        d.w32(self._q(hw.TACC_Q_CQ_SIZE), CQ_ENTRIES)
        d.w32(self._q(hw.TACC_Q_CQ_HEAD), 0)
        d.w32(self._q(hw.TACC_Q_CTRL), hw.TACC_Q_CTRL_ENABLE |
              (hw.TACC_Q_CTRL_IRQ if self.irq else 0))
        if not d.r32(self._q(hw.TACC_Q_CTRL)) & hw.TACC_Q_CTRL_ENABLE:
            raise DeviceError(f"{self.bdf}: queue {QUEUE} refused its ring "
                              f"(status 0x{d.r32(self._q(hw.TACC_Q_STATUS)):x})")
        self.sq_tail = 0
        self.cq_head = 0
        self.done = {}

    def reset(self) -> None:
        """VFIO_DEVICE_RESET (a function-level reset), then program the function again."""
        assert self.dev is not None
        self.dev.reset()
        self.init_hw()

    # --------------------------------------------------------------- jobs ---
    def submit(self, descs: list[bytes], tag: int = 0) -> int:
        """Queue one job (descriptors, F_LAST on the last); returns its job number."""
        assert self.dev is not None
        if len(descs) >= SQ_ENTRIES:
            raise ValueError(f"{len(descs)} descriptors: at most {SQ_ENTRIES - 1} per job")
        self.job = (self.job + 1) & 0xFFFFFFFF
        for i, raw in enumerate(descs):
            b = bytearray(raw)
            struct.pack_into("<HHHI", b, 2, 0, i, 0, self.job)  # ctx 0, index, job
            struct.pack_into("<Q", b, 16, tag)
            if i == len(descs) - 1:
                b[1] |= hw.TACC_DESC_F_LAST
            C.memmove(self.sq.addr + self.sq_tail * hw.TACC_DESC_SIZE, bytes(b),
                      hw.TACC_DESC_SIZE)
            self.sq_tail = (self.sq_tail + 1) % SQ_ENTRIES
        self.dev.w32(self._q(hw.TACC_Q_SQ_TAIL), self.sq_tail)  # doorbell (x86: ordered)
        return self.job

    def completions(self) -> list[Cqe]:
        assert self.dev is not None
        tail = self.dev.r32(self._q(hw.TACC_Q_CQ_TAIL))
        out = []
        while self.cq_head != tail:
            raw = C.string_at(self.cq.addr + self.cq_head * hw.TACC_CQE_SIZE, hw.TACC_CQE_SIZE)
            job, st, q, _, tag, s, e = CQE.unpack(raw)
            out.append(Cqe(job, st, q, tag, s, e))
            self.cq_head = (self.cq_head + 1) % CQ_ENTRIES
        if out:
            self.dev.w32(self._q(hw.TACC_Q_CQ_HEAD), self.cq_head)
        return out

    def wait(self, job: int, timeout: float = 30.0) -> Cqe:
        """The completion of @job: sleeps on the queue's MSI-X eventfd (or polls).
        Completions of other jobs read meanwhile are kept for their own wait()."""
        assert self.dev is not None
        deadline = time.monotonic() + timeout
        efd = self.dev.eventfds[QVEC] if self.dev.eventfds else -1
        while True:
            for c in self.completions():
                self.done[c.job] = c
            if job in self.done:
                return self.done.pop(job)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceError(f"{self.bdf}: job {job} did not complete in {timeout} s")
            if efd >= 0:
                r, _, _ = select.select([efd], [], [], min(left, 0.5))
                if r:
                    os.eventfd_read(efd)
            else:
                time.sleep(0)

    def run(self, descs: list[bytes], timeout: float = 30.0) -> Cqe:
        return self.wait(self.submit(descs), timeout)

    # ------------------------------------------------------------ helpers ---
    @staticmethod
    def nop() -> bytes:
        return desc(hw.TACC_OP_NOP)

    def copy_h2d(self, src: Buffer, dst_off: int, n: int, src_off: int = 0) -> bytes:
        return d_copy(hw.TACC_OP_COPY_H2D, src.va + src_off, DEVMEM_VA + dst_off, n)

    def copy_d2h(self, src_off: int, dst: Buffer, n: int, dst_off: int = 0) -> bytes:
        return d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + src_off, dst.va + dst_off, n)

    @staticmethod
    def gemm(a_off: int, b_off: int, c_off: int, m: int, n: int, k: int) -> bytes:
        return d_gemm(DEVMEM_VA + a_off, DEVMEM_VA + b_off, DEVMEM_VA + c_off, m, n, k, k, n, n)

    def fault(self) -> tuple[int, int]:
        """(FAULT_ADDR, FAULT_INFO) of the first fault since the last FAULT_CLEAR."""
        assert self.dev is not None
        return self.dev.r64(hw.TACC_REG_FAULT_ADDR), self.dev.r32(hw.TACC_REG_FAULT_INFO)

    def irq_status(self) -> int:
        assert self.dev is not None
        return self.dev.r32(hw.TACC_REG_IRQ_STATUS)

    # ------------------------------------------------------------ teardown ---
    def close(self) -> None:
        if self.dev is not None:
            try:
                self.dev.w32(hw.TACC_REG_CTRL, 0)  # stop the queues before unmapping
            except (OSError, ValueError):
                pass
            self.dev.close()
            self.dev = None
        for b in list(self.bufs):
            try:
                self.container.unmap_dma(b.iova, b.size)
            except VfioError:
                pass
            libc.munmap(b.addr, b.size)
        self.bufs.clear()
        if self.group is not None:
            self.group.close()
            self.group = None
        self.container.close()

    def __enter__(self) -> TaccVfio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
