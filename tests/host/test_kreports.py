"""tacc.testing.kreports: cutting checker reports out of a debug kernel's dmesg and
kmemleak dump, and telling those that name tacc (they fail `make test-debug`)."""

from __future__ import annotations

from tacc.testing.kreports import dmesg_reports, kmemleak_reports, tacc_reports

KASAN_TACC = """\
[   52.100000] tacc 0000:01:00.0: ready
[   52.123456] ==================================================================
[   52.123999] BUG: KASAN: slab-use-after-free in tacc_ctx_get+0x1c/0x40 [tacc]
[   52.124000] Read of size 4 at addr ffff888012345678 by task irq/24-tacc/123
[   52.124002] CPU: 0 UID: 0 PID: 123 Comm: irq/24-tacc Not tainted 6.12.117-tacc-debug #1
[   52.124003] Call Trace:
[   52.124004]  <TASK>
[   52.124005]  dump_stack_lvl+0x5d/0x80
[   52.124006]  tacc_mmu_fault_thread+0x99/0x200 [tacc]
[   52.124007]  </TASK>
[   52.124009] Allocated by task 100:
[   52.124010]  __kmalloc_cache_noprof+0x1/0x2
[   52.124013] Freed by task 101:
[   52.124014]  kfree+0x1/0x2
[   52.124015] ==================================================================
[   52.200000] tacc 0000:01:00.0: next line
"""

LOCKDEP_9P = """\
[   60.000000] ======================================================
[   60.000001] WARNING: possible circular locking dependency detected
[   60.000002] 6.12.117-tacc-debug #1 Not tainted
[   60.000003] ------------------------------------------------------
[   60.000004] python3/200 is trying to acquire lock:
[   60.000005] ffff8880 (&p9_lock){+.+.}-{3:3}, at: p9_client_rpc+0x1/0x2
[   60.000006] stack backtrace:
[   60.000007] CPU: 0 UID: 0 PID: 200 Comm: tacc Not tainted 6.12.117-tacc-debug #1
[   60.000008] Call Trace:
[   60.000009]  <TASK>
[   60.000010]  dump_stack_lvl+0x5d/0x80
[   60.000011]  p9_client_rpc+0x1/0x2
[   60.000012]  </TASK>
"""

WARN_REFCOUNT = """\
[   70.000000] ------------[ cut here ]------------
[   70.000001] refcount_t: underflow; use-after-free.
[   70.000002] WARNING: CPU: 0 PID: 300 at lib/refcount.c:28 refcount_warn_saturate+0x9a/0x100
[   70.000003] Modules linked in: tacc
[   70.000004] Call Trace:
[   70.000005]  <TASK>
[   70.000006]  tacc_fence_release+0x10/0x40 [tacc]
[   70.000007]  </TASK>
[   70.000008] ---[ end trace 0000000000000000 ]---
"""

INJECTED = """\
[   80.000000] FAULT_INJECTION: forcing a failure.
[   80.000001] name failslab, interval 1, probability 0, space 0, times 1
[   80.000002] Call Trace:
[   80.000003]  <TASK>
[   80.000004]  tacc_bo_create+0x10/0x40 [tacc]
[   80.000005]  </TASK>
[   81.000000] python3: page allocation failure: order:4, mode:0xcc0(GFP_KERNEL)
[   81.000001] Call Trace:
[   81.000002]  <TASK>
[   81.000003]  tacc_ring_alloc+0x10/0x40 [tacc]
[   81.000004]  </TASK>
"""

KMEMLEAK = """\
unreferenced object 0xffff888003a1b000 (size 256):
  comm "python3", pid 250, jiffies 4294901234
  hex dump (first 32 bytes):
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00  ................
  backtrace (crc 1234abcd):
    [<ffffffff81234567>] kmemleak_alloc+0x4b/0x80
    [<ffffffff81345678>] __kmalloc_cache_noprof+0x2a0/0x3a0
    [<ffffffffc0012345>] tacc_bo_create+0x55/0x300 [tacc]
unreferenced object 0xffff888003a1c000 (size 64):
  comm "swapper/0", pid 1, jiffies 4294890000
  backtrace (crc 0):
    [<00000000a1b2c3d4>] kmemleak_alloc+0x4b/0x80
    [<00000000d4c3b2a1>] 0xffffffffc0054321
unreferenced object 0xffff888003a1d000 (size 32):
  comm "swapper/0", pid 1, jiffies 4294890000
  backtrace (crc 0):
    [<00000000a1b2c3d4>] kmemleak_alloc+0x4b/0x80
    [<00000000d4c3b2a1>] acpi_os_map_memory+0x1/0x2
"""


def test_kasan_report_is_one_report_naming_tacc():
    rs = dmesg_reports(KASAN_TACC)
    assert len(rs) == 1
    r = rs[0]
    assert r.kind.startswith("BUG: KASAN: slab-use-after-free in tacc_ctx_get")
    assert "Freed by task 101:" in r.text  # the allocation/free stacks belong to it
    assert r.lines[-1].startswith("=====")
    assert r.names_tacc
    assert tacc_reports(rs) == rs


def test_lockdep_report_outside_tacc_is_kept_but_does_not_fail():
    rs = dmesg_reports(LOCKDEP_9P)
    assert len(rs) == 1
    assert rs[0].kind == "WARNING: possible circular locking dependency detected"
    assert not rs[0].names_tacc  # "Comm: tacc" is a process name, not a tacc frame
    assert tacc_reports(rs) == []


def test_warn_refcount_names_tacc_but_modules_linked_in_alone_does_not():
    rs = dmesg_reports(WARN_REFCOUNT)
    assert len(rs) == 1 and rs[0].names_tacc
    no_frame = WARN_REFCOUNT.replace("tacc_fence_release+0x10/0x40 [tacc]", "dma_fence_put+0x1/0x2")
    assert not dmesg_reports(no_frame)[0].names_tacc


def test_injected_failures_are_expected_only_when_asked():
    rs = dmesg_reports(INJECTED)
    assert [r.kind for r in rs] == [
        "FAULT_INJECTION: forcing a failure.",
        "python3: page allocation failure: order:4, mode:0xcc0(GFP_KERNEL)"]
    assert all(r.injected and r.names_tacc for r in rs)
    assert tacc_reports(rs, allow_injected=True) == []
    assert len(tacc_reports(rs)) == 2


def test_reports_in_sequence_are_all_found():
    rs = dmesg_reports(KASAN_TACC + LOCKDEP_9P + WARN_REFCOUNT)
    assert len(rs) == 3
    assert len(tacc_reports(rs)) == 2


def test_kmemleak_objects_naming_tacc_including_an_unloaded_module_frame():
    rs = kmemleak_reports(KMEMLEAK)
    assert len(rs) == 3
    assert [r.names_tacc for r in rs] == [True, True, False]
    assert rs[0].kind == "kmemleak: unreferenced object 0xffff888003a1b000 (size 256):"
