"""A virtio-tacc function (docs/virtio.md) as taccd, captures, CDI and ``tacc devices``
see it, from a fake sysfs: discovered after the PF and VFs with kind
``virtio``, its device ticks paired through its PF's clock_sync, its kick and dispatch
records on their own timeline tracks and out of the analysis' commands, an accel device in
the CDI spec and no vfio one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from tacc import cdi
from tacc.capture import open_capture
from tacc.capture.schema import (
    DEVICE_TRACE_DTYPE,
    TRACE_EV_VIRTIO_DISPATCH,
    TRACE_EV_VIRTIO_KICK,
    DropSource,
    Opcode,
)
from tacc.cli import main
from tacc.daemon.session import CaptureSession, Options
from tacc.devices import discover, read_clock_sync
from test_cdi import fake_sysfs as pf_and_vfs

VIRTIO_PCI = "0000:00:04.0"


def fake_sysfs(tmp: Path) -> str:
    """A PF at 0000:01:00.0 (accel0, group 5, clock_sync), a VF at 01:00.1 (accel1,
    group 6), a virtio-tacc function at 00:04.0 (1af4:1079, its accel node accel2 under
    virtio0, driver tacc-virtio, group 7) and an unrelated virtio-net at 00:05.0."""
    pf_and_vfs(tmp, vfs=1)
    base = tmp / "sys/bus/pci/devices"
    groups = tmp / "sys/kernel/iommu_groups"
    drivers = tmp / "sys/bus/virtio/drivers"
    pf = base / "0000:01:00.0"
    for k, v in {"clock_hz": "1000000000", "link_speed": "16.0 GT/s PCIe", "link_width": "8",
                 "time_scale": "2000", "clock_sync": "100 7 110\n200 107 210\n"}.items():
        (pf / "tacc" / k).write_text(v)
    for pci, dev, drv, node in ((VIRTIO_PCI, "0x1079", "tacc-virtio", "accel2"),
                                ("0000:00:05.0", "0x1041", "virtio_net", None)):
        d = base / pci
        v = d / "virtio0"
        v.mkdir(parents=True)
        (d / "vendor").write_text("0x1af4\n")
        (d / "device").write_text(f"{dev}\n")
        (drivers / drv).mkdir(parents=True, exist_ok=True)
        os.symlink(drivers / drv, v / "driver")
        if node:
            (v / "accel" / node).mkdir(parents=True)
    (groups / "7").mkdir()
    os.symlink(groups / "7", base / VIRTIO_PCI / "iommu_group")
    return str(tmp)


def test_discover_lists_the_virtio_function_last_with_its_kind(tmp_path: Path) -> None:
    fns = discover(fake_sysfs(tmp_path))
    assert [(f.pci, f.kind) for f in fns] == [("0000:01:00.0", "pf"), ("0000:01:00.1", "vf"),
                                              (VIRTIO_PCI, "virtio")]
    v = fns[2]
    # named by its PCI address; the tracepoints' dev of the frontend (domain, bus, devfn)
    assert v.accel == "/dev/accel/accel2" and v.devid == 0x20 and not v.is_vf
    # function 5 of the PF whose engines it drives: the PF's link, clock and time scale
    m = v.meta()
    assert m["kind"] == "virtio" and m["pf"] == "0000:01:00.0" and m["vf"] == 5
    assert m["link"]["gen"] == 4 and m["link"]["width"] == 8 and m["time_scale"] == 2.0
    assert fns[0].meta()["kind"] == "pf" and fns[1].meta()["kind"] == "vf"
    # its device ticks are the PF's: pairs from the PF's clock_sync, with its own fid
    pairs = read_clock_sync(v, 2)
    assert list(pairs["devclk"]) == [7, 107] and set(pairs["fid"].tolist()) == {2}


def _rec(opcode: int, t: int, tag: int, engine: int = 255, queue: int = 0,
         job: int = 1) -> np.ndarray:
    r = np.zeros(1, DEVICE_TRACE_DTYPE)
    r["version"], r["opcode"], r["engine"], r["queue"], r["func"] = 2, opcode, engine, queue, 5
    r["job"], r["tag"], r["fid"] = job, tag, 2
    r["t_fetch"], r["t_start"], r["t_end"] = t, t, t + (500 if opcode < 0xF0 else 0)
    r["bytes"] = 4096 if opcode == Opcode.COPY_H2D else 0
    return r


def test_capture_timeline_and_analysis_of_a_virtio_function(tmp_path: Path) -> None:
    """A capture names the function by its PCI address and kind virtio; the clock_sync
    stream pairs its ticks (the PF's); the timeline puts kick and dispatch records on
    their own tracks of the function's group and the command on its engine's; the
    analysis counts only the command."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    from tacc.analyze.data import load
    from tacc.timeline.convert import convert

    fns = discover(fake_sysfs(tmp_path / "root"))
    s = CaptureSession(tmp_path / "cap", fns, Options(device_trace=False, api=False,
                                                      counters_hz=0), tool="test")
    tag = 0x1234 << 32 | 1
    recs = np.concatenate([_rec(TRACE_EV_VIRTIO_KICK, 150, tag, queue=0xFF),
                           _rec(TRACE_EV_VIRTIO_DISPATCH, 160, tag),
                           _rec(Opcode.COPY_H2D, 170, tag, engine=0)])
    s._append("device_trace", recs, DropSource.DEVICE_TRACE)
    s.close()
    cap = open_capture(tmp_path / "cap")
    meta = json.loads((tmp_path / "cap/meta.json").read_text())
    assert [(d["pci"], d["kind"]) for d in meta["devices"]][2] == (VIRTIO_PCI, "virtio")
    assert cap.functions[2].kind == "virtio" and cap.functions[2].name == \
        f"{VIRTIO_PCI} (virtio)"
    assert not [p for p in cap.problems if VIRTIO_PCI in p], cap.problems  # paired
    assert len(cap.read("clock_sync")[cap.read("clock_sync")["fid"] == 2]) >= 2
    cmds = load(cap).cmds
    assert cmds.opcode.tolist() == [int(Opcode.COPY_H2D)]  # events are not commands
    out = tmp_path / "t.pftrace"
    convert([tmp_path / "cap"], out)
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
              if p.HasField("track_descriptor")}
    names = {tracks[p.track_event.track_uuid].name: tracks[tracks[
        p.track_event.track_uuid].parent_uuid].name for p in tr.packet
        if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN}
    group = f"device {VIRTIO_PCI} (virtio)"
    assert names == {"virtio kicks": group, "virtio dispatch q0": group,
                     "PCIe H2D q0": group}, names


