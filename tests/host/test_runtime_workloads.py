"""Workloads and `tacc run` on the simulator backend: numerics and plumbing (no device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tacc.cli import main as tacc_main
from tacc.runtime import Context
from tacc.workloads import run, run_twins


@pytest.fixture(scope="module")
def ctx() -> Context:
    c = Context(sim=True)
    yield c
    c.close()


def test_mlp_matches_numpy(ctx: Context) -> None:
    r = run("mlp", ctx, batches=3, batch=32, d_in=64, d_hidden=96, d_out=16)
    assert r.checked and r.max_abs_err < 1e-3 and r.device_ns > 0


def test_mlp_serial_reference(ctx: Context) -> None:
    r = run("mlp", ctx, True, batches=2, batch=16, d_in=32, d_hidden=32, d_out=8)
    assert r.checked and r.variant == "serial"


@pytest.mark.parametrize("name", ["tiny_transfers", "unaligned_userptr", "map_churn"])
def test_twins_check_and_expectations(ctx: Context, name: str, tmp_path: Path) -> None:
    from tacc.analyze.engine import analyze
    from tacc.analyze.rules import RULES
    from tacc.capture import open_capture
    from tacc.capture.synth import generate

    bad, good = run_twins(name, ctx)
    assert bad.checked and good.checked
    # what the runtime says its bad twin must trigger is what the analysis really finds
    # on that workload's twins (tacc.capture.synth's device model: bad -> exactly these
    # rules, good -> nothing), and names rules that exist
    assert bad.expected_findings and set(bad.expected_findings) <= set(RULES)
    generate(tmp_path / "bad", name, "bad")
    generate(tmp_path / "good", name, "good")
    found = sorted({f.rule for f in analyze(open_capture(tmp_path / "bad"))})
    assert sorted(bad.expected_findings) == found, (bad.expected_findings, found)
    assert not good.expected_findings and analyze(open_capture(tmp_path / "good")) == []
    assert bad.variant == "bad" and good.variant == "good"
    if name == "tiny_transfers":
        assert bad.jobs == 512 and good.jobs == 2


def test_cli_list_and_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert tacc_main(["run", "--list"]) == 0
    assert "tiny_transfers" in capsys.readouterr().out
    assert tacc_main(["run", "tiny_transfers", "--sim", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in out["results"]] == ["bad", "good"]
    assert out["bad_over_good_device_time"] > 1


def test_cli_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert tacc_main(["run", "nope", "--sim"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert tacc_main(["run", "mlp", "--sim", "--scale", "0"]) == 2


def test_mlp_gives_its_device_memory_back() -> None:
    """A context runs mlp again and again (the tracing benchmark: ~100 runs) without
    running out of device memory: mlp frees its buffers.  Before, each run kept its
    2.75 MiB of buffers until the context closed, and the benchmark's ninth round failed
    with BO_CREATE ENOSPC."""
    from tacc.runtime import Context
    from tacc.workloads import run

    ctx = Context(sim=True)
    try:
        used0 = ctx.backend.devmem_used  # type: ignore[attr-defined]
        for _ in range(3):
            run("mlp", ctx, False, batches=2, check=False)
        assert ctx.backend.devmem_used == used0  # type: ignore[attr-defined]
    finally:
        ctx.close()
