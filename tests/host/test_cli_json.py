"""`--json` output is JSON on stdout alone: taccd's warnings go to stderr (`tacc trace
start --json`, against a stand-in taccd on a UNIX socket), and `tacc analyze --json
CAPTURE` / `tacc cluster analyze --json CAPTURE...` read a directory after --json as a
capture (it was taken as the output file, and the capture as missing)."""

from __future__ import annotations

import json
import socket
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
from tacc.capture import synth_cluster as sc

ROOT = Path(__file__).resolve().parents[2]
TACC = str(ROOT / ".venv/bin/tacc")


def _stand_in_taccd(path: Path, reply: dict) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall((json.dumps(reply) + "\n").encode())
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_trace_start_json_warnings_on_stderr(tmp_path: Path) -> None:
    sock = tmp_path / "taccd.sock"
    rep = {"ok": True, "path": "/tmp/cap", "warnings": ["no BPF: host events off"]}
    t = _stand_in_taccd(sock, rep)
    r = subprocess.run([TACC, "trace", "--socket", str(sock), "start", "--json"],
                       capture_output=True, text=True, timeout=60)
    t.join(10)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == rep  # the whole of stdout is the JSON
    assert r.stderr == "tacc: warning: no BPF: host events off\n"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    with tarfile.open(ROOT / "tests/host/data/real-mixed.tar.xz") as tf:
        tf.extractall(root)  # noqa: S202 (our own fixture; Python 3.11.2 has no filter=)
    return root / "real-mixed"


def test_analyze_json_then_capture(real: Path) -> None:
    before = sorted(p.name for p in real.parent.iterdir())
    r = subprocess.run([TACC, "analyze", "--json", real.name], cwd=real.parent,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tacc-findings" and doc["findings"]
    assert sorted(p.name for p in real.parent.iterdir()) == before  # no file written
    r = subprocess.run([TACC, "analyze", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "tacc: error: analyze: give at least " \
        "one CAPTURE", r.stderr


def test_cluster_analyze_json_then_captures(tmp_path: Path) -> None:
    caps = sc.write(sc.pipeline("bad"), tmp_path / "c")
    r = subprocess.run([TACC, "cluster", "analyze", "--json", *map(str, caps)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "tacc-cluster-findings"


def test_timeline_summary_json_is_the_table(real: Path, tmp_path: Path) -> None:
    """tacc timeline --summary --json: one object on stdout holding the figures the text
    table prints (each track's slices and busy ms, each device's busy ms), and the event
    and track counts tacc timeline -o reports for the same capture."""
    r = subprocess.run([TACC, "timeline", str(real), "--summary", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tacc-timeline-summary" and doc["version"] == 1
    t = subprocess.run([TACC, "timeline", str(real), "--summary", "-o",
                        str(tmp_path / "t.pftrace")], capture_output=True, text=True,
                       timeout=300)
    assert t.returncode == 0, t.stderr
    assert t.stderr.endswith(f": {doc['events']} events on {doc['tracks']} tracks\n")
    assert (doc["events"], doc["tracks"]) == (11066, 73)
    text = t.stdout.splitlines()
    head = next(i for i, ln in enumerate(text) if ln.startswith("track "))
    table = text[head + 1:text.index("", head)]  # the track rows, in the JSON's order
    assert len(table) == len(doc["track_busy"]) > 20
    for ln, tr in zip(table, doc["track_busy"], strict=True):
        assert ln.startswith(tr["track"] + " "), (ln, tr)
        slices, busy_ms, _pct, sleep_ms = ln[len(tr["track"]):].split()
        assert int(slices) == tr["slices"], tr
        assert abs(float(busy_ms) - tr["busy_ns"] / 1e6) <= 0.0005, tr
        assert abs(float(sleep_ms) - tr["sleeping_ns"] / 1e6) <= 0.0005, tr
        assert tr["busy_ns"] <= doc["span_ns"]
    dev = [ln for ln in text if ": span " in ln and " busy " in ln]
    assert len(dev) == len(doc["device_engines"]) > 0
    for ln, d in zip(dev, doc["device_engines"], strict=True):
        assert ln.startswith(d["track"] + ": ")
        assert f"busy {d['busy_ns'] / 1e6:.3f} ms" in ln
        assert abs(d["busy_share"] * d["span_ns"] - d["busy_ns"]) <= 1
    assert sum(ev for ev in doc["device_events"]["by_kind"].values()) == \
        doc["device_events"]["total"]
