"""Tuning records: keys, lookup, damaged records; candidates (CPU only)."""
import dataclasses
import json

import pytest

from deepgemm_jit import GemmSpec, buckets, config, tuning

IDENTITY = tuning.DeviceIdentity(name="NVIDIA H200", num_sms=132, capability="9.0", driver=13000, nvrtc="13.0")
SPEC = GemmSpec.create(7168, 2048, dtype="bf16")


def test_key_depends_on_everything_that_changes_timings():
    k = tuning.tuning_key(IDENTITY, SPEC, 4096)
    assert k == tuning.tuning_key(IDENTITY, SPEC, 4096)
    others = [tuning.tuning_key(dataclasses.replace(IDENTITY, **{f: v}), SPEC, 4096)
              for f, v in (("name", "NVIDIA H100"), ("num_sms", 114), ("driver", 13010), ("nvrtc", "13.1"))]
    others += [tuning.tuning_key(IDENTITY, SPEC, 2048),
               tuning.tuning_key(IDENTITY, GemmSpec.create(7168, 2048, dtype="fp16"), 4096)]
    assert len(set(others + [k])) == len(others) + 1


def test_lookup_reads_stored_record_and_ignores_damage(cache_dir):
    assert tuning.lookup(IDENTITY, SPEC, 4096) is None
    cfg = config.sm90_config(SPEC, 128, 192, 4)
    path = cache_dir / "tuning" / f"{tuning.tuning_key(IDENTITY, SPEC, 4096)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    assert tuning.lookup(IDENTITY, SPEC, 4096) == cfg
    path.write_text("{broken")
    assert tuning.lookup(IDENTITY, SPEC, 4096) is None
    # Parsed, but out of any valid range: a band of 2^33 M blocks would not compile (32-bit constexpr).
    path.write_text(json.dumps({"config": dataclasses.asdict(cfg) | {"group_m": 2 ** 33}}))
    assert tuning.lookup(IDENTITY, SPEC, 4096) is None


def test_candidates_start_with_the_heuristic_and_are_valid():
    """Also with epilogues: the ping-pong candidate was offered to TF32 nn's B-transposing kernel, which has no
    ping-pong tiles (found compiling every candidate of fuzz seeds; the tuner skipped it with the error)."""
    for n, k, dt, m, layout, epi in ((7168, 2048, "bf16", 4096, "nt", None), (2112, 7168, "bf16", 64, "nt", None),
                                     (4096, 4096, "tf32", 4096, "nt", None), (1001, 1003, "fp16", 100, "nt", None),
                                     (175, 4294, "tf32", 256, "nn", "bias_row+gelu+residual"),
                                     (4096, 1024, "tf32", 256, "nn", "silu"),
                                     (4096, 1024, "bf16", 4096, "nt", "bias+gelu")):
        spec = GemmSpec.create(n, k, dtype=dt, layout=layout, epilogue=epi)
        cands = config.candidate_configs(spec, m, "sm_90a")
        assert cands[0] == config.choose_config(spec, m, "sm_90a")
        assert 2 <= len(cands) <= 8 and len(set(cands)) == len(cands)
        for cfg in cands:
            cfg.check_for(spec, "sm_90a")
        assert any(c.pingpong for c in cands) == (dt == "bf16" and epi is not None), (n, k, dt, epi)
    # the cooperative 128x128 tile stays a candidate beside the ping-pong one of its shape (it was dropped: the
    # dedup compared the found tiles' schedule with a literal False; review, session 60)
    cands = config.candidate_configs(GemmSpec.create(24576, 1536, dtype="bf16", epilogue="bias+gelu"), 4096, "sm_90a")
    assert {(c.block_m, c.block_n, c.pingpong) for c in cands} >= {(128, 128, True), (128, 128, False)}


