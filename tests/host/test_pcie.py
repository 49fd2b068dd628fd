"""tacc.pcie: the TLP record layout equals the C header, pcapng round trip, the Perfetto
export's read flows, and the real tshark decoding a pcapng with tools/tacc-tlp.lua."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tacc.pcie import CPLD, F_UP, LINKTYPE, MRD, MWR, TLP_DTYPE, pcapng, perfetto, summary

ROOT = Path(__file__).resolve().parents[2]


def test_record_layout_matches_tacc_hw_h(tmp_path: Path) -> None:
    names = list(TLP_DTYPE.names or ())
    prog = tmp_path / "off.c"
    prog.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
                    '#include "tacc_hw.h"\nint main(void) {\n'
                    + "".join(f'printf("{n} %zu %zu\\n", offsetof(struct tacc_tlp_rec, {n}),'
                              f" sizeof(((struct tacc_tlp_rec *)0)->{n}));\n" for n in names)
                    + 'printf("size %zu\\n", sizeof(struct tacc_tlp_rec));\nreturn 0; }\n')
    exe = tmp_path / "off"
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(ROOT / "kernel/include"), "-o",
                    str(exe), str(prog)], check=True)
    out = dict(ln.split(" ", 1) for ln in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    assert out.pop("size") == str(TLP_DTYPE.itemsize)
    for n in names:
        off, size = TLP_DTYPE.fields[n][1], TLP_DTYPE.fields[n][0].itemsize
        assert out[n] == f"{off} {size}", n


def synth() -> np.ndarray:
    """One 1 KiB read (2 requests of 512 B, 16 completions of 64 B) and one 256 B write."""
    r = np.zeros(19, TLP_DTYPE)
    i = 0
    for q in range(2):
        r[i] = (1000 * i, 0x10000 + 512 * q, 5, i, 512, 24, 8, 0, q, 128, 0, 0x20, MRD,
                F_UP, 0xFF, 0, 0, 1, 0, 0, 1, 0)
        i += 1
        for c in range(8):
            a = 0x10000 + 512 * q + 64 * c
            r[i] = (1000 * i + 600_000, a, 5, i, 64, 84, 8, 0x10, q, 16, 512 - 64 * c, 0x4A,
                    CPLD, 0, 0, a & 0x7F, 0, 1, 0, 0, 1, 0)
            i += 1
    r[i] = (1000 * i, 0x20000, 5, i, 256, 280, 8, 0, 0, 64, 0, 0x60, MWR, F_UP, 0xFF, 0, 0,
            1, 0, 0, 1, 0)
    return r


def test_pcapng_round_trip_and_format(tmp_path: Path) -> None:
    recs = synth()
    f = tmp_path / "x.pcapng"
    pcapng.write(f, recs, "0000:01:00.0")
    data = f.read_bytes()
    assert struct.unpack_from("<II", data) [0] == 0x0A0D0D0A
    shb_len = struct.unpack_from("<I", data, 4)[0]
    assert struct.unpack_from("<IIHHI", data, shb_len) [2] == LINKTYPE == 147
    back = pcapng.read(f)
    assert back.tobytes() == recs.tobytes()
    s = summary(back)
    assert s["h2d_cmd"] == {"tlps": 16, "link_bytes": 16 * 84, "payload": 1024, "MRd": 0,
                            "MWr": 0, "CplD": 16}
    assert s["d2h_cmd"]["MRd"] == 2 and s["d2h_cmd"]["MWr"] == 1
    assert s["d2h_cmd"]["payload"] == 256  # requests carry no payload


def test_perfetto_flows_by_tag(tmp_path: Path) -> None:
    recs = synth()
    flows = perfetto.read_flows(recs)
    assert [(a, len(b)) for a, b in flows] == [(0, 8), (9, 8)]
    out = tmp_path / "t.json"
    perfetto.write(out, recs)
    ev = json.loads(out.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in ev) == 19
    assert [e["ph"] for e in ev if e.get("cat") == "read_latency"] == (["s"] + ["t"] * 7
                                                                       + ["f"]) * 2


def test_tshark_decodes_with_the_lua_dissector() -> None:
    """The real tshark (installed by scripts/setup.sh), run as an unprivileged user (it
    ignores -X Lua scripts as root)."""
    if not shutil.which("tshark"):
        pytest.fail("tshark is not installed: run make setup")
    with tempfile.TemporaryDirectory() as d:
        Path(d).chmod(0o755)
        f = Path(d) / "x.pcapng"
        pcapng.write(f, synth())
        f.chmod(0o644)
        # the dissector too: a checkout in a 0700 directory (git clone into mktemp -d, as
        # CI does) is not readable by nobody
        lua = Path(d) / "tacc-tlp.lua"
        shutil.copyfile(ROOT / "tools/tacc-tlp.lua", lua)
        lua.chmod(0o644)
        r = _tshark(f, lua)
    assert r.returncode == 0, r.stderr
    rows = [ln.split(",", 5) for ln in r.stdout.splitlines()]
    assert len(rows) == 19
    assert [x[0] for x in rows[:3]] == ["0", "2", "2"] and rows[-1][0] == "1"
    assert rows[1][1:5] == ["64", "0", "512", "0x4a"] and rows[0][4] == "0x20"
    assert rows[0][5].startswith("MRd up 512 B tag 0 @0x")


def _tshark(f: Path, lua: Path = ROOT / "tools/tacc-tlp.lua") -> subprocess.CompletedProcess:
    fields = ["kind", "payload", "tag", "byte_count", "fmt_type"]
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "HOME=/tmp",
         "tshark", "-X", f"lua_script:{lua}", "-r", str(f), "-T",
         "fields", "-E", "separator=,", *sum((["-e", f"tacc_tlp.{x}"] for x in fields), []),
         "-e", "_ws.col.Info"], capture_output=True, text=True, timeout=120)


def test_cli_timeline_json_is_what_it_wrote(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """tacc pcie timeline --json: one object on stdout, its counts those of the file it
    wrote (19 TLP slices plus the track metadata; 2 read flows)."""
    from tacc.cli import main

    f, out = tmp_path / "x.pcapng", tmp_path / "t.json"
    pcapng.write(f, synth(), "0000:01:00.0")
    assert main(["pcie", "timeline", str(f), "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ev = json.loads(out.read_text())["traceEvents"]
    assert doc == {"output": str(out), "records": 19, "events": len(ev),
                   "read_flows": sum(e["ph"] == "s" for e in ev)}
    assert doc["read_flows"] == 2
