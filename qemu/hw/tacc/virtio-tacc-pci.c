/*
 * virtio-tacc-pci: the virtio-pci proxy of virtio-tacc (docs/virtio.md).
 *
 *   -device virtio-tacc-pci,tacc=<PF id>[,iommu_platform=on]
 *
 * Modern only (1af4:1079), MSI-X in BAR 1, the virtio structures in BAR 2,
 * the shared-memory regions (fence slots, counter block) in BAR 4 with
 * VIRTIO_PCI_CAP_SHARED_MEMORY_CFG capabilities (as virtio-gpu's hostmem).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/module.h"
#include "hw/qdev-properties.h"
#include "hw/virtio/virtio-pci.h"
#include "virtio-tacc.h"

#define TYPE_VIRTIO_TACC_PCI "virtio-tacc-pci-base"
OBJECT_DECLARE_SIMPLE_TYPE(VirtIOTaccPCI, VIRTIO_TACC_PCI)

struct VirtIOTaccPCI {
    VirtIOPCIProxy parent_obj;
    VirtIOTacc vdev;
    MemoryRegion shm_bar;
};

static const Property virtio_tacc_pci_properties[] = {
    DEFINE_PROP_UINT32("vectors", VirtIOPCIProxy, nvectors, 3),
};

static void virtio_tacc_pci_realize(VirtIOPCIProxy *vpci_dev, Error **errp)
{
    VirtIOTaccPCI *dev = VIRTIO_TACC_PCI(vpci_dev);
    VirtIOTacc *vt = &dev->vdev;

    vpci_dev->msix_bar_idx = 1;
    vpci_dev->modern_mem_bar_idx = 2;
    virtio_pci_force_virtio_1(vpci_dev);
    if (!qdev_realize(DEVICE(vt), BUS(&vpci_dev->bus), errp)) {
        return;
    }
    memory_region_init(&dev->shm_bar, OBJECT(dev), "virtio-tacc-shm",
                       TACC_VIRTIO_SHM_BAR_SIZE);
    memory_region_add_subregion(&dev->shm_bar, TACC_VIRTIO_SHM_FENCES_OFF,
                                &vt->fences_mr);
    memory_region_add_subregion(&dev->shm_bar, TACC_VIRTIO_SHM_COUNTERS_OFF,
                                &vt->counters_mr);
    pci_register_bar(&vpci_dev->pci_dev, TACC_VIRTIO_SHM_BAR,
                     PCI_BASE_ADDRESS_SPACE_MEMORY |
                     PCI_BASE_ADDRESS_MEM_PREFETCH |
                     PCI_BASE_ADDRESS_MEM_TYPE_64, &dev->shm_bar);
    virtio_pci_add_shm_cap(vpci_dev, TACC_VIRTIO_SHM_BAR,
                           TACC_VIRTIO_SHM_FENCES_OFF,
                           TACC_VIRTIO_SHM_FENCES_SIZE, TACC_VIRTIO_SHM_FENCES);
    virtio_pci_add_shm_cap(vpci_dev, TACC_VIRTIO_SHM_BAR,
                           TACC_VIRTIO_SHM_COUNTERS_OFF,
                           TACC_VIRTIO_SHM_COUNTERS_SIZE,
                           TACC_VIRTIO_SHM_COUNTERS);
}

static void virtio_tacc_pci_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    VirtioPCIClass *k = VIRTIO_PCI_CLASS(klass);
    PCIDeviceClass *pcidev_k = PCI_DEVICE_CLASS(klass);

    k->realize = virtio_tacc_pci_realize;
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
    device_class_set_props(dc, virtio_tacc_pci_properties);
    dc->hotpluggable = false;
    pcidev_k->vendor_id = PCI_VENDOR_ID_REDHAT_QUMRANET;
    pcidev_k->device_id = TACC_VIRTIO_PCI_DEVICE_ID;
    pcidev_k->revision = VIRTIO_PCI_ABI_VERSION;
    pcidev_k->class_id = TACC_PCI_CLASS >> 8;
}

static void virtio_tacc_pci_instance_init(Object *obj)
{
    VirtIOTaccPCI *dev = VIRTIO_TACC_PCI(obj);

    virtio_instance_init_common(obj, &dev->vdev, sizeof(dev->vdev),
                                TYPE_VIRTIO_TACC);
}

static const VirtioPCIDeviceTypeInfo virtio_tacc_pci_info = {
    .base_name = TYPE_VIRTIO_TACC_PCI,
    .generic_name = "virtio-tacc-pci",
    .instance_size = sizeof(VirtIOTaccPCI),
    .instance_init = virtio_tacc_pci_instance_init,
    .class_init = virtio_tacc_pci_class_init,
};

static void virtio_tacc_pci_register(void)
{
    virtio_pci_types_register(&virtio_tacc_pci_info);
}

type_init(virtio_tacc_pci_register)
