"""Which cgroup and pid namespace a traced process is in: container attribution.

taccd resolves each process once, when a capture first sees its pid in the driver's
events (host pids: the BPF program's ``bpf_get_current_pid_tgid``), from ``/proc``:
cgroup v2 path and id (the cgroup directory's inode, as ``bpf_get_current_cgroup_id``
reports it), pid namespace inode and the pid inside it (``NSpid``), and a container name
derived from the cgroup path.  Nothing is added to the per-event path: one ``np.unique``
over a drained batch's pid column, and /proc reads for pids not seen before.  A process
that exited before its first batch was drained (under one tick, 50 ms) keeps a record with
``cgroup_id`` 0 (unknown).  docs/capture-format.md "Containers".
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tacc.capture.schema import PROCESSES_DTYPE

CGROUP_ROOT = Path("/sys/fs/cgroup")
# runtime scope names: podman/crun (cgroupfs and systemd managers), docker, CRI-O,
# containerd; group 2 is the container id
_CONTAINER_RE = re.compile(r"^(libpod|docker|crio|cri-containerd)-(?:conmon-)?([0-9a-f]{12,})"
                           r"(?:\.scope)?$")


def _ino(path: str | Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return 0


def own_pidns() -> int:
    return _ino("/proc/self/ns/pid")


def container_name(cgroup: str, pidns: int, host_pidns: int) -> str:
    """``libpod:<12 hex>`` for a podman container (docker:, crio:, ...), the cgroup's last
    component for another process in its own pid namespace, "" for a host process."""
    for part in reversed([p for p in cgroup.split("/") if p]):
        m = _CONTAINER_RE.match(part)
        if m:
            return f"{m.group(1)}:{m.group(2)[:12]}"
    if pidns and host_pidns and pidns != host_pidns:
        return cgroup.rstrip("/").rsplit("/", 1)[-1] or cgroup
    return ""


def resolve(pid: int, proc: Path = Path("/proc"), cgroot: Path = CGROUP_ROOT,
            host_pidns: int = 0) -> dict[str, object] | None:
    """cgroup path and id, pid namespace inode, namespaced pid and comm of ``pid``."""
    d = proc / str(pid)
    try:
        cg_lines = (d / "cgroup").read_text().splitlines()
        status = (d / "status").read_text().splitlines()
    except OSError:
        return None
    cgroup = next((ln[3:] for ln in cg_lines if ln.startswith("0::")), "")
    fields = dict(ln.split(":", 1) for ln in status if ":" in ln)
    nspid = fields.get("NSpid", "").split()
    pidns = _ino(d / "ns/pid")
    return {"pid": pid, "cgroup": cgroup,
            "cgroup_id": _ino(cgroot / cgroup.lstrip("/")) if cgroup else 0,
            "pidns": pidns, "ns_pid": int(nspid[-1]) if nspid else pid,
            "comm": fields.get("Name", "").strip(),
            "container": container_name(cgroup, pidns, host_pidns)}


class ProcessTable:
    """The capture's ``processes`` stream: one record per process, at its first event."""

    def __init__(self, string_id: Callable[[str], int], proc: Path = Path("/proc"),
                 cgroot: Path = CGROUP_ROOT) -> None:
        self.string_id = string_id
        self.proc, self.cgroot = proc, cgroot
        self.host_pidns = _ino(proc / "self/ns/pid")
        self.seen: set[int] = {0}
        self.names: dict[int, str] = {}  # pid -> container name (non-empty only)

    def see(self, pids: np.ndarray) -> np.ndarray:
        """PROCESSES_DTYPE records of the pids in ``pids`` not seen before."""
        if not len(pids):
            return np.zeros(0, PROCESSES_DTYPE)
        new = [p for p in np.unique(pids).tolist() if p not in self.seen]
        out = np.zeros(len(new), PROCESSES_DTYPE)
        now = time.monotonic_ns()
        for i, pid in enumerate(new):
            self.seen.add(pid)
            r = out[i]
            r["t_ns"], r["pid"], r["ns_pid"] = now, pid, pid
            info = resolve(pid, self.proc, self.cgroot, self.host_pidns)
            if info is None:
                continue  # exited before we looked: cgroup_id 0, unknown
            r["cgroup_id"], r["pidns"] = info["cgroup_id"], info["pidns"]
            r["ns_pid"] = info["ns_pid"]
            r["cgroup_name_id"] = self.string_id(str(info["cgroup"]) or "/")
            name = str(info["container"])
            if name:
                self.names[pid] = name
                r["container_name_id"] = self.string_id(name)
            r["comm"] = str(info["comm"]).encode()[:15]
        return out
