"""tacc.range: NVTX-like ranges recorded as API records in the calling thread's ring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tacc
from tacc.runtime import apitrace as tr

CODE = """
import json, os, numpy as np, tacc
from tacc.runtime import Context, apitrace

@tacc.range
def upload(s, d):
    s.copy_h2d(d, np.ones(64, np.float32))

@tacc.range("failing")
def fails():
    raise RuntimeError("x")

with Context() as ctx:
    s = ctx.stream(); d = ctx.device_buffer(64)
    with tacc.range("step 0"):
        with tacc.range("L0"):
            upload(s, d)
            s.relu(d, d)
        with tacc.range("L1"):
            s.relu(d, d)
    try:
        fails()
    except RuntimeError:
        pass
    apitrace.set_process_enabled(False)
    with tacc.range("untraced"):
        s.relu(d, d)
    apitrace.set_process_enabled(True)
    s.synchronize()
r = apitrace.RingReader(apitrace.list_rings(pid=os.getpid())[0])
recs = r.drain()
print(json.dumps([[r.names[int(x["name_id"])], x["args"].decode(), int(x["t_start"]),
                   int(x["t_end"]), int(x["tag"]), int(x["status"])] for x in recs]))
"""


@pytest.mark.parametrize("producer", ["c", "python"])
def test_ranges_nest_the_calls_made_inside(tmp_path: Path, producer: str) -> None:
    if producer == "c" and tr.PRODUCER != "c":
        pytest.skip("the C producer is not built (make setup)")
    env = dict(os.environ, TACC_API_DIR=str(tmp_path), TACC_RUNTIME_SIM="1",
               TACC_API_TRACE="1", TACC_API_PRODUCER=producer)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    recs = json.loads(out.splitlines()[-1])
    ranges = {a: (t0, t1, tag, st) for n, a, t0, t1, tag, st in recs if n == "range"}
    assert set(ranges) == {"step 0", "L0", "L1", "upload", "failing"}  # not "untraced"
    assert all(tag == 0 for _, _, tag, _ in ranges.values())
    assert ranges["failing"][3] == -1 and ranges["L0"][3] == 0

    def inside(inner: str, outer: str) -> bool:
        return ranges[outer][0] <= ranges[inner][0] <= ranges[inner][1] <= ranges[outer][1]

    assert inside("L0", "step 0") and inside("L1", "step 0") and inside("upload", "L0")
    assert ranges["L0"][1] <= ranges["L1"][0]
    calls = [(n, t0, t1) for n, a, t0, t1, tag, st in recs if n in ("copy_h2d", "eltwise")]
    # the upload's copy in "upload" (so in L0 and step 0); the relus in L0 and L1 (the
    # untraced range's relu is not recorded either)
    h2d = [c for c in calls if c[0] == "copy_h2d"][0]
    assert ranges["upload"][0] <= h2d[1] <= h2d[2] <= ranges["upload"][1]
    relus = [c for c in calls if c[0] == "eltwise"]
    assert len(relus) == 2
    assert ranges["L0"][0] <= relus[0][1] <= relus[0][2] <= ranges["L0"][1]
    assert ranges["L1"][0] <= relus[1][1] <= relus[1][2] <= ranges["L1"][1]


def test_range_api_and_bad_names() -> None:
    assert tr.NAMES[tr.NAME_ID["range"]] == "range"
    with pytest.raises(ValueError, match="non-empty string"):
        tacc.range("")

    @tacc.range
    def f(x: int) -> int:
        return x + 1

    assert f(1) == 2 and f.__name__ == "f"
    r = tacc.range("reused")
    with r, r:  # reentrant: nested uses of one object keep their own starts
        pass
    assert repr(r) == "tacc.range('reused')"
