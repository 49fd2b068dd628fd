"""ctypes layouts of tacc.counters.uapi against the real uAPI header (compiled)."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.counters import uapi

ROOT = Path(__file__).resolve().parents[2]
STRUCTS = {
    "drm_tacc_get_param": uapi.GetParam, "drm_tacc_bo_create": uapi.BoCreate,
    "drm_tacc_bo_info": uapi.BoInfo, "drm_tacc_operand": uapi.Operand,
    "drm_tacc_cmd": uapi.Cmd, "drm_tacc_submit": uapi.Submit, "drm_tacc_wait": uapi.Wait,
    "drm_tacc_gem_close": uapi.GemClose,
}
IOCTLS = {"DRM_IOCTL_TACC_GET_PARAM": uapi.IOCTL_GET_PARAM,
          "DRM_IOCTL_TACC_BO_CREATE": uapi.IOCTL_BO_CREATE,
          "DRM_IOCTL_TACC_BO_INFO": uapi.IOCTL_BO_INFO,
          "DRM_IOCTL_TACC_SUBMIT": uapi.IOCTL_SUBMIT, "DRM_IOCTL_TACC_WAIT": uapi.IOCTL_WAIT,
          "DRM_IOCTL_TACC_GEM_CLOSE": uapi.IOCTL_GEM_CLOSE}
CONSTS = {"DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET": uapi.PARAM_COUNTERS_MMAP_OFFSET,
          "DRM_TACC_MMAP_COUNTERS": uapi.COUNTERS_MMAP_OFFSET,
          "DRM_TACC_OP_COPY_H2D": uapi.OP_COPY_H2D, "DRM_TACC_OP_COPY_D2H": uapi.OP_COPY_D2H,
          "DRM_TACC_OP_TIMESTAMP": uapi.OP_TIMESTAMP, "DRM_TACC_BO_HOST": uapi.BO_HOST,
          "DRM_TACC_BO_DEVICE": uapi.BO_DEVICE}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_layouts_match_header(tmp_path: Path) -> None:
    lines = ["#include <stdio.h>", "#include <stddef.h>",
             f'#include "{ROOT}/kernel/include/uapi/drm/tacc_accel.h"', "int main(void) {"]
    for s, cls in STRUCTS.items():
        lines.append(f'printf("{s} @sizeof %zu\\n", sizeof(struct {s}));')
        for f, _ in cls._fields_:
            lines.append(f'printf("{s} {f} %zu\\n", offsetof(struct {s}, {f}));')
    for k in (*IOCTLS, *CONSTS):
        lines.append(f'printf("{k} %llu\\n", (unsigned long long)({k}));')
    lines.append("return 0; }")
    src = tmp_path / "l.c"
    src.write_text("\n".join(lines))
    subprocess.run(["cc", "-o", str(tmp_path / "l"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "l")], capture_output=True, text=True, check=True).stdout
    got = {" ".join(ln.split()[:-1]): int(ln.split()[-1]) for ln in out.splitlines()}
    for s, cls in STRUCTS.items():
        assert got[f"{s} @sizeof"] == C.sizeof(cls), s
        for f, _ in cls._fields_:
            assert got[f"{s} {f}"] == getattr(cls, f).offset, (s, f)
    for k, v in {**IOCTLS, **CONSTS}.items():
        assert got[k] == v, k
