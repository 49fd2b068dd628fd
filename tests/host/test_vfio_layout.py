"""tacc.vfio's ctypes mirror of <linux/vfio.h> against a C program compiled with the real
header (the tacc_hw.h values it uses are tacc.hw's: tests/host/test_hw_contract.py)."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.vfio import uapi

ROOT = Path(__file__).resolve().parents[2]

def _c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/vfio.h>",
             "int main(void) {"]
    for st in uapi.STRUCTS:
        name = st.__name__
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        for fname, _ in st._fields_:
            lines.append(f'printf("off {name}.{fname} %zu\\n", offsetof(struct {name}, {fname}));')
    for name in uapi.CONSTANTS:
        lines.append(f'printf("vfio {name} %llu\\n", (unsigned long long){name});')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if not shutil.which("gcc") or not Path("/usr/include/linux/vfio.h").exists():
        pytest.skip("gcc or linux-libc-dev's <linux/vfio.h> not installed")
    d = tmp_path_factory.mktemp("vfio")
    src, exe = d / "layout.c", d / "layout"
    src.write_text(_c_program())
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(ROOT / "kernel/include"), "-o",
                    str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (ln.rsplit(" ", 1) for ln in out.splitlines())}


@pytest.mark.parametrize("st", uapi.STRUCTS, ids=lambda s: s.__name__)
def test_vfio_struct_layout(st: type[C.Structure], c_values: dict[str, int]) -> None:
    name = st.__name__
    assert C.sizeof(st) == c_values[f"size {name}"], f"sizeof(struct {name})"
    for fname, _ in st._fields_:
        assert getattr(st, fname).offset == c_values[f"off {name}.{fname}"], f"{name}.{fname}"


def test_vfio_constants(c_values: dict[str, int]) -> None:
    assert len(uapi.CONSTANTS) > 30
    for name in uapi.CONSTANTS:
        assert getattr(uapi, name) == c_values[f"vfio {name}"], name
