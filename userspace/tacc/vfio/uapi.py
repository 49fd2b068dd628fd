"""ctypes mirror of the parts of ``<linux/vfio.h>`` that tacc.vfio uses (type1 container).

Hand-written from the header (the kernel's stable uAPI); ``tests/host/test_vfio_layout.py``
compiles a C program against ``/usr/include/linux/vfio.h`` and fails if any ioctl number,
flag, size or field offset here differs.
"""

from __future__ import annotations

import ctypes as C

u32, u64, s32 = C.c_uint32, C.c_uint64, C.c_int32

VFIO_TYPE = ord(";")
VFIO_BASE = 100
VFIO_API_VERSION = 0
VFIO_TYPE1v2_IOMMU = 3


def _io(nr: int) -> int:
    """_IO(VFIO_TYPE, VFIO_BASE + nr): VFIO encodes no size or direction (argsz does)."""
    return (VFIO_TYPE << 8) | (VFIO_BASE + nr)


VFIO_GET_API_VERSION = _io(0)
VFIO_CHECK_EXTENSION = _io(1)
VFIO_SET_IOMMU = _io(2)
VFIO_GROUP_GET_STATUS = _io(3)
VFIO_GROUP_SET_CONTAINER = _io(4)
VFIO_GROUP_UNSET_CONTAINER = _io(5)
VFIO_GROUP_GET_DEVICE_FD = _io(6)
VFIO_DEVICE_GET_INFO = _io(7)
VFIO_DEVICE_GET_REGION_INFO = _io(8)
VFIO_DEVICE_GET_IRQ_INFO = _io(9)
VFIO_DEVICE_SET_IRQS = _io(10)
VFIO_DEVICE_RESET = _io(11)
VFIO_IOMMU_GET_INFO = _io(12)
VFIO_IOMMU_MAP_DMA = _io(13)
VFIO_IOMMU_UNMAP_DMA = _io(14)

VFIO_GROUP_FLAGS_VIABLE = 1 << 0
VFIO_GROUP_FLAGS_CONTAINER_SET = 1 << 1
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1
VFIO_REGION_INFO_FLAG_READ = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2
VFIO_IRQ_INFO_EVENTFD = 1 << 0
VFIO_IRQ_SET_DATA_NONE = 1 << 0
VFIO_IRQ_SET_DATA_BOOL = 1 << 1
VFIO_IRQ_SET_DATA_EVENTFD = 1 << 2
VFIO_IRQ_SET_ACTION_MASK = 1 << 3
VFIO_IRQ_SET_ACTION_UNMASK = 1 << 4
VFIO_IRQ_SET_ACTION_TRIGGER = 1 << 5
VFIO_DMA_MAP_FLAG_READ = 1 << 0
VFIO_DMA_MAP_FLAG_WRITE = 1 << 1

# enum: region and irq indices of a vfio-pci device
VFIO_PCI_BAR0_REGION_INDEX = 0
VFIO_PCI_CONFIG_REGION_INDEX = 7
VFIO_PCI_NUM_REGIONS = 9
VFIO_PCI_MSIX_IRQ_INDEX = 2
VFIO_PCI_NUM_IRQS = 5


class vfio_group_status(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32)]


class vfio_device_info(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32), ("num_regions", u32), ("num_irqs", u32),
                ("cap_offset", u32)]


class vfio_region_info(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("cap_offset", u32),
                ("size", u64), ("offset", u64)]


class vfio_irq_info(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("count", u32)]


class vfio_irq_set(C.Structure):
    """Header only: ``data[]`` (here: s32 eventfds) follows it."""

    _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("start", u32),
                ("count", u32)]


class vfio_iommu_type1_dma_map(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32), ("vaddr", u64), ("iova", u64), ("size", u64)]


class vfio_iommu_type1_dma_unmap(C.Structure):
    _fields_ = [("argsz", u32), ("flags", u32), ("iova", u64), ("size", u64)]


STRUCTS: tuple[type[C.Structure], ...] = (
    vfio_group_status, vfio_device_info, vfio_region_info, vfio_irq_info, vfio_irq_set,
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap)

CONSTANTS: tuple[str, ...] = tuple(
    n for n in list(globals()) if n.startswith("VFIO_") and n not in ("VFIO_TYPE", "VFIO_BASE"))
