"""The Python sources stay ruff clean (pyproject.toml's rules), keep their layers and
name the device contract instead of spelling its numbers."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    r = subprocess.run(
        [ruff, "check", "--output-format", "concise", "userspace", "tests", "tools",
         "scripts/run-vm", "scripts/test-vm"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers() -> None:
    """pyproject.toml's import-linter contracts: the layers, production never importing
    tacc.testing, no cycle between tacc's packages; none lists an exception."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert all("ignore_imports" not in c for c in cfg["contracts"]), "no exceptions listed"
    # every top-level module of the package is in a layer (a new one cannot slip past)
    layered = {m.strip() for c in cfg["contracts"] if c["type"] == "layers"
               for layer in c["layers"] for m in re.split(r"[:|]", layer)}
    tops = {p.stem if p.is_file() else p.name for p in (ROOT / "userspace/tacc").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert tops - {"testing"} <= layered, sorted(tops - {"testing"} - layered)
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    r = subprocess.run([lint, "--no-cache", str(ROOT / "pyproject.toml")],
                       cwd=ROOT / "userspace", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr


# MMIO accessors given a literal offset (a register is named by tacc.hw), and ioctl
# encoders given a literal number
_MMIO_LITERAL = re.compile(r"\b(?:r|w)(?:8|16|32|64)\(\s*(?:0x[0-9a-fA-F]+|\d+)\b"
                           r"|\b_?(?:IO|io)[WRwr]{0,2}\(\s*(?:0x[0-9a-fA-F]+|\w+ \+ 0x)")


def contract_literals(root: Path) -> list[str]:
    """Places under @root's userspace/, tests/ and tools/ that spell a tacc ioctl or
    register number instead of naming it from tacc.hw: an ioctl request number, a set of
    two or more tacc ioctl numbers (_IOC_NR, in hex), an MMIO access at a literal offset."""
    from tacc import hw

    requests = set(hw.IOCTLS.values())
    nrs = {v & 0xFF for v in requests}
    out = []
    files = [p for d in ("userspace", "tests", "tools") for p in (root / d).rglob("*.py")
             if "tacc/hw/" not in p.as_posix()]
    for p in files:
        text = p.read_text()
        rel = p.relative_to(root)
        for m in _MMIO_LITERAL.finditer(text):
            out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
        try:
            toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            continue
        group: list[tuple[int, int]] = []  # hex ioctl numbers in the current bracket
        depth = 0
        for t in toks:
            if t.type == tokenize.OP and t.string in "([{":
                depth += 1
                group = []
            elif t.type == tokenize.OP and t.string in ")]}":
                if len(group) >= 2:
                    out.append(f"{rel}:{group[0][0]}: ioctl numbers {[hex(v) for _, v in group]}")
                depth -= 1
                group = []
            elif t.type == tokenize.NUMBER and t.string.lower().startswith("0x"):
                v = int(t.string, 16)
                if v in requests:
                    out.append(f"{rel}:{t.start[0]}: ioctl request {t.string}")
                elif v in nrs and depth:
                    group.append((t.start[0], v))
    return out


def test_no_contract_literals() -> None:
    """Every ioctl and register number comes from tacc.hw (generated from the headers)."""
    assert contract_literals(ROOT) == []
