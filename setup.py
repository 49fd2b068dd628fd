"""Build steps pyproject.toml cannot express: the device contract module generated from
the C headers (tacc.hw._contract) and the API ring's C producer (tacc.runtime._apiring)."""

import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup

root = Path(__file__).resolve().parent
headers = [root / "kernel/include/tacc_hw.h", root / "kernel/include/uapi/drm/tacc_accel.h",
           root / "kernel/include/tacc_virtio.h"]
if all(h.exists() for h in headers):  # a source tree (an sdist carries the generated module)
    subprocess.run([sys.executable, str(root / "userspace/tacc/hw/gen.py"),
                    str(root / "userspace/tacc/hw/_contract.py"), *map(str, headers)],
                   check=True)

setup(ext_modules=[Extension(
    "tacc.runtime._apiring", ["userspace/tacc/runtime/_apiring.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
)])
