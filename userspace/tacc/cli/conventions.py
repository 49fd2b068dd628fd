"""One set of conventions for the three executables (tacc, accel-bpftrace, taccd), as
bcc's tools have them: every command and subcommand has a description and an
``examples:`` epilog, every option a help line; the shell completions and man pages are
generated from these parsers (``python -m tacc.cli.conventions OUTDIR``, run by
scripts/setup.sh).  ``finish(parser)`` fills what a module's ``add_parser`` left out from
the tables below (tests/host/test_cli_conventions.py walks every parser)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

WIDTH = 78

# (executable, subcommand...) -> (description, example command lines)
DOCS: dict[tuple[str, ...], tuple[str, list[str]]] = {
    ("tacc",): ("", ["tacc devices", "tacc profile -o /tmp/cap -- tacc run mlp",
                     "tacc timeline /tmp/cap -o /tmp/cap.pftrace"]),
    ("tacc", "run"): ("", ["tacc run --list", "tacc run tiny_transfers --variant bad --trace"]),
    ("tacc", "stat"): ("Count the device counters over a command (or an interval), as "
                       "perf stat does: each function's counters before and after.",
                       ["tacc stat -- tacc run mlp", "tacc stat -e jobs_completed,h2d_bytes "
                        "-- ./a.out", "tacc stat --json -d 0000:01:00.0 -- sleep 1"]),
    ("tacc", "top"): ("A live view per function (PF and VFs): jobs, bytes, busy shares, "
                      "refreshed every interval.", ["tacc top", "tacc top -i 0.5 -n 10"]),
    ("tacc", "counters"): ("The driver's counter catalogue, and sampling it into a capture.",
                           ["tacc counters list", "tacc counters sample -o /tmp/c -r 1000"]),
    ("tacc", "counters", "list"): ("The counters each function has: name, unit, kind.",
                                   ["tacc counters list", "tacc counters list -d VF1"]),
    ("tacc", "counters", "sample"): ("Sample the counters at a fixed rate into a capture "
                                     "directory (its counters stream).",
                                     ["tacc counters sample -o /tmp/c -r 1000 -t 2",
                                      "tacc counters sample -o /tmp/c -b device -r 5000"]),
    ("tacc", "trace"): ("Control taccd's captures over its UNIX socket (docs/taccd.md).",
                        ["tacc trace start -o /tmp/cap", "tacc trace stop",
                         "tacc trace status --json"]),
    ("tacc", "trace", "start"): ("Start a capture: taccd records the runtime's API calls, "
                                 "the driver's tracepoints, the device's trace ring, counters "
                                 "and clock pairs into a capture directory.",
                                 ["tacc trace start -o /tmp/cap",
                                  "tacc trace start -o /tmp/cap -p 1234 --no-host",
                                  "tacc trace start -o /tmp/cap --tlp --tlp-kinds mrd,cpld"]),
    ("tacc", "trace", "stop"): ("Stop the capture and close its directory; prints what "
                                "it holds.", ["tacc trace stop", "tacc trace stop --json"]),
    ("tacc", "trace", "status"): ("taccd's mode, devices, capture and always-on figures.",
                                  ["tacc trace status", "tacc trace status --json"]),
    ("tacc", "timeline"): ("", ["tacc timeline /tmp/cap -o /tmp/cap.pftrace",
                                "tacc timeline /tmp/cap --summary",
                                "tacc timeline /tmp/cap --format hta -o /tmp/hta",
                                "tacc timeline node0/cap node1/cap -o merged.pftrace"]),
    ("tacc", "cluster"): ("", ["tacc cluster synth /tmp/c --variant bad",
                               "tacc cluster offsets /tmp/c/node0 /tmp/c/node1",
                               "tacc cluster analyze /tmp/c/node0 /tmp/c/node1 --json"]),
    ("tacc", "cluster", "offsets"): ("Each node's clock offset to the first (reference) "
                                     "node and its bound, by the device host clock or "
                                     "taccd's network exchange.",
                                     ["tacc cluster offsets node0/cap node1/cap",
                                      "tacc cluster offsets --json node0/cap node1/cap"]),
    ("tacc", "cluster", "analyze"): ("The cross-node rules (pipeline_bubble, "
                                     "network_bound) over captures of several nodes.",
                                     ["tacc cluster analyze node0/cap node1/cap",
                                      "tacc cluster analyze --json f.json node0/cap node1/cap"]),
    ("tacc", "cluster", "synth"): ("Write synthetic captures of the two-node pipeline "
                                   "(OUT/node0, OUT/node1), for tests and the docs.",
                                   ["tacc cluster synth /tmp/c --variant good --seed 3"]),
    ("tacc", "cdi", "generate"): ("Write the CDI spec (one device per function) for "
                                  "container engines.", []),
    ("tacc", "cdi", "list"): ("The CDI device names and their container edits.", []),
    ("tacc", "vfio", "list"): ("Where each function is: tacc.ko, vfio-pci or none.", []),
    ("tacc", "vfio", "bind"): ("Move a VF from tacc.ko to vfio-pci.", []),
    ("tacc", "vfio", "unbind"): ("Give a VF back to tacc.ko.", []),
    ("tacc", "vfio", "selftest"): ("Copies and a GEMM through tacc.vfio, checked "
                                   "against numpy.", []),
    ("tacc", "vfio", "nop"): ("NOP submit-to-completion latency through tacc.vfio.", []),
    ("tacc", "pcie"): ("", ["tacc pcie capture -o /tmp/tlp.tcs -- tacc run mlp",
                            "tacc pcie summary /tmp/tlp.tcs",
                            "tacc pcie timeline /tmp/tlp.tcs -o /tmp/tlp.json"]),
    ("tacc", "pcie", "capture"): ("Record every TLP of the PF's link (the device's TLP "
                                  "capture ring) while a command runs.",
                                  ["tacc pcie capture -o /tmp/tlp.tcs -- tacc run mlp"]),
    ("tacc", "pcie", "summary"): ("Per-kind TLP counts, bytes and link efficiency of a "
                                  "TLP capture.", ["tacc pcie summary /tmp/tlp.tcs",
                                                   "tacc pcie summary --json /tmp/tlp.tcs"]),
    ("tacc", "pcie", "timeline"): ("A TLP capture as Chrome trace JSON (chrome://tracing, "
                                   "ui.perfetto.dev): one slice per TLP, read requests "
                                   "flowing to their completions.",
                                   ["tacc pcie timeline /tmp/tlp.tcs -o /tmp/tlp.json"]),
    ("tacc", "onnx"): ("ONNX models on the device (docs/onnx.md): run one, or the ONNX "
                       "backend node tests of the supported ops.",
                       ["tacc onnx run model.onnx -o out.npz",
                        "tacc onnx test --sim --ops MatMul,Relu"]),
    ("tacc", "onnx", "run"): ("Run an ONNX model on the device: its outputs' shapes and "
                              "dtypes, optionally saved as an .npz.",
                              ["tacc onnx run model.onnx",
                               "tacc onnx run model.onnx -i x=x.npy -o out.npz --fallback cpu"]),
    ("tacc", "onnx", "test"): ("The ONNX backend node tests of the supported ops, on the "
                               "device or the simulator.",
                               ["tacc onnx test", "tacc onnx test --sim --json results.json"]),
    ("accel-bpftrace",): ("", ["accel-bpftrace snoop", "accel-bpftrace latency --duration 5",
                               "accel-bpftrace snoop --ebpf"]),
    ("accel-bpftrace", "snoop"): ("One line per job submission and completion: process, "
                                  "function, queue, tag, bytes, latency.",
                                  ["accel-bpftrace snoop", "accel-bpftrace snoop -p 1234",
                                   "accel-bpftrace snoop --json --duration 10"]),
    ("accel-bpftrace", "latency"): ("log2 histograms of submit to completion, queue wait "
                                    "and device time, per queue.",
                                    ["accel-bpftrace latency --duration 5",
                                     "accel-bpftrace latency -c python3"]),
    ("accel-bpftrace", "top"): ("Per-process jobs/s, bytes/s and busy share, refreshed "
                                "every interval.", ["accel-bpftrace top -i 2"]),
    ("accel-bpftrace", "dma"): ("IOMMU map/unmap sizes, rates and time of the driver.",
                                ["accel-bpftrace dma --duration 5", "accel-bpftrace dma -i 1"]),
    ("accel-bpftrace", "record"): ("Every tacc event into a capture directory (what taccd "
                                   "records, without taccd).",
                                   ["accel-bpftrace record -o /tmp/cap --duration 10"]),
    ("accel-bpftrace", "list"): ("The tacc tracepoints and their fields.",
                                 ["accel-bpftrace list"]),
    ("taccd",): ("", ["taccd", "taccd -f -v --socket /tmp/taccd.sock",
                      "taccd --clock-exchange 169.254.0.1 --no-cdi"]),
}

# (executable, subcommand..., option) -> help, for options their module left without
OPTION_HELP: dict[tuple[str, ...], str] = {
    ("tacc", "stat", "--backend"): "how the counters are read: sysfs, mmap, perf",
    ("tacc", "stat", "--json"): "print the counters as JSON",
    ("tacc", "top", "--backend"): "how the counters are read: sysfs, mmap, perf",
    ("tacc", "counters", "sample", "--output"): "capture directory to write",
    ("tacc", "trace", "start", "--pid"): "only this process (repeatable)",
    ("tacc", "trace", "start", "--comm"): "only processes with this name",
    ("tacc", "trace", "start", "--device"): "only this function (PCI address)",
    ("tacc", "trace", "start", "--duration"): "stop the capture after this many seconds",
    ("tacc", "trace", "start", "--counters-hz"): "counter sampling rate, Hz",
    ("tacc", "trace", "start", "--max-bytes"): "stop when the capture reaches this size",
    ("tacc", "trace", "start", "--json"): "print taccd's reply as JSON",
    ("tacc", "trace", "stop", "--json"): "print taccd's reply as JSON",
    ("tacc", "trace", "status", "--json"): "print taccd's status as JSON",
    ("tacc", "export", "capture"): "capture directories",
    ("tacc", "query", "dir"): "the export directory (tacc export -o DIR)",
    ("tacc", "query", "sql"): "the SQL query (DuckDB)",
    ("tacc", "cluster", "offsets", "--rename"): "node id of CAPTURE (repeatable)",
    ("tacc", "cluster", "offsets", "--align"): "host clock, network exchange, or auto",
    ("tacc", "cluster", "analyze", "--rename"): "node id of CAPTURE (repeatable)",
    ("tacc", "cluster", "analyze", "--align"): "host clock, network exchange, or auto",
    ("tacc", "cluster", "synth", "out"): "directory for node0/ and node1/",
    ("tacc", "cluster", "synth", "--variant"): "the bad (bubbled) or the good twin",
    ("tacc", "cluster", "synth", "--seed"): "random seed of the synthetic run",
    ("tacc", "pcie", "capture", "--json"): "print the capture's summary as JSON",
    ("tacc", "pcie", "summary", "file"): "a TLP capture (tacc pcie capture -o FILE)",
    ("tacc", "pcie", "summary", "--json"): "print the summary as JSON",
    ("tacc", "pcie", "timeline", "file"): "a TLP capture (tacc pcie capture -o FILE)",
    ("tacc", "pcie", "timeline", "--output"): "Chrome trace JSON file to write",
    ("tacc", "onnx", "run", "model"): "the .onnx model file",
    ("tacc", "onnx", "test", "--sim"): "the runtime's simulator backend",
    ("tacc", "onnx", "test", "--device"): "PCI address or accel node (default: the first PF)",
    ("tacc", "onnx", "test", "--verbose"): "one line per test case",
    ("accel-bpftrace", "top", "--interval"): "seconds between refreshes",
    ("accel-bpftrace", "dma", "--interval"): "seconds between reports (default: at the end)",
    ("taccd", "--verbose"): "log every request and capture event to stderr",
}


def subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for a in p._actions:  # noqa: SLF001 (argparse has no public walk)
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            yield from a.choices.items()


def walk(p: argparse.ArgumentParser, path: tuple[str, ...]
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``p`` (``p`` first), with its command path."""
    yield path, p
    for name, sp in subparsers(p):
        yield from walk(sp, (*path, name))