def test_cdi_spec_has_the_virtio_accel_device_and_no_vfio_one(tmp_path: Path) -> None:
    from test_cdi import validator

    root = fake_sysfs(tmp_path / "root")
    paths = cdi.generate(tmp_path / "cdi/tacc.yaml", root)
    accel, vfio = cdi.load(paths[cdi.ACCEL_KIND]), cdi.load(paths[cdi.VFIO_KIND])
    for spec in (accel, vfio):
        assert list(validator().iter_errors(spec)) == []
    assert [d["name"] for d in accel["devices"]] == ["0000:01:00.0", "0000:01:00.1",
                                                    VIRTIO_PCI]
    assert accel["devices"][2]["containerEdits"]["deviceNodes"][0]["path"] == \
        "/dev/accel/accel2"
    # tacc.vfio drives a PF's or VF's registers, not a virtio transport
    assert [d["name"] for d in vfio["devices"]] == ["0000:01:00.0", "0000:01:00.1"]
    assert cdi.resolve(f"tacc.dev/accel={VIRTIO_PCI}", paths[cdi.ACCEL_KIND])
    with pytest.raises(cdi.CdiError, match="unresolvable"):
        cdi.resolve(f"tacc.dev/vfio={VIRTIO_PCI}", paths[cdi.ACCEL_KIND])


def test_tacc_devices_lists_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fake_sysfs(tmp_path / "root")
    assert main(["devices", "--sysroot", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PCI", "KIND", "PF", "NODE", "DRIVER"]
    assert lines[3].split() == [VIRTIO_PCI, "virtio", "0000:01:00.0", "/dev/accel/accel2",
                                "tacc-virtio"], lines
    assert main(["devices", "--sysroot", root, "--kind", "virtio", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["pci"] == VIRTIO_PCI and row["kind"] == "virtio" and row["meta"]["vf"] == 5
    with pytest.raises(SystemExit) as e:  # argparse: one error line, status 2
        main(["devices", "--kind", "gpu"])
    assert e.value.code == 2 and "invalid choice: 'gpu'" in capsys.readouterr().err


def test_taccd_status_and_cdi_name_the_virtio_function(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """taccd's status gives each function's kind; its CDI spec (written at start) has the
    virtio accel device; ``tacc trace status`` names the function with its kind."""
    from tacc.cli import trace as cli_trace
    from tacc.daemon.main import Daemon

    root = fake_sysfs(tmp_path / "root")
    out = tmp_path / "cdi/tacc.yaml"
    d = Daemon(str(tmp_path / "sock"), tmp_path / "caps", always_on=False, bpf=False,
               sysroot=root, cdi_spec=str(out))
    try:
        st = d.handle({"cmd": "status"})
        assert st["devices"][-1] == VIRTIO_PCI and st["kinds"][VIRTIO_PCI] == "virtio"
        assert VIRTIO_PCI in [x["name"] for x in cdi.load(out)["devices"]]
        monkeypatch.setattr(cli_trace, "_call", lambda args, req: d.handle(req))
        assert main(["trace", "status"]) == 0
        assert f"{VIRTIO_PCI} (virtio)" in capsys.readouterr().out
    finally:
        d.close()
