"""tacc installs as a package: a wheel built from the tree (the contract module generated
and the C producer compiled by the build) into a clean virtualenv with no source tree
beside it runs ``tacc --help`` and ``accel-bpftrace --help`` and imports every module.

The new venv has no network: its dependencies come from the project venv's site-packages
(a .pth line; that directory's editable hook for tacc is not processed, so tacc can only
come from the wheel) and Debian's (bcc).  A missing optional engine names its extra."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORT_ALL = r"""
import importlib, pkgutil, sys, tacc
root = sys.argv[1]
assert not tacc.__file__.startswith(root), tacc.__file__
failed = []
names = [m.name for m in pkgutil.walk_packages(tacc.__path__, "tacc.")
         if not m.name.endswith(".__main__")]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - reported below
        failed.append(f"{name}: {e.__class__.__name__}: {e}")
import tacc.runtime._apiring, tacc.hw._contract
from tacc.bpftrace import bpfsrc
assert "tacc_ev" in bpfsrc.PRELUDE
print(len(names), "modules")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed (the package build compiles the C producer)")
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"  # what an sdist holds: the build reads nothing else
    for rel in ("pyproject.toml", "setup.py", "MANIFEST.in", "userspace/tacc",
                "kernel/include/tacc_hw.h", "kernel/include/tacc_virtio.h",
                "kernel/include/uapi/drm/tacc_accel.h"):
        p = ROOT / rel
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            shutil.copytree(p, dst, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "_contract.py", "*.egg-info"))
        else:
            shutil.copy2(p, dst)
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
                   check=True, timeout=300, cwd=tmp)
    shutil.rmtree(src)  # nothing of the tree is left beside the install
    env = tmp / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    str(env)], check=True, timeout=120)
    site = subprocess.run([str(env / "bin/python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    whl = next(wheels.glob("tacc-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install",
                    "-q", "--no-deps", "--no-index", str(whl)], check=True, timeout=300, cwd=tmp)
    return env


def test_commands_run_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    for cmd in ("tacc", "accel-bpftrace"):
        r = subprocess.run([str(venv / "bin" / cmd), "--help"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "usage:" in r.stdout
    r = subprocess.run([str(venv / "bin/tacc"), "--help"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    for sub in ("run", "stat", "trace", "timeline", "analyze", "export", "vfio", "pcie"):
        assert sub in r.stdout, sub


def test_every_module_imports_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    r = subprocess.run([str(venv / "bin/python"), "-c", IMPORT_ALL, str(ROOT)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert int(r.stdout.split()[0]) > 120, r.stdout


def test_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    """tacc query without duckdb: one line naming ``tacc[fleet]``, exit status 1."""
    (tmp_path / "duckdb.py").write_text("raise ImportError('not installed here')\n")
    exp = tmp_path / "exp"
    exp.mkdir()
    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.path.insert(0, sys.argv[1]); from tacc.cli import main;"
                        " raise SystemExit(main(['query', sys.argv[2], 'select 1']))",
                        str(tmp_path), str(exp)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "tacc[fleet]" in lines[0], r.stderr
