"""tacc cdi: the CDI specs from a fake sysfs, validated against CDI's own JSON schema 0.5.0
(vendored in tests/host/data/cdi-schema-0.5.0, see its README), the version rule, bad
names, and taccd rewriting the spec when VFs come and go."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7
from tacc import cdi
from tacc.cli import main

SCHEMA_DIR = Path(__file__).parent / "data/cdi-schema-0.5.0"


def validator() -> Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    reg = Registry().with_resource("defs.json",
                                   Resource.from_contents(defs, default_specification=DRAFT7))
    return Draft7Validator(schema, registry=reg)


def fake_sysfs(tmp: Path, vfs: int = 2) -> str:
    """A PF at 0000:01:00.0 (accel0, IOMMU group 5) and ``vfs`` VFs at 01:00.n
    (accel n, group 5 + n), as tacc.devices.discover reads them."""
    base = tmp / "sys/bus/pci/devices"
    groups = tmp / "sys/kernel/iommu_groups"
    for fn in range(vfs + 1):
        d = base / f"0000:01:00.{fn}"
        (d / "accel" / f"accel{fn}").mkdir(parents=True)
        (d / "tacc").mkdir()
        (d / "vendor").write_text("0x7acc\n")
        (groups / str(5 + fn)).mkdir(parents=True)
        os.symlink(groups / str(5 + fn), d / "iommu_group")
        if fn:
            os.symlink(base / "0000:01:00.0", d / "physfn")
            os.symlink(d, base / "0000:01:00.0" / f"virtfn{fn - 1}")
    return str(tmp)


def test_spec_is_valid_cdi_050(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path / "root")
    out = tmp_path / "cdi/tacc.yaml"
    paths = cdi.generate(out, root)
    assert paths == {cdi.ACCEL_KIND: out, cdi.VFIO_KIND: tmp_path / "cdi/tacc-vfio.yaml"}
    v = validator()
    accel, vfio = cdi.load(out), cdi.load(paths[cdi.VFIO_KIND])
    for spec in (accel, vfio):
        errors = [e.message for e in v.iter_errors(spec)]
        assert errors == []
        assert spec["cdiVersion"] == "0.5.0"  # PCI names start with a digit
    assert [d["name"] for d in accel["devices"]] == ["0000:01:00.0", "0000:01:00.1",
                                                    "0000:01:00.2"]
    node = accel["devices"][1]["containerEdits"]["deviceNodes"]
    assert node == [{"path": "/dev/accel/accel1", "hostPath": "/dev/accel/accel1",
                     "permissions": "rw"}]
    assert [n["path"] for n in vfio["devices"][2]["containerEdits"]["deviceNodes"]] == [
        "/dev/vfio/vfio", "/dev/vfio/7"]


def test_schema_rejects_what_podman_would() -> None:
    """The vendored schema is the real one: it refuses a spec without devices or a
    device node without a path (so the validation above could fail)."""
    v = validator()
    assert list(v.iter_errors({"cdiVersion": "0.5.0", "kind": cdi.ACCEL_KIND}))
    bad = {"cdiVersion": "0.5.0", "kind": cdi.ACCEL_KIND,
           "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"hostPath": "/a"}]}}]}
    assert list(v.iter_errors(bad))


def test_lowest_version_rule() -> None:
    def spec(name: str, node: dict | None = None, mount: dict | None = None) -> dict:
        edits: dict = {}
        if node:
            edits["deviceNodes"] = [node]
        if mount:
            edits["mounts"] = [mount]
        return {"kind": cdi.ACCEL_KIND, "devices": [{"name": name, "containerEdits": edits}]}

    assert cdi.required_version(spec("a", {"path": "/dev/x"})) == "0.3.0"
    assert cdi.required_version(spec("a", mount={"hostPath": "/a", "containerPath": "/a",
                                                 "type": "bind"})) == "0.4.0"
    assert cdi.required_version(spec("a", {"path": "/x", "hostPath": "/x"})) == "0.5.0"
    assert cdi.required_version(spec("0000:01:00.1", {"path": "/x"})) == "0.5.0"


def test_functions_without_nodes(tmp_path: Path) -> None:
    """A VF without tacc.ko (bound to vfio-pci) has no accel device but keeps its vfio
    one; no IOMMU (no iommu_group link): no vfio devices, the file still written."""
    root = fake_sysfs(tmp_path / "root")
    shutil.rmtree(Path(root, "sys/bus/pci/devices/0000:01:00.2/accel"))
    os.unlink(Path(root, "sys/bus/pci/devices/0000:01:00.1/iommu_group"))
    paths = cdi.generate(tmp_path / "t.yaml", root)
    assert [d["name"] for d in cdi.load(paths[cdi.ACCEL_KIND])["devices"]] == [
        "0000:01:00.0", "0000:01:00.1"]
    assert [d["name"] for d in cdi.load(paths[cdi.VFIO_KIND])["devices"]] == [
        "0000:01:00.0", "0000:01:00.2"]


def test_resolve_and_bad_names(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path / "root")
    out = tmp_path / "tacc.yaml"
    cdi.generate(out, root)
    assert cdi.resolve("tacc.dev/accel=01:00.1", out)["deviceNodes"][0]["path"] == \
        "/dev/accel/accel1"
    with pytest.raises(cdi.CdiError, match=r"unresolvable CDI device tacc.dev/accel="
                       r"0000:01:00\.7: .*present: 0000:01:00\.0, 0000:01:00\.1, 0000:01"):
        cdi.resolve("tacc.dev/accel=0000:01:00.7", out)
    with pytest.raises(cdi.CdiError, match="not a tacc CDI name"):
        cdi.resolve("nvidia.com/gpu=0", out)
    with pytest.raises(cdi.CdiError, match="not a PCI address"):
        cdi.resolve("tacc.dev/vfio=zz", out)
    with pytest.raises(cdi.CdiError, match=r"no tacc function at 0000:01:00\.5"):
        cdi.generate(out, root, only=["0000:01:00.5"])


def test_cli_unknown_function_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    """This host has no tacc device: any function named is unknown (nothing found); one
    line, status 1."""
    assert main(["cdi", "generate", "-o", str(tmp_path / "t.yaml"), "-d",
                 "0000:01:00.7"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tacc: error: no tacc function at "
                                                   "0000:01:00.7")
    assert not (tmp_path / "t.yaml").exists()
    assert main(["cdi", "list", "-o", str(tmp_path / "t.yaml"),
                 "tacc.dev/accel=0000:01:00.7"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unresolvable CDI device" in err


@pytest.fixture
def cli_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tacc cdi on a fake sysfs (a PF and one VF): the spec path to write."""
    root = fake_sysfs(tmp_path / "root", vfs=1)
    real = cdi.functions
    monkeypatch.setattr(cdi, "functions", lambda sysroot="/": real(root))
    return tmp_path / "cdi/tacc.yaml"


