"""README.md's commands as tests: its fenced ``sh`` blocks, their tags and their commands.

Each fenced ``sh`` block in README.md is preceded by a tag comment (blank lines between
are fine)::

    <!-- readme-test: guest -->            run inside a test VM boot (tests/vm/test_readme.py)
    <!-- readme-test: host status=2 -->    run on the host (tests/host/test_readme.py)
    <!-- readme-test: skip: WHY -->        not run as written; WHY says what covers it

A block holds commands, one per logical line (a quote or a trailing backslash continues
it).  A full-line comment right after a command is output that command must print
(stdout or stderr).  ``status=N`` is every command's expected exit status (default 0).
A guest command is ``make run-vm [VAR=value...] CMD='...'``: the guest runs the CMD (``$$``
made ``$``, as make would hand it to scripts/run-vm) with ``TACC_VM_OUT`` set.

Shared by tests/host/test_readme.py and tests/vm/test_readme.py (tests/ is on sys.path:
tests/conftest.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TAG = re.compile(r"<!--\s*readme-test:\s*(?P<kind>[a-z]+)(?P<opts>.*?)\s*-->")
KINDS = ("guest", "host", "skip")
FENCE = re.compile(r"^```(\S*)\s*$")
# make run-vm's variables a guest command may name (scripts/run-vm); the rest are the
# host side's (TACC_KEEP_RUNDIR=1 before make).
VM_VARS = ("IOMMU", "VFS", "MEM", "KERNEL", "SMP", "VIRTIO", "ICOUNT", "MODPARAMS", "QEMU_ARGS",
           "KERNEL_ARGS")


@dataclass
class Command:
    text: str
    line: int
    expect: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    kind: str | None = None  # None: untagged
    opts: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def status(self) -> int:
        m = re.search(r"\bstatus=(\d+)", self.opts)
        return int(m.group(1)) if m else 0

    def commands(self) -> list[Command]:
        out: list[Command] = []
        acc: list[str] = []
        start = 0
        for i, ln in enumerate(self.text.splitlines()):
            if not acc and not ln.strip():
                continue
            if not acc and ln.lstrip().startswith("#"):
                if out:
                    out[-1].expect.append(ln.lstrip()[1:].strip())
                continue
            if not acc:
                start = self.line + 1 + i
            acc.append(ln)
            text = "\n".join(acc)
            if text.endswith("\\"):
                continue
            try:
                shlex.split(text, comments=True)
            except ValueError:  # an open quote: the command goes on
                continue
            out.append(Command(text, start))
            acc = []
        if acc:
            raise ValueError(f"{self.where}: unterminated command: {' '.join(acc)}")
        return out


def fenced_blocks(path: Path, langs: tuple[str, ...] = ("sh",)) -> list[Block]:
    """The fenced blocks of a Markdown file in one of ``langs``, with their tags."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in langs:
            b = Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:j]))
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            t = TAG.search(lines[k]) if k >= 0 else None
            if t:
                b.kind, b.opts = t.group("kind"), t.group("opts").strip()
            blocks.append(b)
        i = j + 1
    return blocks


@dataclass
class RunVm:
    vars: dict[str, str]
    host_env: dict[str, str]
    guest_cmd: str


def run_vm_command(text: str) -> RunVm | None:
    """``[ENV=v...] make [-s] run-vm [VAR=v...] CMD='...'`` -> what the guest runs."""
    words = shlex.split(text, comments=True)
    host_env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], re.S):
        k, _, v = words.pop(0).partition("=")
        host_env[k] = v
    if words[:1] != ["make"]:
        return None
    rest = [w for w in words[1:] if w not in ("-s", "--no-print-directory")]
    if rest[:1] != ["run-vm"]:
        return None
    vars_: dict[str, str] = {}
    cmd = None
    for w in rest[1:]:
        k, eq, v = w.partition("=")
        if not eq or not re.fullmatch(r"[A-Z_]+", k):
            return None  # something after the make command (`; echo $?`): not one guest run
        if k == "CMD":
            cmd = v
        else:
            vars_[k] = v
    if cmd is None:
        return None
    return RunVm(vars_, host_env, cmd.replace("$$", "$"))


SEPARATORS = {";", "&", "&&", "|", "||", "(", ")", ";;", ");", "|&", "\n"}
REDIRECTS = {">", ">>", "<", "<<", ">&", "<&", "&>", "&>>", "<<<", ">|"}
# bash itself: builtins (their words are arguments) and keywords (a command follows)
BUILTINS = {"echo", "cd", "exit", "export", "true", "false", "test", "[", "set", "source",
            ".", "read", "printf", "wait", "kill", "type", "exec", "eval", "unset", "local",
            "return", "shift", "trap", "ulimit", "umask", "jobs", "for", "case", "fi", "done",
            "esac", "}"}
KEYWORDS = {"if", "then", "else", "elif", "while", "until", "do", "!", "{", "time", "command"}


def executables(text: str) -> set[str]:
    """Every program a shell command line runs (first words of its simple commands), the
    commands inside ``make run-vm CMD='...'`` included."""
    lx = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|()<>")
    lx.whitespace_split = True
    lx.whitespace = " \t\r"
    lx.commenters = "#"
    out: set[str] = set()
    at_start, skip_next = True, False
    for tok in list(lx):
        if skip_next:
            skip_next = False
            continue
        if tok in REDIRECTS or re.fullmatch(r"[0-9]*[<>]+&?", tok):
            skip_next = True
            continue
        if tok in SEPARATORS or set(tok) <= set(";&|()\n"):
            at_start = True
            continue
        if tok.startswith("CMD="):  # make run-vm's guest command, in any position
            out |= executables(tok.removeprefix("CMD=").replace("$$", "$"))
            continue
        if not at_start:
            continue
        if re.fullmatch(r"[A-Za-z_]\w*=.*", tok, re.S):
            continue  # an assignment before the command
        if tok in KEYWORDS:
            continue
        at_start = False
        if tok in BUILTINS or tok.startswith("$") or re.fullmatch(r"\.\.\.|[A-Z_]+", tok):
            continue  # bash's own, a variable, or a placeholder (CMD='...', CAPTURE)
        out.add(tok)
    return out
