"""The runtime's mirror of the hw 1.3 descriptor payloads equals kernel/include/tacc_hw.h."""

from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest
from tacc.runtime import cmdcodec as CC

ROOT = Path(__file__).resolve().parents[2]
# payload struct -> the union member of struct tacc_desc (or the struct itself)
MEMBERS = {CC.copy_args: "copy", CC.gemm_args: "gemm", CC.eltwise_args: "eltwise",
           CC.fence_args: "fence", CC.softmax_args: "softmax", CC.norm_args: "norm",
           CC.gather_args: "gather", CC.list_args: "list"}
CONSTS = {"TACC_OP_SOFTMAX": 10, "TACC_OP_NORM": 11, "TACC_OP_GATHER": 12, "TACC_OP_LIST": 13,
          "TACC_DT_FP32": CC.DT["float32"], "TACC_DT_BF16": CC.DT["bfloat16"],
          "TACC_DT_I32": CC.DT["int32"],
          "TACC_GEMM_F_TRANS_A": CC.GEMM_F_TRANS_A, "TACC_GEMM_F_TRANS_B": CC.GEMM_F_TRANS_B,
          "TACC_GEMM_F_BIAS": CC.GEMM_F_BIAS, "TACC_ELT_F_ROW_BCAST": CC.ELT_F_ROW_BCAST,
          "TACC_SOFTMAX_F_CAUSAL": CC.SOFTMAX_F_CAUSAL, "TACC_NORM_LAYER": CC.NORM_LAYER,
          "TACC_NORM_RMS": CC.NORM_RMS, "TACC_PATCH_SET32": CC.PATCH_SET32,
          "TACC_PATCH_ADD32": CC.PATCH_ADD32, "TACC_PATCH_ADD64": CC.PATCH_ADD64,
          "TACC_ELT_GELU": CC.ELT_OPS["gelu"], "TACC_ELT_SILU": CC.ELT_OPS["silu"],
          "TACC_ELT_EXP": CC.ELT_OPS["exp"], "TACC_ELT_CAST": CC.ELT_OPS["cast"],
          "TACC_LIST_PARAMS": 16}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>",
             '#include "tacc_hw.h"', "int main(void) {"]
    for st, mem in MEMBERS.items():
        for f, _ in st._fields_:
            lines.append(f'printf("{mem}.{f} %zu\\n", offsetof(struct tacc_desc, {mem}.{f})'
                         " - offsetof(struct tacc_desc, payload));")
        lines.append(f'printf("{mem} %zu\\n", sizeof(((struct tacc_desc *)0)->{mem}));')
    for st in (CC.tacc_desc, CC.tacc_list_patch):
        n = st.__name__
        for f, _ in st._fields_:
            lines.append(f'printf("{n}.{f} %zu\\n", offsetof(struct {n}, {f}));')
        lines.append(f'printf("{n} %zu\\n", sizeof(struct {n}));')
    for c in CONSTS:
        lines.append(f'printf("{c} %lu\\n", (unsigned long)({c}));')
    lines.append("return 0; }")
    d = tmp_path_factory.mktemp("hw")
    src, exe = d / "l.c", d / "l"
    src.write_text("\n".join(lines))
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(ROOT / "kernel/include"), "-o",
                    str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}


@pytest.mark.parametrize("st", list(MEMBERS), ids=lambda s: s.__name__)
def test_payload_layout(st: type[C.Structure], c_layout: dict[str, int]) -> None:
    mem = MEMBERS[st]
    for f, _ in st._fields_:
        assert getattr(st, f).offset == c_layout[f"{mem}.{f}"], f"{mem}.{f}"
    assert C.sizeof(st) == c_layout[mem], mem


@pytest.mark.parametrize("st", [CC.tacc_desc, CC.tacc_list_patch], ids=lambda s: s.__name__)
def test_desc_layout(st: type[C.Structure], c_layout: dict[str, int]) -> None:
    n = st.__name__
    for f, _ in st._fields_:
        assert getattr(st, f).offset == c_layout[f"{n}.{f}"], f"{n}.{f}"
    assert C.sizeof(st) == c_layout[n]


def test_constants(c_layout: dict[str, int]) -> None:
    for name, val in CONSTS.items():
        assert c_layout[name] == val, name
