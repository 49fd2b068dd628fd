"""tacc.hw, generated from the C headers, equals what a C compiler makes of them: every
integer constant and enum value, every one-argument macro, every struct's size and every
field's offset, every counter of the X-lists; and the generated module is current."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tacc import hw
from tacc.hw import gen

ROOT = Path(__file__).resolve().parents[2]
HEADERS = [ROOT / "kernel/include/tacc_hw.h", ROOT / "kernel/include/uapi/drm/tacc_accel.h",
           ROOT / "kernel/include/tacc_virtio.h"]
MACRO_ARGS = (0, 1, 3)


def _fields(prefix: str, fields: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(C member designator, offset relative to the struct) of every named field."""
    out = []
    for f in fields:
        if "fields" in f:
            base = f"{prefix}{f['name']}." if f["name"] else prefix
            out += [(n, f["offset"] + o) for n, o in _fields(base, f["fields"])]
            if f["name"]:
                out.append((prefix + f["name"], f["offset"]))
        else:
            out.append((prefix + f["name"], f["offset"]))
    return out


def _c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>"]
    lines += [f'#include "{h.relative_to(ROOT / "kernel/include")}"' for h in HEADERS]
    lines.append("int main(void) {")
    for name, v in hw.CONSTANTS.items():
        if isinstance(v, int) and not name.endswith("_H") and not name.endswith("_H_"):
            lines.append(f'printf("const {name} %llu\\n", (unsigned long long)({name}));')
    for name in hw.MACROS:
        for a in MACRO_ARGS:
            lines.append(f'printf("macro {name}({a}) %llu\\n", (unsigned long long)'
                         f"({name}({a})));")
    for name, s in hw.STRUCTS.items():
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        for member, _ in _fields("", s["fields"]):
            lines.append(f'printf("off {name}.{member} %zu\\n", '
                         f"offsetof(struct {name}, {member}));")
    for xl in hw.XLISTS:
        for entry in hw.XLISTS[xl]:
            lines.append(f'printf("x {xl}.{entry[0]} %d\\n", (int)TACC_CNT_{entry[0]});')
    lines.append("return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed")
    d = tmp_path_factory.mktemp("hw")
    src, exe = d / "contract.c", d / "contract"
    src.write_text(_c_program())
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(ROOT / "kernel/include"), "-o",
                    str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (ln.rsplit(" ", 1) for ln in out.splitlines())}


def test_generated_module_is_current() -> None:
    """The installed tacc.hw._contract is what the headers of this tree generate (run
    scripts/setup.sh after editing a header)."""
    text = (Path(hw.__file__).parent / "_contract.py").read_text()
    assert text == gen.generate(HEADERS)


def test_constants(c_values: dict[str, int]) -> None:
    ints = {k: v for k, v in hw.CONSTANTS.items() if f"const {k}" in c_values}
    # what the tools rely on is there: registers, opcodes, faults, ioctls, link, records
    for want in ("TACC_REG_ID", "TACC_OP_GEMM", "TACC_FAULT_VALID", "DRM_IOCTL_TACC_SUBMIT",
                 "TACC_LINK_MWR_OVERHEAD", "TACC_TRACE_REC_SIZE", "TACC_VIRTIO_ID"):
        assert want in ints, want
    assert len(ints) > 400, len(ints)
    for k, v in ints.items():
        assert v & 0xFFFF_FFFF_FFFF_FFFF == c_values[f"const {k}"], k


def test_macros(c_values: dict[str, int]) -> None:
    assert {"TACC_QUEUE_BASE", "TACC_REG_CTX_PTBR", "TACC_MSIX_QUEUE"} <= set(hw.MACROS)
    for name in hw.MACROS:
        for a in MACRO_ARGS:
            assert getattr(hw, name)(a) == c_values[f"macro {name}({a})"], f"{name}({a})"


