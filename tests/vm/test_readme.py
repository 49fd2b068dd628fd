"""README.md's guest-tagged commands, as written, inside the VM (scripts/test-vm runs this
file in the extras boot, VFS=2 SMP=2).

Each ``make run-vm [VAR=v] CMD='...'`` runs its CMD here the way make and scripts/run-vm
hand it to the guest (``$$`` made ``$``; ``TACC_VM_OUT`` a fresh directory): it must exit
with the block's status, print the output the README shows after it, and write every
``$TACC_VM_OUT/FILE`` it names.  ``VFS=N`` is set up for the command when the boot has
another number; IOMMU, SMP and ICOUNT cannot change in a running guest, so a command that
names a value this boot lacks fails (with where it could run).  Grammar: tests/readme_blocks.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import readme_blocks as rb

GUEST = [(b, c) for b in rb.fenced_blocks(rb.README) if b.kind == "guest" for c in b.commands()]


def booted_with() -> dict[str, str]:
    """The boot's settings: what scripts/test-vm asked (checked by test_platform.py)."""
    text = os.environ.get("TACC_VM_EXPECT", "")
    have = dict(w.split("=", 1) for w in text.split())
    have.setdefault("SMP", str(len(os.sched_getaffinity(0))))
    for w in Path("/proc/cmdline").read_text().split():
        if w.startswith("taccvm.iommu="):
            have.setdefault("IOMMU", w.split("=", 1)[1])
    return have


def taccd_pids() -> set[int]:
    pids = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(os.path.basename(a) == b"taccd" for a in argv[:2]):
            pids.add(int(p.name))
    return pids


def stop(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 20
    while pids & taccd_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids & taccd_pids():
        os.kill(pid, signal.SIGKILL)


def set_numvfs(pf_pci: Path, n: int) -> None:
    numvfs = pf_pci / "sriov_numvfs"
    if int(numvfs.read_text()) == n:
        return
    numvfs.write_text("0")
    if n:
        numvfs.write_text(str(n))


@pytest.fixture
def vfs_kept(pf_pci: Path) -> Iterator[None]:
    before = int((pf_pci / "sriov_numvfs").read_text())
    yield
    set_numvfs(pf_pci, before)


def test_readme_has_guest_commands() -> None:
    assert len(GUEST) >= 3, [c.text for _, c in GUEST]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("block", "cmd"), GUEST, ids=[f"README.md:{c.line}" for _, c in GUEST])
def test_readme_guest_command(block: rb.Block, cmd: rb.Command, tmp_path: Path, pf_pci: Path,
                              vfs_kept: None) -> None:
    vm = rb.run_vm_command(cmd.text)
    assert vm is not None, f"README.md:{cmd.line}: not `make run-vm [VAR=v] CMD='...'`"
    have = booted_with()
    for k, v in vm.vars.items():
        if k == "VFS":
            set_numvfs(pf_pci, int(v))
        else:
            assert have.get(k) == v, (
                f"README.md:{cmd.line} needs {k}={v}; this boot has {k}={have.get(k)}: "
                "give it a boot with that setting (scripts/test-vm) or change the example")
    out = tmp_path / "out"
    out.mkdir()
    before = taccd_pids()
    log = tmp_path / "output"
    try:
        # output to a file, not a pipe: the daemon `taccd &&` leaves serving keeps the
        # command's stdout open, and a pipe would wait for it
        with log.open("wb") as f:
            r = subprocess.run(["bash", "-c", vm.guest_cmd], cwd=rb.ROOT,
                               env={**os.environ, "TACC_VM_OUT": str(out)},
                               stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                               timeout=840)
    finally:
        stop(taccd_pids() - before)
    text = log.read_text(errors="replace")
    assert r.returncode == block.status, f"{vm.guest_cmd}\nexit {r.returncode}:\n{text[-3000:]}"
    for want in cmd.expect:
        assert want in [ln.strip() for ln in text.splitlines()], (
            f"README.md:{cmd.line} shows {want!r}; the command printed:\n{text[-3000:]}")
    kept = Path(os.environ.get("TACC_VM_OUT", tmp_path / "kept")) / "readme"
    for name in re.findall(r"\$TACC_VM_OUT/([\w.-]+)", vm.guest_cmd):
        f = out / name
        assert f.exists() and f.stat().st_size > 0, f"{name}: not written ({text[-2000:]})"
        check_written(f)
        # for the host's checks after the boot (tests/after_boot: the HTML in Chromium)
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, kept / name)
    # a bad twin captured and analysed: the analysis names what the twin is for
    m = re.search(r"tacc run (\w+) --variant bad( --trace)?", vm.guest_cmd)
    if m and ("tacc analyze" in vm.guest_cmd or "tacc profile" in vm.guest_cmd):
        from tacc.workloads import get

        for rule in get(m.group(1)).expected:
            assert rule in text, f"README.md:{cmd.line}: no {rule} finding:\n{text[-3000:]}"


def check_written(f: Path) -> None:
    """A timeline the README writes holds the device's commands and the API calls, not
    only bytes."""
    if f.suffix == ".pftrace":
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        tr = pb.Trace()
        tr.ParseFromString(f.read_bytes())
        tracks = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet
                  if p.HasField("track_descriptor")}
        begins = [tracks[p.track_event.track_uuid] for p in tr.packet
                  if p.HasField("track_event")
                  and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
        dev = [t for t in begins if tracks.get(t.parent_uuid, t).name.startswith("device ")]
        api = [t for t in begins if t.name.endswith(" API")]
        assert dev and api, (f.name, len(dev), len(api))
    elif f.suffix == ".html":
        import json

        m = re.search(r'<script id="data" type="application/json">(.*?)</script>',
                      f.read_text(), re.S)
        assert m, f"{f.name}: no data block"
        data = json.loads(m.group(1).replace("<\\/", "</"))
        names = {t["name"] for t in data["tracks"]}
        assert data["slices"] and any(n.startswith("device ") for n in names), f.name
        if "report" in data:  # the model view of version-3 records: roofline and steps
            rep = data["report"]
            assert rep["steps"] and any(r["points"] for r in rep["roofline"]), f.name
