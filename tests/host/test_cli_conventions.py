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
from tacc.cli.conventions import generate, parsers, subparsers, walk

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


# Every leaf subcommand of tacc: a command line failing at run time (a missing or bad
# file, a function that is not there, no taccd: exit 1) and one with a bad option (exit
# 2); None where the command has no input that can fail (a listing of what is there).
# {t}: a temporary directory; this host has no tacc device.
MISSING = "{t}/no-such-capture"
FAILURES: dict[str, tuple[list[str] | None, list[str]]] = {
    "run": (["run", "mlp", "-d", "0000:07:00.0"], ["run", "mlp", "--sim", "--scale", "0"]),
    "stat": (["stat", "-d", "0000:07:00.0", "--", "true"], ["stat", "-a"]),
    "top": (["top", "-n", "1", "-i", "0.01"], ["top", "-i", "fast"]),
    "counters list": (["counters", "list"], ["counters", "list", "-d"]),
    "counters sample": (["counters", "sample", "-o", "{t}/c"],
                        ["counters", "sample", "-o", "{t}/c", "-r", "20000"]),
    "trace start": (["trace", "--socket", "{t}/none.sock", "start"],
                    ["trace", "--socket", "{t}/none.sock", "start", "--trace-entries", "100"]),
    "trace stop": (["trace", "--socket", "{t}/none.sock", "stop"],
                   ["trace", "--socket", "{t}/none.sock", "stop", "--bogus"]),
    "trace status": (["trace", "--socket", "{t}/none.sock", "status"],
                     ["trace", "status", "--json=yes"]),
    "profile": (["profile", "-o", "{t}/p", "--socket", "{t}/p.sock",
                 "--taccd-option=--bogus", "--", "true"], ["profile", "-o", "{t}/p"]),
    "timeline": (["timeline", MISSING, "--summary"], ["timeline", MISSING]),
    "analyze": (["analyze", MISSING], ["analyze", MISSING, "--rule", "nope"]),
    "export": (["export", MISSING, "-o", "{t}/x"], ["export", MISSING]),
    "query": (["query", "{t}/no-export", "SELECT 1"],
              ["query", "{t}/no-export", "SELECT 1", "--json", "--csv"]),
    "cluster offsets": (["cluster", "offsets", MISSING, MISSING + "1"],
                        ["cluster", "offsets", MISSING, MISSING + "1", "--align", "sundial"]),
    "cluster analyze": (["cluster", "analyze", MISSING, MISSING + "1"],
                        ["cluster", "analyze", MISSING, MISSING + "1", "--set", "nope=1"]),
    "cluster synth": (["cluster", "synth", "/dev/null/c"],
                      ["cluster", "synth", "{t}/s", "--variant", "ugly"]),
    "cdi generate": (["cdi", "generate", "-o", "{t}/t.yaml", "-d", "0000:01:00.7"],
                     ["cdi", "generate", "-o", "{t}/t.yaml", "-d", "zz"]),
    "cdi list": (["cdi", "list", "-o", "{t}/none.yaml"], ["cdi", "list", "-o", "{t}/t.yaml",
                                                          "not-a-cdi-name"]),
    "devices": (None, ["devices", "--kind", "gpu"]),
    "vfio list": (None, ["vfio", "list", "--json", "extra"]),
    "vfio bind": (["vfio", "bind", "0000:07:00.0"], ["vfio", "bind"]),
    "vfio unbind": (["vfio", "unbind", "0000:07:00.0"], ["vfio", "unbind"]),
    "vfio selftest": (["vfio", "selftest", "0000:07:00.0"], ["vfio", "selftest"]),
    "vfio nop": (["vfio", "nop", "0000:07:00.0"], ["vfio", "nop", "0000:07:00.0", "-n", "x"]),
    "vfio migrate": (["vfio", "migrate", "0000:07:00.0"], ["vfio", "migrate", "--bogus"]),
    "pcie capture": (["pcie", "capture", "-o", "{t}/f.pcapng", "-d", "0000:07:00.0"],
                     ["pcie", "capture", "-o", "{t}/f.pcapng", "--addr", "9-3"]),
    "pcie summary": (["pcie", "summary", "{t}/none.pcapng"], ["pcie", "summary"]),
    "pcie timeline": (["pcie", "timeline", "{t}/none.pcapng", "-o", "{t}/t.json"],
                      ["pcie", "timeline", "{t}/none.pcapng", "-o", "{t}/t.json", "--gen", "x"]),
    "onnx run": (["onnx", "run", "{t}/missing.onnx", "--sim"],
                 ["onnx", "run", "{t}/missing.onnx", "--fallback", "gpu"]),
    "onnx test": (["onnx", "test", "--device", "0000:07:00.0"],
                  ["onnx", "test", "--sim", "--ops", "Nope"]),
}
LEAVES = [" ".join(path[1:]) for path, p in walk(parsers()["tacc"](), ("tacc",))
          if len(path) > 1 and not list(subparsers(p))]


