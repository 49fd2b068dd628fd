"""Run inside a container given one tacc function by CDI (tests/vm/test_containers.py).

Prints one JSON object: what the container sees and may reach.  Argument: the accel
minors of the functions it must NOT reach.  As the container's root it makes their
nodes with mknod(2) (allowed: CAP_MKNOD) and tries to open them (the cgroup v2 device
program must refuse: EPERM), and tries to open their sysfs BAR files for writing.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ACCEL_MAJOR = 261


def try_open(path: str, flags: int = os.O_RDWR) -> str:
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def main() -> int:
    others = [int(m) for m in sys.argv[1].split(",")]
    go = Path(sys.argv[2])
    out: dict[str, object] = {
        "nodes": sorted(os.listdir("/dev/accel")),
        "uid": os.getuid(), "pid": os.getpid(),
        "cgroup": Path("/proc/self/cgroup").read_text().strip(),
    }
    out["own"] = {n: try_open(f"/dev/accel/{n}") for n in out["nodes"]}  # type: ignore
    denied = {}
    for minor in others:
        node = f"/tmp/accel-stolen-{minor}"
        try:
            os.mknod(node, 0o600 | 0o020000, os.makedev(ACCEL_MAJOR, minor))
            made = "ok"
        except OSError as exc:
            made = errno.errorcode.get(exc.errno or 0, "?")
        denied[str(minor)] = {"mknod": made, "open": try_open(node),
                              "open_ro": try_open(node, os.O_RDONLY)}
        Path(node).unlink(missing_ok=True)
    out["others"] = denied
    bars = {}
    for d in sorted(Path("/sys/bus/pci/devices").iterdir()):
        if (d / "vendor").read_text().strip() == "0x7acc":
            bars[d.name] = try_open(str(d / "resource0"))
    out["sysfs_bar_rw"] = bars
    t0 = time.monotonic()
    r = subprocess.run([str(Path(sys.executable).parent / "tacc"), "run", "mlp", "--json"],
                       capture_output=True, text=True, timeout=120)
    out["mlp"] = {"rc": r.returncode, "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:],
                  "s": round(time.monotonic() - t0, 2)}
    print(json.dumps(out), flush=True)
    # stay until the test has looked at the cgroup from outside (bpftool, taccd)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
