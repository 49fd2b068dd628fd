# tacc: `make run-vm` boots the test VM, `make test` runs every test layer.
# Both install and build what they need first (scripts/setup.sh, idempotent).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

# Variables a kernel developer changes (see README): passed to scripts/run-vm.
IOMMU ?= strict
VFS ?= 0
MEM ?= 2G
KERNEL ?=
SMP ?= 1
VIRTIO ?= 0
ICOUNT ?= 1
MODPARAMS ?=
QEMU_ARGS ?=
KERNEL_ARGS ?=
CMD ?=
NODES ?= 1
PYDISK ?= 1
NVME ?= 0
MIGRATE ?= 0
export IOMMU VFS MEM KERNEL SMP VIRTIO ICOUNT MODPARAMS QEMU_ARGS KERNEL_ARGS NODES PYDISK NVME MIGRATE
# CMD goes to the guest as typed: $(value) stops make expanding `$(mktemp)` or `$f`, and
# scripts/run-vm --make-cmd turns make's escape `$$` into `$` (README: `$$TACC_VM_OUT`).
export TACC_MAKE_CMD = $(value CMD)

# Bad variable values stop here, before anything runs, with one line.
ifeq ($(filter help clean distclean,$(MAKECMDGOALS)),)
BAD_VARS := $(shell IOMMU='$(IOMMU)' VFS='$(VFS)' MEM='$(MEM)' KERNEL='$(KERNEL)' SMP='$(SMP)' \
	VIRTIO='$(VIRTIO)' ICOUNT='$(ICOUNT)' MODPARAMS='$(MODPARAMS)' NODES='$(NODES)' PYDISK='$(PYDISK)' NVME='$(NVME)' \
	MIGRATE='$(MIGRATE)' /usr/bin/python3 scripts/run-vm --validate 2>&1)
ifneq ($(BAD_VARS),)
$(error $(BAD_VARS))
endif
endif

.PHONY: all setup run-vm test test-host test-device test-vm test-long test-debug bench lint checkpatch module qemu clean distclean help fixtures mutation fuzz

all: setup

help:
	@echo 'tacc: make TARGET [VARIABLE=value ...]   (README.md has the details)'
	@echo
	@echo 'targets:'
	@echo '  run-vm        boot the test VM: a shell on the serial console (Ctrl-A x quits), or CMD'
	@echo '  test          every test layer (host, device, vm) with one verdict'
	@echo '  test-host test-device test-vm    one layer; test-long: the heavy runs'
	@echo '  setup         install and build everything (run by the others first)'
	@echo '  fixtures      record real captures for the host tests, in the VM (tests/host/data/fixtures)'
	@echo '  mutation      mutation testing of capture/timeline/analyze/session (MODULE=capture SAMPLE=400 ...)'
	@echo '  bench lint qemu clean distclean fuzz (FUZZ_S=seconds: QEMU generic-fuzz on the device)'
	@echo
	@echo 'variables (run-vm, test-vm):'
	@echo '  IOMMU         strict | lazy | pt | off: guest IOMMU mode (default strict)'
	@echo '  VFS           0..4: SR-IOV VFs enabled at boot (default 0)'
	@echo '  MEM           guest memory, e.g. 1024M, 4G, at least 512M (default 2G)'
	@echo '  KERNEL        6.12.N[+deb12-amd64]: guest kernel (default scripts/kernel.pin)'
	@echo '  SMP           1..8: vCPUs (default 1)'
	@echo '  VIRTIO        1 | 0: add a virtio-tacc-pci function (docs/virtio.md; default 0)'
	@echo '  ICOUNT        1 | 0: -icount shift=0,sleep=off (virtual time) or host time (default 1)'
	@echo '  MODPARAMS     "name=value ...": tacc.ko module parameters'
	@echo '  QEMU_ARGS     extra QEMU arguments, e.g. "-trace tacc_*"'
	@echo '  KERNEL_ARGS   extra guest kernel command line'
	@echo '  NODES         run-vm: 1..4 VMs side by side on a loopback-only network (docs/cluster.md)'
	@echo '  PYDISK        1 | 0: the guest Python trees from disk images (build/*.img) or over 9p (default 1)'
	@echo '  NVME          1 | 0: an NVMe scratch disk (sparse image, $$TACC_NVME_DEV in the guest; default 0)'
	@echo '  MIGRATE       0 | 1 | bad: run-vm: a VM that moves to a second QEMU when CMD runs tacc-vm-migrate (docs/hardware.md section 15)'
	@echo '  CMD           run-vm: run this in the guest instead of a shell (as typed; $$$$ for $$)'
	@echo '  PYTEST_ARGS   test layers: extra pytest arguments, split like a shell: -k "capture and format" -x'
	@echo '  TEST_VM_CONFIGS  test-vm: configurations to boot, e.g. "strict pt" (scripts/test-vm)'

setup:
	@scripts/setup.sh

run-vm: setup
	@[ "$$KERNEL" != debug ] || scripts/debug-kernel.sh
	@.venv/bin/python scripts/guest-pyc
	@/usr/bin/python3 scripts/run-vm --make-cmd

test: setup
	@scripts/test.sh

test-host: setup
	@scripts/test.sh host

test-device: setup
	@scripts/test.sh device

test-vm: setup
	@scripts/test.sh vm

test-long: setup
	@TACC_LONG=1 scripts/test.sh long debug
	@scripts/fuzz.sh 1800

# QEMU's coverage-guided fuzzer on the device (clang/libFuzzer build, not part of setup)
FUZZ_S ?= 60
fuzz: setup
	@scripts/fuzz.sh $(FUZZ_S)

# Mutation testing (mutmut) of capture, timeline, analyze and taccd's session with the host
# tests: MODULE= ONLY= TESTS= JOBS= SAMPLE= (scripts/mutation, docs/measurements.md)
mutation: setup
	@scripts/mutation

# The VM layer on the KASAN/lockdep/kmemleak kernel (built first: scripts/debug-kernel.sh)
test-debug: setup
	@scripts/test.sh debug

bench: setup
	@scripts/bench.sh

# Real captures for the host layer (tests/host/data/fixtures/RECORDED.json says how)
fixtures: setup
	@/usr/bin/python3 scripts/record-fixtures

module: setup

qemu:
	@scripts/build-qemu.sh

lint: setup
	@$(VENV)/bin/ruff check userspace tests tools
	@$(MAKE) -s -C kernel checkpatch KVER=$$(cat build/kernel-version)

checkpatch: lint

clean:
	-$(MAKE) -s -C kernel clean KVER=$$(cat build/kernel-version 2>/dev/null) 2>/dev/null
	rm -rf build/test-results build/modules build/initramfs-*

distclean: clean
	rm -rf build $(VENV)