def test_cli_generate_and_list(cli_spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = cli_spec
    assert main(["cdi", "generate", "-o", str(out)]) == 0
    assert "tacc.dev/accel, 2 devices" in capsys.readouterr().out
    assert main(["cdi", "list", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["tacc.dev/accel=0000:01:00.0 /dev/accel/accel0",
                     "tacc.dev/accel=0000:01:00.1 /dev/accel/accel1",
                     "tacc.dev/vfio=0000:01:00.0 /dev/vfio/vfio /dev/vfio/5",
                     "tacc.dev/vfio=0000:01:00.1 /dev/vfio/vfio /dev/vfio/6"]


def test_taccd_rewrites_spec_when_vfs_go(tmp_path: Path) -> None:
    from tacc.daemon.main import Daemon

    root = fake_sysfs(tmp_path / "root")
    out = tmp_path / "cdi/tacc.yaml"
    d = Daemon(str(tmp_path / "sock"), tmp_path / "caps", always_on=False, bpf=False,
               sysroot=root, cdi_spec=str(out))
    try:
        assert len(cdi.load(out)["devices"]) == 3
        for fn in (1, 2):  # sriov_numvfs = 0
            shutil.rmtree(Path(root, f"sys/bus/pci/devices/0000:01:00.{fn}"))
        d.devices_changed("remove", "0000:01:00.2")
        assert [x["name"] for x in cdi.load(out)["devices"]] == ["0000:01:00.0"]
        assert not [w for w in d.warnings if "CDI" in w]
    finally:
        d.close()


def test_cli_generate_json(cli_spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tacc cdi generate --json: each spec written, its device names those of the file."""
    out = cli_spec
    assert main(["cdi", "generate", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["kind"] for d in doc] == ["tacc.dev/accel", "tacc.dev/vfio"]
    for d in doc:
        spec = cdi.load(Path(d["path"]))
        assert d["devices"] == [f"{spec['kind']}={x['name']}" for x in spec["devices"]]
    assert doc[0]["devices"] == ["tacc.dev/accel=0000:01:00.0", "tacc.dev/accel=0000:01:00.1"]
