"""`tacc profile -o CAP -- CMD` on the host (no tacc device, taccd without BPF: an empty
capture): it starts taccd when none answers and stops it after, and exits with CMD's
status (128 + N for signal N, 127 when it cannot start).  The findings and timeline of a
real workload: README.md's guest block (tests/vm/test_readme.py: the small_transfers
finding, the timeline file)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tacc.daemon import protocol

ROOT = Path(__file__).resolve().parents[2]
TACC = str(ROOT / ".venv/bin/tacc")


def _profile(tmp_path: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    sock = tmp_path / "taccd.sock"
    return subprocess.run(
        [TACC, "profile", "-o", str(tmp_path / "cap"), "--socket", str(sock),
         "--taccd-option=--no-bpf", "--taccd-option=--no-cdi",
         f"--taccd-option=--capture-root={tmp_path}", "--", *cmd],
        capture_output=True, text=True, timeout=300)


def test_profile_exit_status_and_outputs(tmp_path: Path) -> None:
    r = _profile(tmp_path, "sh", "-c", "echo from-the-command; exit 3")
    assert r.returncode == 3, r.stderr
    assert "from-the-command" in r.stdout
    assert "tacc profile: sh -c 'echo from-the-command; exit 3' exited 3" in r.stdout
    assert f"no taccd on {tmp_path}/taccd.sock: starting one" in r.stderr
    assert (tmp_path / "cap" / "meta.json").exists()
    # no device and no BPF here: the capture holds taccd's own records at most; the
    # findings and the timeline are written (an empty capture: one warning line instead)
    if "tacc profile: warning: no findings or timeline:" in r.stderr:
        assert "capture holds no records" in r.stderr
    else:
        doc = json.loads((tmp_path / "cap-findings.json").read_text())
        assert doc["schema"] == "tacc-findings"
        assert (tmp_path / "cap.pftrace").stat().st_size > 0
        assert f"wrote {tmp_path}/cap-findings.json and {tmp_path}/cap.pftrace" in r.stdout
    assert len(r.stdout.splitlines()) <= 24  # one screen
    # the taccd it started is gone
    assert not (tmp_path / "taccd.sock").exists() or not _answers(tmp_path / "taccd.sock")


def _answers(sock: Path) -> bool:
    try:
        return bool(protocol.request({"cmd": "ping"}, str(sock), timeout=2).get("ok"))
    except protocol.ProtocolError:
        return False


def test_profile_signal_and_missing_command(tmp_path: Path) -> None:
    r = _profile(tmp_path, "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + 15, r.stderr
    r = _profile(tmp_path / "x", "/no/such/command")
    assert r.returncode == 127 and "cannot run /no/such/command" in r.stderr
    r = subprocess.run([TACC, "profile", "-o", str(tmp_path / "c")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "give the command after --" in r.stderr