def test_wide_64_row_static_quant_tiles_compile_clean(shared_cache_dir, monkeypatch):
    """64-row tiles 240 and 256 columns wide with a column bias, an activation and a static quantize kept 16 bytes on
    the stack until session 58 (a run-time amax test per pair; a rule kept them out of the candidates). Now they
    compile without local memory and are candidates like any tile: every candidate of such a spec compiles clean."""
    from deepgemm_jit import jit, sass
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(3568, 1008, dtype="bf16", layout="nt", epilogue="bias+relu+quant_fp8_tensor")

    def local_bytes(cfg):
        art = jit.get_kernel(spec, cfg, "sm_90a")
        use = sass.resource_usage(art.cubin)[art.entry]
        return use.get("LOCAL", 0) + use.get("STACK", 0)

    assert local_bytes(config.sm90_config(spec, 64, 240, 4, m_hint=416)) == 0
    cands = config.candidate_configs(spec, 416, "sm_90a", 132)
    assert all(local_bytes(c) == 0 for c in cands), [c.tag for c in cands]


def test_tune_without_gpu_is_refused(cache_dir):
    import deepgemm_jit as dg
    from deepgemm_jit.errors import NoGPUError
    with pytest.raises(NoGPUError, match="tune=True"):
        dg.build(64, 64, 64, arch="sm_90a", tune=True)


def test_fp32_refuses_tuning_before_anything(cache_dir):
    """3xTF32's TF32 GEMM multiplies hi / lo splits, which the tuner has no float64 value for (trial.py)."""
    import deepgemm_jit as dg
    with pytest.raises(ValueError, match="tune=True is not available for dtype='fp32'"):
        dg.build(64, 64, 64, dtype="fp32", tune=True)
    with pytest.raises(ValueError, match="tune=True"):
        dg.build_fp32(64, 64, 64, arch="sm_90a", tune=True)
    dg.build_fp32(64, 64, 64, arch="sm_90a", tune=None)  # DEEPGEMM_JIT_TUNE's default: untuned, no error


def test_tune_environment_default_leaves_offline_builds_alone(cache_dir, monkeypatch, capsys):
    """DEEPGEMM_JIT_TUNE=1 made every offline build (arch=, `explain --arch`, `demo` without a GPU) fail with
    'tune=True needs the GPU'; it is a default for builds on the GPU. An explicit tune=True with arch= still fails."""
    import deepgemm_jit as dg
    from deepgemm_jit import cli
    from deepgemm_jit.errors import NoGPUError

    monkeypatch.setenv("DEEPGEMM_JIT_TUNE", "1")
    assert dg.build(64, 64, 64, arch="sm_90a").config.family == "sm90"
    assert cli.main(["explain", "64", "64", "64", "--arch", "sm_90a"]) == 0
    with pytest.raises(NoGPUError, match="tune=True needs the GPU"):
        dg.build(64, 64, 64, arch="sm_90a", tune=True)


def test_trial_refuses_hi_lo_specs():
    from deepgemm_jit import trial
    from deepgemm_jit.fp32x3 import Fp32Spec
    inner = Fp32Spec.create(64, 96).inner_at(64, "sm_90a")
    assert inner.hi_lo
    with pytest.raises(ValueError, match="hi_lo"):
        trial.trial_call(inner, 64)


def test_tune_keeps_no_record_of_a_partial_or_diskless_run(cache_dir, monkeypatch):
    """A tune in offline mode times only the cached candidates: its pick, stored, would stop every later process
    from tuning. DEEPGEMM_JIT_DISABLE_DISK_CACHE reads and writes no record (it did both: review)."""
    import types

    from deepgemm_jit.errors import KernelNotCachedError

    class Trial:  # every candidate right
        bound = 1.0

        def poisoned_outputs(self):
            return {}

        def run(self, gemm, outputs):
            return gemm()

        def error(self, result):
            return 0.0

        def within_bound(self, err):
            return True

    monkeypatch.setattr(tuning, "trial_call", lambda spec, m: Trial())
    monkeypatch.setattr(tuning.timing, "time_interleaved", lambda fns, reps: {
        tag: types.SimpleNamespace(median_us=1.0 + i) for i, tag in enumerate(fns)})
    cands = [config.sm90_config(SPEC, 128, 192, 4), config.sm90_config(SPEC, 128, 128, 4)]

    def offline(cfg):
        if cfg == cands[1]:
            raise KernelNotCachedError("not cached", spec_tag="s", config_tag="c", arch="sm_90a", cache_dir=None)
        return lambda: None

    assert tuning.tune(IDENTITY, SPEC, 4096, cands, offline).config == cands[0]
    assert tuning.lookup(IDENTITY, SPEC, 4096) is None
    assert tuning.tune(IDENTITY, SPEC, 4096, cands, lambda cfg: (lambda: None)).config == cands[0]
    assert tuning.lookup(IDENTITY, SPEC, 4096) == cands[0]
    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    assert tuning.lookup(IDENTITY, SPEC, 4096) is None


