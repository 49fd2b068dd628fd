"""tacc_virtio.h against the Python driver's struct formats (tacc.testing.virtiodev):
the header is compiled, every structure's size and its fields' offsets compared."""

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from tacc import hw
from tacc.testing import virtiodev as vd

HDR = Path(__file__).resolve().parents[2] / "kernel" / "include"

# struct name -> (Python format, field names in order)
STRUCTS = {
    "tacc_virtio_hdr": (vd.HDR, ["type", "version", "flags", "ctx", "tag"]),
    "tacc_virtio_resp": (vd.RESP, ["status", "rsvd", "value"]),
    "tacc_virtio_bo_create": (vd.BO_CREATE, ["size", "flags", "nr_ents"]),
    "tacc_virtio_mem_entry": (vd.MEM_ENT, ["addr", "length", "padding"]),
    "tacc_virtio_vm_bind": (vd.VM_BIND, ["handle", "flags", "va", "offset", "size"]),
    "tacc_virtio_vm_unbind": (vd.VM_UNBIND, ["va", "size"]),
    "tacc_virtio_trace_setup": (vd.TRACE_SETUP, ["base", "wb", "entries", "enable"]),
    "tacc_virtio_job": (vd.JOB, ["ctx", "ring", "ncmds", "seqno", "tag", "rsvd"]),
    "tacc_virtio_submit_resp": (vd.SUBMIT_RESP, ["status", "njobs", "failed", "rsvd"]),
    "tacc_virtio_job_status": (vd.JOB_STATUS, ["seqno", "status", "index", "rsvd"]),
    "tacc_virtio_fence": (vd.FENCE, ["seqno", "status", "failed"]),
    "tacc_virtio_config": (vd.CONFIG, ["version", "caps", "func", "num_contexts", "num_rings",
                                       "max_job_cmds", "devmem_size", "page_entries",
                                       "rsvd"]),
}


def offsets(fmt: struct.Struct) -> list[int]:
    out, off = [], 0
    for ch in fmt.format.lstrip("<"):
        out.append(off)
        off += struct.calcsize("<" + ch)
    return out


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[int]]:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "tacc_virtio.h"',
             "int main(void) {"]
    for name, (_, fields) in STRUCTS.items():
        args = ", ".join([f"sizeof(struct {name})"] +
                         [f"offsetof(struct {name}, {f})" for f in fields])
        lines.append(f'printf("{name}' + " %zu" * (len(fields) + 1) + f'\\n", {args});')
    lines.append('printf("tacc_virtio_submit %zu\\n", sizeof(struct tacc_virtio_submit));')
    lines.append("return 0; }")
    d = tmp_path_factory.mktemp("vlayout")
    (d / "l.c").write_text("\n".join(lines))
    subprocess.run([gcc, "-Wall", "-Werror", "-I", str(HDR), "-o", str(d / "l"), str(d / "l.c")],
                   check=True)
    out = subprocess.run([str(d / "l")], check=True, capture_output=True, text=True).stdout
    return {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in out.splitlines()}


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_matches_c(c_layout: dict[str, list[int]], name: str) -> None:
    fmt, _ = STRUCTS[name]
    size, *offs = c_layout[name]
    assert size == fmt.size
    assert offs == offsets(fmt)


def test_submit_header(c_layout: dict[str, list[int]]) -> None:
    assert c_layout["tacc_virtio_submit"] == [vd.SUBMIT.size]


def test_constants_parsed_from_the_header() -> None:
    assert hw.TACC_VIRTIO_PCI_DEVICE_ID == 0x1040 + hw.TACC_VIRTIO_ID
    assert hw.TACC_VIRTIO_ID <= 63 and hw.TACC_VIRTIO_ID not in (61, 62, 63)
    assert hw.TACC_VIRTIO_SUBMIT == 0x100 and hw.TACC_VIRTIO_ERR_VERSION == 9
