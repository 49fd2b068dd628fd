"""tacc.vfio's C contracts: the ctypes mirror of <linux/vfio.h> and the tacc_hw.h values
the user-space driver uses (parsed #defines and evaluated function-like macros), both
against a C program compiled with the real headers."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.vfio import driver, uapi
from tacc.vfio.hw import HW, macro, macros

ROOT = Path(__file__).resolve().parents[2]
# tacc_hw.h names the driver uses (grep'd from its source, so a new use is checked too)
USED = sorted({w for src in ("driver.py", "workload.py")
               for w in __import__("re").findall(r"HW\.(TACC_\w+)",
                                                 (ROOT / "userspace/tacc/vfio" / src).read_text())})
MACRO_CALLS = [("TACC_QUEUE_BASE", q) for q in range(4)] + [
    ("TACC_REG_CTX_PTBR", c) for c in (0, 1, 15)] + [("TACC_MSIX_QUEUE", 0)]


def _c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/vfio.h>",
             '#include "tacc_hw.h"', "int main(void) {"]
    for st in uapi.STRUCTS:
        name = st.__name__
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        for fname, _ in st._fields_:
            lines.append(f'printf("off {name}.{fname} %zu\\n", offsetof(struct {name}, {fname}));')
    for name in uapi.CONSTANTS:
        lines.append(f'printf("vfio {name} %llu\\n", (unsigned long long){name});')
    for name in USED:
        lines.append(f'printf("hw {name} %llu\\n", (unsigned long long){name});')
    for name, arg in MACRO_CALLS:
        lines.append(f'printf("macro {name}({arg}) %llu\\n", (unsigned long long){name}({arg}));')
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


def test_tacc_hw_values(c_values: dict[str, int]) -> None:
    assert len(USED) > 30, USED
    for name in USED:
        assert getattr(HW, name) == c_values[f"hw {name}"], name


def test_tacc_hw_macros(c_values: dict[str, int]) -> None:
    assert {"TACC_QUEUE_BASE", "TACC_REG_CTX_PTBR", "TACC_MSIX_QUEUE"} <= set(macros())
    for name, arg in MACRO_CALLS:
        assert macro(name, arg) == c_values[f"macro {name}({arg})"], f"{name}({arg})"
    assert driver.QBASE == c_values["macro TACC_QUEUE_BASE(0)"]


def test_macro_rejects_what_it_cannot_evaluate() -> None:
    with pytest.raises(KeyError):
        macro("TACC_NO_SUCH_MACRO", 1)
