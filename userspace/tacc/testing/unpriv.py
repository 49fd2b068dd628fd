"""The unprivileged tacc-user of the test VM (scripts/guest-init.sh makes it: group tacc,
no capabilities), for the adversarial tests that assert what it must not reach; and
tacc-user2, a second tenant alike (another uid), for the per-user limits.

Two ways in, one place each:

* :func:`drop_to_tacc_user` in a forked child: the process keeps its Python state
  (imported modules) and loses root, as a tenant's process would be;
  :func:`call_as_tacc_user` runs a function so, with none of this process's files open
  (a new interpreter in the VM costs 8-16 s of imports; a fork, none);
* :func:`python_as_tacc_user`: a fresh interpreter through ``su``, with this process's
  ``sys.path``, for code that must start unprivileged (a login's environment, limits).
"""

from __future__ import annotations

import ctypes as C
import grp
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

USER = "tacc-user"
USER2 = "tacc-user2"
GROUP = "tacc"
CAP_PERFMON = 38
PR_SET_KEEPCAPS = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(C.Structure):
    _fields_ = [("version", C.c_uint32), ("pid", C.c_int)]


class _CapData(C.Structure):
    _fields_ = [("effective", C.c_uint32), ("permitted", C.c_uint32),
                ("inheritable", C.c_uint32)]


def drop_to_tacc_user(user: str = USER, caps: tuple[int, ...] = ()) -> None:
    """Become @user (tacc-user; its group and the tacc group only); for a forked child.
    @caps (e.g. ``(CAP_PERFMON,)``): the capabilities the process keeps, effective and
    permitted, and no other (a tool given CAP_PERFMON alone, as taccd may run)."""
    pw = pwd.getpwnam(user)
    libc = C.CDLL(None, use_errno=True)
    if caps and libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(C.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([grp.getgrnam(GROUP).gr_gid])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    if caps:
        mask = sum(1 << c for c in caps)
        data = (_CapData * 2)()
        for i in range(2):
            data[i].effective = data[i].permitted = (mask >> (32 * i)) & 0xFFFFFFFF
        hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        if libc.capset(C.byref(hdr), data) != 0 or libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0):
            raise OSError(C.get_errno(), f"capset({sorted(caps)})")


def call_as_tacc_user(fn: Callable[..., Any], *args: Any, timeout: float = 120.0,
                      user: str = USER) -> Any:
    """``fn(*args)`` in a forked child that closed every file but stdio and became
    @user (tacc-user); its JSON-able result, or AssertionError with the child's traceback.
    A child still running after ``timeout`` s is killed (AssertionError)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.closerange(3, wfd)
            os.closerange(wfd + 1, os.sysconf("SC_OPEN_MAX"))
            drop_to_tacc_user(user)
            out = json.dumps({"result": fn(*args)})
            code = 0
        except BaseException:  # noqa: BLE001 - reported to the parent
            out = json.dumps({"error": traceback.format_exc()})
        finally:
            try:
                os.write(wfd, out.encode())
            finally:
                os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"{fn.__name__} as {user}: still running after {timeout} s")
            data = os.read(rfd, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(rfd)
        os.waitpid(pid, 0)
    rep = json.loads(b"".join(chunks) or b'{"error": "the child wrote nothing"}')
    if "error" in rep:
        raise AssertionError(f"{fn.__name__} as {user} failed:\n{rep['error']}")
    return rep["result"]


def errno_as_tacc_user(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """0 if tacc-user can open @path with @flags, else the errno of the refusal."""
    return int(call_as_tacc_user(_open_errno, os.fspath(path), flags))


def _open_errno(path: str, flags: int) -> int:
    try:
        os.close(os.open(path, flags))
    except OSError as e:
        return e.errno or 254
    return 0


def python_as_tacc_user(code: str, prefix: str = "",
                        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run Python @code (no single quotes in it) as tacc-user through ``su``; @prefix is
    shell put before the interpreter (e.g. ``ulimit -l 64; ``)."""
    if "'" in code:
        raise ValueError("code is passed in single quotes: use double quotes in it")
    env = f"PYTHONPATH={os.pathsep.join(sys.path)}"
    return subprocess.run(["su", USER, "-c", f"{prefix}{env} {sys.executable} -c '{code}'"],
                          capture_output=True, text=True, timeout=timeout)
