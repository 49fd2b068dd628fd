"""The unprivileged tacc-user of the test VM (scripts/guest-init.sh makes it: group tacc,
no capabilities), for the adversarial tests that assert what it must not reach.

Two ways in, one place each:

* :func:`drop_to_tacc_user` in a forked child: the process keeps its Python state (open
  files, imported modules) and loses root, as a tenant's process would be;
* :func:`python_as_tacc_user`: a fresh interpreter through ``su``, with this process's
  ``sys.path``, for code that must start unprivileged (a login's environment, limits).
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys

USER = "tacc-user"
GROUP = "tacc"


def drop_to_tacc_user() -> None:
    """Become tacc-user (its group and the tacc group only); for a forked child."""
    pw = pwd.getpwnam(USER)
    os.setgroups([grp.getgrnam(GROUP).gr_gid])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def errno_as_tacc_user(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """0 if tacc-user can open @path with @flags, else the errno of the refusal."""
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            drop_to_tacc_user()
            os.close(os.open(path, flags))
            code = 0
        except OSError as e:
            code = e.errno or 254
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def python_as_tacc_user(code: str, prefix: str = "",
                        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run Python @code (no single quotes in it) as tacc-user through ``su``; @prefix is
    shell put before the interpreter (e.g. ``ulimit -l 64; ``)."""
    if "'" in code:
        raise ValueError("code is passed in single quotes: use double quotes in it")
    env = f"PYTHONPATH={os.pathsep.join(sys.path)}"
    return subprocess.run(["su", USER, "-c", f"{prefix}{env} {sys.executable} -c '{code}'"],
                          capture_output=True, text=True, timeout=timeout)
