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
VFIO_DEVICE_FEATURE = _io(17)

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

# VFIO_DEVICE_FEATURE: flags = feature index | GET/SET/PROBE; the feature's struct follows
VFIO_DEVICE_FEATURE_MASK = 0xFFFF
VFIO_DEVICE_FEATURE_GET = 1 << 16
VFIO_DEVICE_FEATURE_SET = 1 << 17
VFIO_DEVICE_FEATURE_PROBE = 1 << 18
VFIO_DEVICE_FEATURE_MIGRATION = 1
VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE = 2
VFIO_DEVICE_FEATURE_DMA_LOGGING_START = 6
VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP = 7
VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT = 8
VFIO_MIGRATION_STOP_COPY = 1 << 0
VFIO_MIGRATION_P2P = 1 << 1
# enum vfio_device_mig_state
VFIO_DEVICE_STATE_ERROR = 0
VFIO_DEVICE_STATE_STOP = 1
VFIO_DEVICE_STATE_RUNNING = 2
VFIO_DEVICE_STATE_STOP_COPY = 3
VFIO_DEVICE_STATE_RESUMING = 4
VFIO_DEVICE_STATE_RUNNING_P2P = 5
# Linux 6.2's additions, not in bookworm's <linux/vfio.h> (linux-libc-dev 6.1), so outside the
# layout test's names (they do not start with VFIO_): values from the 6.12 kernel's header.
MIG_DATA_SIZE_FEATURE = 9  # VFIO_DEVICE_FEATURE_MIG_DATA_SIZE: u64 stop_copy_length

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


class vfio_device_feature(C.Structure):
    """Header only: the feature's struct (``data[]``) follows it."""

    _fields_ = [("argsz", u32), ("flags", u32)]


class vfio_device_feature_migration(C.Structure):
    _fields_ = [("flags", u64)]


class vfio_device_feature_mig_state(C.Structure):
    _fields_ = [("device_state", u32), ("data_fd", s32)]


class vfio_device_feature_dma_logging_control(C.Structure):
    _fields_ = [("page_size", u64), ("num_ranges", u32), ("__reserved", u32), ("ranges", u64)]


class vfio_device_feature_dma_logging_range(C.Structure):
    _fields_ = [("iova", u64), ("length", u64)]


class vfio_device_feature_dma_logging_report(C.Structure):
    _fields_ = [("iova", u64), ("length", u64), ("page_size", u64), ("bitmap", u64)]


STRUCTS: tuple[type[C.Structure], ...] = (
    vfio_group_status, vfio_device_info, vfio_region_info, vfio_irq_info, vfio_irq_set,
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_device_feature,
    vfio_device_feature_migration, vfio_device_feature_mig_state,
    vfio_device_feature_dma_logging_control,
    vfio_device_feature_dma_logging_range, vfio_device_feature_dma_logging_report)

CONSTANTS: tuple[str, ...] = tuple(
    n for n in list(globals()) if n.startswith("VFIO_") and n not in ("VFIO_TYPE", "VFIO_BASE"))
