"""Start a foreground taccd for a test (tests/vm): its own socket and capture root."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def start_taccd(sock: Path, root: Path, *extra: str) -> subprocess.Popen[str]:
    """taccd -f -v with ``extra`` options; returns once its control socket exists (10 s).

    stderr goes to ``root/taccd.log``: a pipe nobody reads until the end could block it."""
    with (root / "taccd.log").open("w") as log:
        p = subprocess.Popen([str(BIN / "taccd"), "-f", "-v", *extra, "--socket", str(sock),
                              "--capture-root", str(root)], stderr=log, text=True)
    for _ in range(100):
        if sock.exists():
            break
        time.sleep(0.1)
    return p
