# Trimmed x86_64 device set for the tacc VM harness and qtest
# (used with --without-default-devices --with-devices-x86_64=tacc).
CONFIG_Q35=y
CONFIG_VTD=y
CONFIG_PCIE_PORT=y
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_9P=y
CONFIG_VIRTIO_BLK=y
CONFIG_VIRTIO_NET=y
CONFIG_ISA_DEBUG=y
CONFIG_SERIAL=y
CONFIG_SERIAL_ISA=y
CONFIG_SERIAL_PCI=y
CONFIG_TACC=y
# a nested guest gets a VF of the test VM with -device vfio-pci
# (scripts/run-vm PASSTHROUGH=, docs/vfio.md "Nested guest")
CONFIG_VFIO=y
CONFIG_VFIO_PCI=y
CONFIG_VIRTIO_SERIAL=y
# scripts/run-vm NVME=1: a scratch NVMe disk (the storage of tacc run load)
CONFIG_NVME_PCI=y
# nvme's SPDM responder socket: QEMU 10.0's NVME_PCI does not select it, and
# --without-default-devices ignores its `default y` (undefined spdm_socket_* at link)
CONFIG_SPDM_SOCKET=y
