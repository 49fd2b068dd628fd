"""The debug kernel's plumbing without booting it: KERNEL=debug in scripts/run-vm, the
config fragment scripts/debug-kernel.sh applies, and scripts/test-vm's verdict on a
debug boot's dmesg and kmemleak dump."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: str):
    loader = importlib.machinery.SourceFileLoader(name, str(ROOT / path))
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    loader.exec_module(mod)
    return mod


run_vm = _load("run_vm", "scripts/run-vm")
test_vm = _load("test_vm_script", "scripts/test-vm")


def test_kernel_debug_resolves_to_the_build_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(run_vm, "DEBUG_KERNEL_DIR", tmp_path)
    # not built: validation passes (make checks variables before building), a boot does not
    assert run_vm.resolve_kernel("debug", require_installed=False) == "debug"
    with pytest.raises(run_vm.ConfigError, match="scripts/debug-kernel.sh"):
        run_vm.resolve_kernel("debug")
    (tmp_path / "release").write_text("6.12.117-tacc-debug\n")
    image = tmp_path / "obj/arch/x86/boot/bzImage"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"")
    assert run_vm.resolve_kernel("debug") == "6.12.117-tacc-debug"
    assert run_vm.kernel_image("6.12.117-tacc-debug") == image
    assert run_vm.kernel_image("6.12.117+deb12-amd64") == Path("/boot/vmlinuz-6.12.117+deb12-amd64")
    cfg = run_vm.VMConfig(kernel="6.12.117-tacc-debug")
    argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
    assert argv[argv.index("-kernel") + 1] == str(image)
    assert argv[argv.index("-initrd") + 1].endswith("build/initramfs-6.12.117-tacc-debug.cpio.gz")


def test_fragment_has_the_checkers_and_what_the_vm_needs_built_in():
    lines = (ROOT / "scripts/debug-kernel/config.fragment").read_text().splitlines()
    on = {ln.split("=")[0] for ln in lines if ln.startswith("CONFIG_") and ln.endswith("=y")}
    for sym in ("KASAN", "KASAN_INLINE", "KFENCE", "PROVE_LOCKING", "DEBUG_OBJECTS",
                "DEBUG_KMEMLEAK", "FAULT_INJECTION", "FAILSLAB", "FAIL_PAGE_ALLOC",
                "FAULT_INJECTION_DEBUG_FS", "DEBUG_LIST", "DEBUG_INFO_BTF",
                "NET_9P_VIRTIO", "9P_FS", "OVERLAY_FS", "VIRTIO_PCI", "VIRTIO_CONSOLE",
                "DRM_ACCEL", "DRM_GEM_SHMEM_HELPER", "DRM_SCHED", "PCI_IOV", "INTEL_IOMMU",
                "IRQ_REMAP", "VFIO_PCI", "BPF_SYSCALL", "KPROBES", "PERF_EVENTS"):
        assert f"CONFIG_{sym}" in on, sym
    assert 'CONFIG_LOCALVERSION="-tacc-debug"' in lines
    # run-vm tells the debug kernel by its release suffix
    assert run_vm.DEBUG_KERNEL_SUFFIX == "-tacc-debug"


def test_debug_verdict_fails_on_reports_naming_tacc_only(tmp_path):
    (tmp_path / "dmesg.txt").write_text(
        "[ 1.0] ------------[ cut here ]------------\n"
        "[ 1.0] refcount_t: underflow; use-after-free.\n"
        "[ 1.0] WARNING: CPU: 0 PID: 3 at lib/refcount.c:28 refcount_warn_saturate+0x9a/0x100\n"
        "[ 1.0] Call Trace:\n[ 1.0]  <TASK>\n[ 1.0]  tacc_fence_release+0x10/0x40 [tacc]\n"
        "[ 1.0]  </TASK>\n"
        "[ 2.0] ======================================================\n"
        "[ 2.0] WARNING: possible circular locking dependency detected\n"
        "[ 2.0] Call Trace:\n[ 2.0]  <TASK>\n[ 2.0]  p9_client_rpc+0x1/0x2\n[ 2.0]  </TASK>\n")
    # a fault-injection test's saved dmesg: its allocation-failure warnings are expected
    (tmp_path / "dmesg-faults.txt").write_text(
        "[ 3.0] python3: page allocation failure: order:0, mode:0xcc0(GFP_KERNEL)\n"
        "[ 3.0] Call Trace:\n[ 3.0]  <TASK>\n[ 3.0]  tacc_ring_alloc+0x1/0x2 [tacc]\n"
        "[ 3.0]  </TASK>\n")
    (tmp_path / "kmemleak.txt").write_text(
        "unreferenced object 0xffff888003a1b000 (size 256):\n"
        "  backtrace (crc 1):\n    [<ffffffffc0012345>] tacc_bo_create+0x55/0x300 [tacc]\n")
    bad = test_vm.debug_kernel_check("debug", tmp_path)
    assert bad == ["dmesg.txt: refcount_t: underflow; use-after-free.",
                   "kmemleak.txt: kmemleak: unreferenced object 0xffff888003a1b000 (size 256):"]
    kept = (tmp_path / "debug-reports.txt").read_text()
    assert kept.count("#### ") == 4 and "possible circular locking" in kept


def test_debug_boot_scans_kmemleak_after_pytest_and_keeps_its_status(tmp_path):
    cmd = test_vm.debug_guest_cmd("pytest tests/vm", tmp_path)
    assert cmd.startswith("pytest tests/vm; st=$?;")  # guest-init keeps kmsg.txt
    assert cmd.count("echo scan > /sys/kernel/debug/kmemleak") == 2
    assert f"> {tmp_path}/kmemleak.txt" in cmd and cmd.endswith("exit $st")
    assert "debug" in test_vm.CONFIGS and test_vm.CONFIGS["debug"]["KERNEL"] == "debug"
    assert "debug" not in test_vm.DEFAULT_CONFIGS.split()


def test_debug_verdict_reads_the_kmsg_stream_once_per_report(tmp_path):
    """A report a test's `dmesg -C` removed from the ring is in the /dev/kmsg stream the
    debug boot keeps (the first full debug run lost a KASAN report so); one also in a saved
    dmesg counts once."""
    kasan = ["BUG: KASAN: slab-use-after-free in tacc_timedout_job+0x111c/0x12a0 [tacc]",
             "Read of size 8 at addr ffff888012345678 by task kworker/u4:1/77",
             "Call Trace:", " <TASK>", " tacc_timedout_job+0x111c/0x12a0 [tacc]", " </TASK>"]
    lock = ["WARNING: possible circular locking dependency detected",
            "Call Trace:", " <TASK>", " tacc_pmu_event_init+0x1/0x2 [tacc]", " </TASK>"]
    kmsg = "".join(f"3,{i},{293903118 + i},-;{ln}\n" + (" SUBSYSTEM=pci\n" if i == 0 else "")
                   for i, ln in enumerate(kasan + lock))
    (tmp_path / "kmsg.txt").write_text(kmsg + "3,99,12")  # a torn last record
    (tmp_path / "dmesg-before-faults.txt").write_text(
        "".join(f"[  293.9{i:05d}] {ln}\n" for i, ln in enumerate(lock)))
    assert test_vm.kmsg_as_dmesg("6,1,2000001,-;hello\n SUBSYSTEM=x\n") == \
        "[    2.000001] hello\n"
    bad = test_vm.debug_kernel_check("debug", tmp_path)
    assert sorted(bad) == ["dmesg-before-faults.txt: WARNING: possible circular locking "
                           "dependency detected",
                           "kmsg.txt: BUG: KASAN: slab-use-after-free in tacc_timedout_job"
                           "+0x111c/0x12a0 [tacc]"], bad


def test_containers_run_on_the_debug_kernel():
    """The debug kernel has what crun needs (user and pid namespaces) and what device_del
    needs (PCI hotplug: test_surprise_removal failed with "the PF did not go away" without
    it), so tests/vm/test_containers.py's skip without user namespaces is allowed on no
    boot."""
    frag = (ROOT / "scripts/debug-kernel/config.fragment").read_text().splitlines()
    for opt in ("USER_NS", "PID_NS", "HOTPLUG_PCI_PCIE", "HOTPLUG_PCI_ACPI"):
        assert f"CONFIG_{opt}=y" in frag, opt
    src = (ROOT / "tests/vm/test_containers.py").read_text()
    reason = re.search(r'NO_USERNS = "(.*)"', src).group(1)
    assert reason == test_vm.NO_USERNS_REASON
    assert not test_vm.ALLOWED_SKIPS_DEBUG.fullmatch(reason)
    assert not test_vm.ALLOWED_SKIPS.fullmatch(reason)


def test_dma_api_boot_lines_open_no_report(tmp_path):
    """DMA-API's boot line is not a report (it ran to the next stack's </TASK> and charged
    that stack's tacc frames to itself); its errors, which name driver and device, are."""
    (tmp_path / "dmesg.txt").write_text(
        "[ 0.1] DMA-API: preallocated 65536 debug entries\n"
        "[ 0.1] DMA-API: debugging enabled by kernel config\n"
        "[ 9.0] tacc 0000:01:00.0: probed\n"
        "[ 9.1] Call Trace:\n[ 9.1]  <TASK>\n[ 9.1]  tacc_probe+0x1/0x2 [tacc]\n"
        "[ 9.1]  </TASK>\n"
        "[ 10.0] DMA-API: tacc 0000:01:00.0: cacheline tracking EEXIST, overlapping mappings "
        "aren't supported\n"
        "[ 10.0] WARNING: CPU: 0 PID: 269 at kernel/dma/debug.c:601 add_dma_entry+0x3db/0x590\n"
        "[ 10.0] Call Trace:\n[ 10.0]  <TASK>\n[ 10.0]  tacc_bo_create_ioctl+0x1/0x2 [tacc]\n"
        "[ 10.0]  </TASK>\n")
    bad = test_vm.debug_kernel_check("debug", tmp_path)
    assert bad == ["dmesg.txt: DMA-API: tacc 0000:01:00.0: cacheline tracking EEXIST, "
                   "overlapping mappings aren't supported"], bad
