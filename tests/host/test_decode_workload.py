"""tacc run decode on the simulator backend: the GPT-2-architecture decoder lowered onto the
device ops (tacc.workloads.decode_engine), its tokens against onnx's ReferenceEvaluator,
and every twin's variants reference-checked."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tacc.cli import main as tacc_main
from tacc.models import gpt2
from tacc.runtime import Context
from tacc.workloads import WORKLOADS, run, run_twins
from tacc.workloads import decode as D

SMALL = {"batch": 2, "prompt": 8, "tokens": 4}


@pytest.fixture(scope="module")
def ctx() -> Context:
    c = Context(sim=True)
    yield c
    c.close()


def test_decode_tokens_equal_the_reference_evaluator(ctx: Context) -> None:
    r = run("decode", ctx)
    cfg = gpt2.CONFIGS["tiny"]
    ref, ref_logits = gpt2.reference_decode(cfg, gpt2.weights(cfg), gpt2.prompt(cfg, 4, 8),
                                            8)
    np.testing.assert_array_equal(np.array(r.extra["tokens"]), ref)
    assert r.checked and 0 < r.max_abs_err < D.LOGIT_BOUND
    # one job a decode step (the graph) plus the prefill's per-op jobs and the timing NOPs
    assert r.params["mode"] == "graph"
    x = r.extra
    assert x["ttft_ms"] > 0 and x["tpot_ms"] > 0 and x["tokens_per_s"] > 0


def test_bf16_same_tokens_logits_within_bound(ctx: Context) -> None:
    r = D.decode(ctx, dtype="bf16", **SMALL)
    assert r.checked and 0 < r.max_abs_err < D.BF16_LOGIT_BOUND


def test_a_wrong_token_fails_the_check(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = D._reference("tiny", 2, 8, 4, 7)
    t = ref[0].copy()
    t[1, 2] += 1
    monkeypatch.setattr(D, "_reference", lambda *a: (t, ref[1]))
    with pytest.raises(AssertionError, match="sequence 1 step 2"):
        D.decode(ctx, **SMALL)


@pytest.mark.parametrize("name", [n for n in WORKLOADS if n.startswith("decode_")])
def test_decode_twins_reference_checked(ctx: Context, name: str) -> None:
    bad, good = run_twins(name, ctx, **SMALL)
    assert bad.checked and good.checked
    assert bad.variant == "bad" and good.variant == "good"
    assert bad.extra["tokens"] == good.extra["tokens"]
    assert bad.expected_findings == list(WORKLOADS[name].expected) and not \
        good.expected_findings


def test_graph_replay_is_one_job_a_step(ctx: Context) -> None:
    eager = D.decode(ctx, mode="eager", **SMALL)
    graph = D.decode(ctx, mode="graph", **SMALL)
    # the decode steps: eager submits every op, the graph one launch per step
    assert eager.jobs - graph.jobs > 10 * (SMALL["tokens"] - 1)


def test_cli_decode_json_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert tacc_main(["run", "decode", "--sim", "--json", "--batch", "2", "--tokens", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    r = out["results"][0]
    assert r["checked"] and r["params"]["batch"] == 2 and r["extra"]["tokens_per_s"] > 0
    assert tacc_main(["run", "decode", "--sim", "--prompt", "60"]) == 2
    assert "exceed the KV cache" in capsys.readouterr().err
    assert tacc_main(["run", "tiny_transfers", "--sim", "--batch", "2"]) == 2
    assert "--batch is for the model workloads" in capsys.readouterr().err


def test_heads_sum_wider_than_a_gemm_dimension(ctx: Context) -> None:
    """batch x prompt x d_model above the device's GEMM dimension (4096): the prefill sums
    its heads with element-wise adds instead of one GEMM, the decode step with the ones
    GEMM (its ones vector uploaded though the prefill made none), and the tokens equal
    the reference."""
    r = run("decode", ctx, batch=8, prompt=8, tokens=2)
    assert r.checked and 0 < r.max_abs_err < D.LOGIT_BOUND


@pytest.mark.long
def test_gpt2_small_tokens_equal_the_reference_evaluator() -> None:
    """GPT-2 small's shapes (the LM head, 2 x 768 x 50257, as block GEMMs through the
    output's leading dimension) against ReferenceEvaluator: the same tokens, logits within
    LOGIT_BOUND (measured: 2.4e-6; the reference's top-2 margins >= 0.22)."""
    with Context(sim=True) as c:
        c.backend.devmem_size = 2 << 30  # 498 MB of fp32 weights
        r = D.decode(c, config="gpt2", batch=2, prompt=4, tokens=3)
        gemms = [rec for rec in c.backend.op_records if rec[0] == "gemm"]
    assert r.checked and 0 < r.max_abs_err < D.LOGIT_BOUND
    assert len(r.extra["tokens"]) == 2 and len(r.extra["tokens"][0]) == 3
    # the LM head in 13 column blocks (50257 = 12 x 4096 + 1105): the prefill's 8 tokens
    # x 768 x 4096 the widest GEMM (the MLP's 8 x 768 x 3072 the next)
    assert max(rec[2] for rec in gemms) == 2 * 8 * 768 * 4096


def test_weights_of_2_mib_and_more_fill_whole_2_mib_pages(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A weight of 2 MiB or more gets a buffer rounded up to 2 MiB pages (the driver maps
    a buffer's last partial 2 MiB with 4 KiB pages: GPT-2 small's decode step spent ~90 %
    of its GEMM time walking them); smaller weights keep the default; the KV cache is one
    buffer (on 2 MiB pages when it is 2 MiB or more)."""
    import dataclasses

    from tacc.models import gpt2
    from tacc.runtime.buffers import HUGE
    from tacc.workloads.decode import Decoder

    cfg = dataclasses.replace(gpt2.get_config("tiny"), name="wide", n_layer=1, d_model=384,
                              n_head=6)  # the MLP's weights 2.25 MiB in fp32
    monkeypatch.setitem(gpt2.CONFIGS, "wide", cfg)
    with Context(sim=True) as c:
        dec = Decoder(c, cfg, "fp32", 1, 4)
        w = dec.pre.weights
        big = {n: b for n, b in w.items() if dec.pre.consts[n].nbytes >= HUGE}
        assert len(big) == 2, sorted(big)  # the MLP's; Q, K, V are 576 KiB each
        for n, b in big.items():
            assert b.bo_size % HUGE == 0 and b.page_size == HUGE, (n, b.bo_size, b.page_size)
        small = [b for n, b in w.items() if n not in big]
        assert small and all(b.bo_size < HUGE for b in small)
        # the KV cache: every layer's past keys and values views of one buffer, shared
        # by the prefill and the step engines (small here: default pages)
        kv = list(dec.pre.kv.values())
        assert len(kv) == 2 and len({b._base.handle for b in kv if b._base}) == 1
        assert kv[0]._base.bo_size < HUGE
        assert [b.offset for b in kv] == [0, -(-kv[0].nbytes // 4096) * 4096]
        assert all(dec.step.kv[n] is b for n, b in dec.pre.kv.items())
        dec.free()
