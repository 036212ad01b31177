"""jit.build_artifact and jit.Memo, the one path from a rendered source to a cached cubin for the GEMMs and the
quantization kernels, and runtime.stream_for (CPU, no NVRTC compile: the compiler is replaced or the cache is
filled by hand)."""
import sys
import threading
import types

import pytest

from deepgemm_jit import __version__, cache, compiler, config, jit, runtime
from deepgemm_jit import quantization as quant
from deepgemm_jit.errors import KernelNotCachedError
from deepgemm_jit.spec import GemmSpec

ARCH = "sm_90a"
GEMM = GemmSpec.create(7168, 2048, "fp8")
QUANT = quant.QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
FAKE_CUBIN = b"\x7fELF not a real cubin"


@pytest.fixture
def fresh(cache_dir):
    quant.clear_memo()
    yield cache_dir
    quant.clear_memo()


def expected_key(rendered, arch=ARCH):
    """The key as the cache rules define it (cache.py): what determines the cubin, nothing else."""
    return cache.kernel_key(source=rendered.source, headers=rendered.headers, options=compiler.compile_options(arch),
                            nvrtc_version=compiler.nvrtc_version(), arch=arch, package_version=__version__)


def test_gemm_and_quant_keys_are_the_rendered_source_keys(fresh, monkeypatch):
    """A kernel stored by hand under the rule's key is found offline: get_kernel's key (GEMM and quantization)
    is exactly cache.kernel_key of the rendered source, so existing caches keep hitting."""
    cfg = config.choose_config(GEMM, 4096, ARCH)
    gemm_key = expected_key(jit.render_kernel(GEMM, cfg))
    quant_key = expected_key(quant.render_kernel(QUANT))
    store = cache.default_cache()
    store.store(gemm_key, FAKE_CUBIN, {"name": "by hand"})
    store.store(quant_key, FAKE_CUBIN + b"q", {"name": "by hand"})
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    art = jit.get_kernel(GEMM, cfg, ARCH)
    assert (art.key, art.cubin, art.compiled_now, art.entry) == (gemm_key, FAKE_CUBIN, False, "dgjit_gemm_sm90")
    assert (art.spec, art.config, art.arch) == (GEMM, cfg, ARCH)
    q = quant.get_kernel(QUANT, ARCH)
    assert (q.key, q.cubin, q.compiled_now, q.entry) == (quant_key, FAKE_CUBIN + b"q", False, "dgjit_quantize")
    # The tags name the kernel; they are not part of the key.
    built = jit.build_artifact(quant.render_kernel(QUANT), ARCH, spec_tag="another", config_tag="name", meta={})
    assert built.key == quant_key and built.cubin == q.cubin


def test_offline_miss_names_the_kernel(fresh, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    cfg = config.choose_config(GEMM, 4096, ARCH)
    with pytest.raises(KernelNotCachedError) as info:
        jit.get_kernel(GEMM, cfg, ARCH)
    exc = info.value
    assert str(exc) == (f"DEEPGEMM_JIT_OFFLINE=1 and kernel {GEMM.tag} {cfg.tag} for {ARCH} is not in the cache "
                        f"({fresh})")
    assert (exc.spec_tag, exc.config_tag, exc.arch, exc.cache_dir, exc.warmup_command) == (
        GEMM.tag, cfg.tag, ARCH, str(fresh), None)
    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    with pytest.raises(KernelNotCachedError) as info:
        quant.get_kernel(QUANT, ARCH)
    exc = info.value
    assert str(exc) == f"DEEPGEMM_JIT_OFFLINE=1 and kernel {QUANT.tag} for {ARCH} is not in the cache " \
                       "(disk cache disabled)"
    assert (exc.spec_tag, exc.config_tag, exc.cache_dir) == (QUANT.tag, "", None)


def fake_compiler(monkeypatch):
    calls = []

    def compile_cubin(rendered, arch):
        calls.append((rendered.entry, arch))
        return compiler.CompileResult(cubin=FAKE_CUBIN + rendered.entry.encode(), log="ptxas info", registers=40,
                                      stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0, static_smem_bytes=16)

    monkeypatch.setattr(compiler, "compile_cubin", compile_cubin)
    return calls


def test_metadata_of_both_families(fresh, monkeypatch, capsys):
    calls = fake_compiler(monkeypatch)
    monkeypatch.setenv("DEEPGEMM_JIT_VERBOSE", "1")
    cfg = config.choose_config(GEMM, 4096, ARCH)
    art = jit.get_kernel(GEMM, cfg, ARCH)
    assert art.compiled_now and art.cubin == FAKE_CUBIN + b"dgjit_gemm_sm90"
    meta = art.meta
    assert meta["name"] == f"{GEMM.tag}_{cfg.tag}" and meta["entry"] == "dgjit_gemm_sm90" and meta["arch"] == ARCH
    assert meta["spec"]["n"] == 7168 and meta["config"]["block_m"] == cfg.block_m
    assert meta["dynamic_smem_bytes"] == cfg.smem_bytes(GEMM) and meta["num_threads"] == cfg.num_threads
    assert (meta["registers"], meta["static_smem_bytes"], meta["log"]) == (40, 16, "ptxas info")
    assert meta["options"] == list(compiler.compile_options(ARCH)) and meta["package_version"] == __version__
    q = quant.get_kernel(QUANT, ARCH)
    assert q.compiled_now and q.meta["name"] == QUANT.tag and q.meta["quant_spec"]["granularity"] == "group128"
    assert "spec" not in q.meta and "config" not in q.meta and "dynamic_smem_bytes" not in q.meta
    assert calls == [("dgjit_gemm_sm90", ARCH), ("dgjit_quantize", ARCH)]
    jit.clear_memo()
    quant.clear_memo()
    assert not jit.get_kernel(GEMM, cfg, ARCH).compiled_now and not quant.get_kernel(QUANT, ARCH).compiled_now
    assert len(calls) == 2  # from the disk cache
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"deepgemm-jit: compiled {GEMM.tag} {cfg.tag} for {ARCH} in ")
    assert err[1].startswith(f"deepgemm-jit: compiled {QUANT.tag} for {ARCH} in ")
    assert err[2:] == [f"deepgemm-jit: loaded {GEMM.tag} {cfg.tag} for {ARCH} from the cache",
                       f"deepgemm-jit: loaded {QUANT.tag} for {ARCH} from the cache"]


