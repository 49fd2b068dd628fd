"""Container attribution in captures (docs/capture-format.md "Containers"): the processes
stream from a real /proc (this process, and a fake /proc for a podman container), the
container name rule, and the timeline's process track named with the container."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tacc.capture.schema import PROCESSES_DTYPE, STREAMS
from tacc.daemon import procinfo


def test_layout() -> None:
    assert PROCESSES_DTYPE.itemsize == 56 and STREAMS["processes"] == (1, PROCESSES_DTYPE)


def test_container_names() -> None:
    cid = "1290f4fc9b79186cb6888adac0c8a621e4c169cc3292f34c49688054d667db8c"
    assert procinfo.container_name(f"/libpod_parent/libpod-{cid}", 5, 4) == "libpod:1290f4fc9b79"
    assert procinfo.container_name(f"/machine.slice/libpod-{cid}.scope", 5, 4) == \
        "libpod:1290f4fc9b79"
    assert procinfo.container_name(f"/system.slice/docker-{cid}.scope", 4, 4) == \
        "docker:1290f4fc9b79"
    assert procinfo.container_name("/user.slice/session-3.scope", 4, 4) == ""
    assert procinfo.container_name("/mybox", 9, 4) == "mybox"  # own pid ns, plain cgroup


def test_resolve_self() -> None:
    """This very process, from the real /proc: its cgroup, pid namespace and NSpid."""
    me = procinfo.resolve(os.getpid())
    assert me is not None and me["pid"] == os.getpid()
    assert me["pidns"] == os.stat("/proc/self/ns/pid").st_ino
    assert me["ns_pid"] == os.getpid()  # not in a child pid namespace
    assert me["comm"] and str(me["cgroup"]).startswith("/")
    assert procinfo.resolve(2**22 + 7) is None  # beyond pid_max: no such process


def _fake_proc(tmp: Path, pid: int, nspid: int, cgroup: str) -> Path:
    proc = tmp / "proc"
    d = proc / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nNSpid:\t{pid}\t{nspid}\n")
    (tmp / "pidns").write_text("")
    os.symlink(tmp / "pidns", d / "ns/pid")
    (proc / "self/ns").mkdir(parents=True)
    os.symlink("/proc/self/ns/pid", proc / "self/ns/pid")
    cg = tmp / "cgroup" / cgroup.lstrip("/")
    cg.mkdir(parents=True)
    return proc


def test_table_once_per_process(tmp_path: Path) -> None:
    cgroup = "/libpod_parent/libpod-" + "ab" * 32
    proc = _fake_proc(tmp_path, 4242, 7, cgroup)
    strings: dict[str, int] = {}
    table = procinfo.ProcessTable(lambda s: strings.setdefault(s, len(strings) + 1), proc,
                                  tmp_path / "cgroup")
    recs = table.see(np.array([4242, 4242, 0, 99999], np.uint32))
    assert recs.dtype == PROCESSES_DTYPE and sorted(recs["pid"].tolist()) == [4242, 99999]
    r = recs[recs["pid"] == 4242][0]
    assert r["ns_pid"] == 7 and r["comm"] == b"python3"
    assert r["cgroup_id"] == (tmp_path / "cgroup" / cgroup.lstrip("/")).stat().st_ino
    assert r["pidns"] == (tmp_path / "pidns").stat().st_ino
    inv = {v: k for k, v in strings.items()}
    assert inv[int(r["cgroup_name_id"])] == cgroup
    assert inv[int(r["container_name_id"])] == "libpod:abababababab"
    gone = recs[recs["pid"] == 99999][0]  # exited before it was looked at
    assert gone["cgroup_id"] == 0 and gone["container_name_id"] == 0
    assert len(table.see(np.array([4242, 99999], np.uint32))) == 0  # once per process


def test_timeline_names_the_container(tmp_path: Path) -> None:
    """A process in a container: its track (JSON process name, Perfetto process
    descriptor) carries the container and the pid inside; a host process does not."""
    import json

    from tacc.capture import CaptureWriter
    from tacc.capture.schema import DRIVER_DTYPE, HOST_DTYPE, HostKind
    from tacc.timeline.convert import convert

    meta = {"node": "n0", "devices": [{"pci": "0000:01:00.1", "vf": 1}]}
    cap = tmp_path / "c"
    with CaptureWriter(cap, meta) as w:
        drv = np.zeros(2, DRIVER_DTYPE)
        drv["t_ns"], drv["dur_ns"], drv["kind"] = [1000, 5000], 2000, 1  # ioctl spans
        drv["pid"], drv["tid"] = [4242, 555], [4242, 555]
        w.append("driver", drv)
        # the processes' CPU time (sched_switch out, then in): their process tracks
        h = np.zeros(4, HOST_DTYPE)
        h["kind"] = int(HostKind.SCHED_SWITCH)
        h["t_ns"] = [1000, 3000, 4000, 6000]
        h["tid"], h["pid"], h["comm"] = [4242, 1, 555, 1], [4242, 1, 555, 1], \
            [b"python3", b"init", b"bash", b"init"]
        h["next_pid"], h["next_comm"] = [1, 4242, 1, 555], [b"init", b"python3", b"init",
                                                           b"bash"]
        w.append("host", h)
        p = np.zeros(2, PROCESSES_DTYPE)
        p["pid"], p["ns_pid"], p["comm"] = [4242, 555], [7, 555], [b"python3", b"bash"]
        p["container_name_id"] = [w.string_id("libpod:abababababab"), 0]
        w.append("processes", p)
    js = tmp_path / "t.json"
    convert([cap], js, fmt="json")
    names = {e["args"]["name"] for e in json.loads(js.read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("[libpod:abababababab pid 7] pid 4242" in n for n in names), names
    # the process's own name first (from its sched_switch comm), then the container
    assert "python3 [libpod:abababababab pid 7] pid 4242" in {
        n.split(": ", 1)[-1] for n in names}, names
    assert not any("libpod" in n for n in names if "4242" not in n), names
