"""The runtime's ctypes mirror of the uAPI header equals the C layout (gcc, -I kernel/include)."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.runtime import uapi

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "kernel/include/uapi/drm/tacc_accel.h"


def _c_program() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "uapi/drm/tacc_accel.h"',
             "int main(void) {"]
    for st in uapi.STRUCTS:
        name = st.__name__
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        for fname, _ in st._fields_:
            lines.append(f'printf("off {name}.{fname} %zu\\n", offsetof(struct {name}, {fname}));')
    for name in uapi.IOCTLS:
        lines.append(f'printf("ioctl {name} %lu\\n", (unsigned long){name});')
    for name in uapi.CONSTANTS:
        lines.append(f'printf("const {name} %lu\\n", (unsigned long){name});')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("uapi")
    src, exe = d / "layout.c", d / "layout"
    src.write_text(_c_program())
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(ROOT / "kernel/include"), "-o", str(exe),
                    str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        kind, key, val = line.split()
        res[f"{kind} {key}"] = int(val)
    return res


def test_header_exists() -> None:
    assert HEADER.exists()


@pytest.mark.parametrize("st", uapi.STRUCTS, ids=lambda s: s.__name__)
def test_struct_layout(st: type[C.Structure], c_layout: dict[str, int]) -> None:
    name = st.__name__
    assert C.sizeof(st) == c_layout[f"size {name}"], f"sizeof(struct {name})"
    for fname, _ in st._fields_:
        assert getattr(st, fname).offset == c_layout[f"off {name}.{fname}"], f"{name}.{fname}"


def test_struct_fields_complete(c_layout: dict[str, int]) -> None:
    """Every field declared in the header's structs is mirrored (no field missing)."""
    import re

    text = HEADER.read_text()
    for st in uapi.STRUCTS:
        m = re.search(r"struct " + st.__name__ + r" \{(.*?)\};", text, re.S)
        assert m, st.__name__
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        cnames = re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
        assert cnames == [f for f, _ in st._fields_], st.__name__


def test_ioctl_numbers(c_layout: dict[str, int]) -> None:
    for name, val in uapi.IOCTLS.items():
        assert val == c_layout[f"ioctl {name}"], name


def test_constants(c_layout: dict[str, int]) -> None:
    for name, val in uapi.CONSTANTS.items():
        assert val == c_layout[f"const {name}"], name


def test_sample_ring_uapi() -> None:
    """The sample-ring ioctls follow the trace ring's and its structs are mirrored."""
    nr = {n: (v & 0xFF) - uapi.DRM_COMMAND_BASE for n, v in uapi.IOCTLS.items()
          if "SAMPLE" in n or "TRACE" in n}
    assert nr["DRM_IOCTL_TACC_SAMPLE_OPEN"] == nr["DRM_IOCTL_TACC_TRACE_CLOSE"] + 1
    assert nr["DRM_IOCTL_TACC_SAMPLE_ADVANCE"] == nr["DRM_IOCTL_TACC_SAMPLE_OPEN"] + 1
    assert nr["DRM_IOCTL_TACC_SAMPLE_CLOSE"] == nr["DRM_IOCTL_TACC_SAMPLE_ADVANCE"] + 1
    for st in (uapi.drm_tacc_sample_open, uapi.drm_tacc_sample_header,
               uapi.drm_tacc_sample_advance, uapi.drm_tacc_sample_close):
        assert st in uapi.STRUCTS
    # the device's write-back (struct tacc_ring_wb {prod, dropped}) lands on prod
    assert uapi.drm_tacc_sample_header.dropped.offset == uapi.drm_tacc_sample_header.prod.offset + 4
