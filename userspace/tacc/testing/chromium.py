"""Headless Chromium for the tests of the HTML views: the DOM a page leaves once its
scripts ran (``--dump-dom``), and what the browser printed meanwhile."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page: Path, profile: Path, budget_ms: int = 3000) -> tuple[str, str]:
    """(the page's DOM after its scripts, Chromium's stderr); ``profile``: a fresh
    user-data directory."""
    if CHROMIUM is None:
        raise FileNotFoundError("chromium is not installed (scripts/setup.sh installs it)")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
                        "--dump-dom", page.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    return r.stdout, r.stderr
