"""Autotuning on the GPU for every kind of call: 8-bit inputs with their scales, fused epilogues with their
operands, quantize-on-store (trial.py makes the tuner's call). Before trial.py the tuner called every candidate with
A and B alone, so each of these builds raised "no candidate config ran correctly"."""
import pytest

import deepgemm_jit as dg
from deepgemm_jit import buckets, jit, trial, tuning

pytestmark = pytest.mark.gpu

# (M, N, K, build kwargs): every input recipe, and the epilogue words that take call-time operands.
TUNED = [
    (256, 2112, 1024, {"dtype": "fp8", "scaling": "block"}),
    (200, 1040, 1000, {"dtype": "fp8", "scaling": "tensor", "epilogue": "bias+gelu"}),
    (130, 1024, 512, {"dtype": "fp8", "scaling": "row", "b_dtype": "fp8_e5m2", "epilogue": "residual"}),
    (256, 1024, 1024, {"dtype": "int8"}),
    (256, 1024, 1024, {"dtype": "int8", "scaling": "row", "epilogue": "bias_row+silu"}),
    (300, 1024, 640, {"dtype": "bf16", "epilogue": "bias+gelu+residual"}),
    (300, 1024, 640, {"dtype": "fp16", "epilogue": "beta"}),
    (300, 2048, 640, {"dtype": "bf16", "epilogue": "swiglu"}),
    (256, 1024, 1024, {"dtype": "tf32", "layout": "nn", "epilogue": "silu"}),
    (256, 1024, 1024, {"dtype": "fp8", "scaling": "block", "epilogue": "quant_fp8_g128"}),
    (256, 1024, 1024, {"dtype": "bf16", "epilogue": "bias+quant_fp8_tensor"}),
    (256, 1024, 1024, {"dtype": "bf16", "epilogue": "relu+quant_int8_tensor"}),
    (2048, 2112, 1024, {"dtype": "bf16"}),  # candidates with 192-row tiles (three consumers)
    (1050, 4096, 1024, {"dtype": "fp16", "epilogue": "bias+swiglu"}),
]


@pytest.mark.parametrize("m,n,k,kwargs", TUNED, ids=lambda v: str(v))
def test_tuning_runs_whole_calls(m, n, k, kwargs, tmp_path, monkeypatch):
    """tune=True succeeds, the heuristic's own kernel passes its trial, and the kept config gives correct calls."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    jit.clear_memo()
    seen = {}
    real_tune = tuning.tune

    def recording_tune(*args, **kw):
        seen["result"] = result = real_tune(*args, **kw)
        return result

    monkeypatch.setattr(tuning, "tune", recording_tune)
    g = dg.build(m, n, k, tune=True, weight_streaming=False, **kwargs)
    table = seen["result"].table
    assert table[0]["ok"], table[0]  # the heuristic's choice, which every other GPU test runs
    wrong = [row for row in table if row["why"].startswith("error")]
    assert not wrong, wrong  # a candidate the tuner could keep computes another value: that kernel has a bug
    assert g.config == seen["result"].config
    check = trial.trial_call(g.spec, m)
    err = check.error(check.run(g, check.poisoned_outputs()))
    assert check.within_bound(err), (err, check.bound)


@pytest.mark.parametrize("epilogue", ["bias+gelu", "beta", "residual", "quant_fp8_g128", "bias+quant_fp8_tensor"])
def test_trial_rejects_a_wrong_result(epilogue):
    """The trial's check can fail: the right kernel given a different operand (the tuner's question is whether a
    candidate computes this value) misses the bound."""
    import cupy

    dtype = {"quant_fp8_g128": {"dtype": "fp8", "scaling": "block"}}.get(epilogue, {"dtype": "bf16"})
    g = dg.build(256, 1024, 1024, epilogue=epilogue, weight_streaming=False, **dtype)
    good = trial.trial_call(g.spec, 256, rng=cupy.random.default_rng(1))
    assert good.within_bound(good.error(good.run(g, good.poisoned_outputs())))
    wrong = trial.trial_call(g.spec, 256, rng=cupy.random.default_rng(1))
    if "beta" in wrong.kwargs:
        wrong.kwargs["beta"] = -wrong.kwargs["beta"]
    elif "residual" in wrong.kwargs:
        wrong.kwargs["residual"] = wrong.kwargs["residual"][::-1].copy()
    elif "bias" in wrong.kwargs:
        wrong.kwargs["bias"] = wrong.kwargs["bias"][::-1].copy()
    else:
        wrong.a = wrong.a[::-1].copy()  # other rows: every value moves
    err = wrong.error(wrong.run(g, wrong.poisoned_outputs()))
    assert not wrong.within_bound(err), (err, wrong.bound)


def test_warmup_on_the_gpu_compiles_the_tuned_kernel_an_offline_build_takes(tmp_path, monkeypatch):
    """After `cache clear` (which keeps tuning/), an offline build of a tuned problem needs the tuned config's kernel.
    Its miss names a warmup line without --arch, and that line, run on this GPU, compiles exactly that kernel (it
    used to warm the heuristic's, and the miss stayed)."""
    import dataclasses
    import json

    import cupy

    from deepgemm_jit import cli, config, device, reference
    from deepgemm_jit.errors import KernelNotCachedError

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    jit.clear_memo()
    m, n, k = 256, 1024, 1024
    spec = dg.GemmSpec.create(n, k, dtype="bf16")
    heuristic = dg.build(m, n, k, dtype="bf16").config
    tuned = next(c for c in config.candidate_configs(spec, m, "sm_90a", device.num_sms()) if c != heuristic)
    key = tuning.tuning_key(tuning.DeviceIdentity.current(), spec, buckets.m_bucket(m))
    (tmp_path / "cache" / "tuning").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "tuning" / f"{key}.json").write_text(json.dumps({"config": dataclasses.asdict(tuned)}))
    assert cli.main(["cache", "clear", "--yes"]) == 0
    jit.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError) as miss:
        dg.build(m, n, k, dtype="bf16")
    line = miss.value.warmup_command
    assert line == f"deepgemm-jit warmup --shape {m}:{n}:{k}:bf16", line
    monkeypatch.delenv("DEEPGEMM_JIT_OFFLINE")
    assert cli.main(line.split()[1:]) == 0
    jit.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    g = dg.build(m, n, k, dtype="bf16")
    assert g.config == tuned
    a, b = reference.random_operands(g.spec, m, cupy.random.default_rng(7))
    out = reference.poisoned((m, n), "bf16")
    g(a, b, out=out)
    err = reference.relative_error(out, reference.reference(g.spec, a, b))
    assert reference.within_bound(err, "bf16"), err
