"""The Python sources stay ruff clean (pyproject.toml's rules)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    r = subprocess.run(
        [ruff, "check", "--output-format", "concise", "userspace", "tests", "tools",
         "scripts/run-vm", "scripts/test-vm"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
