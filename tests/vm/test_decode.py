"""In-guest: ``tacc run decode`` (the GPT-2-architecture decoder, tiny config) on every
function kind of the boot (the PF in the strict boot; the PF, a VF and virtio-tacc in the
extras boot, where this file runs again), checked against onnx's ReferenceEvaluator: the
same tokens, logits within the bound (fp32 and bf16 weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tacc.runtime import Context, devices
from tacc.workloads import decode as D

BIN = Path(sys.executable).parent
SMALL = {"batch": 2, "prompt": 8, "tokens": 4}


def _kinds() -> list[str]:
    try:
        have = {d.kind for d in devices()}
    except OSError:
        have = set()
    return ["pf"] + [k for k in ("vf", "virtio") if k in have]


@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_decode_reference_check(kind: str, dtype: str) -> None:
    dev = None if kind == "pf" else next(d for d in devices() if d.kind == kind)
    with Context(dev) as ctx:
        r = D.decode(ctx, dtype=dtype, **SMALL)
    bound = D.BF16_LOGIT_BOUND if dtype == "bf16" else D.LOGIT_BOUND
    assert r.checked and 0 < r.max_abs_err < bound, r
    x = r.extra
    print(kind, dtype, f"ttft {x['ttft_ms']:.1f} ms, tpot {x['tpot_ms']:.1f} ms, "
          f"{x['tokens_per_s']:.1f} tokens/s, device {r.device_ns / 1e6:.2f} ms")
    assert x["ttft_ms"] > 0 and x["tpot_ms"] > 0 and x["tokens_per_s"] > 0


def test_tacc_run_decode_cli() -> None:
    p = subprocess.run([str(BIN / "tacc"), "run", "decode", "--json", "--batch", "2",
                        "--tokens", "4"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)["results"][0]
    assert r["checked"] and r["params"]["mode"] == "graph"