def test_struct_layouts(c_values: dict[str, int]) -> None:
    import ctypes

    assert len(hw.STRUCTS) > 40
    for name, s in hw.STRUCTS.items():
        assert s["size"] == c_values[f"size {name}"], f"sizeof(struct {name})"
        assert ctypes.sizeof(hw.struct(name)) == s["size"], name
        for member, off in _fields("", s["fields"]):
            assert off == c_values[f"off {name}.{member}"], f"{name}.{member}"


def test_record_dtypes(c_values: dict[str, int]) -> None:
    for name in ("tacc_trace_rec", "tacc_tlp_rec", "tacc_cqe", "tacc_sample_hdr"):
        dt = hw.dtype(name)
        assert dt.itemsize == c_values[f"size {name}"], name
        for f in dt.names:
            assert dt.fields[f][1] == c_values[f"off {name}.{f}"], f"{name}.{f}"


def test_counter_lists(c_values: dict[str, int]) -> None:
    assert len(hw.FUNC_COUNTERS) > 40 and len(hw.GLOBAL_COUNTERS) > 15
    for xl, d in (("TACC_FUNC_COUNTERS", hw.FUNC_COUNTERS),
                  ("TACC_GLOBAL_COUNTERS", hw.GLOBAL_COUNTERS)):
        for name, slot in d.items():
            assert slot == c_values[f"x {xl}.{name}"], name


def test_ioctl_names() -> None:
    names = hw.ioctl_names()
    assert names[hw.DRM_IOCTL_TACC_SUBMIT & 0xFF] == "SUBMIT"
    assert names[hw.DRM_COMMAND_BASE + hw.DRM_TACC_GET_PARAM] == "GET_PARAM"
    assert len(names) == len(hw.IOCTLS)


def test_generator_follows_a_new_header_entry(tmp_path: Path) -> None:
    """A register, an opcode, a struct and a counter added to a header appear with no
    edit to the generator (how the next hardware version lands)."""
    extra = tmp_path / "extra.h"
    extra.write_text("""
#define TACC_REG_NEW_THING\t0x900\t/* RW */
enum tacc_new_op { TACC_OP_NEW_A = 20, TACC_OP_NEW_B, };
struct tacc_new_rec { __u8 kind; __u32 n; __u64 t[2]; };
#define TACC_NEW_COUNTERS(X) \\
\tX(new_one, 2, "events", "a new one (really)") \\
\tX(new_two, 3, "bytes", "a second")
#define TACC_NEW_SLOT(i)\t(0x20 + (i) * sizeof(struct tacc_new_rec))
""")
    ns: dict[str, Any] = {}
    exec(gen.generate([*HEADERS, extra]), ns)  # noqa: S102 - our generated module
    assert ns["TACC_REG_NEW_THING"] == 0x900 and ns["TACC_OP_NEW_B"] == 21
    assert ns["STRUCTS"]["tacc_new_rec"]["size"] == 24
    assert [f["offset"] for f in ns["STRUCTS"]["tacc_new_rec"]["fields"]] == [0, 4, 8]
    assert ns["XLISTS"]["TACC_NEW_COUNTERS"][0] == ("new_one", 2, "events",
                                                    "a new one (really)")
    assert ns["TACC_NEW_SLOT"](2) == 0x20 + 48


def test_sample_ring_uapi() -> None:
    """The sample-ring ioctls follow the trace ring's; the device's write-back (struct
    tacc_ring_wb {prod, dropped}) lands on the header's prod and dropped."""
    nr = {n: (v & 0xFF) - hw.DRM_COMMAND_BASE for n, v in hw.IOCTLS.items()
          if "SAMPLE" in n or "TRACE" in n}
    assert nr["SAMPLE_OPEN"] == nr["TRACE_CLOSE"] + 1
    assert nr["SAMPLE_ADVANCE"] == nr["SAMPLE_OPEN"] + 1
    assert nr["SAMPLE_CLOSE"] == nr["SAMPLE_ADVANCE"] + 1
    h = hw.struct("drm_tacc_sample_header")
    assert h.dropped.offset == h.prod.offset + 4