def _fill(text: str) -> str:
    return "\n\n".join(textwrap.fill(" ".join(par.split()), WIDTH)
                       for par in text.split("\n\n") if par.strip())


def finish(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """Fill descriptions, ``examples:`` epilogs and option help from DOCS/OPTION_HELP."""
    for path, p in walk(parser, (prog,)):
        desc, examples = DOCS.get(path, ("", []))
        if not p.description and desc:
            p.description = desc
        if p.description:  # a module docstring as description: no RST markup in --help
            p.description = p.description.replace("``", "'")
        if not p.epilog and examples:
            p.epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
        if p.epilog and p.formatter_class is argparse.HelpFormatter:
            # keep the examples' lines; the description filled to the width instead
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            if p.description:
                p.description = _fill(p.description)
        for a in p._actions:  # noqa: SLF001
            if a.help is None and not isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                name = max(a.option_strings, key=len) if a.option_strings else a.dest
                a.help = OPTION_HELP.get((*path, name))
    return parser


def parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """The three executables' parser builders."""
    from tacc.cli import build_parser as tacc
    from tacc.cli.bpftrace import build_parser as bpftrace
    from tacc.cli.taccd import build_parser as taccd

    return {"tacc": tacc, "accel-bpftrace": bpftrace, "taccd": taccd}


def generate(out: Path) -> list[Path]:
    """Shell completions (bash, zsh: shtab) and man pages (argparse-manpage) of the three
    executables into ``out``/{bash-completion,zsh,man1}."""
    import shtab
    from argparse_manpage.manpage import Manpage

    written = []
    for name, build in parsers().items():
        p = build()
        p.prog = name
        for shell, sub, fname in (("bash", "bash-completion", name), ("zsh", "zsh", f"_{name}")):
            f = out / sub / fname
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(shtab.complete(p, shell=shell))
            written.append(f)
        f = out / "man1" / f"{name}.1"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(str(Manpage(p)))
        written.append(f)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "build/cli-docs")):
        print(path)
