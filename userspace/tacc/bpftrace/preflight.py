"""Checks run before anything is compiled, each failing with one clear line."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tacc.errors import DeviceError

from .errors import ToolError
from .tpformat import tracefs_root

if TYPE_CHECKING:
    from tacc.devices import TaccFunction


def require_root(prog: str = "accel-bpftrace") -> None:
    if os.geteuid() != 0:
        raise ToolError(f"must run as root (BPF needs CAP_BPF and CAP_PERFMON): "
                        f"try 'sudo {prog} ...'")


def require_module(sysroot: str = "/") -> None:
    if not Path(sysroot, "sys/module/tacc").is_dir():
        raise ToolError("the tacc kernel module is not loaded (modprobe tacc)")


def require_tracefs() -> Path:
    root = tracefs_root()
    if root is None:
        raise ToolError("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    if not (root / "events" / "tacc").is_dir():
        raise ToolError(f"no tacc tracepoints under {root}/events: is tacc.ko built with "
                        f"tracepoints and loaded?")
    return root


def require_headers(release: str | None = None) -> None:
    rel = release or os.uname().release
    build = Path("/lib/modules", rel, "build")
    if not (build / "include").is_dir() and not (build / "Makefile").exists():
        raise ToolError(f"kernel headers for {rel} are missing ({build}): "
                        f"install linux-headers-{rel}")


def require_bcc() -> None:
    # found, not imported: importing loads libbcc (~2 s of guest time under TCG), which a
    # program from the compile cache never needs
    import importlib.util

    if importlib.util.find_spec("bcc") is None:
        raise ToolError(f"the bcc Python module is not importable from {sys.executable}: "
                        f"use /usr/bin/python3 or the project venv (python3-bpfcc)") from None


def resolve_device(addr: str | None) -> TaccFunction | None:
    if not addr:
        return None
    # tacc.devices (numpy) only here: a usage error or a missing module fails fast
    from tacc.devices import discover, find

    try:
        return find(discover(), addr)
    except DeviceError as exc:
        raise ToolError(str(exc)) from None


def all_checks(bcc: bool = True) -> Path:
    require_root()
    require_module()
    root = require_tracefs()
    if bcc:
        require_headers()
        require_bcc()
    return root
