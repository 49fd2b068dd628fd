"""``tacc profile -o CAP -- CMD``: one shot, like ``nsys profile``.

Starts taccd if none answers on the socket (and stops it after), starts a capture into
CAP, runs CMD with the runtime's API tracing on (TACC_API_TRACE=1), stops the capture,
then writes the findings (CAP-findings.json, tacc analyze's), the timeline (CAP.pftrace,
tacc timeline's) and prints a one-screen summary.  The exit status is CMD's (128 + N
when a signal N ended it; 127 when it could not be started)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tacc.cli import CommandError, UsageError
from tacc.daemon import protocol

EXAMPLES = """examples:
  tacc profile -o /tmp/cap -- tacc run tiny_transfers --variant bad
  tacc profile -o /tmp/cap --no-host -- python3 train.py --steps 10
  tacc profile -o /tmp/cap --socket /tmp/taccd.sock --taccd-option=--no-bpf -- ./a.out
"""


def add_parser(sub: Any) -> None:
    from tacc.cli import options

    p = sub.add_parser(
        "profile", help="capture a command: taccd, capture, run, stop, findings, timeline",
        description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[options.output("capture directory (also CAP.pftrace and CAP-findings.json)",
                                required=True, metavar="CAP"), options.socket()])
    p.add_argument("--no-host", action="store_true", help="no sched/block/net events")
    p.add_argument("--tlp", action="store_true", help="add the TLP stream (root)")
    p.add_argument("--taccd-option", action="append", default=[], metavar="OPT",
                   help="an option for the taccd that tacc profile starts (repeatable; "
                        "e.g. --taccd-option=--no-bpf)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                   help="the command to profile")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"tacc profile: {msg}", file=sys.stderr, flush=True)


def _ping(sock: str) -> bool:
    try:
        return bool(protocol.request({"cmd": "ping"}, sock, timeout=5.0).get("ok"))
    except protocol.ProtocolError:
        return False


def _start_taccd(sock: str, options: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    """taccd -f in the background, its log in a temporary file; returns once it answers."""
    log = Path(tempfile.mkstemp(prefix="tacc-profile-taccd-", suffix=".log")[1])
    exe = Path(sys.executable).with_name("taccd")
    argv = [str(exe) if exe.exists() else "taccd", "-f", "--socket", sock, *options]
    with log.open("wb") as f:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    end = time.monotonic() + 300  # its imports over 9p under TCG take a while
    while not _ping(sock):
        if p.poll() is not None:
            raise CommandError(f"profile: taccd exited with {p.returncode} before it answered "
                               f"(log: {log})")
        if time.monotonic() > end:
            p.kill()
            raise CommandError(f"profile: taccd did not answer within 300 s (log: {log})")
        time.sleep(0.2)
    return p, log


def _request(sock: str, req: dict[str, Any]) -> dict[str, Any]:
    try:
        rep = protocol.request(req, sock, timeout=600.0)  # the first start compiles BPF
    except protocol.ProtocolError as exc:
        raise CommandError(f"profile: {exc}") from None
    if not rep.get("ok"):
        raise CommandError(f"profile: taccd: {rep.get('error', 'refused the request')}")
    return rep


def _run_cmd(cmd: list[str]) -> int:
    env = {**os.environ, "TACC_API_TRACE": "1"}
    try:
        p = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        _say(f"cannot run {cmd[0]}: {exc.strerror}")
        return 127
    while True:
        try:
            rc = p.wait()
            break
        except KeyboardInterrupt:  # the command got the SIGINT too; wait for it
            continue
    return 128 - rc if rc < 0 else rc


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("profile: give the command after --: tacc profile -o CAP -- CMD")
    cap = Path(args.output).absolute()
    sock = protocol.socket_path(args.socket)
    daemon: subprocess.Popen[bytes] | None = None
    if not _ping(sock):
        _say(f"no taccd on {sock}: starting one")
        daemon, _ = _start_taccd(sock, args.taccd_option)
    try:
        opts: dict[str, Any] = {}
        if args.no_host:
            opts["host_events"] = False
        if args.tlp:
            opts["tlp"] = True
        rep = _request(sock, {"cmd": "start", "output": str(cap), "options": opts})
        for w in rep.get("warnings", []):
            _say(f"warning: {w}")
        _say(f"capturing to {rep['path']}; running {shlex.join(cmd)}")
        t0 = time.monotonic()
        try:
            status = _run_cmd(cmd)
        finally:
            time.sleep(0.2)  # the last completions reach the rings
            stop = _request(sock, {"cmd": "stop"})
        wall = time.monotonic() - t0
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
    from tacc.capture import CaptureError

    print(f"tacc profile: {shlex.join(cmd)} exited {status} after {wall:.1f} s", flush=True)
    try:
        report(cap, stop.get("summary", {}))
    except CaptureError as exc:  # e.g. an empty capture: the command's status still counts
        _say(f"warning: no findings or timeline: {exc}")
    return status


def report(cap: Path, summary: dict[str, Any]) -> None:
    """Findings and timeline next to the capture; the one-screen summary on stdout."""
    from tacc.analyze.engine import analyze, load_thresholds, to_json
    from tacc.capture import open_capture
    from tacc.timeline.convert import convert

    c = open_capture(cap)
    th = load_thresholds(None, [])
    findings = analyze(c, th, None)
    fpath = cap.with_name(cap.name + "-findings.json")
    fpath.write_text(json.dumps(to_json(c, findings, th), indent=1, default=str) + "\n")
    tpath = cap.with_name(cap.name + ".pftrace")
    from tacc.cli.progress import progress_bar

    with progress_bar("tacc profile: timeline", False) as tick:
        res = convert([cap], tpath, "perfetto", summary=True,
                      findings=[f.to_json() for f in findings], progress=tick)
    recs = summary.get("records", {})
    drops = sum((summary.get("drops") or {}).values())
    t0, t1 = c.time_range
    out = sys.stdout
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(recs.items()) if v) or "none"
    out.write(f"capture {cap}: {(t1 - t0) / 1e6:.1f} ms, {sum(recs.values())} records "
              f"({kinds}), {drops} dropped\n")
    dev = [ln for ln in res.summary.splitlines() if ": span " in ln and "busy" in ln]
    for ln in dev[:4]:
        out.write(f"  {ln}\n")
    if findings:
        out.write(f"findings ({len(findings)}; details: tacc analyze {cap}):\n")
        for f in findings[:8]:
            out.write(f"  {f.severity:<8} {f.rule:<18} {f.time_lost_ns / 1e6:>9.2f} ms lost  "
                      f"{f.title}\n")
    else:
        out.write("findings: none\n")
    out.write(f"wrote {fpath} and {tpath} (ui.perfetto.dev)\n")
