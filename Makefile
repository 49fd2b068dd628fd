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
ICOUNT ?= 1
MODPARAMS ?=
QEMU_ARGS ?=
KERNEL_ARGS ?=
CMD ?=
export IOMMU VFS MEM KERNEL SMP ICOUNT MODPARAMS QEMU_ARGS KERNEL_ARGS

# Bad variable values stop here, before anything runs, with one line.
ifeq ($(filter help clean distclean,$(MAKECMDGOALS)),)
BAD_VARS := $(shell IOMMU='$(IOMMU)' VFS='$(VFS)' MEM='$(MEM)' KERNEL='$(KERNEL)' SMP='$(SMP)' \
	ICOUNT='$(ICOUNT)' MODPARAMS='$(MODPARAMS)' /usr/bin/python3 scripts/run-vm --validate 2>&1)
ifneq ($(BAD_VARS),)
$(error $(BAD_VARS))
endif
endif

.PHONY: all setup run-vm test test-host test-device test-vm test-long test-debug bench lint checkpatch module qemu clean distclean help

all: setup

help:
	@sed -n '1,/^$$/p' README.md | head -20; echo; grep -E '^[a-z-]+:' Makefile | cut -d: -f1 | tr '\n' ' '; echo

setup:
	@scripts/setup.sh

run-vm: setup
	@[ "$$KERNEL" != debug ] || scripts/debug-kernel.sh
	@/usr/bin/python3 scripts/run-vm --cmd "$$CMD"

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

# The VM layer on the KASAN/lockdep/kmemleak kernel (built first: scripts/debug-kernel.sh)
test-debug: setup
	@scripts/test.sh debug

bench: setup
	@scripts/bench.sh

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