def test_memo_keeps_each_templates_directory_apart(monkeypatch, tmp_path):
    """A process that switches DEEPGEMM_JIT_TEMPLATES_DIR (A/B experiments) gets the other copy's kernel, not the
    one memoized from the first directory."""
    memo = jit.Memo()
    builds = []

    def build():
        builds.append(1)
        return jit.BuiltKernel(key=f"k{len(builds)}", entry="e", cubin=b"", meta={}, compiled_now=True)

    monkeypatch.delenv("DEEPGEMM_JIT_TEMPLATES_DIR", raising=False)
    first = memo.get(("spec", ARCH), build)
    monkeypatch.setenv("DEEPGEMM_JIT_TEMPLATES_DIR", str(tmp_path))
    other = memo.get(("spec", ARCH), build)
    assert (first.key, other.key, len(builds)) == ("k1", "k2", 2)
    monkeypatch.delenv("DEEPGEMM_JIT_TEMPLATES_DIR")
    assert memo.get(("spec", ARCH), build).key == "k1" and len(builds) == 2


def test_memo_builds_once_across_threads():
    memo = jit.Memo()
    builds = []
    gate = threading.Barrier(8)

    def build():
        builds.append(1)
        return jit.BuiltKernel(key="k", entry="e", cubin=b"", meta={}, compiled_now=True)

    results = []

    def worker():
        gate.wait()
        results.append(memo.get(("spec", ARCH), build))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and sorted(r.compiled_now for r in results) == [False] * 7 + [True]
    memo.clear()
    assert memo.get(("spec", ARCH), build).compiled_now and len(builds) == 2


class FakeTorchStream:
    def __init__(self, device_id):
        self.cuda_stream = 0x7000 + device_id


@pytest.fixture
def fake_torch(monkeypatch):
    """A torch module whose current stream on device d has the handle 0x7000 + d; resolve_stream echoes what it
    is given, so the tests see which stream stream_for picked."""
    module = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=FakeTorchStream))
    monkeypatch.setitem(sys.modules, "torch", module)
    monkeypatch.setattr(runtime, "resolve_stream", lambda stream: ("resolved", stream))


STREAM_FUNCTIONS = [runtime.stream_for]


@pytest.mark.parametrize("stream_for", STREAM_FUNCTIONS, ids=lambda f: f.__module__)
def test_stream_for(fake_torch, stream_for):
    assert stream_for("torch", None, 3) == ("resolved", 0x7003)   # torch's current stream of that device
    assert stream_for("cupy", None, 3) == ("resolved", None)      # CuPy's current stream
    assert stream_for("other", None, 0) == ("resolved", None)
    explicit = object()
    for kind in ("torch", "cupy", "other"):
        assert stream_for(kind, explicit, 1) == ("resolved", explicit)  # an explicit stream always wins
        assert stream_for(kind, 0x1234, 1) == ("resolved", 0x1234)

