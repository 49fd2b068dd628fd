"""The conventions of tacc, accel-bpftrace and taccd (tacc.cli.conventions), walking every
parser: a description and an ``examples:`` epilog on every command and subcommand whose
examples parse with that very parser, a help line on every option (no raw RST markup),
`accel-bpftrace --ebpf` on every subcommand, and shell completions and man pages
generated from the parsers with every subcommand in them."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
from tacc.cli.conventions import generate, parsers, walk

ALL = [(name, path, p) for name, build in parsers().items() for path, p in walk(build(), (name,))]
IDS = [" ".join(path) for _, path, _ in ALL]


def _command(line: str) -> str:
    """An example line without what follows its command after two spaces (outside
    quotes): ``tacc vfio list    every tacc function...`` -> ``tacc vfio list``."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif line.startswith("  ", i):
            return line[:i]
    return line


@pytest.mark.parametrize(("exe", "path", "p"), ALL, ids=IDS)
def test_description_examples_and_option_help(exe: str, path: tuple[str, ...],
                                              p: argparse.ArgumentParser) -> None:
    assert p.description and len(p.description.split()) >= 3, path
    assert p.epilog and p.epilog.startswith("examples:"), (path, p.epilog)
    # the examples block: "  EXE ARGS" lines, each maybe followed by two spaces and what
    # it does (or a "# comment"), until a blank line
    examples: list[str] = []
    for ln in p.epilog.split("\n\n")[0].splitlines()[1:]:
        if ln.startswith(f"  {exe}"):
            examples.append(ln.strip())
        elif ln.startswith("    ") and examples:  # a continued (quoted) argument
            examples[-1] += " " + ln.strip()
    examples = [_command(ex) for ex in examples]
    assert examples, (path, p.epilog)
    for ex in examples:
        words = shlex.split(ex, comments=True)
        assert words[0] == exe, ex
        # each example is a valid command line of this executable
        try:
            parsers()[exe]().parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"{ex}: usage error ({e})")
        except Exception as e:  # noqa: BLE001 (accel-bpftrace's parser raises ToolError)
            pytest.fail(f"{ex}: {e}")
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            continue
        assert a.help, f"{' '.join(path)}: {a.option_strings or a.dest} has no help"
        assert "``" not in str(a.help), f"{' '.join(path)}: raw RST in {a.help!r}"
    assert "``" not in p.description


def test_ebpf_on_every_bpftrace_command() -> None:
    for path, p in walk(parsers()["accel-bpftrace"](), ("accel-bpftrace",)):
        if len(path) == 2:
            assert any("--ebpf" in a.option_strings for a in p._actions), path


def test_completions_and_man_pages_name_every_subcommand(tmp_path: Path) -> None:
    files = generate(tmp_path)
    assert len(files) == 9  # bash, zsh, man page of each executable
    for name, build in parsers().items():
        bash = (tmp_path / "bash-completion" / name).read_text()
        man = (tmp_path / "man1" / f"{name}.1").read_text()
        assert (tmp_path / "zsh" / f"_{name}").read_text().startswith("#compdef")
        for path, _ in walk(build(), (name,)):
            if len(path) > 1:
                assert path[-1] in bash, (name, path)
                assert path[-1] in man, (name, path)
        title = man.split("\n")[0].replace("\\", "")  # groff escapes the dashes
        assert man.startswith(".TH") and name.upper() in title.upper()


def _stderr_in_pty(argv: list[str]) -> str:
    """``argv``'s stderr when it is a terminal (stdout a pipe)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(120)
    os.close(master)
    return out.decode(errors="replace")


def test_timeline_progress_on_a_terminal_only(tmp_path: Path) -> None:
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parents[2]
    with tarfile.open(root / "tests/host/data/real-mixed.tar.xz") as tf:
        tf.extractall(tmp_path)  # noqa: S202 (our own fixture)
    tacc = str(root / ".venv/bin/tacc")
    cmd = [tacc, "timeline", str(tmp_path / "real-mixed"), "-o", str(tmp_path / "t.pftrace")]
    bar = _stderr_in_pty(cmd)
    assert "11,066 events" in bar and "wrote" in bar  # the bar counts the events
    assert "events" not in _stderr_in_pty([*cmd, "-q"]).replace("11066 events", "")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # not a terminal
    assert r.returncode == 0
    assert r.stderr == f"wrote {tmp_path}/t.pftrace: 11066 events on 73 tracks\n"