def test_warmup_on_the_gpu_plans_the_stored_tuned_config(cache_dir, monkeypatch):
    """A build on the GPU takes a stored tuned config; warmup planned the heuristic's, so after `cache clear` (which
    keeps tuning/) an offline build of a tuned problem missed a kernel that its warmup line did not compile. Warmup
    for the GPU it runs on (no --arch) now asks the same question as build (tuning.stored_config), and the miss's
    line drops --arch for a tuned pick."""
    from deepgemm_jit import warmup, warmup_sources

    monkeypatch.setattr(tuning.DeviceIdentity, "current", classmethod(lambda cls: IDENTITY))
    bucket = buckets.m_bucket(4096)
    heuristic = config.choose_config(SPEC, bucket, "sm_90a", 132)
    tuned = config.sm90_config(SPEC, 128, 128, 4)
    assert tuned != heuristic
    assert tuning.stored_config(SPEC, 4096, "sm_90a") is None
    entries = [warmup.parse_shape("4096:7168:2048:bf16")]
    assert list(warmup.plan_buckets(entries, "sm_90a", 132, tuning.stored_config)) == [(SPEC, heuristic)]
    path = cache_dir / "tuning" / f"{tuning.tuning_key(IDENTITY, SPEC, bucket)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": dataclasses.asdict(tuned)}))
    assert tuning.stored_config(SPEC, 4096, "sm_90a") == tuned
    assert list(warmup.plan_buckets(entries, "sm_90a", 132, tuning.stored_config)) == [(SPEC, tuned)]
    assert list(warmup.plan_buckets(entries, "sm_90a", 132)) == [(SPEC, heuristic)]  # --arch: no GPU to ask
    unfit = dataclasses.replace(tuned, block_k=32)  # a record that no longer fits is ignored, as build ignores it
    path.write_text(json.dumps({"config": dataclasses.asdict(unfit)}))
    assert tuning.stored_config(SPEC, 4096, "sm_90a") is None
    line = warmup_sources.warmup_command_for(SPEC, 4096, "sm_90a", 132, this_gpu=True)
    assert line == "deepgemm-jit warmup --shape 4096:7168:2048:bf16"


def test_warmup_for_another_sm_count_does_not_take_this_gpus_tuned_configs(cache_dir, monkeypatch, capsys):
    """review: warmup on the GPU with --num-sms N (planning for another GPU, docs/warmup.md) swapped in this GPU's
    tuned configs, which the other GPU's builds never find: they take the heuristic's at N SMs."""
    from deepgemm_jit import cli, device

    monkeypatch.setattr(tuning.DeviceIdentity, "current", classmethod(lambda cls: IDENTITY))
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "current_arch", lambda: "sm_90a")
    monkeypatch.setattr(device, "num_sms", lambda device_id=None: 132)
    tuned = config.sm90_config(SPEC, 128, 128, 4)
    path = cache_dir / "tuning" / f"{tuning.tuning_key(IDENTITY, SPEC, 4096)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": dataclasses.asdict(tuned)}))
    on_114 = config.choose_config(SPEC, 4096, "sm_90a", 114)
    assert on_114 != tuned
    for flags, want in (([], tuned), (["--num-sms", "132"], tuned), (["--num-sms", "114"], on_114)):
        assert cli.main(["warmup", *flags, "--dry-run", "--shape", "4096:7168:2048:bf16"]) == 0
        assert want.tag in capsys.readouterr().out, flags
