"""Start a foreground taccd for a test (tests/vm): its own socket and capture root."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def start_taccd(sock: Path, root: Path, *extra: str, timeout: float = 300.0,
                verbose: bool = True) -> subprocess.Popen[str]:
    """taccd -f [-v] with ``extra`` options; returns once its control socket exists.

    stderr goes to ``root/taccd.log``: a pipe nobody reads until the end could block it.
    The wait is long (its imports are 9p reads: with -icount sleep=off the guest clock
    runs on while a busy host serves them; 10 s failed once in CI) and ends early, with
    the log, if taccd exits."""
    log_path = root / "taccd.log"
    with log_path.open("w") as log:
        p = subprocess.Popen([str(BIN / "taccd"), "-f", *(["-v"] if verbose else []), *extra,
                              "--socket", str(sock), "--capture-root", str(root)],
                             stderr=log, text=True)
    end = time.monotonic() + timeout
    while not sock.exists():
        if p.poll() is not None:
            raise RuntimeError(f"taccd exited with {p.returncode} before its socket "
                               f"existed: {log_path.read_text()[-2000:]}")
        if time.monotonic() > end:
            p.kill()
            p.wait(10)
            raise RuntimeError(f"taccd made no socket in {timeout:.0f} s: "
                               f"{log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    return p
