"""A flipped bit anywhere in a REAL capture's stream files (tests/host/realcaps.py) is
reported, never read back as records: through ``open_capture().read()``, a capture marked
complete raises the one-line CaptureError; an interrupted one (no 'complete' marker)
reads the whole chunks before the damage and lists the damage in ``problems``.  The only
bits a reader may ignore are those that change no record (the stream header's reserved
field): then every stream reads back identical."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from realcaps import archives, extract
from tacc.capture import CaptureError, open_capture
from tacc.capture.errors import CaptureVersionError

# the damage checks are the same for every capture: two real ones of different functions
DAMAGE_CAPTURES = ["real-mixed", "virtio-mixed", "noisy_neighbour-good"]


def _read_all(p: Path) -> tuple[dict[str, bytes], list[str]]:
    cap = open_capture(p)
    return {s: cap.read(s).tobytes() for s in cap.streams}, list(cap.problems)


class Case:
    """A real capture on disk and what its streams read back undamaged."""

    def __init__(self, path: Path, base: dict[str, bytes], problems: list[str]) -> None:
        self.path, self.base, self.problems = path, base, problems

    def __repr__(self) -> str:  # hypothesis prints the fixture with a failing example
        return f"Case({self.path.parent.name})"


@pytest.fixture(scope="module")
def caps(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Case]:
    """(name, complete) -> the capture, complete or interrupted (its marker removed)."""
    root = tmp_path_factory.mktemp("dmg")
    have = archives()
    out = {}
    for name in DAMAGE_CAPTURES:
        if name not in have:
            continue
        p = extract(have[name], root / name)
        base, problems = _read_all(p)
        assert not problems and len(base) >= 6, (name, problems)
        out[(name, True)] = Case(p, base, problems)
        q = root / f"{name}-interrupted" / p.name
        shutil.copytree(p, q)
        (q / "complete").unlink()
        out[(name, False)] = Case(q, base, _read_all(q)[1])
    return out


def _flip(f: Path, off: int, bit: int) -> None:
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)[0]
        fh.seek(off)
        fh.write(bytes([b ^ (1 << bit)]))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_flipped_bit_is_an_error_never_silent_records(caps: dict, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(caps)), label="capture")
    case = caps[key]
    p, base = case.path, case.base
    files = sorted((p / "streams").glob("*.tcs"))
    f = data.draw(st.sampled_from(files), label="stream")
    size = f.stat().st_size
    # half the draws in the first 256 bytes (headers), half anywhere (payloads)
    off = data.draw(st.one_of(st.integers(0, min(size, 256) - 1), st.integers(0, size - 1)),
                    label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    _flip(f, off, bit)
    try:
        try:
            got, problems = _read_all(p)
        except CaptureError as exc:
            msg = str(exc)
            assert msg and "\n" not in msg, repr(msg)
            # interrupted: damage is a problem, not an error, unless a version changed
            assert key[1] or isinstance(exc, CaptureVersionError), msg
            assert f.name in msg or p.name in msg, msg  # names where
            return
        if got == base and problems == case.problems:
            # a bit no reader uses: only the stream header's reserved u16 (bytes 10-11)
            assert 10 <= off <= 11, (f.name, off, bit)
            return
        assert not key[1], "a complete capture read damaged records without an error"
        # interrupted: the damage is listed, the stream holds whole chunks before it
        stream = f.stem
        assert any(f.name in pr for pr in problems[len(case.problems):]), problems
        for s, recs in got.items():
            if s == stream:
                assert base[s].startswith(recs) and len(recs) < len(base[s]), s
            else:
                assert recs == base[s], s
    finally:
        _flip(f, off, bit)


def test_flipped_payload_byte_fails_the_cli_with_one_line(caps: dict, capsys: pytest.CaptureFixture,
                                                         tmp_path: Path) -> None:
    """One byte in the middle of the device trace's payload: `tacc analyze` and
    `tacc timeline` each print one line naming the stream and exit 1."""
    from tacc.cli import main

    p = caps[("real-mixed", True)].path
    q = tmp_path / p.name
    shutil.copytree(p, q)
    f = q / "streams" / "device_trace.tcs"
    _flip(f, f.stat().st_size // 2, 3)
    for argv in (["analyze", str(q)], ["timeline", str(q), "-o", str(tmp_path / "t.pftrace")]):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1, (argv, rc, err)
        assert err[0].startswith("tacc: error:") and "device_trace.tcs" in err[0], err
        assert "CRC" in err[0] or "damaged" in err[0], err


def test_every_real_stream_is_read_whole(caps: dict) -> None:
    """What the damage test compares with: every stream of the real captures, read through
    the reader, holds the count the 'complete' marker states."""
    import json

    for (_name, complete), case in caps.items():
        if not complete:
            continue
        p, base = case.path, case.base
        marker = json.loads((p / "complete").read_text())
        cap = open_capture(p)
        for s, recs in base.items():
            want = marker["streams"][s]["records"]
            assert len(recs) == want * cap.read(s).dtype.itemsize, s
            assert np.frombuffer(recs, np.uint8).size == len(recs)
