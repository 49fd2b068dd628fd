"""scripts/run-vm: variable validation and exit-status decoding (no VM)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def _load():
    loader = importlib.machinery.SourceFileLoader("run_vm", str(ROOT / "scripts/run-vm"))
    spec = importlib.util.spec_from_loader("run_vm", loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_vm"] = mod  # dataclasses look their module up
    loader.exec_module(mod)
    return mod


run_vm = _load()


def validate(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--validate"],
        env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize(
    ("var", "value", "accepted"),
    [
        ("IOMMU", "bogus", "strict, lazy, pt, off"),
        ("KERNEL", "9.9", "6.12.N"),
        ("VFS", "9", "0 to 4"),
        ("VFS", "-1", "0 to 4"),
        ("MEM", "lots", "1024M or 2G"),
        ("MEM", "64M", "512M or more"),
        ("ICOUNT", "2", "1 (-icount"),
        ("SMP", "0", "1 to 8"),
    ],
)
def test_bad_value_one_clear_line(var: str, value: str, accepted: str) -> None:
    r = validate(**{var: value})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"run-vm: {var}={value}")
    assert accepted in lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("iommu", ["strict", "lazy", "pt", "off"])
def test_good_values_accepted(iommu: str) -> None:
    r = validate(IOMMU=iommu, VFS="4", MEM="1024M", KERNEL="6.12.117")
    assert r.returncode == 0, r.stderr


def test_iommu_modes_reach_qemu_and_kernel(tmp_path: Path) -> None:
    for mode, dev, arg in [("strict", True, "iommu.strict=1"), ("lazy", True, "iommu.strict=0"),
                           ("pt", True, "iommu.passthrough=1"), ("off", False, "intel_iommu=off")]:
        cfg = run_vm.VMConfig.from_env({"IOMMU": mode, "KERNEL": "6.12.117"},
                                       require_installed=False)
        argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
        assert ("intel-iommu,intremap=on" in argv) == dev
        assert arg in argv[argv.index("-append") + 1]


@given(st.integers(min_value=0, max_value=254))
def test_exit_status_roundtrip(status: int) -> None:
    # isa-debug-exit: the guest writes status + 1, QEMU exits (v << 1) | 1.
    rc = ((status + 1) << 1) | 1
    assert run_vm.decode_status(rc, None) == status


@given(st.one_of(st.none(), st.integers(min_value=0, max_value=254)))
def test_qemu_failure_is_never_success(sentinel: int | None) -> None:
    # QEMU's own failure exits 1 (= "guest wrote 0"): never read as success
    # unless the guest printed its sentinel line.
    got = run_vm.decode_status(1, sentinel)
    assert got == (sentinel if sentinel is not None else 125)
    assert run_vm.decode_status(0, None) != 0


def test_module_importable_with_stdlib_only() -> None:
    # run-vm must work before the venv exists.
    code = "import ast,sys; ast.parse(open(sys.argv[1]).read())"
    r = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "scripts/run-vm")],
                       capture_output=True, timeout=30)
    assert r.returncode == 0


@pytest.mark.parametrize(("var", "value"), [("IOMMU", "bogus"), ("KERNEL", "9.9"), ("VFS", "7")])
def test_make_run_vm_bad_value_stops_first(var: str, value: str) -> None:
    # `make run-vm` checks the variables before any set-up step runs.
    r = subprocess.run(["make", "-s", "run-vm", f"{var}={value}", "CMD=true"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{var}={value}" in lines[0] and "accepted" in lines[0], r.stderr
    assert r.stdout == ""
