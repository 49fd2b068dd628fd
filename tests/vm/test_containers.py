"""A real container given one VF through CDI (docs/containers.md; extras boot, VFS=2).

The consumer is Debian's podman 4.3 (CDI 0.5) with crun: it reads /etc/cdi/tacc.yaml as
written by ``tacc cdi generate`` and applies it itself.  The container's root is the
guest's own / (bind-mounted: the guest root is an overlay on the initramfs, which
podman's ``--rootfs /`` cannot move, see the doc), so this checkout and its venv are
there.  Inside, as root with CAP_MKNOD (tests/vm/container_probe.py): ``tacc run mlp``
passes on its VF, and the PF's and the other VF's nodes, made with mknod(2), cannot be
opened (EPERM from the cgroup v2 device program podman attached, seen with bpftool).
The long test (make test-long) runs it again under a taccd capture taken outside and
finds the container's cgroup, pid namespace and pids in the capture and on the timeline.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tacc import cdi

ROOT = Path(__file__).resolve().parent.parent.parent
CONF = ROOT / "tools/containers/containers.conf"
CTR_ROOT = Path("/run/tacc-ctr-root")
PROBE = ROOT / "tests/vm/container_probe.py"
PODMAN = ["podman", "--root", "/var/tmp/tacc-podman", "--runroot", "/run/tacc-podman",
          "--storage-driver", "vfs"]
CGROUP_PARENT = Path("/sys/fs/cgroup/libpod_parent")


# Without user namespaces crun cannot make a container ("error opening file
# /proc/self/setgroups"): a clear skip, which scripts/test-vm counts as a failure on every
# boot (the debug kernel has CONFIG_USER_NS now: config.fragment).
NO_USERNS = "the kernel has no user namespaces (CONFIG_USER_NS): crun cannot run a container"
pytestmark = pytest.mark.skipif(not Path("/proc/self/ns/user").exists(), reason=NO_USERNS)


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def minor(pci: Path) -> int:
    nodes = sorted((pci / "accel").glob("accel*"))
    assert nodes, f"{pci.name}: no accel node"
    return int(nodes[0].name.removeprefix("accel"))


@pytest.fixture(scope="module")
def functions(pf_pci: Path) -> list[Path]:
    """The PF, then its VFs in VF order."""
    vfs = sorted(pf_pci.glob("virtfn*"), key=lambda p: int(p.name.removeprefix("virtfn")))
    fns = [pf_pci] + [v.resolve() for v in vfs]
    if len(fns) < 3:
        pytest.fail(f"needs the extras boot's 2 VFs, found {len(fns) - 1} VFs")
    return fns


@pytest.fixture(scope="module")
def spec(functions: list[Path]) -> Path:
    paths = cdi.generate(cdi.DEFAULT_SPEC)
    if not CTR_ROOT.is_dir() or not os.path.ismount(CTR_ROOT):
        CTR_ROOT.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", "/", str(CTR_ROOT)], check=True)
    return paths[cdi.ACCEL_KIND]


def bpftool_cgroup(path: Path) -> str:
    r = subprocess.run(["bpftool", "cgroup", "show", str(path)], capture_output=True,
                       text=True, timeout=30)
    return r.stdout + r.stderr


class Run:
    """One container run under a taccd capture, looked at by the tests below."""

    def __init__(self, own: Path, seen: dict, progs: str, cgroup: Path, cgroup_ino: int,
                 capture: Path) -> None:
        self.own, self.seen, self.progs, self.cgroup = own, seen, progs, cgroup
        self.cgroup_ino, self.capture = cgroup_ino, capture


def tacc_cmd(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "tacc"), *args]


def container_run(functions: list[Path], capture: Path | None = None) -> Run:
    """The container, given VF 1, runs the probe: tacc run mlp, then the PF's and VF 2's
    nodes by mknod.  While the probe waits, its cgroup and device program are read from
    outside.  With ``capture``, a taccd outside captures the run (make test-long: the
    capture program's compile costs ~20 guest seconds)."""
    pf, own, other = functions[0], functions[1], functions[2]
    taccd = None
    if capture is not None:
        sock = str(capture.parent / "taccd.sock")
        taccd = subprocess.Popen([str(Path(sys.executable).parent / "taccd"), "-f",
                                  "--socket", sock, "--no-always-on", "--no-cdi"],
                                 stderr=subprocess.DEVNULL)
    try:
        if taccd is not None and capture is not None:
            for _ in range(1200):
                if Path(sock).exists() or taccd.poll() is not None:
                    break
                time.sleep(0.05)
            r = subprocess.run(tacc_cmd("trace", "--socket", sock, "start", "-o",
                                        str(capture)), capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, r.stderr
        go = Path(f"/var/tmp/tacc-ctr-go-{uuid.uuid4().hex[:8]}")
        before = set(CGROUP_PARENT.glob("libpod-*")) if CGROUP_PARENT.is_dir() else set()
        # --rootfs is a flag: the path is podman's first positional argument (the image)
        cmd = [*PODMAN, "run", "--rm", "--device", f"{cdi.ACCEL_KIND}={own.name}",
               "-w", str(ROOT), "--rootfs", str(CTR_ROOT), sys.executable, str(PROBE),
               f"{minor(pf)},{minor(other)}", str(go)]
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=podman_env())
        try:
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 150)
            line = p.stdout.readline() if ready else ""
            if not line:
                p.kill()
                _, err = p.communicate(timeout=30)
                pytest.fail(f"container printed nothing: {err.strip()[-800:]}")
            seen = json.loads(line)
            cgroups = sorted(set(CGROUP_PARENT.glob("libpod-*")) - before)
            assert len(cgroups) == 1, f"new container cgroups under {CGROUP_PARENT}: {cgroups}"
            progs = bpftool_cgroup(cgroups[0])
            cg_ino = cgroups[0].stat().st_ino
        finally:
            go.touch()
        _, err = p.communicate(timeout=60)
        go.unlink(missing_ok=True)
        assert p.returncode == 0, err[-800:]
        print(f"container run: {time.monotonic() - t0:.1f} s, tacc run mlp inside "
              f"{seen['mlp']['s']} s")
        if taccd is not None:
            r = subprocess.run(tacc_cmd("trace", "--socket", sock, "stop"),
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        return Run(own, seen, progs, cgroups[0], cg_ino, capture or Path())
    finally:
        if taccd is not None:
            taccd.terminate()
            taccd.wait(timeout=60)


@pytest.fixture(scope="module")
def run(functions: list[Path], spec: Path) -> Run:
    return container_run(functions)


def test_container_gets_its_vf_only(functions: list[Path], run: Run) -> None:
    pf, own, other = functions[0], functions[1], functions[2]
    seen = run.seen
    assert "cgroup_device" in run.progs, run.progs
    assert seen["uid"] == 0 and seen["cgroup"] == "0::/"  # root, in its cgroup namespace
    # exactly its VF: one node, openable, at the host's path (containerPath = hostPath)
    assert seen["nodes"] == [f"accel{minor(own)}"]
    assert seen["own"] == {f"accel{minor(own)}": "ok"}
    # the PF's and the other VF's nodes: mknod allowed, open refused by the cgroup
    for m in (minor(pf), minor(other)):
        assert seen["others"][str(m)] == {"mknod": "ok", "open": "EPERM", "open_ro": "EPERM"}
    # no way round through sysfs: read-only in the container (BAR files); the container's
    # sysfs lists the three functions (a probe that saw no BAR file proves nothing)
    bars = seen["sysfs_bar_rw"]
    assert {pf.name, own.name, other.name} <= set(bars), bars
    assert set(bars.values()) <= {"EROFS", "EACCES", "EPERM"}, bars
    mlp = seen["mlp"]
    assert mlp["rc"] == 0, mlp["stderr"]
    rows = json.loads(mlp["stdout"])["results"]
    assert rows and all(r["checked"] and r["device"] == own.name for r in rows), rows


@pytest.mark.long
def test_capture_attributes_container(functions: list[Path], spec: Path,
                                      tmp_path: Path) -> None:
    """taccd outside: the container's jobs carry a host pid whose processes record names
    the container's cgroup (path and id), its pid namespace and the pid inside, and the
    timeline's process track is named with the container."""
    from tacc.capture import open_capture
    from tacc.timeline.convert import convert

    run = container_run(functions, tmp_path / "cap")
    assert run.seen["mlp"]["rc"] == 0, run.seen["mlp"]["stderr"]

    cap = open_capture(run.capture)
    strings = cap.strings
    procs = cap.read("processes")
    inside = json.loads(run.seen["mlp"]["stdout"])["pid"]  # the runtime's getpid()
    cid = run.cgroup.name.removeprefix("libpod-")
    mine = procs[(procs["container_name_id"] != 0) & (procs["ns_pid"] == inside)]
    assert len(mine) == 1, [(int(r["pid"]), int(r["ns_pid"]), strings[int(
        r["container_name_id"])]) for r in procs]
    r = mine[0]
    assert strings[int(r["container_name_id"])] == f"libpod:{cid[:12]}"
    assert strings[int(r["cgroup_name_id"])] == f"/libpod_parent/libpod-{cid}"
    assert int(r["cgroup_id"]) == run.cgroup_ino
    assert int(r["pidns"]) != os.stat("/proc/self/ns/pid").st_ino
    assert int(r["pid"]) != inside  # the host pid differs from the one inside
    drv = cap.read("driver", ["pid", "kind", "fid"])
    fid = [d["pci"] for d in cap.meta["devices"]].index(run.own.name)
    submits = drv[(drv["pid"] == r["pid"]) & (drv["kind"] == 2)]
    assert len(submits) > 0 and set(submits["fid"].tolist()) == {fid}
    js = tmp_path / "t.json"
    convert([run.capture], js, fmt="json")
    names = {e["args"]["name"] for e in json.loads(js.read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    want = f"[libpod:{cid[:12]} pid {inside}] pid {int(r['pid'])}"
    assert any(want in n for n in names), names


def test_unknown_cdi_name(functions: list[Path], spec: Path) -> None:
    """A CDI name for a function that does not exist: one line from tacc, and podman
    refuses to start the container."""
    bad = f"{cdi.ACCEL_KIND}=0000:01:00.7"
    r = subprocess.run([str(Path(sys.executable).parent / "tacc"), "cdi", "list", bad],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"tacc: error: unresolvable CDI device {bad}: "), r.stderr
    r = subprocess.run([*PODMAN, "run", "--rm", "--device", bad, "--rootfs", str(CTR_ROOT),
                        "true"], capture_output=True, text=True, timeout=120,
                       env=podman_env())
    assert r.returncode != 0
    assert "0000:01:00.7" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
