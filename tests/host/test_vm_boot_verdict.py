"""scripts/test-vm's verdict on a boot's kernel log: a warning anywhere in the boot fails
it, even one a test cleared from the ring with `dmesg -C` (guest-init streams /dev/kmsg to
kmsg.txt from boot on), and the stall and list corruption reports count too."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: str) -> Any:
    loader = importlib.machinery.SourceFileLoader(name, str(ROOT / path))
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    loader.exec_module(mod)
    return mod


test_vm = _load("test_vm_verdict", "scripts/test-vm")

WARN = ["WARNING: CPU: 0 PID: 1234 at drivers/accel/tacc/tacc_job.c:321 "
        "tacc_job_timedout+0x51/0x90 [tacc]",
        "Modules linked in: tacc(OE) gpu_sched drm_shmem_helper",
        "Call Trace:", " <TASK>", " tacc_job_timedout+0x51/0x90 [tacc]", " </TASK>"]
CLEAN = "[    0.000000] Linux version 6.12.117+deb12-amd64\n[   70.1] tacc 0000:01:00.0: ok\n"


def _kmsg(lines: list[str], first_seq: int = 0) -> str:
    return "".join(f"4,{first_seq + i},{70_000_000 + i},-;{ln}\n SUBSYSTEM=pci\n"
                   for i, ln in enumerate(lines))


@pytest.mark.parametrize("line", [
    WARN[0],
    "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
    "rcu: INFO: rcu_sched self-detected stall on CPU",
    "list_del corruption. prev->next should be ffff888003a1b000, but was dead000000000100",
    "list_del corruption, ffff888003a1b000->next is NULL",
])
def test_the_patterns_catch_each_report(line: str) -> None:
    assert test_vm.bad_dmesg_lines(f"[  12.5] {line}\n") == [f"[  12.5] {line}"]


def test_a_warning_cleared_from_the_ring_still_fails(tmp_path: Path) -> None:
    (tmp_path / "dmesg.txt").write_text(CLEAN)  # after a test's `dmesg -C`
    (tmp_path / "kmsg.txt").write_text(_kmsg(["tacc 0000:01:00.0: ok", *WARN]) + "4,99,7")
    logged, bad = test_vm.boot_log(tmp_path)
    assert logged
    assert [ln.split("] ", 1)[1] for ln in bad] == [WARN[0], "Call Trace:"]


def test_a_report_in_both_logs_is_listed_once(tmp_path: Path) -> None:
    (tmp_path / "dmesg.txt").write_text("".join(f"[   70.00000{i}] {ln}\n"
                                                for i, ln in enumerate(WARN)))
    (tmp_path / "kmsg.txt").write_text(_kmsg(WARN))
    assert len(test_vm.boot_log(tmp_path)[1]) == 2


def test_no_log_at_all_is_not_a_clean_boot(tmp_path: Path) -> None:
    assert test_vm.boot_log(tmp_path) == (False, [])


def _fake_boot(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    """run_vm.run replaced by a boot whose tests all pass and whose guest wrote ``files``."""
    junit = ('<testsuites><testsuite name="pytest" tests="1">'
             '<testcase classname="tests.vm.test_x" name="test_ok"/></testsuite></testsuites>')

    def run(cfg: Any, cmd: str, run_dir: Path, echo: bool = True) -> int:
        out = run_dir / "out"
        out.mkdir(parents=True, exist_ok=True)
        (out / "junit.xml").write_text(junit)
        for name, text in files.items():
            (out / name).write_text(text)
        return 0

    monkeypatch.setattr(test_vm.run_vm, "run", run)
    monkeypatch.setattr(test_vm.run_vm, "check_prerequisites", lambda cfg: None)


@pytest.mark.parametrize("files,status", [
    ({"dmesg.txt": CLEAN, "kmsg.txt": _kmsg(["tacc 0000:01:00.0: ok"])}, 0),
    ({"dmesg.txt": CLEAN, "kmsg.txt": _kmsg(WARN)}, 1),  # the planted WARN, cleared from the ring
    ({"dmesg.txt": CLEAN + "[  99.1] " + WARN[0] + "\n"}, 1),  # no stream: the ring still counts
])
def test_a_planted_warn_fails_the_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       files: dict[str, str], status: int) -> None:
    _fake_boot(monkeypatch, files)
    env = {"IOMMU": "strict", "VFS": "0", "KERNEL": ""}
    st = test_vm.run_config("strict", env, ["tests/vm/test_platform.py"], tmp_path)
    assert st == status


def test_guest_init_streams_the_kernel_log_on_every_boot() -> None:
    init = (ROOT / "scripts/guest-init.sh").read_text()
    start = init.index('cat /dev/kmsg > "$out/kmsg.txt"')
    assert start < init.index('insmod "$ko"')  # before the driver loads
    assert "kill $kmsg_pid" in init[init.index("finish() {"):]