def test_every_subcommand_has_its_failures() -> None:
    assert sorted(FAILURES) == sorted(LEAVES)


@pytest.mark.parametrize("leaf", sorted(FAILURES))
def test_exit_status_runtime_1_usage_2(leaf: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A runtime failure exits 1, a bad option 2; each is one line on stderr naming
    tacc, nothing on stdout and no traceback (docs/cli.md)."""
    from tacc.cli import main

    (tmp_path / "none.yaml").write_text("")  # cdi list: a spec that is not one
    runtime, usage = FAILURES[leaf]
    for argv, status in ((runtime, 1), (usage, 2)):
        if argv is None:
            continue
        argv = [a.format(t=tmp_path) for a in argv]
        capsys.readouterr()
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        errors = [ln for ln in lines if ": error: " in ln]
        assert (rc, len(errors)) == (status, 1), (argv, rc, err)
        assert errors[0].startswith("tacc") and "Traceback" not in err, lines
        # besides: only tacc profile's progress lines (it tried to start a taccd)
        assert all(ln.startswith("tacc profile: ") for ln in lines if ln not in errors), err
        assert out == "", (argv, out)


def test_taccd_exit_status(tmp_path: Path) -> None:
    import subprocess

    taccd = str(Path(__file__).resolve().parents[2] / ".venv/bin/taccd")
    r = subprocess.run([taccd, "--interval", "soon"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("taccd: error: argument --interval")
    r = subprocess.run([taccd, "-f", "--no-bpf", "--no-cdi", "--no-always-on", "--socket",
                        "/dev/null/taccd.sock", "--capture-root", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("taccd: error: ")


def test_export_progress_on_a_terminal_only(tmp_path: Path) -> None:
    """tacc export: a bar counting the rows written on a terminal's stderr, none with -q
    or on a pipe (stdout then the same report)."""
    import subprocess
    import tarfile

    from tacc.capture import open_capture

    root = Path(__file__).resolve().parents[2]
    with tarfile.open(root / "tests/host/data/real-mixed.tar.xz") as tf:
        tf.extractall(tmp_path)  # noqa: S202 (our own fixture)
    cap = open_capture(tmp_path / "real-mixed")
    rows = sum(cap.count(s) for s in cap.streams)
    tacc = str(root / ".venv/bin/tacc")
    cmd = [tacc, "export", str(tmp_path / "real-mixed"), "-o", str(tmp_path / "x")]
    bar = _stderr_in_pty(cmd)
    assert f"{rows:,} rows" in bar, bar
    assert "rows" not in _stderr_in_pty([*cmd, "-q", "-o", str(tmp_path / "y")])
    r = subprocess.run([*cmd, "-o", str(tmp_path / "z")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "rows" not in r.stderr, r.stderr
    assert f"{rows} rows in" in r.stdout, r.stdout


# Commands without a --json of theirs, and why
NO_JSON = {
    "profile": "stdout carries CMD's own output; the findings are CAP-findings.json",
    "onnx test": "--json FILE writes every case's result (the conformance tool's option)",
}


def test_json_on_every_reporting_command() -> None:
    """Every tacc subcommand and accel-bpftrace command takes --json (but NO_JSON's)."""
    for name in ("tacc", "accel-bpftrace"):
        for path, p in walk(parsers()[name](), (name,)):
            leaf = " ".join(path[1:])
            if len(path) == 1 or list(subparsers(p)) or leaf in NO_JSON:
                continue
            assert any("--json" in a.option_strings for a in p._actions), path


@pytest.mark.parametrize("cmd", ["snoop", "latency", "top", "dma", "record", "list"])
def test_bpftrace_exit_status(cmd: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """accel-bpftrace: the host lacks tacc.ko (a runtime failure: 1), a bad option is 2;
    one line each."""
    from tacc.cli import bpftrace

    extra = ["-o", str(tmp_path / "cap")] if cmd == "record" else []
    for argv, status in (([cmd, *extra], 1), ([cmd, *extra, "--duration", "-1"], 2)):
        capsys.readouterr()
        rc = bpftrace.main(argv)
        out, err = capsys.readouterr()
        assert (rc, len(err.strip().splitlines())) == (status, 1), (argv, rc, err)
        assert err.startswith("accel-bpftrace: ") and out == "", (argv, err, out)
