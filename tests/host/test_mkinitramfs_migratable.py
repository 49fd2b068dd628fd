"""scripts/mkinitramfs-migratable.sh against what the host's other processes do meanwhile:
a file that vanishes under its library scan (a .pyc temporary written beside it) is not
a failure, and a step that does fail names its line (run-vm prints the script's stderr)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/mkinitramfs-migratable.sh"
KVER = (ROOT / "build/kernel-version").read_text().strip() \
    if (ROOT / "build/kernel-version").exists() else ""

pytestmark = pytest.mark.skipif(
    not (ROOT / f"build/modules/{KVER}/tacc.ko").exists(),
    reason="make setup builds tacc.ko and the kernel's modules first")


def _shim(d: Path, name: str, body: str) -> None:
    p = d / name
    p.write_text(f"#!/bin/bash\n{body}\n")
    p.chmod(0o755)


def _run(tmp: Path, shims: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_ = tmp / "bin"
    bin_.mkdir()
    for name, body in shims.items():
        _shim(bin_, name, body)
    out = tmp / "initramfs.cpio.gz"
    r = subprocess.run([str(SCRIPT), KVER, str(out)], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}, timeout=300)
    return r, out


def test_a_file_vanishing_under_the_library_scan_is_not_a_failure(tmp_path: Path) -> None:
    # find as it ends when a file it listed is gone before it stats it: the rest of its
    # output, "No such file or directory" and status 1
    real = subprocess.run(["bash", "-c", "command -v find"], capture_output=True,
                          text=True).stdout.strip()
    r, out = _run(tmp_path, {"find": f'{real} "$@"; s=$?\n'
                                     'case "$*" in *.venv/lib*) echo "find: gone.pyc.123: '
                                     'No such file or directory" >&2; exit 1 ;; esac\n'
                                     'exit $s'})
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1_000_000  # busybox, python and its libraries, tacc.ko


def test_a_failing_step_names_its_line(tmp_path: Path) -> None:
    r, out = _run(tmp_path, {"cpio": "exit 1"})
    assert r.returncode != 0 and not out.exists()
    assert "mkinitramfs-migratable: failed at line" in r.stderr and "cpio" in r.stderr, r.stderr
