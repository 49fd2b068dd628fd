"""The CLI's start-up stays light: bfloat16 (ml_dtypes) and ONNX load only when a command
needs them.  Each costs ~10 s of guest time per process under TCG (docs/measurements.md), and
every `tacc`, `taccd` and `tacc run` start in the VM layer would pay it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("ml_dtypes", "onnx")


@pytest.mark.parametrize("stmt", [
    "import tacc.cli",
    "import tacc.cli.taccd",
    "from tacc.runtime import uapi",
    "from tacc.runtime import Context, Stream",
    "import tacc.workloads; tacc.workloads.get('tiny_transfers')",
    "from tacc.counters.backends import open_backend",
])
def test_start_up_imports_no_bfloat16_or_onnx(stmt: str) -> None:
    code = (f"import sys, json\n{stmt}\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [], f"{stmt!r} imported {r.stdout.strip()}"


def test_bf16_still_there_when_asked() -> None:
    """The lazy attribute resolves to ml_dtypes' bfloat16 and is recognised by name."""
    import ml_dtypes
    import numpy as np
    from tacc.runtime import kernels as K

    assert K.BF16 == np.dtype(ml_dtypes.bfloat16)
    assert K.is_bf16(K.BF16) and not K.is_bf16(np.float32)


@pytest.mark.parametrize("argv", [["trace", "status", "--help"], ["analyze", "--help"],
                                  ["timeline", "--help"], ["profile", "--help"]])
def test_a_command_imports_its_own_module_only(argv: list[str]) -> None:
    """`tacc trace ...` builds the trace parser alone: numpy and the counters' modules (which
    `tacc stat` needs) stay unloaded.  Fails when build_parser imports every module again."""
    _, loaded, _ = _run_main("tacc.cli", argv, ("numpy", "tacc.cli.counters", "tacc.cli.onnx"))
    assert loaded == [], f"tacc {argv}: {loaded}"


@pytest.mark.parametrize("argv", [["start", "-o", "/tmp/never-written"], ["stop"],
                                  ["status"]])
def test_trace_control_imports_no_numpy(argv: list[str], tmp_path: object) -> None:
    """`tacc trace start|stop|status` is one request over taccd's socket: the options are
    checked (tacc.daemon.options) without numpy or the capture modules, which cost ~3 s of
    a guest's host wall per process.  Here taccd is not running: the request fails after
    everything the command imports is imported."""
    sock = f"{tmp_path}/no-taccd.sock"
    st, loaded, err = _run_main("tacc.cli", ["trace", "--socket", sock, *argv],
                                ("numpy", "tacc.daemon.session", "tacc.capture", "tacc.pcie"))
    assert st == 1 and "taccd is not running" in err, (st, err)
    assert loaded == [], f"tacc trace {argv}: {loaded}"


def test_commands_table_is_what_the_modules_add() -> None:
    """tacc.cli.COMMANDS (the lazy dispatch's table) names every command each module adds."""
    import importlib

    from tacc.cli import COMMANDS, SUBCOMMAND_MODULES
    from tacc.cli.conventions import Parser

    added: dict[str, str] = {}
    for mod in SUBCOMMAND_MODULES:
        sub = Parser(prog="tacc").add_subparsers(dest="command")
        importlib.import_module(mod).add_parser(sub)
        added.update(dict.fromkeys(sub.choices, mod))
    assert COMMANDS == added


@pytest.mark.parametrize("argv", [["snoop", "--no-such-option"], ["latency", "--duration", "0"],
                                  ["top", "-p", "x"]])
def test_accel_bpftrace_usage_error_imports_no_numpy(argv: list[str]) -> None:
    """A usage error of accel-bpftrace is one line before numpy, tacc.devices or bcc are
    imported (the VM's Python spends seconds on each).  Fails when the preflight checks, or
    tacc.devices through them, are imported before the options are parsed."""
    st, loaded, err = _run_main("tacc.cli.bpftrace", argv, ("numpy", "tacc.devices", "bcc"))
    assert st == 2 and loaded == [], (st, loaded, err)
    assert len(err.strip().splitlines()) == 1, err


def _run_main(module: str, argv: list[str], watch: tuple[str, ...]
              ) -> tuple[int | None, list[str], str]:
    """(main's status, the modules of ``watch`` loaded after it, stderr) of ``module.main``
    run on ``argv`` in a new interpreter; argparse's --help exit is a None status."""
    code = (f"import sys, json\nfrom {module} import main\nst = None\n"
            "try:\n    st = main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print(json.dumps([st, [m for m in {watch!r} if m in sys.modules]]))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    st, loaded = json.loads(r.stdout.splitlines()[-1])
    return st, loaded, r.stderr
