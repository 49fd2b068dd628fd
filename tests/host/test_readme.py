"""README.md's commands as tests (host side), and every program the README and docs/ call
mapped to a package scripts/setup.sh installs.  Tags and block grammar: tests/readme_blocks.py;
the guest-tagged blocks run in a VM boot (tests/vm/test_readme.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import readme_blocks as rb

ROOT = rb.ROOT
GUEST_PATH = f"{ROOT}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
README_BLOCKS = rb.fenced_blocks(rb.README)


def test_every_readme_sh_block_is_tagged() -> None:
    assert README_BLOCKS, "no sh block in README.md"
    bad = [f"{b.where}: tag {b.kind!r}" for b in README_BLOCKS if b.kind not in rb.KINDS]
    assert not bad, ("README.md sh blocks need a `<!-- readme-test: guest | host | skip: WHY "
                     "-->` line before them:\n" + "\n".join(bad))
    for b in README_BLOCKS:
        if b.kind == "skip":
            assert b.opts.lstrip(":").strip(), f"{b.where}: a skip tag says why (what covers it)"
        assert b.commands(), f"{b.where}: no command"


def test_readme_has_each_kind() -> None:
    # the tagging is exercised: at least one block of each kind
    assert {b.kind for b in README_BLOCKS} == set(rb.KINDS)


@pytest.mark.parametrize("block", [b for b in README_BLOCKS if b.kind == "guest"],
                         ids=lambda b: b.where)
def test_guest_blocks_are_run_vm_commands(block: rb.Block) -> None:
    for c in block.commands():
        vm = rb.run_vm_command(c.text)
        assert vm is not None, f"{block.where}: not `make run-vm [VAR=v] CMD='...'`: {c.text}"
        assert set(vm.vars) <= set(rb.VM_VARS), vm.vars


HOST_COMMANDS = [(b, c) for b in README_BLOCKS if b.kind == "host" for c in b.commands()]
# The README's scratch files live under /tmp/tacc-readme-*; each test run takes its own
# directory for them, so runs in several worktrees at once do not remove each other's
# (a concurrent run's `rm -rf /tmp/tacc-readme-cluster` failed three cluster commands
# with "no such capture", session 9)
README_TMP = "/tmp/tacc-readme-"


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize(("block", "cmd"), HOST_COMMANDS,
                         ids=[f"{b.where}:{c.line}" for b, c in HOST_COMMANDS])
def test_readme_host_command(block: rb.Block, cmd: rb.Command, scratch: Path) -> None:
    env = {**os.environ, "SETUP_QUIET": "1"}
    text = cmd.text.replace(README_TMP, f"{scratch}/tacc-readme-")
    r = subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == block.status, f"{text}: exit {r.returncode}\n{out}"
    for want in cmd.expect:
        want = want.replace(README_TMP, f"{scratch}/tacc-readme-")
        assert want in out, f"{text}: README says it prints {want!r}; it printed:\n{out}"


# ---- executables -> packages

def setup_packages() -> set[str]:
    text = (ROOT / "scripts/setup.sh").read_text()
    pkgs: set[str] = set()
    for m in re.finditer(r"^\s*(?:pkgs|bpo_pkgs)=\((.*?)\)", text, re.S | re.M):
        body = re.sub(r"#.*", "", m.group(1))
        pkgs |= set(body.split())
    assert "build-essential" in pkgs, "cannot read scripts/setup.sh's package lists"
    return pkgs


def inline_commands(path: Path) -> list[str]:
    """`make ...`, `scripts/...`, `.venv/bin/...` code spans in prose (README's one-liners)."""
    spans = re.finditer(r"`((?:[A-Z_]+=\S+ )*(?:make |scripts/|\.venv/bin/)[^`]*)`",
                        path.read_text())
    return [m.group(1) for m in spans
            if not m.group(1).startswith("scripts/")
            or os.access(ROOT / m.group(1).split()[0], os.X_OK)]  # a command, not a file


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) of every sh block in README.md and docs/*.md, and README's inline
    make/scripts commands."""
    out = []
    for md in [rb.README, *sorted((ROOT / "docs").glob("*.md"))]:
        for b in rb.fenced_blocks(md, ("sh", "bash", "console", "shell")):
            out += [(f"{b.where}", c.text) for c in b.commands()]
    out += [("README.md inline", c) for c in inline_commands(rb.README)]
    return out


def documented_executables() -> dict[str, list[str]]:
    exes: dict[str, list[str]] = {}
    for where, cmd in documented_commands():
        for exe in rb.executables(cmd):
            exes.setdefault(exe, []).append(where)
    return exes


def owning_package(path: str) -> str | None:
    cands = [path, os.path.realpath(path)]
    for p in list(cands):
        cands.append(p.removeprefix("/usr") if p.startswith("/usr/") else "/usr" + p)
    r = subprocess.run(["dpkg", "-S", *dict.fromkeys(cands)], capture_output=True, text=True,
                       timeout=60)
    for ln in r.stdout.splitlines():
        if ln.startswith("diversion "):
            continue
        pkgs, _, owned = ln.rpartition(": ")
        if owned in cands and pkgs:
            return pkgs.split(",")[0].strip().split(":")[0]
    return None


def is_essential(pkg: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Essential}", pkg], capture_output=True,
                       text=True, timeout=30)
    return r.stdout.strip() == "yes"


def test_documented_commands_found() -> None:
    exes = documented_executables()
    # the extraction sees what the README runs (the guest commands inside CMD='...' too)
    assert {"make", "tacc", "taccd", "lspci"} <= set(exes), sorted(exes)


@pytest.mark.parametrize("exe", sorted(documented_executables()))
def test_executable_comes_from_setup(exe: str) -> None:
    where = ", ".join(sorted(set(documented_executables()[exe])))
    if "/" in exe:  # scripts/run-vm, .venv/bin/pytest: the project's own
        p = (ROOT / exe).resolve()
        assert p.is_relative_to(ROOT) and os.access(p, os.X_OK), f"{exe} ({where}): missing"
        return
    found = shutil.which(exe, path=GUEST_PATH)
    assert found, (f"{exe} ({where}): not installed; the package that has it belongs in "
                   "scripts/setup.sh")
    if Path(found).is_relative_to(ROOT):
        return  # the venv's: the project itself (pyproject.toml)
    pkg = owning_package(found)
    assert pkg, f"{exe} ({where}): {found} belongs to no Debian package (installed by hand?)"
    assert pkg in setup_packages() or is_essential(pkg), (
        f"{exe} ({where}): {found} is in package {pkg}, which scripts/setup.sh does not "
        "install (and it is not Essential)")


def test_lspci_maps_to_pciutils() -> None:
    # the README's `lspci -nn` (issue 13 item 3): found, and from pciutils, which setup installs
    found = shutil.which("lspci", path=GUEST_PATH)
    assert found, "lspci: not installed (scripts/setup.sh must install pciutils)"
    assert owning_package(found) == "pciutils"
    assert "pciutils" in setup_packages()


def test_readme_vm_blocks_name_the_test_of_their_path() -> None:
    # a README block that starts VMs from the host and is not run as written names, in its
    # tag, the test that runs the same path: `scripts/test-vm:FUNCTION` (a function there)
    # or a tests/ file
    test_vm = (ROOT / "scripts/test-vm").read_text()
    starts_vm = re.compile(r"(^|[\s;&|(])(make\s+run-vm|scripts/run-vm)\b")
    blocks = [b for b in README_BLOCKS if b.kind == "skip"
              and any(starts_vm.search(c.text) for c in b.commands())]
    assert blocks, "no README block starts a VM from the host"
    for b in blocks:
        funcs = re.findall(r"scripts/test-vm:(\w+)", b.opts)
        files = [f for f in re.findall(r"\btests/[\w/]+\.py\b", b.opts) if (ROOT / f).exists()]
        assert funcs or files, f"{b.where}: the skip tag names no test of its path: {b.opts}"
        for f in funcs:
            assert re.search(rf"^def {f}\(", test_vm, re.M), f"{b.where}: no scripts/test-vm {f}"
